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
    ends first, the rest of the other runs with BLAS's own threads (slower, not wrong).  (A first
    version waited for the holder: a threaded scan inside a section deadlocked.)"""
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


#: glibc's malloc in lshdist's own command-line process (the driver): blocks up to 256 MiB from
#: the heap, up to 256 MiB of freed heap kept (64 MiB of padding), two arenas.  glibc's defaults
#: map every block above its dynamic threshold (at most 32 MiB) afresh and unmap it when freed,
#: so each 20,000 x 784 float32 shard the driver decodes (62.7 MB; a learning sample is read
#: shard by shard) faulted its pages in again: reading the 1 M set's 20,000-row sample took
#: 5.6-6.9 s (3.5-5.1 s of it system time), with these 3.0-3.3 s (0.1-0.5 s), measured on
#: `lshdist learn` of the 1 M set.  Blocks a thread's own arena serves stay under its 64 MiB
#: heap.  glibc before the limit was lifted (2.36 has none) refuses mmap thresholds above 32
#: MiB: then 32 MiB.  Workers get theirs at spawn (`lshdist.cluster.client`).
DRIVER_MALLOC = {"M_TRIM_THRESHOLD": 256 << 20, "M_TOP_PAD": 64 << 20,
                 "M_MMAP_THRESHOLD": 256 << 20, "M_ARENA_MAX": 2}
#: glibc's mallopt parameter numbers (malloc.h)
_MALLOPT = {"M_TRIM_THRESHOLD": -1, "M_TOP_PAD": -2, "M_MMAP_THRESHOLD": -3, "M_ARENA_MAX": -8}
#: the environment variables by which a user sets the same (then lshdist changes nothing)
MALLOC_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_",
              "MALLOC_ARENA_MAX")


def keep_freed_memory() -> bool:
    """Apply `DRIVER_MALLOC` to this process through glibc's ``mallopt``, the mmap threshold
    first (32 MiB where glibc refuses a larger one): True when applied; False — nothing changed
    — where the C library is not glibc, refuses both thresholds, or the user set any of
    `MALLOC_ENV` (their choice stands).  Called once by the command line, before any work."""
    import ctypes
    import os

    if any(k in os.environ for k in MALLOC_ENV):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # the threshold first: another setting would pin it where it is (128 KiB at start)
    if not any(mallopt(_MALLOPT["M_MMAP_THRESHOLD"], v) == 1
               for v in (DRIVER_MALLOC["M_MMAP_THRESHOLD"], 32 << 20)):
        return False
    accepted = [mallopt(_MALLOPT[k], v) == 1 for k, v in DRIVER_MALLOC.items()
                if k != "M_MMAP_THRESHOLD"]  # every one, whatever the others did
    return all(accepted)


def available_memory(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup",
                     proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """Bytes this process may still allocate, as far as the system says: the kernel's
    ``MemAvailable``, lowered to what the tightest memory limit of the process's cgroups
    leaves (`cgroup_memory_left`: a container's, a batch job's or a systemd unit's); None
    where neither is known (not Linux).  A guard against allocations that would get the
    process killed, not a reservation: what others allocate meanwhile is not counted."""
    free: int | None = None
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        free = None
    left = cgroup_memory_left(cgroup, proc_cgroup)
    if left is not None:
        free = left if free is None else min(free, left)
    return free


#: a cgroup v1 limit at or above this is "no limit" (the kernel's unlimited is ~2**63)
_UNLIMITED = 2**60


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _stat_value(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_memory_left(cgroup: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
                       ) -> int | None:
    """Bytes left under the tightest memory limit among this process's cgroup and its
    ancestors (cgroup v2: ``memory.max`` less ``memory.current``; v1: ``memory.limit_in_bytes``
    less ``memory.usage_in_bytes``), the inactive page cache -- reclaimable -- not counted as
    used (``inactive_file`` / ``total_inactive_file`` of ``memory.stat``); None where no limit
    is set or none can be read.  Without a cgroup namespace (a batch scheduler's job step, a
    systemd unit) the process's group is below the mount point: its path comes from
    ``/proc/self/cgroup``, and every level up to the root is read."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: int | None = None
    for line in lines:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            base, names = cgroup, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base, names = f"{cgroup}/memory", ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                               "total_inactive_file")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            where = "/".join([base, *parts[:depth]])
            limit = _read_int(f"{where}/{names[0]}")
            if limit is None or limit >= _UNLIMITED:
                continue
            used = _read_int(f"{where}/{names[1]}") or 0
            cache = _stat_value(f"{where}/memory.stat", names[2])
            left = max(0, limit - max(0, used - cache))
            best = left if best is None else min(best, left)
    return best
