"""Damage drills: every way of damaging an index or a model on disk is refused with an
lshdist error (exit code 2 at the CLI, no traceback), never answered and never a crash.

Two small indexes are built in-process with the real pipeline: a dense one (explicit metric,
``payload/Z``, two segments) and a sparse one (implicit metric, ``payload/{indptr, indices, data,
kx, sx}``).  Each case damages a copy.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

from lshdist.blocks import SparseBlock
from lshdist.cli import main
from lshdist.cluster.pipeline import build_index
from lshdist.config import IndexConfig
from lshdist.errors import FormatError, InputError
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.index import (
    _segment_checksum,
    manifest_checksum,
    read_manifest,
    verify_index,
    write_manifest,
)
from lshdist.store.model import load_model, save_model

pytestmark = pytest.mark.drills

# (segments no longer store sorted_prefix: it is recomputed from the keys when read)
SEGMENT_ARRAYS = ["ids", "codes", "positions", "sorted_rows"]
DENSE_PAYLOAD = ["payload/Z"]
SPARSE_PAYLOAD = [f"payload/{k}" for k in ("indptr", "indices", "data", "kx", "sx")]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Datasets, models and the two indexes (built once per module)."""
    from distributed import Client, LocalCluster

    root = tmp_path_factory.mktemp("drills")
    rng = np.random.default_rng(7)
    X = rng.normal(size=(400, 8)).astype(np.float32)
    write_dataset(root / "dense", X, rng.integers(0, 3, 400), ids=rng.permutation(5000)[:400],
                  shard_rows=100)
    write_dataset(root / "dense-q", X[:20], shard_rows=20)
    B = rng.normal(size=(8, 8))
    save_model(root / "explicit", ExplicitMetric(B @ B.T + np.eye(8), center=X.mean(0)))
    S = sp.random(300, 500, density=0.03, format="csr", dtype=np.float32, random_state=1)
    S = S + sp.csr_matrix((np.ones(300, np.float32), (np.arange(300), np.arange(300) % 500)),
                          shape=(300, 500))  # no empty row
    write_dataset(root / "sparse", S, shard_rows=100)
    write_dataset(root / "sparse-q", S[:10], shard_rows=10)
    basis = SparseBlock.from_csr(S[:6])
    C = rng.normal(size=(6, 6)) * 0.01
    save_model(root / "implicit", ImplicitMetric(basis, C @ C.T, d=500))
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        build_index(client, data=str(root / "dense"), model=str(root / "explicit"),
                    out=str(root / "dense-idx"),
                    cfg=IndexConfig(bits=70, permutations=5, window=2, segment_rows=200))
        build_index(client, data=str(root / "sparse"), model=str(root / "implicit"),
                    out=str(root / "sparse-idx"),
                    cfg=IndexConfig(bits=64, permutations=4, window=2, segment_rows=300))
    yield root


