"""`lshdist._kernels.itml` against the formulas of ARCHITECTURE.md section 2, in plain numpy.

Each test names the plausible bug it catches; each was checked once by planting that bug.
"""

import numpy as np
import pytest

from lshdist._kernels.itml import itml_basis, itml_explicit


def _scalars(p, lam, xi, delta, gamma):
    gp = 1.0 if np.isinf(gamma) else gamma / (gamma + 1)
    alpha = min(lam, delta * gp * (1 / p - 1 / xi))
    new_xi = xi if np.isinf(gamma) else 1 / (1 / xi + delta * alpha / gamma)
    return alpha, new_xi


def _converged(lam, lam_old, tol):
    normsum = np.linalg.norm(lam) + np.linalg.norm(lam_old)
    return normsum == 0 or np.abs(lam_old - lam).sum() / normsum < tol


def itml_reference(A, V, delta, xi, gamma, max_iter, tol, offsets=None):
    """The authors' / metric-learn loop, constraints in the given order.  ``offsets`` (the span
    route's ``||(I-P)v||^2``) enter the learned length p that alpha sees; beta keeps
    ``q = v^T A v``, so that ``A^{-1}`` moves by exactly ``delta alpha v v^T`` (Sherman-Morrison)
    and stays consistent with the dual variables."""
    A, xi = A.copy(), xi.copy()
    offsets = np.zeros(len(V)) if offsets is None else offsets
    lam, lam_old = np.zeros(len(V)), np.zeros(len(V))
    for n_iter in range(1, max_iter + 1):
        for c, v in enumerate(V):
            q = v @ A @ v
            if q <= 1e-12:
                continue
            alpha, xi[c] = _scalars(q + offsets[c], lam[c], xi[c], delta[c], gamma)
            lam[c] -= alpha
            beta = delta[c] * alpha / (1 - delta[c] * alpha * q)
            Av = A @ v
            A += beta * np.outer(Av, Av)
        if _converged(lam, lam_old, tol):
            return A, n_iter
        lam_old = lam.copy()
    return A, max_iter


def itml_basis_reference(K0, I, J, delta, xi, gamma, max_iter, tol):
    """Eq. 5, Lemma 1 and Lemma 2 written as matrices: returns (S, K, n_iter)."""
    c = len(K0)
    Id = np.eye(c)
    S, K, xi = np.zeros((c, c)), K0.copy(), xi.copy()
    lam, lam_old = np.zeros(len(I)), np.zeros(len(I))
    for n_iter in range(1, max_iter + 1):
        for t, (i, j) in enumerate(zip(I, J)):
            e = Id[i] - Id[j]
            p = e @ K @ e
            if p <= 1e-12:
                continue
            alpha, xi[t] = _scalars(p, lam[t], xi[t], delta[t], gamma)
            lam[t] -= alpha
            beta = delta[t] * alpha / (1 - delta[t] * alpha * p)
            K = K + beta * K @ np.outer(e, e) @ K  # eq. 5
            alpha_t = (np.sqrt(1 + beta * p) - 1) / p  # Lemma 1
            a = (Id + S @ K0) @ e  # Lemma 2
            S = S + alpha_t * np.outer(a, a) @ (Id + K0 @ S)
        if _converged(lam, lam_old, tol):
            return S, K, n_iter
        lam_old = lam.copy()
    return S, K, max_iter


@pytest.fixture(scope="module")
def pairs_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 8))
    X[:, 0] += 3 * rng.integers(0, 3, 30)
    pairs = rng.permutation(np.array(np.triu_indices(30, 1)).T)[:60]
    delta = np.where(rng.random(60) < 0.5, 1.0, -1.0)
    return X, pairs, delta


