"""EH-Hash projections ``x^T U_b x`` of sparse rows over a symmetric counter-based Gaussian U.

Only ``U + U^T`` enters a quadratic form, so U is drawn symmetric: for feature ids ``i <= j``
(as uint64 values) one standard normal ``G_b(i, j)`` per bit b, ``U_b[i, i] = G_b(i, i)`` and
``U_b[i, j] = U_b[j, i] = G_b(i, j) / sqrt(2)``.  Then
``x^T U_b x = sum_i x_i^2 G_b(i, i) + sqrt(2) sum_{i<j} x_i x_j G_b(i, j)`` has the law of the
form over an i.i.d. N(0, 1) matrix (variance ``||x||^4``, covariance ``(x^T w)^2`` with w): the
EH-Hash family of NIPS 2010, from ``nnz (nnz + 1) / 2`` pairs a row instead of ``nnz^2``.

``G_b(i, j)`` is counter-based: a pair key ``K = splitmix64(mix(seed) ^ pair_key(i, j))`` (one
per pair, not per bit), then per bit ``table[(K * mult[b]) >> 52]`` (`eh_multipliers`: odd
64-bit multipliers from the seed; ``table``: the 4,096 quantiles ``Phi^-1((k + 1/2) / 4096)``,
scaled to unit variance, rounded to float32).  One multiply, one shift and one load a pair and
bit: the Box-Muller stream of `add_gaussians` (a log, a square root, a sine or cosine per two
values) cost 23 ns a pair and bit, 30 times the rest of the loop.
"""

import numpy as np
from numba import njit

from lshdist._kernels.hashing import _GOLDEN, splitmix64
from lshdist._kernels.hyperplane import pair_key

_S52 = np.uint64(52)
#: salt of the per-bit multipliers' stream (not the pairs')
_MULT_SALT = np.uint64(0x6A09E667F3BCC909)
_SQRT2 = np.sqrt(2.0)


@njit(cache=True, nogil=True)
def eh_multipliers(seed, bits):
    """The odd multipliers of bits 0..bits-1 under ``seed``: uint64 (bits,).  Bit b's values
    do not depend on ``bits`` (a shorter key is a prefix of a longer one)."""
    s = splitmix64(splitmix64(np.uint64(seed)) ^ _MULT_SALT)
    out = np.empty(bits, dtype=np.uint64)
    for b in range(bits):
        out[b] = splitmix64(s + np.uint64(b) * _GOLDEN) | np.uint64(1)
    return out


@njit(cache=True, nogil=True)
def eh_pair_base(seed, fi, fj):
    """The pair key K of features ``fi``, ``fj`` (either order): uint64."""
    lo = min(fi, fj)
    hi = max(fi, fj)
    return splitmix64(splitmix64(np.uint64(seed)) ^ pair_key(lo, hi))


@njit(cache=True, nogil=True)
def _add_pair(acc, K, w, mult, table):
    """``acc[b] += w * G_b`` for the pair of key K, every bit."""
    for b in range(acc.shape[0]):
        acc[b] += w * table[(K * mult[b]) >> _S52]


@njit(cache=True, nogil=True)
def eh_project_rows(indptr, indices, data, seed, mult, table, start, stop, out):
    """``x^T U_b x`` of CSR rows ``start..stop-1`` into ``out[start:stop]`` (float64, bits
    columns; zeroed here).  indptr int64 (n+1,); indices uint64 (nnz,) feature ids; data float
    (nnz,).  Every unordered pair of a row's entries once: a pair of equal ids (the same entry,
    or a repeated id) takes the diagonal Gaussian, with weight ``x_p^2`` or ``2 x_p x_q``."""
    s = splitmix64(np.uint64(seed))
    for r in range(start, stop):
        acc = out[r]
        acc[:] = 0.0
        lo, hi = indptr[r], indptr[r + 1]
        for p in range(lo, hi):
            fp = indices[p]
            xp = np.float64(data[p])
            sp = splitmix64(fp)
            for q in range(p, hi):
                fq = indices[q]
                xq = np.float64(data[q])
                if fp == fq:
                    w = xp * xq if p == q else 2.0 * xp * xq
                    key = splitmix64(sp + fp * _GOLDEN)
                elif fp < fq:
                    w = _SQRT2 * xp * xq
                    key = splitmix64(sp + fq * _GOLDEN)
                else:
                    w = _SQRT2 * xp * xq
                    key = splitmix64(splitmix64(fq) + fp * _GOLDEN)
                if w != 0.0:
                    _add_pair(acc, splitmix64(s ^ key), w, mult, table)


