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
    raw = {k: gzip.decompress((d / f"t10k-{k}.gz").read_bytes()) for k in ("images-idx3-ubyte",
                                                                            "labels-idx1-ubyte")}
    pixels = np.frombuffer(raw["images-idx3-ubyte"], np.uint8, offset=16)
    labels = np.frombuffer(raw["labels-idx1-ubyte"], np.uint8, offset=8)
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
    assert info["format"] == "lshdist-dataset v3"  # byte values: stored as uint8


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
    assert "--shard-rows: '0': expected an integer >= 1" in capsys.readouterr().err


def test_id_column_and_id_offset(tmp_path, capsys):
    (tmp_path / "a.csv").write_text("f1,key,f2,label\n1,70,2,x\n3,12,4,y\n5,55,6,x\n")
    code, out, _ = run(capsys, "ingest", tmp_path / "a.csv", "--id-column", "key",
                       "--id-offset", 1000, "--out", tmp_path / "ds")  # fmt: skip
    assert code == 0 and "3 rows x 2 features" in out
    ds = Dataset(tmp_path / "ds")
    assert ds.ids().tolist() == [1070, 1012, 1055]
    np.testing.assert_array_equal(ds.read_all(), [[1, 2], [3, 4], [5, 6]])
    code, _, _ = run(capsys, "ingest", tmp_path / "a.csv", "--id-offset", 500, "--rows", "1:3",
                     "--out", tmp_path / "part")  # fmt: skip
    assert code == 0 and Dataset(tmp_path / "part").ids().tolist() == [501, 502]


def test_negative_id_offset_is_a_usage_error(tmp_path, capsys, small):
    with pytest.raises(SystemExit) as exit_:
        main(["ingest", str(small), "--out", str(tmp_path / "ds"), "--id-offset", "-1"])
    assert exit_.value.code == 2
    assert "--id-offset: '-1': expected an integer >= 0" in capsys.readouterr().err


def test_every_ingest_option_states_its_default():
    import argparse

    from lshdist.config import ClusterConfig
    from lshdist.jobs import ingest

    parser = ingest.add_parser(argparse.ArgumentParser().add_subparsers())
    cluster = set(ClusterConfig.__dataclass_fields__)  # the cluster section's own convention
    options = [a for a in parser._actions
               if a.option_strings and a.dest != "help" and a.dest not in cluster]
    assert {a.dest for a in options} >= {"id_offset", "id_column", "format", "rows"}
    for action in options:
        if action.required:
            continue
        text = parser._get_formatter()._expand_help(action)
        assert "default" in text and "None" not in text, (action.option_strings, text)


# -- bad input --------------------------------------------------------------------------------
def _nan(tmp):
    X = np.ones((6, 2))
    X[4, 0], X[5, 1] = np.nan, -np.inf
    np.save(tmp / "x.npy", X)
    message = (r"'.*x.npy' holds 2 NaN or infinite values \(first in row 4, column \d+\): "
               r".*remove or impute")
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
    message = r"cannot tell the format of '.*a.xlsx' .*pass --format, one of: npy, npz, parquet"
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
    return ["src"], (r"shard 1 \(rows 10:20\) of X does not match its checksum: a chunk is "
                     r"damaged; the dataset is corrupted, re-ingest it")


def _idx_no_items(tmp):
    header = bytes([0, 0, 0x08, 3]) + np.array([0, 28, 28], ">i4").tobytes()
    (tmp / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(header))
    return ["train-images-idx3-ubyte.gz"], (
        r"'train-images-idx3-ubyte.gz' holds no data: its header announces 0 x 28 x 28 uint8 "
        r"values \(0 items\), expected at least one item"
    )


def _duplicate_npz_ids(tmp):
    np.savez(tmp / "a.npz", X=np.ones((3, 2)), ids=np.array([5, 6, 5]))
    return ["a.npz"], r"'a.npz:ids' has duplicate ids: id 5 is on rows 0 and 2; ids must be unique"


def _duplicate_id_column(tmp):
    (tmp / "a.csv").write_text("key,f\n1,0.5\n2,0.5\n2,0.7\n")
    message = r"'a.csv:key' has duplicate ids: id 2 is on rows 1 and 2"
    return ["a.csv", "--id-column", "key"], message


def _non_integer_id(tmp):
    (tmp / "a.csv").write_text("key,f\n1,0.5\nx9,0.5\n")
    return ["a.csv", "--id-column", "key"], r"id column 'key' holds 'x9' on line 3, which is not"


def _ids_across_inputs(tmp):
    np.savez(tmp / "a.npz", X=np.ones((2, 2)), ids=np.array([0, 1]))
    np.savez(tmp / "b.npz", X=np.ones((2, 2)), ids=np.array([1, 2]))
    return ["a.npz", "b.npz"], r"row id 1 is in both 'a.npz' and 'b.npz'; ids must be unique"


def _id_offset_overflow(tmp):
    np.savez(tmp / "a.npz", X=np.ones((2, 2)), ids=np.array([0, 2**62]))
    return ["a.npz", "--id-offset", str(2**62)], r"moves id 4611686018427387904 beyond the int64"


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
    "idx-no-items": _idx_no_items,
    "duplicate-npz-ids": _duplicate_npz_ids,
    "duplicate-id-column": _duplicate_id_column,
    "non-integer-id": _non_integer_id,
    "ids-across-inputs": _ids_across_inputs,
    "id-offset-overflow": _id_offset_overflow,
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
    assert main(["ingest", str(small), "--out", str(tmp_path / "out")]) == 2  # one line
    assert "OSError: No space left on device" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["small.npz"]


def _plain_directory(tmp):
    (tmp / "d").mkdir()
    return ["d"], (r"'d' is not an lshdist dataset, model, index or results directory "
                   r"\(none of zarr.json")


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
    assert code == 2 and "cannot read shard 0 (rows 0:4) of y" in err and "re-ingest it" in err


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
    src = data_root / "letter" / "letter-recognition.data"
    code, _, _ = run(capsys, "ingest", src, "--format", "letter", "--rows", "16000:20000",
                     "--out", tmp_path / "te")  # fmt: skip
    assert code == 0
    ds = Dataset(tmp_path / "te")
    assert (ds.n, ds.d, len(ds.classes)) == (4000, 16, 26)
    assert ds.ids()[0] == 16000
    code, _, err = run(capsys, "ingest", src, "--format", "letter", "--rows", "0:20001",
                       "--out", tmp_path / "x")  # fmt: skip
    assert code == 2
    assert "rows 0:20001 are out of range: the input has 20000 rows" in err
    assert not (tmp_path / "x").exists()
