"""``lshdist compact``: an index of 20 small segments merged into 4.

Checks: packed (the default), every query — hashed and exact — answers identically before and
after, also after packing the packed segments again, and a damaged part is named; with
``--refit`` the exact scan answers identically and the compacted index is, array for array, the
index a fresh build with 500-row segments writes, answering its hashed queries bit for bit;
rows, ids and batch labels are kept; the old segments are gone and nothing is orphaned; below
the threshold nothing changes; a held lock gives exit 2 naming the holder.  The SIGKILL drill
(marked ``drills``) kills compactions at seeded moments: the index left answers as before, and
after ``lshdist gc`` nothing is orphaned.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lshdist.cli import main
from lshdist.cluster.compact import compaction_groups
from lshdist.cluster.pipeline import query_index
from lshdist.config import QueryConfig
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.index import index_lock, list_orphans, read_manifest, verify_index
from lshdist.store.model import save_model
from lshdist.store.results import read_results

LSHDIST = str(Path(sys.executable).parent / "lshdist")
CLUSTER = ["--in-process", "--workers", "1"]
OPTS = ["--bits", "64", "--permutations", "8", "--window", "4", "--hamming-keep", "0"]
N, SEED = 2000, 20261123


def _build(root: Path, out: Path, segment_rows: int) -> None:
    assert main(["index", "--data", str(root / "data"), "--model", str(root / "model"),
                 "--out", str(out), "--segment-rows", str(segment_rows), *OPTS, *CLUSTER]) == 0


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Data (ids not rising with rows), queries, a 20-segment index and the reference: a fresh
    build with 500-row segments; one in-process client for the queries."""
    from distributed import Client, LocalCluster

    root = tmp_path_factory.mktemp("compact")
    rng = np.random.default_rng(SEED)
    X = rng.normal(size=(N, 16)).astype(np.float32)
    ids = rng.permutation(N).astype(np.int64) * 7 + 3
    write_dataset(root / "data", X, ids=ids, shard_rows=100)
    write_dataset(root / "queries", X[:300] + rng.normal(scale=0.1, size=(300, 16)).astype(
        np.float32), ids=np.arange(300) + 10**6, shard_rows=100)
    save_model(root / "model", ExplicitMetric.identity(16))
    _build(root, root / "idx20", 100)
    _build(root, root / "ref500", 500)
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield {"root": root, "client": client}


def _answers(built, index: Path, out: Path, mode: str) -> dict[str, np.ndarray]:
    query_index(built["client"], index=str(index), queries=str(built["root"] / "queries"),
                out=str(out), cfg=QueryConfig(k=10, mode=mode, query_chunk=100))
    qid, nb, dist, cand = read_results(out)
    order = np.lexsort((np.arange(len(qid)), qid))
    return {"qid": qid[order], "nb": nb[order], "dist": dist[order], "cand": cand[order]}


def _same(a, b, cols=("qid", "nb", "dist")) -> bool:
    return all(np.array_equal(a[c], b[c]) for c in cols)


def _recall(a, exact) -> float:
    k = 10
    hits = [len(set(x) & set(y)) for x, y in zip(a["nb"].reshape(-1, k),
                                                   exact["nb"].reshape(-1, k))]
    return float(np.sum(hits)) / exact["nb"].size


def test_groups_policy():
    e = [{"rows": r} for r in (100, 100, 900, 100, 300, 200, 100)]
    assert compaction_groups(e, min_segments=7, segment_rows=500) == []  # 6 small < 7
    # small ones in manifest order, cut at 500 rows: [0,1,3] (300), [4,5] (500), [6] alone
    assert compaction_groups(e, min_segments=6, segment_rows=500) == [[0, 1, 3], [4, 5]]


def _ids(index: Path, manifest) -> np.ndarray:
    from lshdist.store.index import segment_ids

    return np.sort(np.concatenate([segment_ids(index, e) for e in manifest["segments"]]))


