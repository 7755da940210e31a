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
    own: two threads of a 2-thread BLAS on 2 cores run slower than one).  Its users: the
    threaded hashing, the metric selection's grid and the threaded exact scan.

    The limit is process-wide, saved and restored by the one section that holds it.  A section
    entered while another is active (nested in the same thread, in a thread the holder waits
    for, or in another thread) neither waits nor touches the limit — BLAS is at one thread
    already — so sections never deadlock and never restore each other's limit; if the holder
    ends first, the rest of the other runs with BLAS's own threads (slower, not wrong).  (Until
    session 16 a section waited for the holder: a threaded scan inside a section deadlocked.)"""
    from threadpoolctl import threadpool_limits

    if not _ONE_BLAS_THREAD.acquire(blocking=False):
        yield
        return
    try:
        with threadpool_limits(1, user_api="blas"):
            yield
    finally:
        _ONE_BLAS_THREAD.release()


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
