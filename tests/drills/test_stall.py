"""Frozen-scheduler drills: an external ``dask scheduler`` stopped with SIGSTOP (it
still accepts TCP connections, the kernel queues them, but never answers) must make
``lshdist query --scheduler ...`` exit 2 with a one-line message within ~30 s — no traceback,
no hang, nothing at ``--out`` — whether it is frozen before the query connects or while it
runs.  Every process is continued and terminated in a ``finally``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lshdist.cluster.client import dask_client
from lshdist.cluster.pipeline import build_index
from lshdist.config import IndexConfig
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.index import verify_index
from lshdist.store.model import save_model

pytestmark = pytest.mark.drills

BIN = Path(sys.executable).parent
LIMIT = 30.0  # seconds from the freeze to the exit (--stall-timeout 5)


@contextlib.contextmanager
def scheduler_and_worker() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``dask scheduler`` + one ``dask worker`` on a free loopback port; yields the address and
    the scheduler process.  Continued (if stopped) and terminated on the way out."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    addr = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port",
                               str(port), "--no-dashboard"], stderr=subprocess.DEVNULL)]
    try:
        procs.append(subprocess.Popen([str(BIN / "dask"), "worker", addr, "--nthreads", "1",
                                       "--no-dashboard"], stderr=subprocess.DEVNULL))
        with dask_client(addr, timeout=30) as client:
            client.wait_for_workers(1, timeout=60)
        yield addr, procs[0]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stall")
    rng = np.random.default_rng(3)
    X = rng.normal(size=(2000, 8)).astype(np.float32)
    write_dataset(root / "data", X, shard_rows=500)
    write_dataset(root / "queries", X + 0.01, ids=np.arange(10000, 12000), shard_rows=100)
    save_model(root / "model", ExplicitMetric.identity(8))
    return root


def _query(job: Path, addr: str, out: Path,
           *opts: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(BIN / "lshdist"), "query", "--index", str(job / "idx"), "--queries",
         str(job / "queries"), "--k", "5", "--mode", "hash", "--out", str(out),
         "--query-chunk", "5",
         "--scheduler", addr, *(opts or ("--stall-timeout", "5")), "--connect-timeout", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _check_exit(p: subprocess.Popen[bytes], frozen_at: float, out: Path,
                limit: float = LIMIT) -> tuple[float, str]:
    """Exit 2 within ``limit`` s of the freeze, a one-line error, nothing at (or beside) out."""
    try:
        _, err = p.communicate(timeout=limit + 30)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"lshdist query still running {limit + 30:.0f}s after the freeze")
    took = time.monotonic() - frozen_at
    text = err.decode()
    errors = [line for line in text.splitlines() if line.startswith("lshdist query: error:")]
    assert p.returncode == 2, text
    assert "Traceback" not in text, text
    assert len(errors) == 1 and "scheduler" in errors[0], text
    assert took < limit, f"exit {took:.1f}s after the freeze"
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp-*")), "a temporary results directory"
    print(f"\n  exit 2 after {took:.1f}s: {errors[0]}")
    return took, errors[0]


def test_a_query_against_a_frozen_scheduler_exits_2(job, tmp_path):
    with scheduler_and_worker() as (addr, sched):
        with dask_client(addr, timeout=30) as client:  # built through the same cluster
            build_index(client, data=str(job / "data"), model=str(job / "model"),
                        out=str(job / "idx"), cfg=IndexConfig(bits=64, permutations=8,
                                                              segment_rows=500))
        verify_index(job / "idx")
        sched.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        p = _query(job, addr, tmp_path / "res")
        _check_exit(p, frozen, tmp_path / "res")


def test_a_scheduler_frozen_mid_query_exits_2(job, tmp_path):
    if not (job / "idx").exists():
        pytest.skip("needs the index of the previous test")
    out = tmp_path / "res"
    with scheduler_and_worker() as (addr, sched):
        p = _query(job, addr, out)
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".res.tmp-*/neighbors/part-*")):  # the query is running
            assert p.poll() is None, p.communicate()[1].decode()
            assert time.monotonic() < deadline, "no results part written within 60s"
            time.sleep(0.01)
        sched.send_signal(signal.SIGSTOP)
        _check_exit(p, time.monotonic(), out)


def test_a_frozen_scheduler_is_found_by_the_heartbeat_not_the_stall_timeout(job, tmp_path):
    """The default settings (--stall-timeout 600, --heartbeat-timeout 30): a scheduler frozen
    mid-query is found by the heartbeat, the job exits 2 within a minute naming it."""
    if not (job / "idx").exists():
        pytest.skip("needs the index of the first test")
    out = tmp_path / "res"
    with scheduler_and_worker() as (addr, sched):
        p = _query(job, addr, out, "--no-check-recall")
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".res.tmp-*/neighbors/part-*")):  # the query is running
            assert p.poll() is None, p.communicate()[1].decode()
            assert time.monotonic() < deadline, "no results part written within 60s"
            time.sleep(0.01)
        sched.send_signal(signal.SIGSTOP)
        took, error = _check_exit(p, time.monotonic(), out, limit=30 + 5 + 5 + 10)
    assert took > 20, f"exit {took:.1f}s after the freeze: before the heartbeat timeout"
    assert "has not answered for" in error and "--heartbeat-timeout" in error, error