def test_compact_packs_20_segments_answers_unchanged(built, tmp_path, capsys):
    root = built["root"]
    idx = tmp_path / "idx"
    shutil.copytree(root / "idx20", idx)
    old = read_manifest(idx)
    before = {m: _answers(built, idx, tmp_path / f"{m}0", m) for m in ("scan", "hash")}

    assert main(["compact", str(idx), "--min-segments", "20", "--segment-rows", "500",
                 *CLUSTER]) == 0
    assert "packed: answers unchanged" in capsys.readouterr().out
    new = verify_index(idx)
    assert len(new["segments"]) == 4 and new["rows"] == N
    assert [len(e["parts"]) for e in new["segments"]] == [5, 5, 5, 5]
    # the parts are the old segments, in order (their checksums unchanged)
    assert [p["checksum"] for e in new["segments"] for p in e["parts"]] == [
        e["checksum"] for e in old["segments"]]
    assert new["calibration"] == old["calibration"]
    assert np.array_equal(_ids(idx, new), _ids(root / "idx20", old))
    assert sorted(p.name for p in (idx / "segments").iterdir()) == sorted(
        e["name"] for e in new["segments"])
    assert list_orphans(idx) == []
    for m in ("scan", "hash"):  # bit for bit, candidate counts included
        assert _same(before[m], _answers(built, idx, tmp_path / f"{m}1", m),
                     ("qid", "nb", "dist", "cand")), m

    # packing packed segments again flattens their parts; still the same answers
    assert main(["compact", str(idx), "--min-segments", "2", "--segment-rows", "1001",
                 *CLUSTER]) == 0
    again = verify_index(idx)
    assert [len(e["parts"]) for e in again["segments"]] == [10, 10]
    for m in ("scan", "hash"):
        assert _same(before[m], _answers(built, idx, tmp_path / f"{m}2", m),
                     ("qid", "nb", "dist", "cand")), m

    # a damaged part is named when the segment is read
    seg = idx / "segments" / again["segments"][1]["name"]
    chunk = next(p for p in sorted((seg / "part-0003" / "ids").rglob("*"))
                 if p.is_file() and p.name != "zarr.json")
    chunk.unlink()
    from lshdist.errors import FormatError

    with pytest.raises(FormatError, match=r"part 3\)"):
        verify_index(idx)


def test_compact_refit_is_a_fresh_build(built, tmp_path):
    root = built["root"]
    idx = tmp_path / "idx"
    shutil.copytree(root / "idx20", idx)
    old = read_manifest(idx)
    assert len(old["segments"]) == 20
    scan_before = _answers(built, idx, tmp_path / "s0", "scan")
    hash_before = _answers(built, idx, tmp_path / "h0", "hash")

    assert main(["compact", str(idx), "--refit", "--min-segments", "20", "--segment-rows",
                 "500", *CLUSTER]) == 0
    new = verify_index(idx)
    ref = read_manifest(root / "ref500")
    assert len(new["segments"]) == 4 and new["rows"] == N
    # array for array what a fresh build of 500-row segments writes
    assert [e["checksum"] for e in new["segments"]] == [e["checksum"] for e in ref["segments"]]
    assert [(e["start"], e["stop"]) for e in new["segments"]] == [
        (e["start"], e["stop"]) for e in ref["segments"]]
    assert np.array_equal(_ids(idx, new), _ids(root / "idx20", old))
    # old segments removed after the swap, nothing orphaned
    assert sorted(p.name for p in (idx / "segments").iterdir()) == sorted(
        e["name"] for e in new["segments"])
    assert list_orphans(idx) == []

    scan_after = _answers(built, idx, tmp_path / "s1", "scan")
    hash_after = _answers(built, idx, tmp_path / "h1", "hash")
    hash_ref = _answers(built, root / "ref500", tmp_path / "h2", "hash")
    assert _same(scan_before, scan_after, ("qid", "nb", "dist", "cand"))
    assert _same(hash_after, hash_ref, ("qid", "nb", "dist", "cand"))
    r0, r1 = _recall(hash_before, scan_before), _recall(hash_after, scan_after)
    print(f"\nrecall@10 hashed vs scan: 20 segments {r0:.3f}, re-fitted to 4: {r1:.3f}")
    # fewer segments gather fewer candidates per query at the same (M, W, H)
    assert hash_after["cand"].sum() < hash_before["cand"].sum()


