"""ITML Bregman projections (ARCHITECTURE.md section 2), O(d^2) or O(c^2) each."""

import numpy as np
from numba import njit

_TINY = 1e-12

#: reassociation (with nsz/arcp) lets LLVM vectorise the O(d^2) loops: 3.5x at d=784.  No
#: "no-inf/no-nan" flags: gamma may be inf and the convergence test compares with inf.
_FAST = {"reassoc", "contract", "nsz", "arcp"}


@njit(cache=True, nogil=True)
def _project_scalars(p, lam, xi, delta, gamma):
    """Return (alpha, new_xi) of one ITML projection for a pair of learned length p."""
    if np.isinf(gamma):
        gproj = 1.0
    else:
        gproj = gamma / (gamma + 1.0)
    alpha = min(lam, delta * gproj * (1.0 / p - 1.0 / xi))
    if np.isinf(gamma):
        new_xi = xi
    else:
        new_xi = 1.0 / (1.0 / xi + delta * alpha / gamma)
    return alpha, new_xi


@njit(cache=True, nogil=True, inline="always")
def _project(t, p, q, lam, xi, delta, gamma):
    """Constraint ``t``'s projection on the duals (``lam[t]``, ``xi[t]`` updated); returns the
    scale beta of its rank-one step.  ``p``: the learned length alpha sees; ``q = v^T A v``, which
    beta keeps (they differ by the span route's offset)."""
    alpha, new_xi = _project_scalars(p, lam[t], xi[t], delta[t], gamma)
    lam[t] -= alpha
    xi[t] = new_xi
    return delta[t] * alpha / (1.0 - delta[t] * alpha * q)


@njit(cache=True, nogil=True, fastmath=_FAST, inline="always")
def _add_outer(M, scale, a, b):
    """``M += scale * a b^T`` in place (the rank-one step of every projection)."""
    for r in range(a.shape[0]):
        sr = scale * a[r]
        for k in range(b.shape[0]):
            M[r, k] += sr * b[k]


@njit(cache=True, nogil=True)
def _dual_change(lam, lam_old):
    """metric-learn's convergence measure ``sum|lam - lam_old| / (||lam|| + ||lam_old||)``;
    inf when both are zero (no constraint was ever active: nothing left to do)."""
    normsum = np.sqrt(np.sum(lam * lam)) + np.sqrt(np.sum(lam_old * lam_old))
    if normsum == 0.0:
        return np.inf
    return np.sum(np.abs(lam_old - lam)) / normsum


@njit(cache=True, nogil=True, fastmath=_FAST)
def _itml_sequential(A, V, delta, xi, offsets, gamma, max_iter, tol):
    """`itml_explicit` a constraint at a time (small d): the product ``A v`` and the rank-one
    update as loops."""
    n, d = V.shape
    lam = np.zeros(n)
    lam_old = np.zeros(n)
    Av = np.empty(d)
    conv = np.inf
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - the passes made are returned
        for c in range(n):
            for r in range(d):
                s = 0.0
                for k in range(d):
                    s += A[r, k] * V[c, k]
                Av[r] = s
            q = 0.0
            for r in range(d):
                q += V[c, r] * Av[r]
            if q <= _TINY:
                continue  # zero-length pair: nothing to project, never divide by it
            beta = _project(c, q + offsets[c], q, lam, xi, delta, gamma)
            _add_outer(A, beta, Av, Av)
        conv = _dual_change(lam, lam_old)
        if conv < tol or np.isinf(conv):
            break
        lam_old[:] = lam
    return it, conv


