"""`lshdist._kernels.ehhash` against a plain numpy reference of EH-Hash's symmetric U.

Each test names the plausible bug it catches; each was checked once by planting that bug.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from lshdist._kernels.ehhash import (
    eh_matrix,
    eh_multipliers,
    eh_project_rows,
    eh_project_sampled,
    top_terms,
)
from lshdist.hashing.hyperplane import gaussian_table

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
SALT = 0x6A09E667F3BCC909


def splitmix_ref(x: int) -> int:
    z = (x + GOLDEN) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def table_ref() -> np.ndarray:
    q = stats.norm.ppf((np.arange(4096) + 0.5) / 4096)
    return (q / np.sqrt(np.mean(q**2))).astype(np.float32).astype(np.float64)


def mult_ref(seed: int, bits: int) -> list[int]:
    s = splitmix_ref(splitmix_ref(seed) ^ SALT)
    return [splitmix_ref((s + b * GOLDEN) & MASK) | 1 for b in range(bits)]


def G_ref(seed: int, i: int, j: int, bits: int) -> np.ndarray:
    """G_b(min(i, j), max(i, j)) for b < bits: the pair key, then a table value per bit."""
    lo, hi = min(i, j), max(i, j)
    key = splitmix_ref((splitmix_ref(lo) + hi * GOLDEN) & MASK)
    K = splitmix_ref(splitmix_ref(seed) ^ key)
    T = table_ref()
    return np.array([T[((K * m) & MASK) >> 52] for m in mult_ref(seed, bits)])


def U_ref(seed: int, features: np.ndarray, bits: int) -> np.ndarray:
    """Symmetric U (bits, f, f): G on the diagonal, G / sqrt(2) off it."""
    f = len(features)
    U = np.zeros((bits, f, f))
    for a in range(f):
        for b in range(a, f):
            g = G_ref(seed, int(features[a]), int(features[b]), bits)
            U[:, a, b] = U[:, b, a] = g if a == b else g / np.sqrt(2)
    return U


def _csr(X: np.ndarray, features: np.ndarray):
    m = sp.csr_matrix(X)
    return m.indptr.astype(np.int64), features[m.indices].astype(np.uint64), m.data


def _rows(indptr, indices, data, seed, bits, start=0, stop=None):
    n = len(indptr) - 1
    out = np.full((n, bits), 7.0)  # rows outside start..stop keep this
    eh_project_rows(indptr, indices, data, np.uint64(seed), eh_multipliers(np.uint64(seed), bits),
                    gaussian_table(), start, n if stop is None else stop, out)
    return out


def test_table_and_multipliers_match_reference():
    """The table is the float32-rounded unit-variance quantiles and the multipliers are odd,
    seed-dependent and a prefix for fewer bits.  Bugs caught: quantiles at k/4096 (an
    infinite first entry), no variance scaling, an even multiplier (the top bits of K * m lose
    K's top bit), multipliers depending on the number of bits."""
    T = gaussian_table()
    np.testing.assert_array_equal(T, table_ref())
    assert np.all(np.isfinite(T)) and T.mean() == pytest.approx(0, abs=1e-12)
    assert np.mean(T**2) == pytest.approx(1, abs=1e-6)
    m = eh_multipliers(np.uint64(3), 70)
    assert [int(v) for v in m] == mult_ref(3, 70)
    assert np.all(m & np.uint64(1) == 1)
    np.testing.assert_array_equal(eh_multipliers(np.uint64(3), 64), m[:64])
    assert not np.array_equal(eh_multipliers(np.uint64(4), 70), m)


def test_eh_project_rows_equals_quadratic_form():
    """x^T U_b x against the symmetric U built in numpy, over feature ids not rising with the
    column and an empty row; only rows start..stop are written.  Bugs caught: the off-diagonal
    weight x_i x_j instead of sqrt(2) x_i x_j (variance ||x||^4 lost), diagonal pairs skipped,
    pairs with p > q counted twice, a row's pairs running into the next row (indptr off by
    one), rows outside the range overwritten or rows not zeroed first."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(7, 6))
    X[rng.random(X.shape) < 0.4] = 0.0
    X[3] = 0.0
    features = np.array([40, 3, 977, 12, 2**40 + 5, 8], dtype=np.uint64)
    U = U_ref(11, features, 9)
    expect = np.einsum("ni,bij,nj->nb", X, U, X)
    got = _rows(*_csr(X, features), 11, 9)
    np.testing.assert_allclose(got, expect, rtol=1e-10, atol=1e-10)
    part = _rows(*_csr(X, features), 11, 9, start=2, stop=5)
    np.testing.assert_allclose(part[2:5], expect[2:5], rtol=1e-10, atol=1e-10)
    assert np.all(part[:2] == 7.0) and np.all(part[5:] == 7.0)


def test_repeated_feature_ids_add_up():
    """A row naming a feature twice hashes as the row with the two values summed.  Bug caught:
    a repeated id taken as an off-diagonal pair (weight sqrt(2) x_p x_q, not 2 x_p x_q)."""
    ip = np.array([0, 3, 5], np.int64)
    ix = np.array([5, 9, 5, 9, 2], np.uint64)
    data = np.array([0.5, -1.0, 1.5, 2.0, 0.25])
    merged = _rows(np.array([0, 2, 4], np.int64), np.array([5, 9, 9, 2], np.uint64),
                   np.array([2.0, -1.0, 2.0, 0.25]), 4, 33)
    np.testing.assert_allclose(_rows(ip, ix, data, 4, 33), merged, rtol=1e-12, atol=1e-12)


def test_eh_matrix_equals_reference_and_is_symmetric():
    """The dense path's U equals the reference.  Bugs caught: U filled on one triangle only,
    the diagonal divided by sqrt(2)."""
    feats = np.array([0, 7, 3, 1], np.uint64)
    U = eh_matrix(feats, np.uint64(2), eh_multipliers(np.uint64(2), 5), gaussian_table())
    np.testing.assert_allclose(U, U_ref(2, feats, 5), rtol=1e-12)


def test_eh_project_sampled_equals_dense_sum():
    """sum_s wt_s U_b[fi_s, fj_s] against numpy, zero weights skipped.  Bugs caught: an
    off-diagonal sample weighted by G not G / sqrt(2), padding (weight 0) read as the pair of
    feature 0."""
    feats = np.array([4, 0, 9], dtype=np.uint64)
    U = U_ref(2, feats, 6)
    fi = np.array([[4, 9, 0, 0], [0, 0, 9, 4]], np.uint64)
    fj = np.array([[9, 9, 4, 0], [4, 9, 0, 4]], np.uint64)
    wt = np.array([[1.5, -2.0, 0.5, 0.0], [3.0, 1.0, -1.0, 2.5]])
    pos = {4: 0, 0: 1, 9: 2}
    expect = np.zeros((2, 6))
    for r in range(2):
        for s in range(4):
            expect[r] += wt[r, s] * U[:, pos[int(fi[r, s])], pos[int(fj[r, s])]]
    got = eh_project_sampled(fi, fj, wt, np.uint64(2), eh_multipliers(np.uint64(2), 6),
                             gaussian_table())
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)


def test_pair_gaussians_are_standard_normal_and_uncorrelated():
    """Over 20,000 pairs: each bit's values N(0, 1) (Kolmogorov-Smirnov against the normal,
    the table's 1/4096 steps far below the test's resolution), and bits and pairs
    uncorrelated (|corr| < 0.03 between bits, a pair's values not those of another).  Bugs
    caught: the bottom bits of K * m taken (bit 0 is K's bit 0 for every multiplier: bits
    perfectly correlated), one multiplier for every bit, the table indexed by the pair alone."""
    rng = np.random.default_rng(5)
    ids = rng.choice(2**40, size=(20_000, 2), replace=False).astype(np.uint64)
    bits = 16
    mult = eh_multipliers(np.uint64(1), bits)
    fi, fj = ids[:, :1].copy(), ids[:, 1:].copy()
    G = eh_project_sampled(fi, fj, np.full((len(ids), 1), np.sqrt(2)), np.uint64(1), mult,
                           gaussian_table())
    for b in range(bits):
        assert stats.kstest(G[:, b], "norm").pvalue > 1e-3, b
    C = np.corrcoef(G.T)
    assert np.abs(C[np.triu_indices(bits, 1)]).max() < 0.03
    assert np.abs(np.corrcoef(G[:-1, 0], G[1:, 0])[0, 1]) < 0.03


def top_terms_ref(indptr, indices, data, m):
    """Each row's m largest |value| (ties: smaller feature id), zeros dropped, row order kept."""
    ptr, ids, vals = [0], [], []
    for r in range(len(indptr) - 1):
        i, v = indices[indptr[r]:indptr[r + 1]], data[indptr[r]:indptr[r + 1]]
        nz = np.flatnonzero(v != 0)
        order = nz[np.lexsort((i[nz], -np.abs(v[nz])))][:m]
        keep = np.sort(order)
        ids.extend(i[keep]), vals.extend(v[keep]), ptr.append(ptr[-1] + len(keep))
    return np.array(ptr), np.array(ids, np.uint64), np.array(vals)


def test_top_terms_equals_reference():
    """The m largest entries of each row against numpy's lexsort, with ties in |value| across
    feature ids not in row order, explicit zeros, a row shorter than m and an empty row.
    Bugs caught: ties broken by position instead of feature id (the key of a row would depend
    on how its entries are stored), the smallest entries kept (sign of the sort key), values
    compared with their signs (a large negative entry dropped), zeros kept, the row order
    lost (entries moved to another feature)."""
    ip = np.array([0, 6, 8, 8, 13], np.int64)
    ix = np.array([50, 7, 900, 3, 2**63 + 1, 12, 4, 5, 9, 1, 8, 2, 6], np.uint64)
    data = np.array([0.5, -2.0, 0.5, 0.0, 1.0, -0.5, 3.0, 0.0, 1.0, -1.0, 1.0, 0.1, -1.0])
    for m in (1, 2, 3, 4, 10):
        got = top_terms(ip, ix, data, m)
        ref = top_terms_ref(ip, ix, data, m)
        for g, e in zip(got, ref):
            np.testing.assert_array_equal(g, e)
    ids = top_terms(ip, ix, data, 3)[1]
    assert ids[:3].tolist() == [7, 2**63 + 1, 12]  # -2, 1, then -0.5 at 12 before 0.5s
    assert ids[3:4].tolist() == [4] and ids[4:].tolist() == [1, 8, 6]  # |v| = 1: ids 1, 6, 8
    rng = np.random.default_rng(8)
    X = np.round(rng.normal(size=(40, 30)), 1) * (rng.random((40, 30)) < 0.5)
    feats = rng.choice(2**40, 30, replace=False).astype(np.uint64)
    a, b, c = _csr(X, feats)
    for m in (5, 17):
        for g, e in zip(top_terms(a, b, c, m), top_terms_ref(a, b, c, m)):
            np.testing.assert_array_equal(g, e)
