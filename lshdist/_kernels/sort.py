"""Sorting the permutation lists: a stable LSD radix argsort of 64-bit keys.

numpy's stable argsort of uint64 is a comparison (merge) sort, O(n log n) with branchy
compares; the lists' keys are near-uniform random bits, where six counting passes over 11-bit
digits do the same job in O(n) (measured on the index build's lists).  The build's lists sort
by their leading digits only and finish the short runs of equal leading bits by insertion
(`radix_sort_leading`: the same arrays in about half the time).
"""

import numpy as np
from numba import njit

_BITS = 11  # 2,048 buckets: the counts stay in L1 (16-bit digits measured slower at 60k keys)
_PASSES = 6  # 6 x 11 >= 64
_DIGITS = 1 << _BITS
_MASK = np.uint64(_DIGITS - 1)


@njit(cache=True, nogil=True)
def radix_sort_u64(keys, order):
    """Stable LSD radix sort of uint64 ``keys``, carrying ``order`` (int32 or int64, (n,),
    usually ``arange(n)``) along: returns ``(sorted keys, order permuted alike)`` -- new
    arrays; the inputs are not changed.  Ascending, ties in input order (like
    ``np.argsort(keys, kind="stable")``).  The six 11-bit digits' counts are taken in one read
    of the keys (not one per pass); a pass whose digit is the same for every key is skipped;
    the sorted keys come out of the passes (no gather by the order after)."""
    n = keys.shape[0]
    k = keys.copy()
    o = order.copy()
    if n == 0:
        return k, o
    counts = np.zeros((_PASSES, _DIGITS), dtype=np.int64)
    for i in range(n):
        x = k[i]
        for p in range(_PASSES):
            counts[p, (x >> np.uint64(_BITS * p)) & _MASK] += 1
    k_tmp = np.empty_like(k)
    o_tmp = np.empty_like(o)
    start = np.empty(_DIGITS, dtype=np.int64)
    for p in range(_PASSES):
        shift = np.uint64(_BITS * p)
        if counts[p, (k[0] >> shift) & _MASK] == n:
            continue  # one digit value: this pass would not move anything
        total = 0
        for d in range(_DIGITS):
            start[d] = total
            total += counts[p, d]
        for i in range(n):
            x = k[i]
            d = (x >> shift) & _MASK
            pos = start[d]
            start[d] = pos + 1
            o_tmp[pos] = o[i]
            k_tmp[pos] = x
        o, o_tmp = o_tmp, o
        k, k_tmp = k_tmp, k
    return k, o


#: runs of keys equal in their sorted leading digits at most this long are finished by
#: insertion; longer ones by the full sort (`radix_sort_u64`): a bounded worst case
_SMALL_RUN = 32
#: leading digits sorted at most (5 x 11 bits; `radix_sort_leading`)
_MAX_LEADING = 5


@njit(cache=True, nogil=True)
def leading_passes(n):
    """The leading 11-bit digits `radix_sort_leading` sorts ``n`` keys by: the fewest whose
    buckets number at least 4 n (30,000 keys: 2; 1 M: 2), at most `_MAX_LEADING`."""
    passes = 1
    while passes < _MAX_LEADING and (1 << (_BITS * passes)) < 4 * n:
        passes += 1
    return passes


@njit(cache=True, nogil=True)
def radix_sort_leading(keys, order):
    """`radix_sort_u64`'s result (the same arrays: stable, ascending, ``order`` carried
    along) in fewer passes for near-uniform keys such as the lists' permuted prefixes: LSD
    passes over the leading digits only (`leading_passes`: about a quarter of the keys share
    their leading bits with another), then each run of keys equal in those bits is finished
    by insertion (by whole keys, stable), or by `radix_sort_u64` when longer than
    `_SMALL_RUN` (keys alike in their leading bits: the worst case stays one full sort).
    Measured on 30,000 random keys: 0.38 ms against 0.84 ms for the six passes; 1 M keys:
    26 against 50 ms."""
    n = keys.shape[0]
    k = keys.copy()
    o = order.copy()
    if n < 2:
        return k, o
    passes = leading_passes(n)
    counts = np.zeros((passes, _DIGITS), dtype=np.int64)
    for i in range(n):
        x = k[i]
        for p in range(passes):
            counts[p, (x >> np.uint64(64 - _BITS * (passes - p))) & _MASK] += 1
    k_tmp = np.empty_like(k)
    o_tmp = np.empty_like(o)
    start = np.empty(_DIGITS, dtype=np.int64)
    for p in range(passes):
        shift = np.uint64(64 - _BITS * (passes - p))
        if counts[p, (k[0] >> shift) & _MASK] == n:
            continue  # one digit value: this pass would not move anything
        total = 0
        for d in range(_DIGITS):
            start[d] = total
            total += counts[p, d]
        for i in range(n):
            x = k[i]
            d = (x >> shift) & _MASK
            pos = start[d]
            start[d] = pos + 1
            o_tmp[pos] = o[i]
            k_tmp[pos] = x
        o, o_tmp = o_tmp, o
        k, k_tmp = k_tmp, k
    top = np.uint64(64 - _BITS * passes)
    i = 0
    while i < n:
        head = k[i] >> top
        j = i + 1
        while j < n and (k[j] >> top) == head:
            j += 1
        if j - i > _SMALL_RUN:
            ks, os_ = radix_sort_u64(k[i:j], o[i:j])
            k[i:j] = ks
            o[i:j] = os_
        else:
            for a in range(i + 1, j):
                x = k[a]
                if x >= k[a - 1]:
                    continue
                y = o[a]
                b = a - 1
                while b >= i and k[b] > x:
                    k[b + 1] = k[b]
                    o[b + 1] = o[b]
                    b -= 1
                k[b + 1] = x
                o[b + 1] = y
        i = j
    return k, o


@njit(cache=True, nogil=True)
def radix_argsort_u64(keys):
    """Stable argsort of uint64 ``keys`` (`radix_sort_u64`'s order): ascending, ties in input
    order, like ``np.argsort(keys, kind="stable")``.  Returns int64 (n,)."""
    return radix_sort_u64(keys, np.arange(keys.shape[0], dtype=np.int64))[1]
