"""Every mode listens on loopback only: the in-process cluster's workers too.

With ``--in-process`` the workers are threads talking to the scheduler in-process, but each
still serves HTTP (/metrics, /health); it bound 0.0.0.0 and [::], so /metrics answered from
the machine's external address.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from lshdist.cluster.client import dask_client
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.model import save_model

BIN = Path(sys.executable).parent


def _listening(pids: set[int]) -> set[tuple[str, int, int]]:
    """``(address, port, pid)`` of the listening inet sockets of ``pids``."""
    out = set()
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out |= {(c.laddr.ip, c.laddr.port, pid) for c in conns if c.status == psutil.CONN_LISTEN}
    return out


def test_the_in_process_cluster_listens_on_loopback_only():
    me = {psutil.Process().pid}
    before = _listening(me)
    with dask_client(processes=False, workers=2) as client:
        assert client.submit(int, 3).result() == 3
        new = _listening(me) - before
    assert len(new) >= 3, new  # the dashboard and one HTTP server a worker
    assert {ip for ip, _, _ in new} == {"127.0.0.1"}, new


@pytest.mark.cluster
@pytest.mark.parametrize("mode", [["--in-process", "--workers", "2"], ["--workers", "2"]])
def test_a_query_job_listens_on_loopback_only(tmp_path, mode):
    """The CLI, watched from outside: every listening socket of the job's process tree."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(3000, 8)).astype(np.float32)
    write_dataset(tmp_path / "data", X, shard_rows=500)
    write_dataset(tmp_path / "queries", X[:2000] + 0.01, ids=np.arange(2000) + 10**6,
                  shard_rows=200)
    save_model(tmp_path / "model", ExplicitMetric(np.eye(8) * 2.0))
    subprocess.run([str(BIN / "lshdist"), "index", "--data", str(tmp_path / "data"), "--model",
                    str(tmp_path / "model"), "--out", str(tmp_path / "idx"), "--bits", "32",
                    "--permutations", "4", "--in-process"], check=True, capture_output=True,
                   timeout=300)
    p = subprocess.Popen([str(BIN / "lshdist"), "query", "--index", str(tmp_path / "idx"),
                          "--queries", str(tmp_path / "queries"), "--k", "5", "--out",
                          str(tmp_path / "res"), *mode],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[tuple[str, int, int]] = set()
    try:
        proc = psutil.Process(p.pid)
        while p.poll() is None:
            try:
                pids = {proc.pid, *(c.pid for c in proc.children(recursive=True))}
            except psutil.NoSuchProcess:
                break
            seen |= _listening(pids)
            time.sleep(0.05)
    finally:
        _out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert len(seen) >= 2, seen
    assert {ip for ip, _, _ in seen} == {"127.0.0.1"}, seen
