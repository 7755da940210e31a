"""Getting a Dask client: a LocalCluster by default, or an existing scheduler."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lshdist.errors import ClusterError, InputError

if TYPE_CHECKING:
    from distributed import Client

log = logging.getLogger(__name__)


#: a worker is one thread: no BLAS/OpenMP/numba pools of its own beside it (a user's
#: OMP_NUM_THREADS would otherwise win over Dask's default)
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "NUMBA_NUM_THREADS": "1"}


def one_thread_io() -> None:
    """Zarr's own I/O and codec thread pool down to one thread on this worker (measured: with
    its default pool, a '1-thread' worker used 1.35 cores while reading and writing)."""
    import zarr

    zarr.config.set({"threading.max_workers": 1})


def warm_kernels() -> bool:
    """Compile (or load from cache) every numba kernel once, on a worker at job start."""
    import numpy as np

    from lshdist._kernels.hashing import gaussian_rows, pack_signs, permuted_prefix
    from lshdist._kernels.search import (
        collect_candidates,
        rerank_dense,
        window_candidates_bsearch,
        window_candidates_merge,
    )

    codes = pack_signs(gaussian_rows(np.uint64(0), np.arange(4, dtype=np.uint64), 8))
    prefix = permuted_prefix(codes, np.arange(8, dtype=np.int64))
    sp = np.sort(prefix)[None, :]
    rows = np.argsort(prefix)[None, :].astype(np.int64)
    cand = window_candidates_merge(sp, rows, prefix[None, :], rows, 1)
    window_candidates_bsearch(sp, rows, prefix[None, :], 1)
    off, r, _ = collect_candidates(cand, codes, codes, 0)
    Z = np.zeros((4, 2), np.float32)
    rerank_dense(off, r, Z, Z, 1, np.arange(4, dtype=np.int64))
    return True


@contextlib.contextmanager
def dask_client(scheduler: str | None = None, *, workers: int = 2, processes: bool = True,
                timeout: float = 10.0, stall: float = 600.0) -> Iterator[Client]:
    """A ``distributed.Client``: on ``scheduler`` (``tcp://HOST:PORT``) or on a new
    LocalCluster of ``workers`` single-threaded worker processes (threads if not ``processes``).
    Workers warm the numba kernels before the job starts.  A scheduler that does not answer
    (a frozen process still accepts connections, and distributed waits for its replies without
    a limit) is a `ClusterError`: after ``timeout`` s when connecting, after ``stall`` s in any
    later blocking call (``run``, ``replicate``, ``scheduler_info``, ...)."""
    from distributed import Client, LocalCluster

    if workers < 1:
        raise InputError(f"workers={workers}: need at least one worker")
    cluster = None
    if scheduler:
        try:
            client = _bounded(lambda: Client(scheduler, timeout=timeout), timeout + 1.0)
        except (OSError, TimeoutError) as exc:
            raise ClusterError(
                f"could not reach the Dask scheduler at {scheduler!r} within {timeout:.0f}s "
                f"({type(exc).__name__}); check the address, or omit --scheduler to run on a "
                "local cluster"
            ) from None
    else:
        # Nanny options: worker processes only (threads talk in-process, no sockets)
        extra = {"env": WORKER_ENV, "host": "127.0.0.1"} if processes else {}
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                               **extra,
                               # loopback only: nothing listens on the machine's other
                               # addresses (the dashboard included)
                               dashboard_address="127.0.0.1:0",
                               # task errors reach the driver; the rest is shutdown noise
                               silence_logs=logging.CRITICAL)
        client = Client(cluster)
    _bound_calls(client, stall)
    try:
        log.info("Dask dashboard: %s (%d workers)", client.dashboard_link,
                 len(client.scheduler_info()["workers"]))
        if cluster is not None and processes:
            client.run(one_thread_io)
        client.run(warm_kernels)
        yield client
    finally:
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


def _bound_calls(client: Any, stall: float) -> None:
    """Every synchronous call of ``client`` without its own timeout waits at most ``stall`` s,
    then raises a `ClusterError` (all of them go through ``Client.sync``)."""
    sync = client.sync

    def bounded(func: Any, *args: Any, callback_timeout: Any = None, **kwargs: Any) -> Any:
        try:
            return sync(func, *args, callback_timeout=callback_timeout or stall, **kwargs)
        except TimeoutError:
            raise ClusterError(f"the Dask scheduler did not answer for {stall:.0f}s (in "
                               f"{getattr(func, '__name__', func)}); it is stalled or "
                               "overloaded — check it, or raise --stall-timeout") from None

    client.sync = bounded