def test_compact_refit_of_rows_on_a_uint8_grid_is_a_fresh_build(built, tmp_path):
    """Integer-valued rows (pixels) are stored on their exact uint8 grid, each segment with its
    own column minima: re-fitted, the merged segment is the one a fresh build of those rows
    writes (its grid found again), and the scan answers as before (the grids' lo and step
    were once concatenated, and the merge refused)."""
    rng = np.random.default_rng(SEED)
    X = rng.integers(0, 200, size=(N, 16)).astype(np.float32)
    X[: N // 2, 0] += 7  # the first segments' column 0 starts higher: other grids
    write_dataset(tmp_path / "data", X, shard_rows=100)
    save_model(tmp_path / "model", ExplicitMetric.identity(16))
    _build(tmp_path, tmp_path / "idx", 500)
    _build(tmp_path, tmp_path / "ref", 2000)
    seg = next((tmp_path / "idx" / "segments").iterdir())
    assert (seg / "payload" / "U").is_dir()  # held on its grid
    scan_before = _answers(built, tmp_path / "idx", tmp_path / "s0", "scan")
    assert main(["compact", str(tmp_path / "idx"), "--refit", "--min-segments", "4",
                 "--segment-rows", "2000", *CLUSTER]) == 0
    new, ref = verify_index(tmp_path / "idx"), read_manifest(tmp_path / "ref")
    assert [e["checksum"] for e in new["segments"]] == [e["checksum"] for e in ref["segments"]]
    scan_after = _answers(built, tmp_path / "idx", tmp_path / "s1", "scan")
    assert _same(scan_before, scan_after, ("qid", "nb", "dist"))


def test_nothing_to_compact(built, tmp_path, capsys):
    idx = tmp_path / "idx"
    shutil.copytree(built["root"] / "idx20", idx)
    before = (idx / "index.json").read_bytes()
    assert main(["compact", str(idx), "--min-segments", "21", "--segment-rows", "500",
                 *CLUSTER]) == 0
    assert "nothing to compact" in capsys.readouterr().out
    assert (idx / "index.json").read_bytes() == before


def test_compact_waits_for_lock(built, tmp_path, capsys):
    idx = tmp_path / "idx"
    shutil.copytree(built["root"] / "idx20", idx)
    before = (idx / "index.json").read_bytes()
    with index_lock(idx):
        rc = main(["compact", str(idx), "--min-segments", "2", "--segment-rows", "500",
                   "--timeout", "0.5", *CLUSTER])
    assert rc == 2
    assert "is locked by pid" in capsys.readouterr().err
    assert (idx / "index.json").read_bytes() == before
    assert list_orphans(idx) == []  # the refused run removed what it had written


@pytest.mark.drills
@pytest.mark.parametrize("trial", range(5))
def test_kill_compact(built, tmp_path, trial):
    """SIGKILL at a seeded moment (trial 3: at the first new segment; trial 4: as soon as the
    manifest is swapped, before the old segments are removed): the index
    answers as before (the old, byte-identical manifest, or the packed one: the same answers);
    gc leaves no orphans and the next compaction completes."""
    root = built["root"]
    idx = tmp_path / "idx"
    shutil.copytree(root / "idx20", idx)
    before = (idx / "index.json").read_bytes()
    names = {p.name for p in (idx / "segments").iterdir()}
    cmd = ["compact", str(idx), "--min-segments", "20", "--segment-rows", "500", *CLUSTER]
    p = subprocess.Popen([LSHDIST, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    delay = float(np.random.default_rng([SEED, trial]).uniform(0.5, 4.0))
    deadline = time.monotonic() + (30.0 if trial >= 3 else delay)
    while p.poll() is None and time.monotonic() < deadline:
        if trial == 3 and any(q.name not in names for q in (idx / "segments").iterdir()):
            break
        if trial == 4 and (idx / "index.json").read_bytes() != before:
            break
        time.sleep(0.005)
    if p.poll() is None:
        os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    old = (idx / "index.json").read_bytes() == before
    ref = root / "idx20"  # packing keeps every answer, old or new manifest
    print(f"\ncompact kill #{trial} (delay {delay:.2f}s, rc {p.returncode}): "
          f"{'old' if old else 'new'} index answering")
    assert _same(_answers(built, idx, tmp_path / "a", "hash"),
                 _answers(built, ref, tmp_path / "b", "hash"))
    assert main(["gc", str(idx)]) == 0
    assert list_orphans(idx) == []
    assert main(cmd) == 0
    assert len(verify_index(idx)["segments"]) == 4