def explicit_block(d: int) -> int:
    """Constraints per block of `itml_explicit`: one below d = 64 (a matrix product's call
    costs more than the loop it replaces: Letter's 16-d fit 0.041 s a constraint at a time,
    0.069 s at best blocked), else ``min(64, d // 2)`` (d = 784: 3.4 -> 0.40 s a pass of 10,000
    pairs; d = 128: 0.21 -> 0.12 s; measured)."""
    return 1 if d < 64 else int(min(64, d // 2))


@njit(cache=True, nogil=True, fastmath=_FAST)
def itml_explicit(A, V, delta, xi, offsets, gamma, max_iter, tol, block=1):
    """Cyclic ITML projections on an explicit matrix, in place.

    Each projection needs ``A v`` for the current ``A``; the sequential loop streams the
    d x d matrix twice per constraint (the product, then the rank-one update), which binds it
    to memory at large d (3.4 s a pass of 10,000 pairs at d = 784).  Here constraints are taken
    ``block`` at a time: ``A_k v_j`` for the whole block is one matrix product, the updates
    of earlier constraints of the block are added as ``sum_i beta_i u_i (u_i^T v_j)`` (exact:
    ``A = A_k + sum_i beta_i u_i u_i^T``), and ``A`` is updated once per block by a rank-``block``
    product.  The same projections in the same order — the result differs from the
    constraint-at-a-time loop (``block=1``) only by rounding.

    Parameters
    ----------
    A : float64 (d, d), updated in place (the prior on entry, the learned matrix on exit)
    V : float64 (n, d), difference vectors ``x_i - x_j`` of the constraints, in order
    delta : float64 (n,), +1 similar, -1 dissimilar
    xi : float64 (n,), the bound of each constraint (u or l), updated in place (slack targets)
    offsets : float64 (n,), a constant added to every learned length ``v^T A v`` (0 for explicit
        ITML; ``||(I-P)v||^2`` for the span-coordinate route of the kernelized learner)
    gamma : float, slack (``inf`` for hard constraints)
    max_iter : int, passes over all constraints
    tol : float, stop when ``sum|lam - lam_old| / (||lam|| + ||lam_old||) < tol``
    block : int, constraints per block (`explicit_block`)

    Returns
    -------
    n_iter : int, conv : float
    """
    n, d = V.shape
    if block <= 1:
        return _itml_sequential(A, V, delta, xi, offsets, gamma, max_iter, tol)
    B = max(1, min(block, n))
    lam = np.zeros(n)
    lam_old = np.zeros(n)
    U = np.zeros((B, d))  # u_i = A v_i at the time of constraint i of the block
    beta = np.zeros(B)
    conv = np.inf
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - the passes made are returned
        for c0 in range(0, n, B):
            nb = min(B, n - c0)
            P = V[c0:c0 + nb] @ A.T  # row j: A_k v_j
            for j in range(nb):
                c = c0 + j
                for i in range(j):  # the block's earlier updates
                    if beta[i] != 0.0:
                        s = 0.0
                        for k in range(d):
                            s += U[i, k] * V[c, k]
                        s *= beta[i]
                        for k in range(d):
                            P[j, k] += s * U[i, k]
                beta[j] = 0.0
                q = 0.0
                for k in range(d):
                    q += V[c, k] * P[j, k]
                if q <= _TINY:
                    continue  # zero-length pair: nothing to project, never divide by it
                beta[j] = _project(c, q + offsets[c], q, lam, xi, delta, gamma)
                U[j] = P[j]
            W = U[:nb].T * beta[:nb]
            A += W @ U[:nb]
            beta[:] = 0.0
        conv = _dual_change(lam, lam_old)
        if conv < tol or np.isinf(conv):
            break
        lam_old[:] = lam
    return it, conv


@njit(cache=True, nogil=True, fastmath=_FAST)
def itml_basis(K0, S, K, I, J, delta, xi, gamma, max_iter, tol):
    """Kernelized ITML over basis points: eq. 5 on K and Lemma 2 on S, in place, O(c^2) each.

    Parameters
    ----------
    K0 : float64 (c, c), kernel matrix of the basis
    S : float64 (c, c), zeros on entry; ``G = I + Phi S Phi^T`` on exit
    K : float64 (c, c), a copy of K0 on entry; ``Phi^T A Phi`` on exit
    I, J : int64 (n,), basis indices of each constraint
    delta, xi, gamma, max_iter, tol : as in `itml_explicit`
    """
    n = I.shape[0]
    c = K0.shape[0]
    lam = np.zeros(n)
    lam_old = np.zeros(n)
    Ke = np.empty(c)
    a = np.empty(c)
    bt = np.empty(c)
    aK0 = np.empty(c)
    conv = np.inf
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - the passes made are returned
        for t in range(n):
            i = I[t]
            j = J[t]
            p = K[i, i] + K[j, j] - 2.0 * K[i, j]
            if p <= _TINY:
                continue
            beta = _project(t, p, p, lam, xi, delta, gamma)
            # eq. 5: K <- K + beta K e e^T K
            for r in range(c):
                Ke[r] = K[r, i] - K[r, j]
            _add_outer(K, beta, Ke, Ke)
            # Lemma 1 and Lemma 2
            alpha_l = (np.sqrt(1.0 + beta * p) - 1.0) / p
            for r in range(c):
                s = 0.0
                for k in range(c):
                    s += S[r, k] * (K0[k, i] - K0[k, j])
                a[r] = s
            a[i] += 1.0
            a[j] -= 1.0
            for k in range(c):
                s = 0.0
                for r in range(c):
                    s += a[r] * K0[r, k]
                aK0[k] = s
            for k in range(c):
                s = 0.0
                for r in range(c):
                    s += aK0[r] * S[r, k]
                bt[k] = a[k] + s
            _add_outer(S, alpha_l, a, bt)
        conv = _dual_change(lam, lam_old)
        if conv < tol or np.isinf(conv):
            break
        lam_old[:] = lam
    return it, conv
