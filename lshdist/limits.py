"""Bounds on parameters, in one place (the config checks them; the layers below rely on them).

``MAX_PERMUTATIONS`` keeps the permutation lists of a segment within reason: M lists of N
int32 rows and uint64 prefixes are 12·M·N bytes (M = 4,096 at N = 100,000 is 4.9 GB).
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager

MAX_BITS = 4096
MAX_PERMUTATIONS = 4096

#: held while work runs on several Python threads with BLAS limited to one thread each
_ONE_BLAS_THREAD = threading.Lock()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS held to one thread while the caller runs its own threads (each a BLAS call of its
    own: two threads of a 2-thread BLAS on 2 cores run slower than one).  The limit is
    process-wide, saved and restored, so only one such section runs at a time — overlapping
    ones would restore each other's limit.  Never nested: the threads a holder waits for must
    not enter another section (its users — the threaded hashing, the metric selection's grid
    and the threaded exact scan — call nothing that does: the grid's fits scan on one
    thread)."""
    from threadpoolctl import threadpool_limits

    with _ONE_BLAS_THREAD, threadpool_limits(1, user_api="blas"):
        yield


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
