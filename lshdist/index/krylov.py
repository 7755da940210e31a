"""Randomized block Krylov iteration (Musco & Musco 2015) for the top-k right singular subspace.

Algorithm 2 of the paper on a tall ``A`` (n x d): the Krylov space
``K = [A Π, (A Aᵀ) A Π, ..., (A Aᵀ)^q A Π]`` (n x (q+1)k) from a Gaussian Π (d x k),
an orthonormal basis ``Q`` of it, and the top-k singular vectors of the projection ``Q Qᵀ A``.
Theorem 1 of the paper: with ``q = Θ(log d / √ε)``, the rank-k basis ``Z`` satisfies
``‖A − Z Zᵀ A‖ ≤ (1+ε) ‖A − A_k‖`` in the spectral and Frobenius norms.

Here the right subspace is returned: ``V`` (d x k), the top-k left singular vectors of
``B = Aᵀ Q`` (d x (q+1)k).  ``Q Qᵀ A = Q Y S Wᵀ`` for the SVD ``Qᵀ A = Y S Wᵀ``; Musco's
``Z Zᵀ A`` is ``(Q Y_k S_k) V ᵀ`` with ``V = W_k``, and no matrix ``X`` does better than
``X = A V`` in ``‖A − X Vᵀ‖`` (both norms), so ``‖A − A V Vᵀ‖ ≤ ‖A − Z Zᵀ A‖``: the theorem's
bound holds for ``V`` whenever it holds for ``Z``.

How it is computed (one pass over ``A`` per block, nothing n-sized on the driver):
``K`` is never formed.  Each block is ``Q_j = A T_j`` with ``T_j`` (d x k) on the driver; a pass
computes ``S_j = Aᵀ A P_j`` (d x k) for the block's start ``P_j`` (orthonormal, d x k), the
block's Gram ``P_jᵀ S_j`` (k x k) gives ``T_j = P_j C_j`` with ``A T_j`` orthonormal, and the next
start is ``P_{j+1} = orth(Aᵀ Q_j) = orth(S_j C_j)``: the same span as ``(A Aᵀ)^{j+1} A Π``
(orthonormalised powers, the numerically safe way to build the same Krylov space).  Then
``Q = A T C`` with ``C`` from the Gram ``Tᵀ Aᵀ A T`` (assembled from the ``S_j``) and
``B = Aᵀ Q = [S_0 C_0, ..., S_q C_q] C``.  The driver holds d x (q+1)k and (q+1)k x (q+1)k
matrices only; for a dask array each ``Aᵀ (A P)`` is a dask.array expression (blockwise
products over row chunks and a sum), computed to its d x k result.

Directions whose Gram eigenvalue falls below ``RANK_TOL`` times the largest are dropped (an
exactly rank-deficient ``A``, or a Krylov space that has converged); if fewer than k directions
remain (rank(A) < k) the basis is completed with orthonormal directions that ``A`` does not use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lshdist.errors import InputError

#: relative eigenvalue below which a direction of a Gram matrix counts as absent
RANK_TOL = 1e-10
#: rows per block of the one-process product ``Aᵀ (A P)`` (bounds the float64 copy)
ROW_BLOCK = 16_384


def _is_dask(A: Any) -> bool:
    return type(A).__module__.split(".")[0] == "dask"


def _check(A: Any, k: int, q: int) -> tuple[int, int]:
    shape = getattr(A, "shape", None)
    if shape is None or len(shape) != 2:
        raise InputError(f"A must be a 2-d array (n x d), got shape {shape}")
    n, d = int(shape[0]), int(shape[1])
    if n == 0 or d == 0:
        raise InputError(f"A is empty (shape {(n, d)}); give at least one row and one column")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= d:
        raise InputError(f"k={k!r}: the rank must be an integer in [1, d={d}]")
    if not isinstance(q, (int, np.integer)) or isinstance(q, bool) or q < 0:
        raise InputError(f"q={q!r}: the number of Krylov iterations must be an integer >= 0")
    if np.dtype(A.dtype).kind not in "biuf":
        raise InputError(f"A has dtype {A.dtype}, but must be numeric")
    return n, d


def gram_apply(A: Any, P: np.ndarray) -> np.ndarray:
    """``Aᵀ (A P)``, float64 (d, m), for ``A`` (n, d) numpy or dask and ``P`` float64 (d, m).

    numpy: accumulated over blocks of `ROW_BLOCK` rows in float64.  dask: one task per row
    chunk computes its ``Aᵢᵀ (Aᵢ P)`` (d x m, `_chunk_gram`) and the partial products are summed
    (dask.array ``map_blocks`` + ``sum``): only the d x m result reaches the caller.  (dask's
    own ``A.T @ (A @ P)`` computes the same in about twice the time: float64 copies of the
    chunks and a contraction graph, measured on 60,000 x 784.)
    """
    if _is_dask(A):
        if len(A.chunks[1]) != 1:
            A = A.rechunk({1: -1})
        d, m = A.shape[1], P.shape[1]
        parts = A.map_blocks(_chunk_gram, P, new_axis=2, dtype=np.float64,
                             chunks=((1,) * A.numblocks[0], (d,), (m,)),
                             meta=np.empty((0, 0, 0), np.float64))
        out = np.asarray(parts.sum(axis=0).compute(), dtype=np.float64)
        if not np.all(np.isfinite(out)):
            raise InputError("A holds NaN or infinite values")
        return out
    A = np.asarray(A)
    S = np.zeros((A.shape[1], P.shape[1]))
    for lo in range(0, A.shape[0], ROW_BLOCK):
        Ab = A[lo : lo + ROW_BLOCK].astype(np.float64)
        S += Ab.T @ (Ab @ P)
    if not np.all(np.isfinite(S)):
        raise InputError("A holds NaN or infinite values")
    return S


def _chunk_gram(A: np.ndarray, P: np.ndarray) -> np.ndarray:
    """``Aᵀ (A P)`` of one row chunk, float64 (1, d, m) (`gram_apply` on dask)."""
    A64 = np.asarray(A, np.float64)
    out: np.ndarray = (A64.T @ (A64 @ P))[None]
    return out


def _inv_sqrt(H: np.ndarray) -> np.ndarray:
    """``C`` (m, m') with ``Cᵀ H C = I`` over the eigen-directions of the PSD ``H`` above
    `RANK_TOL` of its largest eigenvalue (m' may be smaller than m, or 0)."""
    H = 0.5 * (H + H.T)
    lam, U = np.linalg.eigh(H)
    top = float(lam[-1]) if len(lam) else 0.0
    if top <= 0.0:
        return np.zeros((H.shape[0], 0))
    keep = lam > RANK_TOL * top
    out: np.ndarray = U[:, keep] / np.sqrt(lam[keep])
    return out


def _orth(X: np.ndarray) -> np.ndarray:
    """Orthonormal basis of the range of ``X`` (columns with singular value above tolerance)."""
    if X.shape[1] == 0:
        return X
    U, s, _ = np.linalg.svd(X, full_matrices=False)
    if s[0] == 0.0:
        return U[:, :0]
    out: np.ndarray = U[:, s > np.sqrt(RANK_TOL) * s[0]]
    return out


def _complete(V: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``V`` (d, r <= k) orthonormal, completed to k orthonormal columns."""
    d, r = V.shape
    if r >= k:
        return V[:, :k]
    R = rng.standard_normal((d, k - r))
    R -= V @ (V.T @ R)
    extra = np.linalg.qr(R)[0]
    extra -= V @ (V.T @ extra)  # once more: the complement stays orthogonal to V in float64
    return np.hstack([V, np.linalg.qr(extra)[0]])


def block_krylov(A: Any, k: int, q: int = 4, seed: int = 0) -> np.ndarray:
    """Orthonormal basis of the top-k right singular subspace of ``A`` (Musco & Musco 2015).

    Parameters
    ----------
    A : array (n, d), numpy or dask.array (row-chunked; any numeric dtype, used in float64)
    k : rank of the subspace, 1 <= k <= d
    q : Krylov iterations: the space spans ``(A Aᵀ)^j A Π`` for j = 0..q (q+1 passes over A)
    seed : seeds the Gaussian start Π (d, k): same seed, same basis up to rounding, whatever
        the chunking of ``A``

    Returns
    -------
    V : float64 (d, k), orthonormal columns, ordered by decreasing Ritz value
        (``A V`` has the k largest singular values found)

    Raises
    ------
    InputError
        If ``A`` is not a non-empty numeric matrix, holds NaN/inf, or ``k``/``q`` are out of range.
    """
    _, d = _check(A, k, q)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 15]))
    P = _orth(rng.standard_normal((d, k)))
    T_blocks: list[np.ndarray] = []
    S_blocks: list[np.ndarray] = []
    for _ in range(q + 1):
        if P.shape[1] == 0:
            break
        S = gram_apply(A, P)
        C = _inv_sqrt(P.T @ S)
        if C.shape[1] == 0:  # A P = 0: nothing of A left in this direction
            break
        T_blocks.append(P @ C)
        S_blocks.append(S @ C)
        P = _orth(S_blocks[-1])
    if not T_blocks:  # A = 0: every subspace is optimal
        return _complete(np.zeros((d, 0)), k, rng)
    T = np.hstack(T_blocks)
    S_all = np.hstack(S_blocks)
    C = _inv_sqrt(T.T @ S_all)  # Gram of K = A T
    B = S_all @ C  # Aᵀ Q, Q = A T C orthonormal
    W, s, _ = np.linalg.svd(B, full_matrices=False)
    W = W[:, s > np.sqrt(RANK_TOL) * s[0]] if len(s) and s[0] > 0 else W[:, :0]
    return _complete(W[:, :k], k, rng)


def subspace_residuals(X: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Distance of every row of ``X`` (n, d) to the span of the orthonormal ``V`` (d, k):
    ``‖x − V Vᵀ x‖``, float64 (n,).  Formed as a difference (not ``‖x‖² − ‖Vᵀx‖²``, which
    cancels for the points nearest the subspace, the ones a threshold decides about)."""
    X = np.asarray(X)
    out = np.empty(X.shape[0])
    for lo in range(0, X.shape[0], ROW_BLOCK):
        Xb = X[lo : lo + ROW_BLOCK].astype(np.float64)
        R = Xb - (Xb @ V) @ V.T
        out[lo : lo + len(Xb)] = np.sqrt(np.einsum("ij,ij->i", R, R))
    return out
