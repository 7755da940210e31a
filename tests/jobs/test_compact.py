"""``lshdist compact``: an index of 20 small segments merged into 4.

Checks: the exact scan answers identically before and after; the compacted index is, array for
array, the index a fresh build with 500-row segments writes, and answers its hashed queries bit
for bit; rows, ids and batch labels are kept; the old segments are gone and nothing is orphaned;
below the threshold nothing changes; a held lock gives exit 2 naming the holder.  The SIGKILL
drill (marked ``drills``) kills compactions at seeded moments: the index left answers as the old
or the new one, and after ``lshdist gc`` nothing is orphaned.
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
import zarr

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


def test_compact_20_segments(built, tmp_path):
    root = built["root"]
    idx = tmp_path / "idx"
    shutil.copytree(root / "idx20", idx)
    old = read_manifest(idx)
    assert len(old["segments"]) == 20
    scan_before = _answers(built, idx, tmp_path / "s0", "scan")
    hash_before = _answers(built, idx, tmp_path / "h0", "hash")

    assert main(["compact", str(idx), "--min-segments", "20", "--segment-rows", "500",
                 *CLUSTER]) == 0
    new = verify_index(idx)
    ref = read_manifest(root / "ref500")
    assert len(new["segments"]) == 4 and new["rows"] == N
    # array for array what a fresh build of 500-row segments writes
    assert [e["checksum"] for e in new["segments"]] == [e["checksum"] for e in ref["segments"]]
    assert [(e["start"], e["stop"]) for e in new["segments"]] == [
        (e["start"], e["stop"]) for e in ref["segments"]]
    ids = np.concatenate([zarr.open_group(str(idx / "segments" / e["name"]), mode="r")["ids"][:]
                          for e in new["segments"]])
    assert np.array_equal(np.sort(ids), np.sort(np.concatenate([
        zarr.open_group(str(root / "idx20" / "segments" / e["name"]), mode="r")["ids"][:]
        for e in old["segments"]])))
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
    print(f"\nrecall@10 hashed vs scan: 20 segments {r0:.3f}, compacted to 4: {r1:.3f}")
    # fewer segments gather fewer candidates per query at the same (M, W, H)
    assert hash_after["cand"].sum() < hash_before["cand"].sum()


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
    answers as the old (byte-identical manifest) or as the compacted one; gc leaves no
    orphans and the next compaction completes."""
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
    ref = root / ("idx20" if old else "ref500")
    print(f"\ncompact kill #{trial} (delay {delay:.2f}s, rc {p.returncode}): "
          f"{'old' if old else 'new'} index answering")
    assert _same(_answers(built, idx, tmp_path / "a", "hash"),
                 _answers(built, ref, tmp_path / "b", "hash"))
    assert main(["gc", str(idx)]) == 0
    assert list_orphans(idx) == []
    assert main(cmd) == 0
    assert len(verify_index(idx)["segments"]) == 4
