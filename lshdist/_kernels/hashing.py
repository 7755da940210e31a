"""Counter-based Gaussians, sign packing and permuted key prefixes.

Key layout: bit ``i`` of a b-bit key is bit ``63 - (i % 64)`` of word ``i // 64`` (most
significant first), so comparing words lexicographically compares keys bit by bit.
"""

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_ONE = np.uint64(1)
_TWO53 = 1.0 / 9007199254740992.0


@njit(cache=True, nogil=True)
def splitmix64(x):
    """One step of SplitMix64 (Steele et al. 2014) as a stateless mixing function."""
    z = x + _GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(cache=True, nogil=True)
def add_gaussians(out, row, s, key, w, bits):
    """``out[row, t] += w * g_t`` for the ``bits`` standard normals ``g_t`` of counter ``key``
    under the mixed seed ``s``: Box-Muller over two SplitMix64 outputs per pair of bits.  The one
    stream every counter-based family draws from (features, feature pairs, unary bins)."""
    k = splitmix64(s ^ key)
    for t in range((bits + 1) // 2):
        z1 = splitmix64(k + np.uint64(2 * t) * _GOLDEN)
        z2 = splitmix64(k + np.uint64(2 * t + 1) * _GOLDEN)
        u1 = (np.float64(z1 >> _S11) + 0.5) * _TWO53
        u2 = (np.float64(z2 >> _S11) + 0.5) * _TWO53
        rad = np.sqrt(-2.0 * np.log(u1))
        out[row, 2 * t] += w * rad * np.cos(2.0 * np.pi * u2)
        if 2 * t + 1 < bits:
            out[row, 2 * t + 1] += w * rad * np.sin(2.0 * np.pi * u2)


@njit(cache=True, nogil=True)
def gaussian_rows(seed, features, bits):
    """``r[bit, f]`` for every feature id in ``features``: float64 (len(features), bits).

    Entry ``(i, t)`` is a standard normal that depends only on ``(seed, t, features[i])``
    (`add_gaussians`), so any worker generates the same hash coefficients for the features it
    sees, and nothing of size bits x d is ever stored.
    """
    n = features.shape[0]
    out = np.zeros((n, bits))
    s = splitmix64(np.uint64(seed))
    for i in range(n):
        add_gaussians(out, i, s, features[i], 1.0, bits)
    return out


@njit(cache=True, nogil=True)
def pack_signs(P):
    """``[P >= 0]`` packed into uint64 words: (n, b) float -> (n, ceil(b/64)) uint64 (bit i
    of a key is bit ``63 - i % 64`` of word ``i // 64``; a last partial word is left-aligned).
    Each word is built in a register, one shift and one comparison per bit."""
    n, b = P.shape
    w = (b + 63) // 64
    out = np.zeros((n, w), dtype=np.uint64)
    for r in range(n):
        for j in range(w):
            lo = j * 64
            hi = min(lo + 64, b)
            v = np.uint64(0)
            for i in range(lo, hi):
                v = (v << _ONE) | np.uint64(P[r, i] >= 0)
            out[r, j] = v << np.uint64(64 - (hi - lo)) if hi - lo < 64 else v
    return out


@njit(cache=True, nogil=True)
def pack_signs_exact(P, X, xnorm, Wt, off, wtol, otol):
    """The keys of ``T = X Wt^T - off`` packed like `pack_signs`, with every sign that of T
    summed in float64 in one fixed order, from ``P``, the same product computed in float32 by
    BLAS.

    BLAS's float32 result for a row depends on where that row sits in the call (its kernels
    sum rows at different positions of a block in different orders: OpenBLAS 0.3.31 does), so
    its signs near 0 would depend on the chunking.  An entry with
    ``|P| > |x| wtol + otol`` (``wtol = tol |w|``, ``otol = tol |off|``, tol above the float32
    product's error bound ``(d + 2) u``) already has T's sign; a word holding any other entry
    -- about ``d u`` of the entries -- is redone with those entries recomputed: products of
    float32 values are exact in float64, summed in a fixed order (four partial sums by feature
    index mod 4; ``Wt`` is (b, d), a row per hash vector).  The key then depends on the row
    alone.  Whether an entry is recomputed may depend on the chunking (P and ``xnorm`` do);
    its bit does not: either way it is T's sign."""
    n, b = P.shape
    d = X.shape[1]
    w = (b + 63) // 64
    out = np.zeros((n, w), dtype=np.uint64)
    d4 = d - d % 4
    for r in range(n):
        xn = xnorm[r]
        for j in range(w):
            lo = j * 64
            hi = min(lo + 64, b)
            v = np.uint64(0)
            near = False
            for i in range(lo, hi):
                p = P[r, i]
                v = (v << _ONE) | np.uint64(p >= 0)
                near |= abs(p) <= xn * wtol[i] + otol[i]
            if near:
                v = np.uint64(0)
                for i in range(lo, hi):
                    p = P[r, i]
                    bit = p >= 0
                    if abs(p) <= xn * wtol[i] + otol[i]:
                        t0 = 0.0
                        t1 = 0.0
                        t2 = 0.0
                        t3 = 0.0
                        for k in range(0, d4, 4):
                            t0 += np.float64(X[r, k]) * np.float64(Wt[i, k])
                            t1 += np.float64(X[r, k + 1]) * np.float64(Wt[i, k + 1])
                            t2 += np.float64(X[r, k + 2]) * np.float64(Wt[i, k + 2])
                            t3 += np.float64(X[r, k + 3]) * np.float64(Wt[i, k + 3])
                        for k in range(d4, d):
                            t0 += np.float64(X[r, k]) * np.float64(Wt[i, k])
                        bit = ((t0 + t1) + (t2 + t3) - np.float64(off[i])) >= 0
                    v = (v << _ONE) | np.uint64(bit)
            out[r, j] = v << np.uint64(64 - (hi - lo)) if hi - lo < 64 else v
    return out


@njit(cache=True, nogil=True)
def _prefix_tables(positions):
    """Byte tables of a permutation: the distinct key bytes its positions read (``src``) and,
    per such byte and byte value, that byte's bits placed where the prefix wants them."""
    L = positions.shape[0]
    nbytes = 0
    for j in range(L):
        nbytes = max(nbytes, positions[j] // 8 + 1)
    slot = np.full(nbytes, -1, dtype=np.int64)
    src = np.empty(L, dtype=np.int64)
    k = 0
    for j in range(L):
        b = positions[j] // 8
        if slot[b] < 0:
            slot[b] = k
            src[k] = b
            k += 1
    tables = np.zeros((k, 256), dtype=np.uint64)
    for j in range(L):
        p = positions[j]
        t = slot[p // 8]
        bit_in_byte = 7 - (p & 7)  # key bit p is bit (7 - p % 8) of its byte (MSB first)
        for val in range(256):
            if (val >> bit_in_byte) & 1:
                tables[t, val] |= _ONE << np.uint64(63 - j)
    return src[:k], tables


@njit(cache=True, nogil=True)
def permuted_prefix(codes, positions):
    """The first ``len(positions)`` (<= 64) bits of each key under a permutation.

    ``positions[j]`` is the key bit that becomes bit ``j`` of the prefix (MSB first).
    By byte tables: one lookup per distinct key byte the positions read (about 42 for 64
    random bits of a 512-bit key, 8 if they were whole bytes; at most ``len(positions)``).
    Returns uint64 (n,).
    """
    n = codes.shape[0]
    src, tables = _prefix_tables(positions)
    k = src.shape[0]
    words = src >> 3
    shifts = (np.uint64(56) - ((src & 7) * 8).astype(np.uint64))
    out = np.zeros(n, dtype=np.uint64)
    for r in range(n):
        v = np.uint64(0)
        for i in range(k):
            byte = (codes[r, words[i]] >> shifts[i]) & np.uint64(0xFF)
            v |= tables[i, byte]
        out[r] = v
    return out


_K1 = np.uint64(0x5555555555555555)
_K2 = np.uint64(0x3333333333333333)
_K4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_KF = np.uint64(0x0101010101010101)
_S1 = np.uint64(1)
_S2 = np.uint64(2)
_S4 = np.uint64(4)
_S56 = np.uint64(56)


@njit(cache=True, nogil=True)
def popcount64(x):
    """Set bits of a uint64 (SWAR, branch-free)."""
    x = x - ((x >> _S1) & _K1)
    x = (x & _K2) + ((x >> _S2) & _K2)
    x = (x + (x >> _S4)) & _K4
    return (x * _KF) >> _S56


@njit(cache=True, nogil=True)
def hamming(a, b):
    """Hamming distance between two packed keys (1-d uint64 arrays)."""
    d = np.uint64(0)
    for i in range(a.shape[0]):
        d += popcount64(a[i] ^ b[i])
    return np.int64(d)
