"""Worker processes start with one BLAS/OpenMP/numba thread in their environment even when the
driver's environment asks for more: pools sized at import (before the Nanny's ``env`` is
applied) must see 1 (measured: with the driver's OMP_NUM_THREADS=2 etc. inherited, the
distributed Fashion-MNIST index + query ran 1.3-1.5x slower)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from lshdist.cluster.client import WORKER_ENV, dask_client


def _exec_environ() -> dict[str, str]:
    """The environment this process was started with (/proc: what exec received)."""
    with open(f"/proc/{os.getpid()}/environ", "rb") as f:
        raw = f.read().split(b"\0")
    env = dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)
    return {k: env.get(k, "") for k in WORKER_ENV}


@pytest.mark.cluster
@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs /proc")
def test_workers_start_single_threaded_whatever_the_driver_env(monkeypatch):
    for var in WORKER_ENV:
        monkeypatch.setenv(var, "2")
    with dask_client(workers=1) as client:
        got = list(client.run(_exec_environ).values())
    assert got == [WORKER_ENV]
    assert all(os.environ[v] == "2" for v in WORKER_ENV)  # the driver's own env is restored


def test_warm_kernels_compiles_the_dense_search_path():
    """`warm_kernels` (run on every worker at job start) leaves every kernel of the dense
    build, calibration and search compiled, so that no task pays a first use: checked in a
    fresh interpreter (in this one other tests may have compiled them already).  Bugs caught:
    the warm-up covered 6 of them; a 1 M-row query's first search task compiled for 6-13 s;
    the exact uint8 grid's kernels were loaded in a fresh cluster's first job."""
    import subprocess
    import sys

    code = """
from lshdist.cluster.client import warm_kernels
import lshdist._kernels.hashing as h, lshdist._kernels.search as s, lshdist._kernels.sort as o
warm_kernels()
need = [h.pack_signs_exact, h.permuted_prefix, o.radix_argsort_u64, s.window_positions_merge,
        s.window_positions_bsearch, s.window_candidates, s.collect_windows, s.rerank_dense,
        s.rerank_dense_quantized, s.column_bounds, s.grid_steps, s.quantize_block, s.grid_scale,
        s.scan_thresholds, s.rows_within, s.candidate_hamming,
        s.candidate_recall_grid,
        # rows on an exact uint8 grid (pixels): found, made, normed (first job: loaded in tasks)
        s.grid_unit_block, s.grid_unit, s.grid_fill_block, s.grid_table_exact, s.grid_norms,
        s.grid_rows]
missing = [f.py_func.__name__ for f in need if not f.signatures]
assert not missing, missing
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def _malloc_environ() -> dict[str, str]:
    with open(f"/proc/{os.getpid()}/environ", "rb") as f:
        raw = f.read().split(b"\0")
    return {k: v for k, v in (kv.decode().split("=", 1) for kv in raw if b"=" in kv)
            if k.startswith("MALLOC_")}


def test_worker_malloc_replaces_only_dasks_default_trim_threshold():
    import dask

    from lshdist.cluster.client import DASK_DEFAULT_TRIM, WORKER_MALLOC, worker_pre_spawn_env

    pre = worker_pre_spawn_env()
    assert {k: pre[k] for k in WORKER_MALLOC} == WORKER_MALLOC
    assert WORKER_MALLOC["MALLOC_TRIM_THRESHOLD_"] != DASK_DEFAULT_TRIM
    assert pre["OMP_NUM_THREADS"] == "1"  # Dask's other pre-spawn settings kept
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": 12345}):
        user = worker_pre_spawn_env()
    assert user["MALLOC_TRIM_THRESHOLD_"] == "12345" and "MALLOC_MMAP_THRESHOLD_" not in user
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TOP_PAD_": 4096}):
        assert worker_pre_spawn_env()["MALLOC_TOP_PAD_"] == "4096"  # the user's, beside ours


@pytest.mark.cluster
@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs /proc")
def test_workers_are_spawned_with_the_malloc_settings(monkeypatch):
    """glibc reads them at process start: they must be in what exec received, and the
    driver's own environment is left as it was (the Nanny writes them into it to spawn)."""
    from lshdist.cluster.client import WORKER_MALLOC

    for var in WORKER_MALLOC:
        monkeypatch.delenv(var, raising=False)
    with dask_client(workers=1) as client:
        got = list(client.run(_malloc_environ).values())
    assert got == [WORKER_MALLOC]
    assert not any(v in os.environ for v in WORKER_MALLOC)


def _numpy_huge_pages() -> bool:
    """Whether numpy in this process advises huge pages for its large arrays."""
    from numpy._core.multiarray import _set_madvise_hugepage

    was = bool(_set_madvise_hugepage(False))
    _set_madvise_hugepage(was)
    return was


def test_worker_pages_keep_a_users_choice(monkeypatch):
    import dask

    from lshdist.cluster.client import WORKER_PAGES, worker_pre_spawn_env

    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    assert {k: worker_pre_spawn_env()[k] for k in WORKER_PAGES} == WORKER_PAGES
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": 1}):
        assert worker_pre_spawn_env()["NUMPY_MADVISE_HUGEPAGE"] == "0"  # (not malloc's)
    with dask.config.set({"distributed.nanny.pre-spawn-environ.NUMPY_MADVISE_HUGEPAGE": 1}):
        assert worker_pre_spawn_env()["NUMPY_MADVISE_HUGEPAGE"] == "1"  # the config's
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
    assert "NUMPY_MADVISE_HUGEPAGE" not in worker_pre_spawn_env()  # the environment's, inherited


