"""Getting a Dask client: a LocalCluster by default, or an existing scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lshdist.cluster.heartbeat import SchedulerWatch, mark_seen, outcome, unpack
from lshdist.config import ClusterConfig
from lshdist.errors import ClusterError, InputError

if TYPE_CHECKING:
    from distributed import Client

log = logging.getLogger(__name__)


#: a worker is one thread: no BLAS/OpenMP/numba pools of its own beside it (a user's
#: OMP_NUM_THREADS would otherwise win over Dask's default)
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "NUMBA_NUM_THREADS": "1"}
#: glibc's malloc in LocalCluster worker processes keeps the memory the tasks free for the next
#: ones: one arena (the heap every thread grows by brk), no block mapped apart (mmap off: a
#: mapped block is unmapped on free and the next one faults its pages in again), up to 1 GiB
#: of free heap kept at its top, 64 MiB added at a time.  Dask's default
#: (``distributed.nanny.pre-spawn-environ``: MALLOC_TRIM_THRESHOLD_=65536, which also pins the
#: mmap threshold at 128 KiB) maps every larger block on allocation and unmaps it on free.
#: Page faults cost more than their count on a VM that hands freed guest memory back to its
#: host (virtio-balloon free page reporting): touched again after ~10 s idle, memory faulted
#: in at ~3 s a GiB, against 0.15 s a GiB at once.  A worker that kept its memory (this
#: setting) ran the warm Fashion-MNIST job as fast after a 15 s idle gap as without one
#: (1.90 against 1.96 s, medians of 4 paired; 0-1,700 page faults a job), where the earlier
#: setting (8 MiB blocks apart, 16 MiB kept, two arenas) took 2.58 against 2.08 s (11,000 -
#: 17,000 faults); a fresh cluster's first job 2.41 against 2.65 s (4 paired), its workers'
#: peak RSS 600 against 540 MB.  A thread's own arena maps every block above its 64 MiB heap
#: apart whatever the thresholds: hence one arena.  Before: Dask's default against 8 MiB
#: blocks apart, 1 M-row benchmark, loading a 100,000-row segment took 4.4x the page faults
#: and the 1 M query stage 138-142 s on one worker against 111-114 s.
#: Read by glibc when a process starts, so it must be in the environment the worker is
#: spawned with (the Nanny's pre-spawn config, not its ``env``).  A trim threshold the user
#: configured is kept (and Dask's default, were it to change, is left alone).
WORKER_MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_MMAP_MAX_": "0",
                 "MALLOC_TOP_PAD_": str(64 << 20), "MALLOC_ARENA_MAX": "1"}
#: Dask's own default trim threshold (distributed.yaml), which `WORKER_MALLOC` replaces
DASK_DEFAULT_TRIM = "65536"
#: numpy in worker processes does not advise transparent huge pages for its arrays of 4 MiB
#: and more (its default on Linux).  Under this kernel's ``defrag=madvise`` a fresh worker
#: faulted each such block in with compaction: a fresh cluster's first job paid it, and every
#: ``lshdist run`` is one.  Fresh clusters, paired and alternated, huge pages on / off:
#: Fashion-MNIST ``lshdist run`` 1.03 [0.95-1.33] by pair (8 pairs; medians 1.60 / 1.48 s),
#: 240,000 shifted rows 1.02 [0.95-1.27] (6 pairs), the 1,020,000-row job 1.04 and 0.97 (2
#: pairs) -- where, on older code, the 1 M job had lost 7 % with them off.  Read by numpy at
#: import, so it goes in the spawn environment; a value the user set (in the driver's
#: environment or Dask's pre-spawn config) is kept.
WORKER_PAGES = {"NUMPY_MADVISE_HUGEPAGE": "0"}


#: Dask's periodic housekeeping in LocalCluster processes, made rarer: the statistical profiler
#: (every 10 ms, into the dashboard's profile page) off, the system monitor every 2 s (was
#: 500 ms), the event loop's tick every 100 ms (was 20 ms).  On 2 cores with 2 busy workers
#: every cycle they spend is taken from a search: py-spy on a worker of the 1 M query stage
#: found its event loop on the CPU 28 % of the time, ~40 % of that in these callbacks; the
#: stage took 81.2-81.6 s with Dask's settings and 69.8-75.5 s with these (2 workers, 3 paired
#: rounds).  Each key is replaced only while it holds
#: Dask's default (`DASK_HOUSEKEEPING`), the profiler only while its interval is Dask's too: a
#: value the user configured is kept.
WORKER_HOUSEKEEPING = {"distributed.worker.profile.enabled": False,
                       "distributed.admin.system-monitor.interval": "2s",
                       "distributed.admin.tick.interval": "100ms"}
#: Dask's own defaults (distributed.yaml) of what `WORKER_HOUSEKEEPING` replaces
DASK_HOUSEKEEPING = {"distributed.worker.profile.enabled": True,
                     "distributed.admin.system-monitor.interval": "500ms",
                     "distributed.admin.tick.interval": "20ms"}

#: no spilling to disk: Dask writes spilled task results to its local directory with pickle,
#: and lshdist keeps no pickle on disk (a segment is re-read, verified, from its Zarr index
#: instead).  Since Dask knows what a segment weighs (`lshdist.cluster.sizes`), its "target"
#: (60 % of a worker's memory limit in task results) would otherwise spill segments of an
#: index larger than that share; the "spill" threshold (70 % of the process's memory) did so
#: before.  Pausing (80 %) and restarting (95 %) a worker are left to Dask.
WORKER_MEMORY = {"distributed.worker.memory.target": False,
                 "distributed.worker.memory.spill": False}
#: Dask's own defaults (distributed.yaml) of what `WORKER_MEMORY` replaces
DASK_MEMORY = {"distributed.worker.memory.target": 0.6,
               "distributed.worker.memory.spill": 0.7}
#: no work stealing: lshdist places its tasks itself — segments spread over the workers by
#: rows (`lshdist.cluster.pipeline.spread`), each search beside its segment and its worker's
#: encoding of the chunk (`chunk_tasks`) — and a stolen search drags its segment (~0.44 GB for
#: 100,000 rows of 784-d) to the thief, which then holds a second copy.  On the 1 M
#: query stage from the stored index, 2 workers, stealing copied 4
#: segments (1.4 GB) and 9 chunk encodings between the workers with stealing, nothing without;
#: 79.0 / 73.4 / 69.5 s with stealing, 76.2 / 67.6 / 68.8 s without (3 paired rounds).  A task
#: whose preferred worker leaves still runs elsewhere (its placement is a loose restriction).
SCHEDULER_PLACEMENT = {"distributed.scheduler.work-stealing": False}
#: Dask's own default (distributed.yaml) of what `SCHEDULER_PLACEMENT` replaces
DASK_PLACEMENT = {"distributed.scheduler.work-stealing": True}


def housekeeping_config() -> dict[str, object]:
    """`WORKER_HOUSEKEEPING`, `WORKER_MEMORY` and `SCHEDULER_PLACEMENT` for the keys whose
    configured value is still Dask's default (the profiler's switch only while its interval is
    Dask's 10 ms)."""
    import dask
    import distributed  # noqa: F401  (registers distributed's config defaults)

    out: dict[str, object] = {}
    defaults = {**DASK_HOUSEKEEPING, **DASK_MEMORY, **DASK_PLACEMENT}
    for key, value in {**WORKER_HOUSEKEEPING, **WORKER_MEMORY, **SCHEDULER_PLACEMENT}.items():
        if dask.config.get(key, default=None) != defaults[key]:
            continue
        if key.endswith("profile.enabled") and dask.config.get(
                "distributed.worker.profile.interval", default=None) != "10ms":
            continue
        out[key] = value
    return out