@pytest.mark.parametrize("block", [1, 2, 7, 64])
@pytest.mark.parametrize("gamma", [1.0, np.inf])
def test_itml_explicit_matches_numpy(pairs_data, gamma, block):
    # Bugs caught: the slack update's sign (1/xi - delta alpha / gamma); gamma/(gamma+1) dropped;
    # a zero-length pair divided by instead of skipped; the wrong stopping pass (off by one).
    # Blocked (60 pairs: blocks of 2, of 7 with a short last one, one block of all): a block's
    # earlier updates left out of A v (or counted twice), a skipped pair's stale u added to A,
    # a block's rows of A_k v taken from the wrong constraints.
    X, pairs, delta = pairs_data
    V = X[pairs[:, 0]] - X[pairs[:, 1]]
    V[3] = 0.0  # a zero-length pair is skipped, never divided by
    xi = np.where(delta > 0, 5.0, 40.0)
    M = np.random.default_rng(1).normal(size=(8, 8))
    A0 = np.eye(8) + 0.05 * M @ M.T  # a prior other than I (symmetric, as every prior is)
    ref, it_ref = itml_reference(A0, V, delta, xi, gamma, 30, 1e-3)
    A = A0.copy()
    it, _ = itml_explicit(A, np.ascontiguousarray(V), delta, xi.copy(), np.zeros(len(V)), gamma,
                          30, 1e-3, block)
    assert it == it_ref
    np.testing.assert_allclose(A, ref, rtol=1e-10, atol=1e-12)
    assert not np.allclose(A, np.eye(8), atol=1e-2)  # it learned something


@pytest.mark.parametrize("block", [1, 7])
def test_itml_explicit_offsets_match_numpy(pairs_data, block):
    # Bug caught: the span route's constant ||(I-P)v||^2 dropped from the learned length (or
    # added to q inside beta as well, which breaks A^{-1}'s consistency with the duals).
    X, pairs, delta = pairs_data
    V = X[pairs[:, 0], :4] - X[pairs[:, 1], :4]  # "span coordinates"
    offsets = ((X[pairs[:, 0], 4:] - X[pairs[:, 1], 4:]) ** 2).sum(1)  # "the rest"
    xi = np.where(delta > 0, 5.0, 40.0)
    ref, it_ref = itml_reference(np.eye(4), V, delta, xi, 1.0, 30, 1e-3, offsets)
    no_offset, _ = itml_reference(np.eye(4), V, delta, xi, 1.0, 30, 1e-3)
    A = np.eye(4)
    it, _ = itml_explicit(A, np.ascontiguousarray(V), delta, xi.copy(), offsets, 1.0, 30, 1e-3,
                          block)
    assert it == it_ref
    np.testing.assert_allclose(A, ref, rtol=1e-10, atol=1e-12)
    assert np.abs(no_offset - ref).max() > 1e-2  # the offsets matter on this data


@pytest.mark.parametrize("gamma", [1.0, np.inf])
def test_itml_basis_matches_numpy(pairs_data, gamma):
    # Bugs caught: Lemma 2 transposed (a^T (I + S K0) for a^T (I + K0 S)), which only shows with
    # an asymmetric S; e = e_i + e_j (a sign); Lemma 1's sqrt(1 + beta p) written sqrt(1 - beta p).
    X, pairs, delta = pairs_data
    c = 7
    Phi = X[:c].T  # d x c, d > c
    K0 = Phi.T @ Phi
    bp = pairs[(pairs < c).all(1)]
    bd = delta[(pairs < c).all(1)]
    assert len(bp) >= 2
    xi = np.where(bd > 0, 5.0, 40.0)
    S_ref, K_ref, it_ref = itml_basis_reference(K0, bp[:, 0], bp[:, 1], bd, xi, gamma, 20, 1e-6)
    S, K = np.zeros((c, c)), K0.copy()
    it, _ = itml_basis(K0, S, K, bp[:, 0].copy(), bp[:, 1].copy(), bd, xi.copy(), gamma, 20, 1e-6)
    assert it == it_ref
    assert np.abs(S_ref - S_ref.T).max() > 1e-3 * np.abs(S_ref).max()  # asymmetric: a real test
    np.testing.assert_allclose(S, S_ref, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(K, K_ref, rtol=1e-9, atol=1e-9)
    G = np.eye(8) + Phi @ S @ Phi.T  # K_t = Phi^T G^T G Phi (eq. 5 and Lemma 2 agree)
    np.testing.assert_allclose(Phi.T @ G.T @ G @ Phi, K, rtol=1e-8, atol=1e-8)
