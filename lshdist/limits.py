"""Bounds on parameters, in one place (the config checks them; the layers below rely on them).

``MAX_PERMUTATIONS`` keeps the permutation lists of a segment within reason: M lists of N
int32 rows and uint64 prefixes are 12·M·N bytes (M = 4,096 at N = 100,000 is 4.9 GB).
"""

MAX_BITS = 4096
MAX_PERMUTATIONS = 4096


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
