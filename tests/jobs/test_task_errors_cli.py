"""An error raised inside a Dask task reaches the user as one exit-2 line: what distributed's
worker logs when a task fails ("Compute Failed ... Traceback", once a try) is not printed --
silenced in LocalCluster worker processes, at debug level (``-v``) for in-process workers.

The failing task: a segment fit reading a dataset shard whose bytes changed (the shard's
checksum is verified on the worker, in the task)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.model import save_model

BIN = Path(sys.executable).parent
ERROR = ("lshdist index: error: '{data}': shard 2 (rows 200:300) of X does not match its "
         "checksum: a chunk is damaged or missing; the dataset is corrupted, re-ingest it")


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("task-errors")
    rng = np.random.default_rng(5)
    write_dataset(root / "data", rng.normal(size=(400, 6)).astype(np.float32), shard_rows=100)
    save_model(root / "model", ExplicitMetric(np.eye(6) * 2.0))
    X = zarr.open_group(str(root / "data"), mode="r+")["X"]
    X[203, 1] = np.asarray(X[203, 1]) + 1  # shard 2, read by a worker's fit task
    return root


def _index(root: Path, *opts: str, verbose: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "lshdist"), *(["-v"] if verbose else []), "index", "--data",
         str(root / "data"), "--model", str(root / "model"), "--out", str(root / "idx"),
         "--bits", "32", "--permutations", "4", "--segment-rows", "100", *opts],
        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("cluster", [
    pytest.param(["--in-process", "--workers", "2"], id="in-process"),
    pytest.param(["--workers", "2"], id="worker-processes", marks=pytest.mark.cluster),
])
def test_a_task_that_fails_is_one_line_without_dasks_traceback(damaged, cluster):
    r = _index(damaged, *cluster)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "Compute Failed" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if ": error: " in line]
    assert errors == [ERROR.format(data=damaged / "data")], r.stderr
    assert not (damaged / "idx").exists()


def test_the_workers_report_is_kept_at_debug_level(damaged):
    """``-v``: distributed's report of the failed task (its traceback) is in the debug log,
    marked as lshdist's; the error line is the same."""
    r = _index(damaged, "--in-process", "--workers", "1", verbose=True)
    assert r.returncode == 2, r.stderr
    assert "DEBUG lshdist.cluster.client: a task failed on a worker: Compute Failed" in r.stderr
    assert "in fit_segment" in r.stderr  # the task's traceback, for whoever debugs
    assert r.stderr.rstrip().splitlines()[-1] == ERROR.format(data=damaged / "data")