def worker_pre_spawn_env() -> dict[str, str]:
    """The Nanny's pre-spawn environment for LocalCluster workers: Dask's configured one with
    `WORKER_MALLOC` over it — unless the configured MALLOC_TRIM_THRESHOLD_ is not Dask's
    default (a user's choice: then no malloc setting is changed); malloc settings the user
    gave beside Dask's default trim threshold are kept.  `WORKER_PAGES` where neither that
    config nor this process's environment sets its variable."""
    import dask
    import distributed  # noqa: F401  (registers distributed's config defaults)

    pre = {k: str(v) for k, v in
           (dask.config.get("distributed.nanny.pre-spawn-environ", default=None) or {}).items()}
    pre.update({k: v for k, v in WORKER_PAGES.items() if k not in pre and k not in os.environ})
    if pre.get("MALLOC_TRIM_THRESHOLD_", DASK_DEFAULT_TRIM) != DASK_DEFAULT_TRIM:
        return pre
    extra = {k: v for k, v in WORKER_MALLOC.items()
             if k == "MALLOC_TRIM_THRESHOLD_" or k not in pre}
    return {**pre, **extra}


@contextlib.contextmanager
def _spawn_env(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment while worker processes are spawned.  The
    Nanny's ``env`` is applied in the worker after it has imported numpy and numba, whose
    thread pools are sized at import: a driver run with OMP_NUM_THREADS=2 (a benchmark, a
    user's shell) gave each 1-thread worker 2 BLAS and 2 numba threads — 4 threads on 2 cores,
    the distributed Fashion-MNIST run 1.5x slower (measured)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def one_thread_io() -> None:
    """Zarr's own I/O and codec thread pool down to one thread on this worker (measured: with
    its default pool, a '1-thread' worker used 1.35 cores while reading and writing)."""
    import zarr

    zarr.config.set({"threading.max_workers": 1})


def warm_kernels() -> bool:
    """Compile (or load from cache) the numba kernels of the dense build and search on a
    worker at job start: a small learned-hash index built, calibrated and queried (hashed,
    with enough candidates for the uint8 re-rank pass, and by the exact scan), so that no
    task of the job pays a kernel's first use (measured: with a cold cache, the first search
    task of a 1 M-row query compiled for 6-13 s).  The sparse, kernelized, hyperplane and
    set kernels compile at their first use."""
    import numpy as np

    from lshdist._kernels.hashing import gaussian_rows, pack_signs, permuted_prefix
    from lshdist._kernels.search import rows_within, window_candidates, window_positions_bsearch
    from lshdist.index.searcher import MetricIndex
    from lshdist.metric.learned import ExplicitMetric

    codes = pack_signs(gaussian_rows(np.uint64(0), np.arange(4, dtype=np.uint64), 8))
    prefix = permuted_prefix(codes, np.arange(8, dtype=np.int64))
    sp = np.sort(prefix)[None, :]
    rows = np.argsort(prefix)[None, :].astype(np.int64)
    window_candidates(window_positions_bsearch(sp, prefix[None, :]), rows, 1)
    rows_within(np.zeros((1, 2), np.float32), np.zeros(1), 2)  # the scan's rare second read
    X = np.random.default_rng(0).normal(size=(600, 40)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(40), bits=128, target_recall=0.5, seed=0).fit(X)
    ix.query(X[:20], 3, mode="hash")
    ix.query(X[:20], 3, mode="scan")
    ix.index_.search(*_encoded(ix, X[:8]), 1, n_permutations=8, window=8, hamming_keep=0)
    _warm_grid()
    _warm_parquet()
    # the modules of the job's task functions (a task's function is imported where it is
    # unpickled: a fresh worker's first task paid 0.6-0.9 s for these), and the two a fresh
    # worker's first build and query still imported in their tasks (a segment's write, the
    # first numpy array sent between workers)
    for name in ("lshdist.cluster.tasks", "lshdist.cluster.answers", "lshdist.store.subspace",
                 "distributed.protocol.numpy"):
        importlib.import_module(name)
    return True


def _warm_grid() -> None:
    """The kernels of rows on an exact uint8 grid (pixels: a segment and its queries held on
    the grid alone, `DensePayload.compact`): the grid found, its rows and norms made, a
    hashed search and the block scan of a compact segment.  Not warmed, a fresh worker loaded
    them from numba's cache in its first job's tasks (measured: Fashion-MNIST's first job on
    a fresh 2-worker cluster, median of 3, 2.04 s without this, 1.95 s with it; the next job
    1.8 s either way)."""
    import numpy as np

    from lshdist.index.payload import DensePayload
    from lshdist.index.scan import scan_topk
    from lshdist.index.searcher import MetricIndex
    from lshdist.metric.learned import ExplicitMetric

    X = np.random.default_rng(1).integers(0, 256, size=(600, 40)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(40), bits=128, target_recall=0.5, seed=0).fit(X)
    seg = ix.index_.truncated(8)
    qc, qp = _encoded(ix, X[:8])
    if not isinstance(seg.payload_, DensePayload) or not isinstance(qp, DensePayload):
        raise RuntimeError("internal error: an explicit metric's payload is not dense")
    seg.payload_ = seg.payload_.compact()
    qp = qp.compact()
    seg.search(qc, qp, 3, n_permutations=8, window=8, hamming_keep=0)
    scan_topk(seg.payload_, qp, 3, ids=seg.ids_)
    B = X.astype(np.uint8)  # rows fitted as the bytes they are stored as: the grid's unit 1
    DensePayload.from_bytes(B)  # and, for even values, 2
    DensePayload.from_bytes(B & np.uint8(0xFE))


def _warm_parquet() -> None:
    """Write a small Parquet part of the results' schema in memory: the first results a
    worker writes otherwise pay pyarrow's Parquet module and writer set-up (measured on a
    fresh 2-worker cluster, Fashion-MNIST's 10,000 queries: the chunk's merge-and-write 0.69 s
    against 0.05 s once warm, on the query's critical path)."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lshdist.store.results import NEIGHBORS_SCHEMA

    table = pa.Table.from_pydict({f.name: np.zeros(1, f.type.to_pandas_dtype())
                                  for f in NEIGHBORS_SCHEMA}, schema=NEIGHBORS_SCHEMA)
    with pq.ParquetWriter(io.BytesIO(), NEIGHBORS_SCHEMA) as w:
        w.write_table(table)


def _encoded(ix: Any, X: Any) -> tuple[Any, Any]:
    from lshdist.index.searcher import encode

    qc, qp = encode(ix.metric, ix.family_, X, query=True)
    return qc, qp


#: a scheduler address distributed can connect to: scheme, host (or [IPv6]) and port
_SCHEDULER = re.compile(r"(tcp|tls|ws|wss|ucx)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})/?")


def check_scheduler_address(address: str) -> None:
    """Refuse what is not a scheduler address (distributed raises a bare ValueError deep in
    its connection code for ``http://...``, a missing port or a port that is not a number)."""
    m = _SCHEDULER.fullmatch(address)
    if m is None or not 0 < int(m[3]) < 65536:
        raise InputError(f"--scheduler {address!r} is not a Dask scheduler address: expected "
                         "tcp://HOST:PORT or tls://HOST:PORT, as the scheduler prints it (e.g. "
                         "tcp://10.0.0.5:8786; the dashboard's http:// address is not it)")


class _TaskFailures(logging.Filter):
    """distributed's workers log a failed task with its traceback ("Compute Failed") at ERROR,
    once a try -- three times with the retries -- before the error reaches the driver, which
    reports it in one line: kept at debug level (``-v``) instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Compute Failed"):
            log.debug("a task failed on a worker: %s", record.getMessage())
            return False
        return True


def _quiet_task_failures() -> None:
    worker_log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, _TaskFailures) for f in worker_log.filters):
        worker_log.addFilter(_TaskFailures())


@contextlib.contextmanager
def dask_client(scheduler: str | None = None, *, workers: int = 2, processes: bool = True,
                timeout: float = 10.0, stall: float = 600.0, heartbeat: float = 30.0,
                security: Any = None, listen: str = "127.0.0.1") -> Iterator[Client]:
    """A ``distributed.Client``: on ``scheduler`` (``tcp://HOST:PORT``) or on a new
    LocalCluster of ``workers`` single-threaded worker processes (threads if not ``processes``).
    Workers warm the numba kernels before the job starts.  A scheduler that does not answer
    (a frozen process still accepts connections, and distributed waits for its replies without
    a limit) is a `ClusterError`: after ``timeout`` s when connecting, after ``heartbeat`` s
    without an answer to the questions `SchedulerWatch` asks it every few seconds, and after
    ``stall`` s in any later blocking call (``run``, ``replicate``, ``scheduler_info``, ...).

    ``security`` (a ``distributed.Security``, see `cluster_security`) is used for ``scheduler``;
    a LocalCluster listens on ``listen`` only (loopback by default: scheduler, workers and
    dashboard)."""
    import dask
    from distributed import Client, LocalCluster

    if workers < 1:
        raise InputError(f"workers={workers}: need at least one worker")
    _quiet_task_failures()  # in-process workers log here
    cluster = None
    if scheduler:
        check_scheduler_address(scheduler)
        try:
            client = _bounded(lambda: Client(scheduler, timeout=timeout, security=security),
                              timeout + 1.0)
        except ValueError as exc:  # an address distributed cannot use after all
            raise InputError(f"--scheduler {scheduler!r}: {exc}") from None
        except (OSError, TimeoutError) as exc:
            raise ClusterError(
                f"could not reach the Dask scheduler at {scheduler!r} within {timeout:.0f}s "
                f"({type(exc).__name__}); check the address, or omit --scheduler to run on a "
                "local cluster"
            ) from None
    else:
        # Nanny options: worker processes only.  Threads talk in-process, but each worker
        # still serves HTTP (/metrics, /health) -- on every address unless told where
        extra = ({"env": WORKER_ENV, "host": listen} if processes
                 else {"worker_dashboard_address": f"{listen}:0"})
        pre = worker_pre_spawn_env() if processes else {}
        # the Nanny writes its pre-spawn environment into this process's: restored after.
        # The housekeeping config reaches the workers through their Nanny (and applies to
        # the in-process scheduler too).
        with _spawn_env({**WORKER_ENV, **pre} if processes else {}), dask.config.set(
                {"distributed.nanny.pre-spawn-environ": pre, **housekeeping_config()}
                if processes else housekeeping_config()):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1,
                                   processes=processes, **extra,
                                   # loopback by default: nothing listens on the machine's
                                   # other addresses (the dashboard included)
                                   dashboard_address=f"{listen}:0",
                                   # task errors reach the driver; the rest is shutdown noise
                                   silence_logs=logging.CRITICAL)
        client = Client(cluster)
    watch = SchedulerWatch(client, heartbeat).start()
    _bound_calls(client, stall, watch)
    try:
        log.info("Dask scheduler %s, dashboard %s (%d workers)", client.scheduler.address,
                 _dashboard(client), len(client.scheduler_info()["workers"]))
        if cluster is not None and processes:
            client.run(one_thread_io)
        client.run(warm_kernels)
        yield client
    finally:
        watch.stop()
        if watch.lost is not None:  # nothing to wait for: the scheduler will not answer
            with contextlib.suppress(Exception):
                client.close(timeout=2)
        else:
            client.close()
        if cluster is not None:
            cluster.close()


def _bounded(make: Any, seconds: float) -> Any:
    """``make()`` in a daemon thread, given up (`TimeoutError`) after ``seconds``."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append((True, make()))
        except BaseException as exc:  # re-raised in the caller
            box.append((False, exc))

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if not box:
        raise TimeoutError(f"no answer within {seconds:.0f}s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _bound_calls(client: Any, stall: float, watch: SchedulerWatch) -> None:
    """Every synchronous call of ``client`` without its own timeout waits at most ``stall`` s,
    then raises a `ClusterError` (all of them go through ``Client.sync``); any call fails at
    once with a `ClusterError` when ``watch`` finds the scheduler frozen."""
    sync = client.sync

    def bounded(func: Any, *args: Any, callback_timeout: Any = None, asynchronous: Any = None,
                **kwargs: Any) -> Any:
        async def call() -> Any:
            out = func(*args, **kwargs)
            return await watch.race(out) if inspect.isawaitable(out) else out

        async def watched() -> tuple[bool, Any]:
            # the task running this call (distributed's wait_for) carries its failure as a
            # value (`outcome`) and has it read even when nothing waits for it any longer: a
            # call whose caller gave up at the stall timeout, failing once the client had
            # closed, was logged by asyncio with a traceback after the job's one-line error
            # (the frozen-scheduler drill, rarely)
            task = asyncio.current_task()
            if task is not None:
                task.add_done_callback(mark_seen)
            return await outcome(call())

        def stalled() -> ClusterError:
            return ClusterError(f"the Dask scheduler did not answer for {stall:.0f}s (in "
                                f"{getattr(func, '__name__', func)}); it is stalled or "
                                "overloaded — check it, or raise --stall-timeout")

        async def raised() -> Any:  # an asynchronous call: its caller awaits the value
            return unpack(await watched())

        if client.asynchronous if asynchronous is None else asynchronous:
            return sync(raised, asynchronous=True, callback_timeout=callback_timeout or stall)
        try:
            result = sync(watched, asynchronous=False,
                          callback_timeout=callback_timeout or stall)
        except TimeoutError:
            raise stalled() from None
        ok, value = result
        if not ok and isinstance(value, TimeoutError):  # (as before: raised by the call)
            raise stalled() from None
        return unpack(result)

    client.sync = bounded


def _dashboard(client: Any) -> str:
    """The dashboard's real address (``client.dashboard_link`` formats dask's template with
    this machine's name, not the address the server is bound to)."""
    try:
        services = client.scheduler_info().get("services", {})
    except Exception:  # the link is informative only
        return "?"
    port = services.get("dashboard")
    if port is None:
        return "not running"
    try:  # the host the dashboard's server is bound to, asked of the scheduler
        host = client.run_on_scheduler(_dashboard_host)
    except Exception:  # a scheduler that refuses to run functions
        host = client.scheduler.address.split("://", 1)[-1].rsplit(":", 1)[0]
    every = host in ("", "0.0.0.0", "::")
    return (f"http://{host or '0.0.0.0'}:{port}/status"
            + (" (every address of the scheduler's machine)" if every else ""))


def _dashboard_host(dask_scheduler: Any) -> str:
    """On the scheduler: the address its dashboard's HTTP server is bound to."""
    return str(getattr(dask_scheduler.http_server, "address", ""))


def cluster_security(scheduler: str | None, *, ca_file: str | None = None,
                     cert: str | None = None, key: str | None = None) -> Any:
    """The ``distributed.Security`` for ``scheduler``: TLS with these files, else with dask's
    config (``distributed.comm.tls.*``); None for a plain ``tcp://`` scheduler given no files.

    Dask's TLS is mutual: the scheduler accepts only clients and workers holding a certificate
    signed by its CA, so the certificates are the cluster's authentication.

    Raises
    ------
    InputError
        For a ``tls://`` scheduler without a CA and a client certificate, for files that do not
        exist, or for certificate files given with a ``tcp://`` scheduler.
    """
    import dask
    from distributed import Security

    files = {"ca_file": ca_file, "cert": cert, "key": key}
    given = {k: v for k, v in files.items() if v}
    for name, path in given.items():
        if not Path(path).is_file():
            raise InputError(f"tls {name} {path!r} does not exist; give the path of a PEM file")
    if not scheduler or not scheduler.startswith("tls://"):
        if given and scheduler:
            raise InputError(f"TLS certificates were given but the scheduler {scheduler!r} is "
                             "not tls://; use tls://HOST:PORT (a plain tcp:// cluster is not "
                             "encrypted)")
        return None
    ca = ca_file or dask.config.get("distributed.comm.tls.ca-file", None)
    crt = cert or dask.config.get("distributed.comm.tls.client.cert", None)
    k = key or (None if cert else dask.config.get("distributed.comm.tls.client.key", None))
    if not ca or not crt:
        raise InputError(f"scheduler {scheduler!r} needs TLS certificates: give --tls-ca-file "
                         "and --tls-cert (and --tls-key) or the cluster section's tls_ca_file, "
                         "tls_cert, tls_key, or set dask's distributed.comm.tls.ca-file and "
                         "distributed.comm.tls.client.cert")
    return Security(tls_ca_file=ca, tls_client_cert=crt, tls_client_key=k,
                    require_encryption=True)


def client_for(cfg: ClusterConfig) -> contextlib.AbstractContextManager[Client]:
    """The Dask client a `ClusterConfig` asks for (a context manager): an existing scheduler
    (TLS per `cluster_security`), a LocalCluster, SLURM jobs or a DaskJob's scheduler."""
    kind = cfg.resolved_kind
    scheduler = cfg.scheduler
    if kind == "kubernetes":
        scheduler = os.environ.get("DASK_SCHEDULER_ADDRESS")
        if not scheduler:
            raise InputError("--cluster kubernetes runs inside a DaskJob, whose job pod gets "
                             "$DASK_SCHEDULER_ADDRESS from the dask-kubernetes operator; it is "
                             "not set here (use --scheduler ADDRESS or --cluster local)")
    security = cluster_security(scheduler, ca_file=cfg.tls_ca_file, cert=cfg.tls_cert,
                                key=cfg.tls_key)
    if kind == "slurm":
        return slurm_client(cfg)
    return dask_client(scheduler, workers=cfg.workers, processes=not cfg.in_process,
                       timeout=cfg.connect_timeout, stall=cfg.stall_timeout,
                       heartbeat=cfg.heartbeat_timeout, security=security, listen=cfg.listen)


def slurm_cluster(cfg: ClusterConfig) -> Any:
    """A dask-jobqueue ``SLURMCluster`` (not yet scaled): dask's ``jobqueue.slurm`` config,
    overridden by the ``jobqueue.slurm`` section of the YAML file ``cfg.jobqueue`` (passed as
    arguments, so that every job the cluster submits later uses them); TLS files secure it."""
    try:
        from dask_jobqueue.slurm import SLURMCluster
    except ModuleNotFoundError:
        raise InputError("--cluster slurm needs dask-jobqueue: pip install 'lshdist[deploy]'"
                         ) from None
    kwargs: dict[str, Any] = {}
    if cfg.jobqueue:
        import yaml

        path = Path(cfg.jobqueue)
        if not path.is_file():
            raise InputError(f"jobqueue config {cfg.jobqueue!r} does not exist; give a YAML file "
                             "with a jobqueue.slurm section (deploy/slurm/jobqueue.yaml)")
        raw = yaml.safe_load(path.read_text())
        section = raw.get("jobqueue", {}).get("slurm") if isinstance(raw, dict) else None
        if not isinstance(section, dict):
            raise InputError(f"jobqueue config {cfg.jobqueue!r} has no jobqueue.slurm section")
        kwargs = {k.replace("-", "_"): v for k, v in section.items() if v is not None}
        if "name" in kwargs:  # the config's `name` is the constructor's `job_name`
            kwargs["job_name"] = kwargs.pop("name")
    from lshdist.cluster.slurm import slurm_kwargs

    kwargs = slurm_kwargs(kwargs, cfg.jobqueue or "dask's jobqueue.slurm config")
    if cfg.tls_ca_file and cfg.tls_cert:
        from distributed import Security

        kwargs["security"] = Security(tls_ca_file=cfg.tls_ca_file, tls_client_cert=cfg.tls_cert,
                                      tls_client_key=cfg.tls_key,
                                      tls_scheduler_cert=cfg.tls_cert,
                                      tls_scheduler_key=cfg.tls_key, tls_worker_cert=cfg.tls_cert,
                                      tls_worker_key=cfg.tls_key, require_encryption=True)
        kwargs["protocol"] = "tls://"
    import dask

    try:
        # its scheduler runs in this process: lshdist's placement (no work stealing), where
        # the configuration still holds Dask's default
        with dask.config.set({k: v for k, v in housekeeping_config().items()
                              if k in SCHEDULER_PLACEMENT}):
            return SLURMCluster(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InputError(f"dask-jobqueue refused the SLURM settings ({exc}); check the "
                         "jobqueue.slurm section (deploy/slurm/jobqueue.yaml)") from None


@contextlib.contextmanager
def slurm_client(cfg: ClusterConfig) -> Iterator[Client]:
    """A client on ``cfg.workers`` SLURM worker jobs (`slurm_cluster`), kernels warmed on
    each as it joins; the job script tried first, the jobs watched until their workers join
    (`lshdist.cluster.slurm`)."""
    from lshdist.cluster.slurm import check_submission, start_workers

    cluster = slurm_cluster(cfg)
    try:
        check_submission(cluster, cfg.jobqueue or "dask's jobqueue.slurm config")
        address = cluster.scheduler_address
        with dask_client(address, workers=cfg.workers, timeout=cfg.connect_timeout,
                         stall=cfg.stall_timeout, heartbeat=cfg.heartbeat_timeout,
                         security=cluster.security) as client:
            start_workers(client, cluster, cfg.workers, timeout=cfg.stall_timeout)
            yield client
    finally:
        cluster.close()
