"""Sets of local features: hashed pyramid bin ids and the histogram intersection.

A bin id is 64 bits: the top 8 are the *channel* (the pyramid level; what the unary encoding
reads its quantum from), the low 56 a hash of (tag, channel, integer bin coordinates).  No
vocabulary of bins is ever built.
"""

import numpy as np
from numba import njit

from lshdist._kernels.hashing import splitmix64

_LOW56 = np.uint64((1 << 56) - 1)
_S56 = np.uint64(56)


@njit(cache=True, nogil=True)
def channel_id(tag, channel, h):
    """``channel << 56 | (hash of (tag, channel, h)) & (2**56 - 1)``."""
    c = np.uint64(channel)
    z = splitmix64(splitmix64(np.uint64(tag) ^ c) ^ h)
    return (c << _S56) | (z & _LOW56)


@njit(cache=True, nogil=True)
def pyramid_bin_ids(X, shift, finest_side, levels, tag):
    """Bin id of every point at every level: uint64 (n, levels).

    Level ``i`` has uniform bins of side ``finest_side * 2**i`` over the shifted features
    ``X + shift`` (X float64 (n, d), shift float64 (d,)); the coordinates of a point's bin are
    ``floor((x + shift) / side)``, hashed in order with SplitMix64.
    """
    n, d = X.shape
    out = np.empty((n, levels), dtype=np.uint64)
    for i in range(levels):
        side = finest_side * 2.0**i
        for p in range(n):
            h = np.uint64(0x243F6A8885A308D3)
            for j in range(d):
                c = np.int64(np.floor((X[p, j] + shift[j]) / side))
                h = splitmix64(h ^ np.uint64(c))
            out[p, i] = channel_id(tag, i, h)
    return out


@njit(cache=True, nogil=True)
def pair_ids(tag, channel, a, b):
    """Bin ids of ordered integer pairs ``(a[k], b[k])`` (int64) in one channel: uint64."""
    n = a.shape[0]
    out = np.empty(n, dtype=np.uint64)
    for k in range(n):
        h = splitmix64(splitmix64(np.uint64(0x13198A2E03707344) ^ np.uint64(a[k]))
                       ^ np.uint64(b[k]))
        out[k] = channel_id(tag, channel, h)
    return out


@njit(cache=True, nogil=True)
def _row_min_sum(ia, va, lo_a, hi_a, ib, vb, lo_b, hi_b):
    s = 0.0
    p, q = lo_a, lo_b
    while p < hi_a and q < hi_b:
        if ia[p] < ib[q]:
            p += 1
        elif ib[q] < ia[p]:
            q += 1
        else:
            s += min(va[p], vb[q])
            p += 1
            q += 1
    return s


@njit(cache=True, nogil=True)
def intersection_pairwise(ptr_a, ids_a, val_a, ptr_b, ids_b, val_b):
    """``sum_f min(A[i, f], B[j, f])`` for every pair of rows: float64 (n_a, n_b).

    CSR rows whose ids (uint64) are sorted ascending within each row; values float64 >= 0.
    """
    na = ptr_a.shape[0] - 1
    nb = ptr_b.shape[0] - 1
    out = np.zeros((na, nb))
    for i in range(na):
        for j in range(nb):
            out[i, j] = _row_min_sum(ids_a, val_a, ptr_a[i], ptr_a[i + 1],
                                     ids_b, val_b, ptr_b[j], ptr_b[j + 1])
    return out


@njit(cache=True, nogil=True)
def intersection_paired(ptr_a, ids_a, val_a, ptr_b, ids_b, val_b):
    """``sum_f min(A[i, f], B[i, f])`` row by row: float64 (n,)."""
    n = ptr_a.shape[0] - 1
    out = np.zeros(n)
    for i in range(n):
        out[i] = _row_min_sum(ids_a, val_a, ptr_a[i], ptr_a[i + 1],
                              ids_b, val_b, ptr_b[i], ptr_b[i + 1])
    return out
