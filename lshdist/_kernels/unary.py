"""The implicit unary encoding of weighted histograms (ARCHITECTURE.md section 2).

A bin with integer count ``n`` and entry value ``v`` stands for ``n`` unary coordinates of value
``v``; coordinate ``j`` of bin ``f`` is feature ``unary_id(f, j)`` of the counter-based Gaussian
stream of `lshdist._kernels.hashing.gaussian_rows`.  So ``r^T phi(Y)`` is, per bin, ``v`` times
the sum of the first ``n`` Gaussians of that bin's stream, and no unary vector is ever built.
"""

import numpy as np
from numba import njit

from lshdist._kernels.hashing import add_gaussians, splitmix64

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_UNARY_TAG = np.uint64(0xA4093822299F31D0)
_S11 = np.uint64(11)
_TWO53 = 1.0 / 9007199254740992.0


@njit(cache=True, nogil=True)
def unary_id(feature, j):
    """Feature id of unary coordinate ``j`` (0-based) of bin ``feature``: uint64."""
    return splitmix64(feature ^ splitmix64(np.uint64(j) + _UNARY_TAG))


@njit(cache=True, nogil=True)
def unary_ids(ids, counts):
    """Every unary feature id of every bin, bin after bin: uint64 (sum(counts),)."""
    total = 0
    for k in range(ids.shape[0]):
        total += counts[k]
    out = np.empty(total, dtype=np.uint64)
    m = 0
    for k in range(ids.shape[0]):
        for j in range(counts[k]):
            out[m] = unary_id(ids[k], j)
            m += 1
    return out


@njit(cache=True, nogil=True)
def unary_projection(seed, indptr, ids, counts, values, bits):
    """``r^T phi(Y)`` of the unary encoding of every row: float64 (n, bits).

    CSR rows (indptr int64 (n+1,)) of bins ``ids`` (uint64), integer ``counts`` (int64 >= 0)
    and entry values ``values`` (float64): row ``y`` gets
    ``sum_k values[k] * sum_{j < counts[k]} r(seed, t, unary_id(ids[k], j))`` for every bit t.
    Cost O(sum(counts) * bits) per row.
    """
    n = indptr.shape[0] - 1
    out = np.zeros((n, bits))
    s = splitmix64(np.uint64(seed))
    for y in range(n):
        for k in range(indptr[y], indptr[y + 1]):
            for j in range(counts[k]):
                add_gaussians(out, y, s, unary_id(ids[k], j), values[k], bits)
    return out
