"""`lshdist._kernels.hyperplane` against numpy references.

Each test names the plausible bug it catches; each was checked once by planting that bug.
"""

import numpy as np
import scipy.sparse as sp

from lshdist._kernels.hashing import gaussian_rows
from lshdist._kernels.hyperplane import (
    content_seeds,
    eh_sample_pairs,
    rerank_margin_dense,
    rerank_margin_sparse,
)

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix_ref(x: int) -> int:
    z = (x + GOLDEN) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def pair_key_ref(i: int, j: int) -> int:
    return splitmix_ref((splitmix_ref(i) + j * GOLDEN) & MASK)


def U_ref(seed: int, features: np.ndarray, bits: int) -> np.ndarray:
    """An asymmetric Gaussian U (bits, f, f) over the given feature ids, entry (b, i, j) the
    Box-Muller Gaussian of (seed, b, pair_key(features[i], features[j])): any fixed U serves
    the sampling's unbiasedness check (EH-Hash's own U: test_ehhash_kernels)."""
    f = len(features)
    keys = np.array([pair_key_ref(int(a), int(b)) for a in features for b in features],
                    dtype=np.uint64)
    G = gaussian_rows(np.uint64(seed), keys, bits)  # (f*f, bits), tested in test_hashing_kernels
    return np.ascontiguousarray(G.T.reshape(bits, f, f))


def _csr(X: np.ndarray, features: np.ndarray):
    m = sp.csr_matrix(X)
    return m.indptr.astype(np.int64), features[m.indices].astype(np.uint64), m.data


def test_sampled_pairs_follow_w_squared_and_are_unbiased():
    """Lemma 3.4's sampling: i, j drawn with w_i^2/||w||^2, weights ||w||^4/(t w_i w_j).
    Bugs caught: sampling proportional to |w_i| (or uniform), a missing importance weight (the
    estimate of u^T vec(ww^T) biased), an off-by-one in the inverse CDF (the last feature never
    drawn)."""
    w = np.array([[0.5, -2.0, 0.0, 1.0, 3.0]])
    feats = np.array([7, 2, 9, 1, 4], dtype=np.uint64)
    indptr, indices, data = _csr(w, feats)
    t = 200_000
    fi, fj, wt = eh_sample_pairs(indptr, indices, data.astype(np.float64), t,
                                 np.array([123], np.uint64))
    p = (w[0] ** 2) / (w[0] ** 2).sum()
    freq = np.array([(fi[0] == f).mean() for f in feats])
    np.testing.assert_allclose(freq, p, atol=4 * np.sqrt(0.25 / t))
    freq_j = np.array([(fj[0] == f).mean() for f in feats])
    np.testing.assert_allclose(freq_j, p, atol=4 * np.sqrt(0.25 / t))
    pos = {int(f): k for k, f in enumerate(feats)}
    wi = w[0][[pos[int(f)] for f in fi[0]]]
    wj = w[0][[pos[int(f)] for f in fj[0]]]
    np.testing.assert_allclose(wt[0], (w[0] ** 2).sum() ** 2 / (t * wi * wj), rtol=1e-12)
    # unbiased for a fixed u = vec(U_0): the estimate of w^T U_0 w within its sampling error
    U = U_ref(5, feats, 1)[0]
    est_terms = np.array([U[pos[int(a)], pos[int(b)]] for a, b in zip(fi[0], fj[0])]) * wt[0]
    exact = w[0] @ U @ w[0]
    se = est_terms.std() * np.sqrt(t)
    assert abs(est_terms.sum() - exact) < 4 * se


def test_content_seeds_depend_on_row_only():
    """A row's seed does not depend on its position in the batch.  Bug caught: seeding the
    sampling by row number (a query's bits would change with its chunk)."""
    X = np.array([[1.0, 0, 2], [0, 3.0, 0], [1.0, 0, 2.5]])
    ip, ix, d = _csr(X, np.arange(3, dtype=np.uint64))
    s = content_seeds(ip, ix, d.astype(np.float64).view(np.uint64), np.uint64(1))
    ip2, ix2, d2 = _csr(X[::-1].copy(), np.arange(3, dtype=np.uint64))
    s2 = content_seeds(ip2, ix2, d2.astype(np.float64).view(np.uint64), np.uint64(1))
    assert np.array_equal(s, s2[::-1]) and len(set(s.tolist())) == 3


def _margin_ref(X, W, offsets, rows, k, ids):
    D = np.abs(W @ X.T) / np.linalg.norm(W, axis=1)[:, None]
    out_d = np.full((len(W), k), np.inf, np.float32)
    out_r = np.full((len(W), k), -1)
    for q in range(len(W)):
        r = rows[offsets[q]:offsets[q + 1]]
        d32 = D[q, r].astype(np.float32)
        order = np.lexsort((ids[r], d32))[:k]
        out_d[q, :len(order)] = d32[order]
        out_r[q, :len(order)] = r[order]
    return out_d, out_r


def test_rerank_margin_dense_and_sparse():
    """|w^T x|/||w|| top-k of the candidates, both kernels.  Bugs caught: the signed value
    (points on the negative side ranked first), dividing by ||x|| instead of ||w||, ties by
    row rather than id, the sparse query buffer not cleared between queries."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 5)).astype(np.float32)
    X[rng.random(X.shape) < 0.3] = 0
    X[7] = X[2]  # an exact tie
    W = rng.normal(size=(4, 5)) * np.array([[1], [10], [0.1], [3]])
    ids = rng.permutation(1000)[:30].astype(np.int64)  # ids do not rise with rows
    offsets = np.array([0, 12, 12, 25, 40])
    rows = np.concatenate([rng.permutation(30)[:12], rng.permutation(30)[:13],
                           rng.permutation(30)[:15]]).astype(np.int64)
    rows[:2] = [2, 7]
    k = 6
    ed, er = _margin_ref(X.astype(np.float64), W, offsets, rows, k, ids)
    inv = 1.0 / np.linalg.norm(W, axis=1)
    d, r = rerank_margin_dense(offsets, rows, X, W, inv, k, ids)
    np.testing.assert_allclose(d, ed, rtol=1e-5)
    assert np.array_equal(r, er)
    m = sp.csr_matrix(X)
    Wm = sp.csr_matrix(W)
    d2, r2 = rerank_margin_sparse(offsets, rows, m.indptr.astype(np.int64),
                                  m.indices.astype(np.int32), m.data, 5,
                                  Wm.indptr.astype(np.int64), Wm.indices.astype(np.int32),
                                  Wm.data.astype(np.float64), inv, k, ids)
    np.testing.assert_allclose(d2, ed, rtol=1e-5)
    assert np.array_equal(r2, er)
