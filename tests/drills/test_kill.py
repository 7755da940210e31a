"""SIGKILL drills: ``lshdist index`` (--overwrite), ``index --append``, ``query``
(--overwrite) and ``ingest`` (--overwrite) are run as CLI subprocesses and killed with SIGKILL
at a seeded random moment between 0.2 s and the command's measured duration.  After each kill:

(a) the previous artefact answers identically (the same query results, the same rows);
(b) nothing half-written is visible at the final path: the old artefact, the new complete one
    (the kill came after the swap), or nothing (the kill came between the two renames of the
    swap, the old one then lies aside as ``.NAME.old-*``) — never a directory without its
    manifest;
(c) after the next run of the same command (and, for an append, ``lshdist gc``) no orphans
    remain: `list_orphans` is empty and no ``.NAME.tmp-*`` / ``.NAME.old-*`` / lock is left.

The next runs go through `lshdist.cli.main` in this process (the same code as the CLI, without
an interpreter start per run).  ``-s`` prints what each kill hit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lshdist.cli import main
from lshdist.cluster.pipeline import query_index
from lshdist.config import QueryConfig
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import Dataset, write_dataset
from lshdist.store.index import list_orphans, lock_path, read_manifest, verify_index
from lshdist.store.model import save_model
from lshdist.store.results import read_results

pytestmark = pytest.mark.drills

LSHDIST = str(Path(sys.executable).parent / "lshdist")
CLUSTER = ["--in-process", "--workers", "1"]
INDEX_OPTS = ["--bits", "64", "--permutations", "8", "--window", "4", "--segment-rows", "2000"]
K, CHUNK = 10, 100
SEED = 20261122
#: kills per command: the last one of each is triggered by the first output on disk (a new
#: segment, a results part, a temporary dataset), the others come at a random moment
TRIALS = {"index": 5, "append": 5, "query": 5, "ingest": 5}  # 20 kills
OUTCOMES: list[str] = []


def _cmd(kind: str, root: Path, out: Path) -> list[str]:
    if kind == "index":
        return ["index", "--data", str(root / "data"), "--model", str(root / "model"),
                "--out", str(out), "--overwrite", *INDEX_OPTS, *CLUSTER, "--stall-timeout", "30"]
    if kind == "append":
        return ["index", "--append", "--data", str(root / "more"), "--model", str(root / "model"),
                "--out", str(out), "--segment-rows", "2000", *CLUSTER, "--stall-timeout", "30"]
    if kind == "query":
        return ["query", "--index", str(root / "idx"), "--queries", str(root / "queries"),
                "--k", str(K), "--mode", "hash", "--out", str(out), "--overwrite",
                "--query-chunk", str(CHUNK),
                *CLUSTER, "--stall-timeout", "30"]
    return ["ingest", str(root / "raw.npy"), "--out", str(out), "--overwrite",
            "--shard-rows", "250"]


def _timed(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([LSHDIST, *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - t0


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Inputs, the reference artefacts (built by the CLI, timed: each command's duration),
    their answers, and an in-process client for checking indexes."""
    from distributed import Client, LocalCluster

    root = tmp_path_factory.mktemp("kill")
    rng = np.random.default_rng(SEED)
    X = rng.normal(size=(8000, 16)).astype(np.float32)
    write_dataset(root / "data", X, shard_rows=500)
    write_dataset(root / "more", rng.normal(size=(2000, 16)).astype(np.float32),
                  ids=np.arange(8000, 10000), shard_rows=500)
    write_dataset(root / "queries", X[:1000] + 0.01, ids=np.arange(20000, 21000), shard_rows=100)
    np.save(root / "raw.npy", rng.normal(size=(30000, 16)).astype(np.float32))
    save_model(root / "model", ExplicitMetric.identity(16))
    dur = {"ingest": _timed([a for a in _cmd("ingest", root, root / "ds") if a != "--overwrite"])}
    dur["index"] = _timed([a for a in _cmd("index", root, root / "idx") if a != "--overwrite"])
    shutil.copytree(root / "idx", root / "idx-appended")
    dur["append"] = _timed(_cmd("append", root, root / "idx-appended"))
    dur["query"] = _timed([a for a in _cmd("query", root, root / "res") if a != "--overwrite"])
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        ctx = {"root": root, "dur": dur, "client": client, "ref": read_results(root / "res"),
               "X": Dataset(root / "ds").to_dask().compute()}
        ctx["ref_appended"] = _answers(ctx, root / "idx-appended", root / "check-appended")
        yield ctx
    print(f"\nkill drills: durations {({k: round(v, 2) for k, v in dur.items()})}")
    for line in OUTCOMES:
        print("  " + line)


