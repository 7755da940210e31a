"""``lshdist ingest`` and ``lshdist info``: real data, summaries, and bad input (exit code 2,
a message saying what is wrong and how to fix it, and nothing left behind)."""

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from lshdist.cli import main
from lshdist.store.dataset import Dataset, write_dataset


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- real data --------------------------------------------------------------------------------
def test_ingest_letter(tmp_path, capsys, data_root):
    code, out, _ = run(capsys, "ingest", data_root / "letter" / "letter-recognition.data",
                       "--out", tmp_path / "letter")  # fmt: skip
    assert code == 0
    assert "ingested 20000 rows x 16 features (dense, 26 classes)" in out
    ds = Dataset(tmp_path / "letter")
    assert (ds.n, ds.d, ds.kind, ds.n_shards) == (20_000, 16, "dense", 2)
    assert ds.classes == [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    assert ds.attrs["source"]["format"] == "letter"
    first = ds.read_rows(0, 1)[0]  # "T,2,8,3,5,1,8,13,0,6,6,10,8,0,8,0,8"
    assert first.tolist() == [2, 8, 3, 5, 1, 8, 13, 0, 6, 6, 10, 8, 0, 8, 0, 8]
    assert ds.classes[ds.labels()[0]] == "T"


def test_ingest_fashion_mnist_both_idx_pairs(tmp_path, capsys, data_root):
    d = data_root / "fashion-mnist"
    files = [d / f"{s}-{k}" for s in ("train", "t10k")
             for k in ("labels-idx1-ubyte.gz", "images-idx3-ubyte.gz")]  # fmt: skip
    code, out, _ = run(capsys, "ingest", *files, "--out", tmp_path / "fm", "--shard-rows", 70_000)
    assert code == 0, out
    assert "ingested 70000 rows x 784 features (dense, 10 classes)" in out
    ds = Dataset(tmp_path / "fm")
    assert (ds.n, ds.d, ds.n_shards, len(ds.classes)) == (70_000, 784, 1, 10)
    y = ds.labels()
    assert np.bincount(y).tolist() == [7000] * 10  # 6,000 + 1,000 of each class
    # the test split comes second, pixel for pixel (read as the datasets README does)
    pixels = np.frombuffer(gzip.open(d / "t10k-images-idx3-ubyte.gz").read(), np.uint8, offset=16)
    labels = np.frombuffer(gzip.open(d / "t10k-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)
    test_rows = ds.read_rows(60_000, 70_000)
    assert test_rows.dtype == np.float32
    np.testing.assert_array_equal(test_rows, pixels.reshape(-1, 784))
    np.testing.assert_array_equal(np.array(ds.classes)[y[60_000:]].astype(int), labels)


def test_ingest_newsgroups_both_splits(tmp_path, capsys, data_root):
    d = data_root / "20newsgroups"
    code, out, _ = run(capsys, "ingest", d / "20newsgroups-train.tab.gz",
                       d / "20newsgroups-test.tab.gz", "--out", tmp_path / "ng")  # fmt: skip
    assert code == 0
    assert "ingested 18821 rows x hashed 64-bit feature ids (sparse" in out
    ds = Dataset(tmp_path / "ng")
    assert (ds.n, ds.kind, ds.d, len(ds.classes)) == (18_821, "sparse", 2**64, 20)
    assert "comp.graphics" in ds.classes and ds.attrs["text"]["weighting"] == "tfidf"
    np.testing.assert_allclose(ds.read_shard(1).row_norms_sq(), 1.0, rtol=1e-5)


# -- summaries, info, re-shard ----------------------------------------------------------------
@pytest.fixture
def small(tmp_path) -> Path:
    X = np.arange(30, dtype=np.float32).reshape(10, 3)
    np.savez(tmp_path / "small.npz", X=X, y=np.array(["a", "b"] * 5))
    return tmp_path / "small.npz"


def test_info_text_and_json(tmp_path, capsys, small):
    assert run(capsys, "ingest", small, "--out", tmp_path / "ds", "--shard-rows", 4)[0] == 0
    code, out, _ = run(capsys, "info", tmp_path / "ds")
    assert code == 0
    lines = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert lines["N"] == "10" and lines["d"] == "3" and lines["kind"] == "dense"
    assert lines["shards"] == "3" and lines["classes"] == "2" and lines["class_names"] == "a b"
    assert lines["nnz"] == "30"
    code, out, _ = run(capsys, "info", "--json", tmp_path / "ds")
    info = json.loads(out)
    assert code == 0 and info["N"] == 10 and info["class_names"] == ["a", "b"]
    assert info["format"] == "lshdist-dataset v1"


def test_reshard_and_overwrite(tmp_path, capsys, small):
    run(capsys, "ingest", small, "--out", tmp_path / "ds", "--shard-rows", 4)
    code, out, _ = run(capsys, "ingest", tmp_path / "ds", "--out", tmp_path / "ds",
                       "--shard-rows", 6, "--overwrite")  # fmt: skip
    assert code == 0 and "2 shard(s) of <= 6 rows" in out
    ds = Dataset(tmp_path / "ds")
    assert ds.n_shards == 2 and ds.classes == ["a", "b"]
    np.testing.assert_array_equal(ds.read_all(), np.arange(30).reshape(10, 3))
    assert sorted(os.listdir(tmp_path)) == ["ds", "small.npz"]


def test_bad_shard_rows_is_a_usage_error(tmp_path, capsys, small):
    with pytest.raises(SystemExit) as exit_:
        main(["ingest", str(small), "--out", str(tmp_path / "ds"), "--shard-rows", "0"])
    assert exit_.value.code == 2
    assert "--shard-rows: 0 must be >= 1" in capsys.readouterr().err


# -- bad input --------------------------------------------------------------------------------
def _nan(tmp):
    X = np.ones((6, 2))
    X[4, 0], X[5, 1] = np.nan, -np.inf
    np.save(tmp / "x.npy", X)
    message = r"'.*x.npy' holds 2 NaN or infinite values \(first in row 4\); remove or impute"
    return ["x.npy"], message


def _ragged(tmp):
    (tmp / "a.csv").write_text("1,2,3\n4,5,6\n7,8\n9,1,2\n")
    return ["a.csv"], r"line 3 has 2 fields, but the first line has 3; every row needs the same"


def _label_count(tmp):
    np.save(tmp / "x.npy", np.zeros((5, 2)))
    np.save(tmp / "y.npy", np.zeros(4, dtype=int))
    return ["x.npy", "--labels", "y.npy"], r"has 4 labels, but '.*x.npy' has 5 rows; give one label"


def _empty(tmp):
    (tmp / "a.csv").write_bytes(b"")
    return ["a.csv"], r"input '.*a.csv' is empty; give a file with at least one row"


def _unknown_format(tmp):
    (tmp / "a.xlsx").write_bytes(b"\x07\x08 not a known format")
    message = r"cannot tell the format of '.*a.xlsx' .*pass --format, one of: npy, npz, csv"
    return ["a.xlsx"], message


def _non_numeric(tmp):
    (tmp / "a.csv").write_text("h,w,label\n1.5,2,x\n1.7,tall,y\n")
    return ["a.csv"], r"column 'w' holds the non-numeric value 'tall' on line 3; features must be"


def _foreign_zarr(tmp):
    zarr.open_group(str(tmp / "g"), mode="w").create_array("a", data=np.arange(3))
    return ["g"], r"'.*g' is a Zarr group but not an lshdist dataset \(format=None"


def _corrupted_zarr_json(tmp):
    write_dataset(tmp / "src", np.ones((4, 2)))
    (tmp / "src" / "zarr.json").write_text('{"zarr_format": 3, "node_typ')
    return ["src"], r"zarr.json is corrupted \(.*\); (re-ingest the dataset|write it again)"


def _damaged_chunk(tmp):
    write_dataset(tmp / "src", np.random.default_rng(0).random((20, 3)), shard_rows=10)
    chunk = tmp / "src" / "X" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[:9])
    return ["src"], r"cannot read rows 0:20 of X .*the dataset is corrupted, re-ingest it"


BAD_INPUTS = {
    "nan": _nan,
    "ragged-csv": _ragged,
    "label-count": _label_count,
    "empty": _empty,
    "unknown-format": _unknown_format,
    "non-numeric": _non_numeric,
    "foreign-zarr-group": _foreign_zarr,
    "corrupted-zarr-json": _corrupted_zarr_json,
    "damaged-zarr-chunk": _damaged_chunk,
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_with_a_message_and_writes_nothing(tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    argv, message = BAD_INPUTS[case](tmp_path)
    before = sorted(os.listdir(tmp_path))
    code, out, err = run(capsys, "ingest", *argv, "--out", "out")
    assert code == 2
    assert err.startswith("lshdist ingest: error: ") and err.count("\n") == 1
    assert "Traceback" not in err and out == ""
    assert re.search(message, err), err
    assert sorted(os.listdir(tmp_path)) == before  # no output, no temporary directory


def test_existing_output_is_refused_and_kept(tmp_path, capsys, small):
    write_dataset(tmp_path / "out", np.zeros((2, 2)))
    code, _, err = run(capsys, "ingest", small, "--out", tmp_path / "out")
    assert code == 2
    assert "output '" in err and "already exists; choose another path or pass --overwrite" in err
    assert Dataset(tmp_path / "out").n == 2
    assert sorted(os.listdir(tmp_path)) == ["out", "small.npz"]


def test_failure_while_writing_leaves_nothing(tmp_path, capsys, small, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(zarr.Group, "create_array", full_disk)
    with pytest.raises(OSError):
        main(["ingest", str(small), "--out", str(tmp_path / "out")])
    assert sorted(os.listdir(tmp_path)) == ["small.npz"]


def _plain_directory(tmp):
    (tmp / "d").mkdir()
    return ["d"], r"'d' is not an lshdist dataset, model or index \(none of zarr.json"


def _missing(tmp):
    return ["missing"], r"'missing' does not exist"


@pytest.mark.parametrize(
    "make",
    [_foreign_zarr, _corrupted_zarr_json, _plain_directory, _missing],
    ids=["foreign-zarr-group", "corrupted-zarr-json", "plain-directory", "missing"],
)
def test_info_on_bad_directories(tmp_path, capsys, monkeypatch, make):
    monkeypatch.chdir(tmp_path)
    (path,), message = make(tmp_path)
    code, out, err = run(capsys, "info", path)
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith("lshdist info: error: ") and err.count("\n") == 1
    assert re.search(message, err), err


def test_info_on_a_damaged_label_chunk(tmp_path, capsys):
    write_dataset(tmp_path / "ds", np.ones((4, 2)), np.array([0, 1, 1, 1]))
    for chunk in (tmp_path / "ds" / "y" / "c").iterdir():
        chunk.write_bytes(b"garbage")
    code, _, err = run(capsys, "info", tmp_path / "ds")
    assert code == 2 and "cannot read y" in err and "re-ingest it" in err


def test_console_script_exits_2_without_traceback(tmp_path):
    script = shutil.which("lshdist", path=os.path.dirname(sys.executable))
    assert script, "the lshdist console script is not installed in this environment"
    (tmp_path / "a.csv").write_text("1,2\n3\n")
    proc = subprocess.run([script, "ingest", "a.csv", "--out", "out"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "line 2 has 1 fields, but the first line has 2" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.csv"]


def test_rows_split_letter(data_root, tmp_path, capsys):
    from lshdist.cli import main
    from lshdist.store.dataset import Dataset

    src = str(data_root / "letter" / "letter-recognition.data")
    assert main(["ingest", src, "--format", "letter", "--rows", "16000:20000", "--out", str(tmp_path / "te")]) == 0
    ds = Dataset(tmp_path / "te")
    assert (ds.n, ds.d, len(ds.classes)) == (4000, 16, 26)
    assert ds.ids()[0] == 16000
    assert main(["ingest", src, "--format", "letter", "--rows", "0:20001", "--out", str(tmp_path / "x")]) == 2
    assert "rows 0:20001 are out of range: the input has 20000 rows" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
