"""Damage drills on datasets and on what `verify INDEX` reaches beyond the index: a changed
value or a deleted chunk in a dataset shard stops `verify`, `index` and `query` with exit code 2
naming the shard (they were read, and answered, before the shard checksums); `verify INDEX`
loads its model's arrays (a flipped byte in the model passed it) and opens its source dataset;
ids repeated across segments are refused.

One small dense dataset, a queries dataset, an explicit model and an index built through the
CLI, once per module; each case damages a copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

from lshdist.cli import main
from lshdist.errors import FormatError
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.index import _segment_checksum, read_manifest, verify_index, write_manifest
from lshdist.store.model import save_model

pytestmark = pytest.mark.drills

CLUSTER = ["--in-process", "--workers", "1"]
INDEX_OPTS = ["--bits", "32", "--permutations", "4", "--segment-rows", "200"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("dataset-drills")
    rng = np.random.default_rng(11)
    X = rng.normal(size=(400, 6)).astype(np.float32)
    write_dataset(root / "data", X, rng.integers(0, 3, 400), ids=rng.permutation(9000)[:400],
                  shard_rows=100)
    write_dataset(root / "queries", X[:40] + 0.01, shard_rows=20)
    B = rng.normal(size=(6, 6))
    save_model(root / "model", ExplicitMetric(B @ B.T + np.eye(6)))
    assert main(["index", "--data", str(root / "data"), "--model", str(root / "model"),
                 "--out", str(root / "idx"), *INDEX_OPTS, *CLUSTER]) == 0
    yield root


def _copy(built: Path, tmp_path: Path, name: str) -> Path:
    shutil.copytree(built / name, tmp_path / name)
    return tmp_path / name


def _damage(path: Path, how: str, shard: int, shard_rows: int) -> None:
    if how == "change":  # a flipped bit that still decodes
        a = zarr.open_group(str(path), mode="r+")["X"]
        row = shard * shard_rows + 3
        a[row, 1] = np.asarray(a[row, 1]) + 1
    else:
        (path / "X" / "c" / str(shard) / "0").unlink()


def _exit_2(args: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("how", ["change", "delete"])
def test_verify_and_index_refuse_a_damaged_dataset_naming_the_shard(built, tmp_path, capsys,
                                                                     how):
    data = _copy(built, tmp_path, "data")
    _damage(data, how, 2, 100)
    shard = "shard 2 (rows 200:300) of X does not match its checksum"
    _exit_2(["verify", str(data)], capsys, "lshdist verify: error:", shard)
    _exit_2(["index", "--data", str(data), "--model", str(built / "model"),
             "--out", str(tmp_path / "idx"), *INDEX_OPTS, *CLUSTER], capsys,
            "lshdist index: error:", shard)
    assert not (tmp_path / "idx").exists()


@pytest.mark.parametrize("how", ["change", "delete"])
def test_a_damaged_query_dataset_is_not_answered(built, tmp_path, capsys, how):
    queries = _copy(built, tmp_path, "queries")
    _damage(queries, how, 1, 20)
    _exit_2(["query", "--index", str(built / "idx"), "--queries", str(queries), "--k", "3",
             "--out", str(tmp_path / "res"), *CLUSTER], capsys, "lshdist query: error:",
            "shard 1 (rows 20:40) of X does not match its checksum")
    assert not (tmp_path / "res").exists()


def _index_with(built: Path, tmp_path: Path, *, model: Path | None = None,
                data: Path | None = None) -> Path:
    """A copy of the index naming another model or source dataset (manifest re-sealed)."""
    idx = _copy(built, tmp_path, "idx")
    m = read_manifest(idx)
    if model is not None:
        m["model"] = str(model)
    if data is not None:
        for e in m["segments"]:
            e["source"] = str(data)
    write_manifest(idx, m)
    return idx


def test_verify_index_reads_its_model_arrays(built, tmp_path, capsys):
    model = _copy(built, tmp_path, "model")
    idx = _index_with(built, tmp_path, model=model)
    assert main(["verify", str(idx)]) == 0
    out = capsys.readouterr().out
    assert "every segment and the model checked, 1 source dataset checked" in out
    g = zarr.open_group(str(model / "arrays"), mode="r+")
    g["A"][2, 3] = np.asarray(g["A"][2, 3]) * 1.5  # model.json still agrees with itself
    _exit_2(["verify", str(idx)], capsys, "its model cannot be read",
            "array 'A' does not match its checksum")


def test_verify_index_opens_its_source_dataset(built, tmp_path, capsys):
    data = _copy(built, tmp_path, "data")
    idx = _index_with(built, tmp_path, data=data)
    (data / "zarr.json").write_text((data / "zarr.json").read_text().replace('"N": 400',
                                                                            '"N": 399'))
    _exit_2(["verify", str(idx)], capsys, "the dataset it was built from is damaged",
            "do not match their checksum")
    shutil.rmtree(data)
    assert main(["verify", str(idx)]) == 0
    assert "0 source datasets checked (1 no longer there" in capsys.readouterr().out


def test_ids_repeated_across_segments_are_refused(built, tmp_path, capsys):
    """A checksum-valid index (segment and manifest re-sealed) whose two segments share an
    id: `verify` refuses it."""
    idx = _copy(built, tmp_path, "idx")
    m = read_manifest(idx)
    assert len(m["segments"]) == 2
    first = zarr.open_group(str(idx / "segments" / m["segments"][0]["name"]), mode="r")
    seg = zarr.open_group(str(idx / "segments" / m["segments"][1]["name"]), mode="r+")
    ids = np.asarray(seg["ids"][:])
    ids[7] = int(np.asarray(first["ids"][5]))
    seg["ids"][:] = ids
    arrays = {k: np.asarray(v[:]) for k, v in seg.arrays()}
    arrays.update({f"payload/{k}": np.asarray(v[:]) for k, v in seg["payload"].arrays()})
    m["segments"][1]["checksum"] = _segment_checksum(arrays)
    write_manifest(idx, m)
    a, b = (e["name"] for e in m["segments"])
    with pytest.raises(FormatError, match=rf"id {ids[7]} is in segments '{a}' and '{b}'"):
        verify_index(idx)
    _exit_2(["verify", str(idx)], capsys, "an id names one row")


def test_overwrite_of_the_current_results_directory_is_one_line(built, tmp_path, capsys,
                                                                 monkeypatch):
    query = ["query", "--index", str(built / "idx"), "--queries", str(built / "queries"),
             "--k", "3", *CLUSTER]
    assert main([*query, "--out", str(tmp_path / "res")]) == 0
    monkeypatch.chdir(tmp_path / "res")
    _exit_2([*query, "--out", ".", "--overwrite"], capsys, "the current directory")
    (tmp_path / "res" / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    _exit_2([*query, "--out", "res", "--overwrite"], capsys, "it holds 'notes.txt', which "
                                                              "lshdist did not write")
    assert (tmp_path / "res" / "notes.txt").read_text() == "mine"


def test_an_unreadable_segments_directory_is_called_unreadable(built, tmp_path):
    """Root reads anything: the job runs without the capabilities that let it (setpriv)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    idx = _copy(built, tmp_path, "idx")
    (idx / "segments").chmod(0)
    try:
        cmd = [str(Path(sys.executable).parent / "lshdist"), "verify", str(idx)]
        if os.geteuid() == 0:
            cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *cmd]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        (idx / "segments").chmod(0o755)
    assert out.returncode == 2, out.stderr
    assert "is unreadable (Permission denied" in out.stderr, out.stderr
    assert "cannot write" not in out.stderr and "Traceback" not in out.stderr