def _answers(job: dict[str, Any], index: Path, out: Path) -> dict[str, np.ndarray]:
    query_index(job["client"], index=str(index), queries=str(job["root"] / "queries"),
                out=str(out), cfg=QueryConfig(k=K, mode="hash", query_chunk=CHUNK))
    return _sorted(read_results(out))


def _sorted(res: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
    order = np.argsort(res[0])
    return {name: a[order] for name, a in zip(("qid", "nb", "dist", "cand"), res)}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(a[c], b[c]) for c in a)


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def _aside(path: Path) -> list[str]:
    """Temporaries and replaced copies of ``path`` beside it, and its lock file."""
    return sorted(p.name for p in path.parent.iterdir()
                  if p.name.startswith(f".{path.name}.tmp-") or p.name.startswith(
                      f".{path.name}.old-") or p == lock_path(path))


def _kill(args: list[str], delay: float, trigger: Callable[[], bool] | None = None) -> str:
    """Run ``lshdist args`` and SIGKILL it after ``delay`` s, or as soon as ``trigger()`` holds
    (polled every 5 ms, ``delay`` then bounds the wait); what the kill hit."""
    t0 = time.monotonic()
    p = subprocess.Popen([LSHDIST, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + delay
        while p.poll() is None and time.monotonic() < deadline:
            if trigger is not None and trigger():
                break
            time.sleep(0.005)
        if p.poll() is not None:
            return f"finished first (rc {p.returncode}, {time.monotonic() - t0:.2f}s)"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        return (f"killed at {time.monotonic() - t0:.2f}s"
                + ("" if trigger is None else " on the first output"))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _first(pattern: str, root: Path) -> Callable[[], bool]:
    return lambda: next(iter(root.glob(pattern)), None) is not None


def _delay(job: dict[str, Any], kind: str, trial: int) -> float:
    if trial == TRIALS[kind] - 1:  # triggered: wait up to three durations for the output
        return 3 * job["dur"][kind]
    rng = np.random.default_rng([SEED, list(TRIALS).index(kind), trial])
    return float(rng.uniform(0.2, job["dur"][kind]))


def _trigger(kind: str, trial: int, pattern: str, root: Path) -> Callable[[], bool] | None:
    return _first(pattern, root) if trial == TRIALS[kind] - 1 else None


def _trials(kind: str) -> list[int]:
    return list(range(TRIALS[kind]))


def _record(kind: str, trial: int, delay: float, how: str, left: list[str], state: str) -> None:
    OUTCOMES.append(f"{kind:6s} #{trial} (delay {delay:.2f}s) {how}; left beside: "
                    f"{[n.split('-')[0] + '-*' if '-' in n else n for n in left] or 'nothing'}; "
                    f"final path: {state}")


@pytest.mark.parametrize("trial", _trials("index"))
def test_kill_index_overwrite(job, tmp_path, trial):
    root, idx = job["root"], tmp_path / "idx"
    shutil.copytree(root / "idx", idx)
    before = _files(idx)
    cmd, delay = _cmd("index", root, idx), _delay(job, "index", trial)
    how = _kill(cmd, delay, _trigger("index", trial, ".idx.tmp-*/segments/seg-*", tmp_path))
    left = _aside(idx)
    if idx.exists():  # (b) a whole index: the old one, or the new one after the swap
        state = "old (byte-identical)" if _files(idx) == before else "new, complete"
        if state != "old (byte-identical)":  # (a) the same bytes answer the same
            verify_index(idx)
            assert _same(_answers(job, idx, tmp_path / "c1"), _sorted(job["ref"]))
    else:  # killed between the two renames of the swap: the old index lies aside
        state = "absent (between the renames)"
        assert any(n.startswith(".idx.old-") for n in left), left
    _record("index", trial, delay, how, left, state)
    assert main(cmd) == 0  # the next run: takes the lock over, clears what the kill left
    assert list_orphans(idx) == [] and _aside(idx) == []  # (c)
    assert _same(_answers(job, idx, tmp_path / "c2"), _sorted(job["ref"]))


@pytest.mark.parametrize("trial", _trials("append"))
def test_kill_append(job, tmp_path, trial):
    root, idx = job["root"], tmp_path / "idx"
    shutil.copytree(root / "idx", idx)
    old = read_manifest(idx)
    before = (idx / "index.json").read_bytes()
    cmd, delay = _cmd("append", root, idx), _delay(job, "append", trial)
    names = {e["name"] for e in old["segments"]}

    def new_segment() -> bool:
        return any(p.name not in names for p in (idx / "segments").iterdir())

    how = _kill(cmd, delay, new_segment if trial == TRIALS["append"] - 1 else None)
    left = _aside(idx)
    had_lock = lock_path(idx).exists()
    landed = (idx / "index.json").read_bytes() != before
    verify_index(idx)  # (b) the index is always whole: the manifest is swapped in last
    if landed:
        new = read_manifest(idx)
        assert new["segments"][:len(old["segments"])] == old["segments"]
        assert _same(_answers(job, idx, tmp_path / "c1"), job["ref_appended"])
        state = "the append landed (new manifest)"
    else:  # (a) the old manifest names the old segments, verified above: the same answers
        state = "old manifest (byte-identical)"
    orphans = [p.name for p in list_orphans(idx)]
    state += f", lock {'left' if had_lock else 'free'}, orphans inside before gc: {len(orphans)}"
    _record("append", trial, delay, how, left, state)
    if not landed:  # the next append takes over the dead process's lock and lands
        t0 = time.perf_counter()
        assert main(cmd) == 0
        assert time.perf_counter() - t0 < 25
        assert not lock_path(idx).exists()
        assert read_manifest(idx)["rows"] == 10000
    assert main(["gc", str(idx)]) == 0
    assert list_orphans(idx) == [] and _aside(idx) == []  # (c)
    verify_index(idx)


@pytest.mark.parametrize("trial", _trials("query"))
def test_kill_query_overwrite(job, tmp_path, trial):
    root, res = job["root"], tmp_path / "res"
    shutil.copytree(root / "res", res)
    before = _files(res)
    cmd, delay = _cmd("query", root, res), _delay(job, "query", trial)
    how = _kill(cmd, delay, _trigger("query", trial, ".res.tmp-*/neighbors/part-*", tmp_path))
    left = _aside(res)
    if res.exists():  # (b) the old results or the new complete ones, never a part of them
        assert (res / "results.json").is_file()
        state = "old (byte-identical)" if _files(res) == before else "new, complete"
        assert _same(_sorted(read_results(res)), _sorted(job["ref"]))  # (a)
    else:
        state = "absent (between the renames)"
        assert any(n.startswith(".res.old-") for n in left), left
    _record("query", trial, delay, how, left, state)
    assert main(cmd) == 0  # the next run removes the killed run's temporaries
    assert _aside(res) == []  # (c)
    assert _same(_sorted(read_results(res)), _sorted(job["ref"]))


@pytest.mark.parametrize("trial", _trials("ingest"))
def test_kill_ingest_overwrite(job, tmp_path, trial):
    root, ds = job["root"], tmp_path / "ds"
    shutil.copytree(root / "ds", ds)
    before = _files(ds)
    cmd, delay = _cmd("ingest", root, ds), _delay(job, "ingest", trial)
    how = _kill(cmd, delay, _trigger("ingest", trial, ".ds.tmp-*/X/c/*", tmp_path))
    left = _aside(ds)
    if ds.exists():  # (b) the old dataset or the new complete one
        state = "old (byte-identical)" if _files(ds) == before else "new, complete"
        if state != "old (byte-identical)":  # (a) the same bytes read the same
            got = Dataset(ds)
            assert got.n == 30000 and np.array_equal(got.ids(), np.arange(30000))
            assert np.array_equal(got.to_dask().compute(), job["X"])
    else:
        state = "absent (between the renames)"
        assert any(n.startswith(".ds.old-") for n in left), left
    _record("ingest", trial, delay, how, left, state)
    assert main(cmd) == 0
    assert _aside(ds) == []  # (c)
    assert np.array_equal(Dataset(ds).to_dask().compute(), job["X"])