@pytest.mark.cluster
@pytest.mark.parametrize("user", [None, "1"])
def test_workers_numpy_advises_huge_pages_only_when_the_user_asks(monkeypatch, user):
    """numpy reads NUMPY_MADVISE_HUGEPAGE at import: a worker's numpy advises no huge pages
    (`WORKER_PAGES`) unless the driver's environment asks for them; the driver's own numpy
    and environment are left as they were."""
    if user is None:
        monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    else:
        monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", user)
    here = _numpy_huge_pages()
    with dask_client(workers=1) as client:
        got = list(client.run(_numpy_huge_pages).values())
    assert got == [user == "1"]
    assert _numpy_huge_pages() == here and os.environ.get("NUMPY_MADVISE_HUGEPAGE") == user


def _refaults() -> tuple[int, int]:
    """Minor page faults of filling a 256 MiB array, then of filling another after freeing
    it (a task's large temporaries, one task after another)."""
    import resource

    import numpy as np

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    got = []
    for _ in range(2):
        before = faults()
        a = np.ones(64 << 20, np.float32)
        got.append(faults() - before)
        del a
    return got[0], got[1]


@pytest.mark.cluster
def test_workers_reuse_freed_memory_without_faulting_it_in_again(monkeypatch):
    """A block freed by one task is served again from the worker's heap: the second 256 MiB
    array faults (almost) nothing in, where a block mapped apart and unmapped on free — any
    block above 8 MiB before, or above a thread arena's 64 MiB heap with two arenas — faults
    every page again (128 faults of 2 MiB pages, or 65,536 of 4 KiB ones)."""
    from lshdist.cluster.client import WORKER_MALLOC

    for var in WORKER_MALLOC:
        monkeypatch.delenv(var, raising=False)
    with dask_client(workers=1) as client:
        first, again = client.submit(_refaults, pure=False).result()  # (in a task thread)
    assert first >= 64, first  # the first block's pages were faulted in (the check works)
    assert again < first // 10 and again < 64, (first, again)


def test_housekeeping_replaces_only_dasks_defaults():
    import os

    import dask
    import distributed
    import yaml

    from lshdist.cluster.client import (
        DASK_HOUSEKEEPING,
        DASK_MEMORY,
        DASK_PLACEMENT,
        SCHEDULER_PLACEMENT,
        WORKER_HOUSEKEEPING,
        WORKER_MEMORY,
        housekeeping_config,
    )

    # distributed.yaml's defaults are what this module says they are (read from the file: a
    # machine's own Dask config files, /etc/dask in the image, may differ)
    with open(os.path.join(os.path.dirname(distributed.__file__), "distributed.yaml")) as f:
        defaults = yaml.safe_load(f)
    assert {k: dask.config.get(k, config=defaults) for k in DASK_HOUSEKEEPING} == \
        DASK_HOUSEKEEPING
    assert {k: dask.config.get(k, config=defaults) for k in DASK_MEMORY} == DASK_MEMORY
    assert {k: dask.config.get(k, config=defaults) for k in DASK_PLACEMENT} == DASK_PLACEMENT
    with dask.config.set({**DASK_HOUSEKEEPING, **DASK_MEMORY, **DASK_PLACEMENT}):
        assert housekeeping_config() == {**WORKER_HOUSEKEEPING, **WORKER_MEMORY,
                                         **SCHEDULER_PLACEMENT}
    with dask.config.set({"distributed.scheduler.work-stealing": True}):  # Dask's: replaced
        assert housekeeping_config()["distributed.scheduler.work-stealing"] is False
    with dask.config.set({"distributed.worker.memory.spill": 0.9}):  # a user's threshold: kept
        assert "distributed.worker.memory.spill" not in housekeeping_config()
        assert housekeeping_config()["distributed.worker.memory.target"] is False
    with dask.config.set({"distributed.admin.system-monitor.interval": "1s"}):
        assert "distributed.admin.system-monitor.interval" not in housekeeping_config()
    with dask.config.set({"distributed.worker.profile.interval": "50ms"}):  # a user's profiler
        assert "distributed.worker.profile.enabled" not in housekeeping_config()
    with dask.config.set({"distributed.admin.tick.interval": "20ms"}):  # Dask's own: replaced
        assert housekeeping_config()["distributed.admin.tick.interval"] == "100ms"


def _housekeeping() -> dict[str, object]:
    import dask

    from lshdist.cluster.client import WORKER_HOUSEKEEPING, WORKER_MEMORY

    return {k: dask.config.get(k) for k in {**WORKER_HOUSEKEEPING, **WORKER_MEMORY}}


def _steals(dask_scheduler: Any) -> bool:
    return "stealing" in dask_scheduler.extensions


def _spills(dask_worker: Any) -> tuple[object, object]:
    m = dask_worker.memory_manager
    return m.memory_target_fraction, m.memory_spill_fraction


@pytest.mark.cluster
def test_workers_run_with_the_quieter_housekeeping():
    import dask

    from lshdist.cluster.client import (
        DASK_HOUSEKEEPING,
        DASK_MEMORY,
        DASK_PLACEMENT,
        WORKER_HOUSEKEEPING,
        WORKER_MEMORY,
    )

    before = {k: dask.config.get(k) for k in DASK_HOUSEKEEPING}
    with dask.config.set({**DASK_HOUSEKEEPING, **DASK_MEMORY, **DASK_PLACEMENT}), \
            dask_client(workers=1) as client:
        got = list(client.run(_housekeeping).values())
        spills = list(client.run(_spills).values())
        steals = client.run_on_scheduler(_steals)
    assert got == [{**WORKER_HOUSEKEEPING, **WORKER_MEMORY}]
    assert spills == [(False, False)]  # the worker's memory manager never writes to disk
    assert steals is False  # tasks stay where lshdist placed them
    # the driver's config is as it was
    assert {k: dask.config.get(k) for k in DASK_HOUSEKEEPING} == before