def copy(built: Path, tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(built / name, dst, symlinks=True)
    return dst


def chunk_files(array_dir: Path) -> list[Path]:
    return sorted(p for p in array_dir.rglob("*")
                  if p.is_file() and p.relative_to(array_dir).parts[0] == "c")


def flip_byte(f: Path) -> None:
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    f.write_bytes(bytes(raw))


def segment_dir(idx: Path, i: int = 0) -> Path:
    return idx / "segments" / read_manifest(idx)["segments"][i]["name"]


def refused(idx: Path, match: str | None = None) -> None:
    with pytest.raises((FormatError, InputError), match=match):
        verify_index(idx)


CASES = [("dense-idx", a) for a in SEGMENT_ARRAYS + DENSE_PAYLOAD] + [
    ("sparse-idx", a) for a in SEGMENT_ARRAYS + SPARSE_PAYLOAD]


@pytest.mark.parametrize("index,array", CASES)
def test_a_flipped_byte_in_any_segment_array_is_refused(built, tmp_path, index, array):
    idx = copy(built, tmp_path, index)
    chunks = chunk_files(segment_dir(idx) / array)
    assert chunks
    flip_byte(chunks[-1])
    seg = segment_dir(idx).name
    refused(idx, f"segment '{seg}' .*restore segment '{seg}'")


@pytest.mark.parametrize("index,array", CASES)
def test_a_deleted_chunk_of_any_segment_array_is_refused(built, tmp_path, index, array):
    """Zarr reads a missing chunk as fill values without a word: the checksum notices."""
    idx = copy(built, tmp_path, index)
    chunk_files(segment_dir(idx) / array)[0].unlink()
    refused(idx, "does not match its checksum .*a chunk is damaged or missing")


@pytest.mark.parametrize("index", ["dense-idx", "sparse-idx"])
def test_damaged_array_metadata_or_a_missing_segment(built, tmp_path, index):
    idx = copy(built, tmp_path, index)
    meta = segment_dir(idx) / "sorted_rows" / "zarr.json"
    m = json.loads(meta.read_text())
    m["shape"] = [m["shape"][0], m["shape"][1] + 7]
    meta.write_text(json.dumps(m))
    refused(idx, "sorted_rows|unreadable|checksum")
    meta.write_text("{")
    refused(idx, "unreadable")
    shutil.rmtree(segment_dir(idx))
    refused(idx, "is missing")


def _manifest(idx: Path) -> dict[str, Any]:
    return json.loads((idx / "index.json").read_text())


def _rewrite(idx: Path, m: dict[str, Any], *, reseal: bool) -> None:
    if reseal:
        m["checksum"] = manifest_checksum(m)
    (idx / "index.json").write_text(json.dumps(m))


def _other(v: Any) -> Any:
    """A value of the same JSON type that differs from ``v``."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v * 2
    if isinstance(v, str):
        return v[:-1] + ("0" if v[-1:] != "0" else "1")
    if isinstance(v, list):
        return v[:-1]
    if v is None:
        return 3
    if isinstance(v, dict):
        return {**v, "target": 0.5}
    raise AssertionError(type(v))


MANIFEST_KEYS = ["format", "version", "model", "model_checksum", "kind", "d", "bits", "epsilon",
                 "permutations", "window", "hamming_keep", "seed", "learned", "segments", "rows",
                 "calibration", "checksum"]
ENTRY_KEYS = ["name", "rows", "permutations", "checksum", "source", "start", "stop"]


@pytest.mark.parametrize("key", MANIFEST_KEYS)
def test_every_manifest_field_edited_deleted_or_mistyped(built, tmp_path, key):
    idx = copy(built, tmp_path, "dense-idx")
    good = _manifest(idx)
    assert set(good) == set(MANIFEST_KEYS)  # a new field gets its drill
    _rewrite(idx, {**good, key: _other(good[key])}, reseal=False)  # edited by hand
    refused(idx)
    _rewrite(idx, {k: v for k, v in good.items() if k != key}, reseal=key != "checksum")
    refused(idx, f"no '?{key}'?|not an lshdist index|format version")
    _rewrite(idx, {**good, key: {}}, reseal=key != "checksum")
    refused(idx, f"{key}=|not an lshdist index|format version")


@pytest.mark.parametrize("key", ENTRY_KEYS)
def test_every_segment_entry_field_edited_or_deleted(built, tmp_path, key):
    idx = copy(built, tmp_path, "dense-idx")
    good = _manifest(idx)
    assert set(good["segments"][1]) == set(ENTRY_KEYS)
    m = json.loads(json.dumps(good))
    m["segments"][1][key] = _other(m["segments"][1][key])
    _rewrite(idx, m, reseal=False)
    refused(idx, "does not match its checksum")
    if key not in ("source", "start", "stop"):  # provenance, not needed to read the segment
        m = json.loads(json.dumps(good))
        del m["segments"][1][key]
        _rewrite(idx, m, reseal=True)
        refused(idx, f"segments\\[1\\] has no '{key}'")
        m = json.loads(json.dumps(good))
        m["segments"][1][key] = _other(m["segments"][1][key])
        _rewrite(idx, m, reseal=True)  # a careful forger: the segment itself disagrees
        refused(idx)


@pytest.mark.parametrize("name", ["../../explicit", "../seg-0123456789abcdef", "/tmp",
                                  "seg-0123456789abcdef/../../../x", "seg-0123456789abcde"])
def test_segment_names_outside_the_index_are_refused(built, tmp_path, name):
    idx = copy(built, tmp_path, "dense-idx")
    m = _manifest(idx)
    m["segments"][0]["name"] = name
    _rewrite(idx, m, reseal=True)
    refused(idx, "is not seg-<16 hex digits>")


def test_duplicated_or_dropped_entries_are_refused(built, tmp_path):
    idx = copy(built, tmp_path, "dense-idx")
    good = _manifest(idx)
    first = good["segments"][0]
    _rewrite(idx, {**good, "segments": [*good["segments"], first],
                   "rows": good["rows"] + first["rows"]}, reseal=True)
    refused(idx, "is listed twice")
    _rewrite(idx, {**good, "segments": good["segments"][1:]}, reseal=False)
    refused(idx, "does not match its checksum")
    _rewrite(idx, {**good, "segments": good["segments"][1:]}, reseal=True)
    refused(idx, "rows=400 but its segments hold 200")


def _plant(idx: Path, array: str, change: Callable[[np.ndarray], None]) -> None:
    """Rewrite one array of segment 0 and reseal segment and manifest checksums, so that only
    the range checks stand between the array and the kernels."""
    seg = segment_dir(idx)
    g = zarr.open_group(str(seg), mode="r+")
    a = np.asarray(g[array][:])
    change(a)
    g[array][...] = a
    arrays = {k: np.asarray(v[:]) for k, v in g.arrays()}
    arrays.update({f"payload/{k}": np.asarray(v[:]) for k, v in g["payload"].arrays()})
    m = read_manifest(idx)
    m["segments"][0]["checksum"] = _segment_checksum(arrays)
    write_manifest(idx, m)


def _set(index: tuple[int, ...], value: int) -> Callable[[np.ndarray], None]:
    return lambda a: a.__setitem__(index, value)


@pytest.mark.parametrize("array,change,match", [
    ("sorted_rows", _set((2, 17), 10**6), r"sorted_rows hold rows in \[0, 1000000\]"),
    ("sorted_rows", _set((0, 0), -3), "outside"),
    ("sorted_rows", lambda a: a.__setitem__((1, 5), a[1, 6]),
     r"sorted_rows\[1\] is not a permutation"),
    ("positions", _set((0, 3), 300), r"positions hold bit numbers .* outside \[0, 70\)"),
    # a list reversed is still a permutation: only the recomputed prefixes show it
    ("sorted_rows", lambda a: a.__setitem__((0, slice(None)), a[0, ::-1].copy()),
     "do not belong together"),
])
def test_out_of_range_arrays_with_valid_checksums_are_refused(built, tmp_path, array, change,
                                                              match):
    idx = copy(built, tmp_path, "dense-idx")
    _plant(idx, array, change)
    assert read_manifest(idx)  # the checksums agree: only the range checks are left
    refused(idx, f"is inconsistent: .*{match}")


def test_out_of_range_payload_with_valid_checksums_is_refused(built, tmp_path):
    idx = copy(built, tmp_path, "sparse-idx")
    _plant(idx, "payload/indptr", _set((5,), 10**9))
    refused(idx, "is inconsistent: kernel payload: indptr must ascend")


def test_a_query_against_a_planted_index_exits_2_without_a_traceback(built, tmp_path, capsys):
    idx = copy(built, tmp_path, "dense-idx")
    _plant(idx, "sorted_rows", _set((2, 17), 10**6))
    code = main(["query", "--index", str(idx), "--queries", str(built / "dense-q"),
                 "--out", str(tmp_path / "res"), "--k", "3", "--in-process", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "sorted_rows hold rows in [0, 1000000]" in err
    assert "Traceback" not in err and not (tmp_path / "res").exists()


@pytest.mark.parametrize("damage", ["flip", "delete", "manifest"])
def test_verify_cli_exits_2_with_the_problem(built, tmp_path, capsys, damage):
    idx = copy(built, tmp_path, "sparse-idx")
    assert main(["verify", str(idx)]) == 0
    assert capsys.readouterr().out.startswith(f"OK index '{idx}': 1 segments, 300 rows")
    if damage == "flip":
        flip_byte(chunk_files(segment_dir(idx) / "payload" / "kx")[0])
    elif damage == "delete":
        chunk_files(segment_dir(idx) / "codes")[0].unlink()
    else:
        m = _manifest(idx)
        m["window"] = 9
        _rewrite(idx, m, reseal=False)
    assert main(["verify", str(idx)]) == 2
    out = capsys.readouterr()
    assert "lshdist verify: error:" in out.err and "Traceback" not in out.err
    assert "rebuild the index" in out.err and out.out == ""


MODEL_ARRAYS = [("explicit", "A"), ("explicit", "center"), ("implicit", "S"),
                ("implicit", "basis/indptr"), ("implicit", "basis/indices"),
                ("implicit", "basis/data")]


@pytest.mark.parametrize("model,array", MODEL_ARRAYS)
def test_a_flipped_byte_in_any_model_array_is_refused(built, tmp_path, model, array):
    path = copy(built, tmp_path, model)
    flip_byte(chunk_files(path / "arrays" / array)[0])
    with pytest.raises(FormatError, match=f"array '{array}' does not match|unreadable"):
        load_model(path)


@pytest.mark.parametrize("model,array", MODEL_ARRAYS)
def test_a_deleted_checksums_entry_is_refused(built, tmp_path, model, array, capsys):
    path = copy(built, tmp_path, model)
    meta = json.loads((path / "model.json").read_text())
    del meta["checksums"][array]
    (path / "model.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=r"does not match its checksums|checksums name arrays"):
        load_model(path)
    assert main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert "lshdist verify: error:" in err and "learn it again" in err


def test_verify_a_dataset_and_a_model(built, tmp_path, capsys, reseal):
    for name in ("dense", "sparse", "explicit", "implicit"):
        assert main(["verify", str(built / name)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out] == [["OK", "dataset"], ["OK", "dataset"],
                                                  ["OK", "model"], ["OK", "model"]]
    ds = copy(built, tmp_path, "dense")
    g = zarr.open_group(str(ds), mode="r+")
    g["X"][5, 2] = np.nan
    assert main(["verify", str(ds)]) == 2
    assert "shard 0 (rows 0:100) of X does not match its checksum" in capsys.readouterr().err
    reseal(ds)  # what the checksums cannot catch, the content checks do
    assert main(["verify", str(ds)]) == 2
    assert "rows 0:100 of X hold NaN" in capsys.readouterr().err


def test_the_index_of_a_missing_model_fails_verify(built, tmp_path, capsys):
    idx = copy(built, tmp_path, "dense-idx")
    m = read_manifest(idx)
    m["model"] = str(tmp_path / "gone")
    write_manifest(idx, m)
    assert main(["verify", str(idx)]) == 2
    assert "is intact, but its model cannot be read" in capsys.readouterr().err


def test_gc_removes_orphans_and_info_reports_them(built, tmp_path, capsys):
    idx = copy(built, tmp_path, "dense-idx")
    stray = idx / "segments" / "seg-00000000deadbeef"
    shutil.copytree(segment_dir(idx), stray)
    (tmp_path / ".dense-idx.tmp-0123456789ab").mkdir()
    assert main(["info", str(idx)]) == 0
    assert "seg-00000000deadbeef" in capsys.readouterr().out
    assert main(["gc", str(idx), "--dry-run"]) == 0
    assert stray.exists() and "would remove" in capsys.readouterr().out
    assert main(["gc", str(idx)]) == 0
    out = capsys.readouterr().out
    assert "removed 2 orphans" in out and str(stray) in out
    assert not stray.exists() and not (tmp_path / ".dense-idx.tmp-0123456789ab").exists()
    assert main(["verify", str(idx)]) == 0
    assert "lshdist gc" not in capsys.readouterr().out
    assert main(["gc", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
