"""Randomized block Krylov (Musco & Musco 2015) against a dense SVD.

Theorem 1 of the paper is the tolerance: ``‖A − A V Vᵀ‖ ≤ (1+ε) ‖A − A_k‖`` (spectral and
Frobenius).  The matrices have a slowly decaying spectrum (σ_i = i^-0.25: a heavy tail, where a
plain randomized SVD is poor), so the measured ε separates q=0 from q=4.
"""

import dask.array as da
import numpy as np
import pytest

from lshdist.errors import InputError
from lshdist.index.krylov import block_krylov, subspace_residuals


def _matrix(n, d, rate, seed=0):
    """A = U diag(σ) Wᵀ with σ_i = i^-rate, random orthonormal U (n, d), W (d, d)."""
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((n, d)))[0]
    W = np.linalg.qr(rng.standard_normal((d, d)))[0]
    s = np.arange(1, d + 1, dtype=float) ** -rate
    return (U * s) @ W.T, s


def _eps(A, V, s, k):
    """Measured ε of Theorem 1: spectral and Frobenius."""
    R = A - A @ V @ V.T
    spec = np.linalg.norm(R, 2) / s[k] - 1
    fro = np.linalg.norm(R) / np.sqrt((s[k:] ** 2).sum()) - 1
    return spec, fro


@pytest.fixture(scope="module")
def heavy_tail():
    return _matrix(1000, 300, 0.25, seed=4)


def test_theorem1_bound_heavy_tail(heavy_tail):
    A, s = heavy_tail
    k = 10
    V = block_krylov(A, k, q=4, seed=1)
    assert np.allclose(V.T @ V, np.eye(k), atol=1e-12)
    spec, fro = _eps(A, V, s, k)
    # measured: spec 7.8e-4, fro 5.3e-5 (the bar: eps <= 0.05)
    assert spec <= 2e-3 and fro <= 1e-4, (spec, fro)
    # q=0 is the plain randomized SVD: the same bound fails there (measured spec 0.34, fro 0.037)
    spec0, fro0 = _eps(A, block_krylov(A, k, q=0, seed=1), s, k)
    assert spec0 > 0.1 and fro0 > 0.02, (spec0, fro0)


def test_ritz_values_and_order(heavy_tail):
    """A V has the top-k singular values, in decreasing order (a transpose or a left/right mix-up
    gives a basis of the wrong space: these values drop)."""
    A, s = heavy_tail
    V = block_krylov(A, 8, q=4, seed=2)
    sv = np.linalg.svd(A @ V, compute_uv=False)
    assert np.allclose(sv, s[:8], rtol=5e-3)  # measured: 1e-9 for the first, 3e-3 the 8th
    norms = np.linalg.norm(A @ V, axis=0)  # the first column is the top Ritz vector
    assert norms[0] == pytest.approx(s[0], rel=1e-3) and norms[-1] < norms[0]


def test_dask_equals_numpy_any_chunking(heavy_tail):
    A, _ = heavy_tail
    A32 = A.astype(np.float32)
    V = block_krylov(A32, 6, q=3, seed=5)
    for chunks in [(128, 300), (333, 300), (1000, 300)]:
        Vd = block_krylov(da.from_array(A32, chunks=chunks), 6, q=3, seed=5)
        assert Vd.shape == (300, 6)
        # same basis (up to rounding in the summation order over chunks)
        assert np.abs(np.abs(np.sum(V * Vd, axis=0)) - 1).max() < 1e-8
        assert np.abs(Vd @ Vd.T - V @ V.T).max() < 1e-8


def test_same_seed_same_basis(heavy_tail):
    A, _ = heavy_tail
    assert np.array_equal(block_krylov(A, 5, 2, seed=9), block_krylov(A, 5, 2, seed=9))
    assert not np.array_equal(block_krylov(A, 5, 1, seed=9), block_krylov(A, 5, 1, seed=10))


def test_rank_deficient_completed():
    """rank(A) = 3 < k = 5: the basis spans the row space and is completed orthonormally."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((200, 3)) @ rng.standard_normal((3, 40))
    V = block_krylov(A, 5, q=3, seed=0)
    assert np.allclose(V.T @ V, np.eye(5), atol=1e-10)
    assert subspace_residuals(A, V).max() < 1e-8 * np.linalg.norm(A)
    Z = block_krylov(np.zeros((10, 4)), 2, q=1)
    assert np.allclose(Z.T @ Z, np.eye(2))


def test_subspace_residuals_exact():
    rng = np.random.default_rng(1)
    V = np.linalg.qr(rng.standard_normal((7, 2)))[0]
    X = rng.standard_normal((50, 7))
    expected = np.linalg.norm(X - X @ V @ V.T, axis=1)
    assert np.allclose(subspace_residuals(X, V), expected, rtol=1e-12)


def test_errors():
    A = np.ones((5, 4))
    with pytest.raises(InputError, match=r"k=0: the rank must be an integer in \[1, d=4\]"):
        block_krylov(A, 0)
    with pytest.raises(InputError, match=r"k=5"):
        block_krylov(A, 5)
    with pytest.raises(InputError, match="q=-1"):
        block_krylov(A, 2, q=-1)
    with pytest.raises(InputError, match="2-d"):
        block_krylov(np.ones(4), 1)
    with pytest.raises(InputError, match="empty"):
        block_krylov(np.ones((0, 4)), 1)
    bad = A.copy()
    bad[2, 1] = np.nan
    with pytest.raises(InputError, match="NaN"):
        block_krylov(bad, 2)
    with pytest.raises(InputError, match="NaN"):
        block_krylov(da.from_array(bad, chunks=(2, 4)), 2)