@njit(cache=True, nogil=True)
def eh_project_sampled(fi, fj, wt, seed, mult, table):
    """``sum_s wt[r, s] U_b[fi[r, s], fj[r, s]]`` (the sampled query embedding, ordered
    entries of ``vec(w w^T)``): float64 (n, bits).  O(t bits) a row; zero weights skipped."""
    n, t = wt.shape
    bits = mult.shape[0]
    out = np.zeros((n, bits))
    for r in range(n):
        for j in range(t):
            w = wt[r, j]
            if w != 0.0:
                if fi[r, j] != fj[r, j]:
                    w = w / _SQRT2
                _add_pair(out[r], eh_pair_base(seed, fi[r, j], fj[r, j]), w, mult, table)
    return out


@njit(cache=True, nogil=True)
def eh_matrix(features, seed, mult, table):
    """U (bits, f, f) float64 over ``features`` (symmetric; the dense rows' path)."""
    f = features.shape[0]
    bits = mult.shape[0]
    U = np.zeros((bits, f, f))
    g = np.zeros(bits)
    for i in range(f):
        for j in range(i, f):
            g[:] = 0.0
            _add_pair(g, eh_pair_base(seed, features[i], features[j]),
                      1.0 if i == j else 1.0 / _SQRT2, mult, table)
            for b in range(bits):
                U[b, i, j] = g[b]
                U[b, j, i] = g[b]
    return U


@njit(cache=True, nogil=True)
def top_terms(indptr, indices, data, m):
    """Each CSR row cut to its ``m`` entries of largest ``|value|`` (ties: the smaller feature
    id first; zeros never kept), the kept entries in the row's order: ``(indptr int64 (n+1,),
    indices uint64, data float64)``.  A row with at most m nonzeros is kept whole."""
    n = indptr.shape[0] - 1
    new_ptr = np.zeros(n + 1, dtype=np.int64)
    for r in range(n):
        nz = 0
        for p in range(indptr[r], indptr[r + 1]):
            if data[p] != 0:
                nz += 1
        new_ptr[r + 1] = new_ptr[r] + min(nz, m)
    out_i = np.empty(new_ptr[n], dtype=np.uint64)
    out_d = np.empty(new_ptr[n], dtype=np.float64)
    for r in range(n):
        lo, hi = indptr[r], indptr[r + 1]
        k = new_ptr[r + 1] - new_ptr[r]
        if k == 0:
            continue
        keep = np.zeros(hi - lo, dtype=np.bool_)
        if k == hi - lo:
            keep[:] = True
        else:
            # by feature id, then (stable) by decreasing |value|: the first k
            by_id = np.argsort(indices[lo:hi], kind="mergesort")
            mag = np.empty(hi - lo)
            for q in range(hi - lo):
                mag[q] = -abs(np.float64(data[lo + by_id[q]]))
            order = by_id[np.argsort(mag, kind="mergesort")]
            taken = 0
            for q in order:
                if taken == k:
                    break
                if data[lo + q] != 0:
                    keep[q] = True
                    taken += 1
        o = new_ptr[r]
        for q in range(hi - lo):
            if keep[q]:
                out_i[o] = indices[lo + q]
                out_d[o] = np.float64(data[lo + q])
                o += 1
    return new_ptr, out_i, out_d
