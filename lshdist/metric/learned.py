"""Learned metrics as objects: distances, similarities, and what the hash functions need."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lshdist.blocks import Block, RowsLike, SparseBlock, as_block, n_rows
from lshdist.errors import InputError
from lshdist.metric.kernels import get_kernel

if TYPE_CHECKING:
    from lshdist.embed.model import SetEmbedding


def _check_dense_dim(X: RowsLike, d: int) -> np.ndarray:
    Xd = as_block(X)  # a SparseBlock stays one; a scipy matrix becomes one
    if isinstance(Xd, SparseBlock):
        raise InputError("this metric was learned on dense data, but sparse rows were given")
    if Xd.ndim != 2 or Xd.shape[1] != d:
        raise InputError(
            f"X has {Xd.shape[-1] if Xd.ndim else 0} features, but the model was learned on {d}"
        )
    return Xd


def sq_euclidean(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Pairwise squared L2 distances, float64 (n_A, n_B), never negative."""
    A = np.asarray(A, np.float64)
    B = np.asarray(B, np.float64)
    D = np.einsum("ij,ij->i", A, A)[:, None] + np.einsum("ij,ij->i", B, B)[None, :] - 2 * A @ B.T
    out: np.ndarray = np.maximum(D, 0.0)
    return out


#: rows transformed at a time (`ExplicitMetric.transform`)
TRANSFORM_ROWS = 2048


class ExplicitMetric:
    """``d_A(x, y) = (x-y)^T A (x-y)`` with ``A = G^T G`` (d x d).

    Parameters
    ----------
    A : float64 (d, d), symmetric positive definite
    center : float32 (d,), optional
        Where hash hyperplanes pass through: the mean of the training data.  Distances do not
        depend on it; random hyperplanes through the data's centre split it far better than
        hyperplanes through the origin (on Fashion-MNIST, recall@10 0.49 -> 0.59 at W=1).
    """

    kind = "explicit"
    #: an explicit metric takes vectors as given (only implicit models embed point sets)
    embedding: SetEmbedding | None = None

    def __init__(self, A: np.ndarray, *, center: np.ndarray | None = None):
        A = np.asarray(A, np.float64)
        self.center = None if center is None else np.asarray(center, np.float32).ravel()
        if self.center is not None and self.center.shape != (A.shape[0],):
            raise InputError(
                f"center has {self.center.shape[0]} entries, the metric d={A.shape[0]}"
            )
        A = 0.5 * (A + A.T)
        self.A = A
        self.d = A.shape[0]
        self.is_identity = bool(np.array_equal(A, np.eye(self.d)))
        if self.is_identity:  # the prior, kept by the metric selection: its Cholesky factor,
            self.G = np.eye(self.d)  # exactly, without the 15 ms factorisation at d = 784
            return
        try:
            self.G = np.linalg.cholesky(A).T  # A = L L^T, G = L^T  =>  G^T G = A
        except np.linalg.LinAlgError:
            w, U = np.linalg.eigh(A)
            if w.min() < -1e-8 * max(1.0, w.max()):
                raise InputError(
                    f"the metric matrix is not positive semi-definite (eigenvalue {w.min():.3g})"
                ) from None
            self.G = (U * np.sqrt(np.maximum(w, 0))).T @ U.T

    def __getstate__(self) -> dict[str, Any]:
        """The identity is sent between processes as its size (``A`` and ``G`` are 9.8 MB of
        float64 at d = 784, copied with every hash family a job broadcasts)."""
        state = dict(self.__dict__)
        if self.is_identity:
            del state["A"], state["G"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["is_identity"] and "A" not in state:
            state = {**state, "A": np.eye(state["d"]), "G": np.eye(state["d"])}
        self.__dict__.update(state)

    @classmethod
    def identity(cls, d: int, *, center: np.ndarray | None = None) -> ExplicitMetric:
        return cls(np.eye(d), center=center)

    def check(self, X: RowsLike) -> np.ndarray:
        return _check_dense_dim(X, self.d)

    def transform(self, X: RowsLike) -> np.ndarray:
        """``G x`` for every row: float32 (n, d).  L2 on these equals ``d_A``."""
        Xd = self.check(X)
        if self.is_identity:
            return Xd
        # in float64, a block of rows at a time: the float64 copies of X and of G x are then
        # a block's (2 x 12.8 MB at d = 784), not the whole input's (a 10,000-query chunk at
        # d = 784: 190 -> ~90 MB at the peak; a 60,000-row build: ~1.1 GB -> ~0.2 GB)
        out = np.empty((Xd.shape[0], self.G.shape[0]), dtype=np.float32)
        GT = self.G.T
        for lo in range(0, Xd.shape[0], TRANSFORM_ROWS):
            out[lo:lo + TRANSFORM_ROWS] = Xd[lo:lo + TRANSFORM_ROWS].astype(np.float64) @ GT
        return out

    def pairwise(self, X: RowsLike, Y: RowsLike) -> np.ndarray:
        """``d_A(x_i, y_j)`` for all pairs: float64 (n_X, n_Y)."""
        return sq_euclidean(self.transform(X), self.transform(Y))

    def similarity(self, X: RowsLike, Y: RowsLike) -> np.ndarray:
        """``s_A(x_i, y_j) = x_i^T A y_j``."""
        Xf, Yf = self.check(X).astype(np.float64), self.check(Y).astype(np.float64)
        out: np.ndarray = Xf @ self.A @ Yf.T
        return out


class ImplicitMetric:
    """``A = G^T G`` with ``G = I + Phi S Phi^T`` over c basis points (kernelized ITML).

    ``d_A(x, q) = ||phi(x) - phi(q)||^2 + (k_x - k_q)^T F (k_x - k_q)`` with ``k_x = Phi^T phi(x)``
    and the c x c form ``F = S + S^T + S^T K0 S`` (expanding ``G^T G``; `kernel_form`).

    Parameters
    ----------
    basis : rows (dense float32 array or `SparseBlock`), c of them
    S : float64 (c, c)
    kernel : str, base kernel name
    d : int, dimension of the input space
    """

    kind = "implicit"

    def __init__(self, basis: RowsLike, S: np.ndarray, *, kernel: str = "linear", d: int,
                 embedding: SetEmbedding | None = None):
        self.basis = as_block(basis)
        self.S = np.asarray(S, np.float64)
        self.kernel_name = kernel
        self.kernel = get_kernel(kernel)
        self.d = int(d)
        self.K0 = self.kernel(self.basis, self.basis)
        #: F, the form of the learned term over kernel values (not stored: made from S)
        self.kernel_form = self.S + self.S.T + self.S.T @ self.K0 @ self.S
        self.c = n_rows(self.basis)
        self.is_identity = not self.S.any()
        #: how sets of local features become this metric's rows (None: rows are given)
        self.embedding = embedding

    @classmethod
    def identity(cls, basis: RowsLike, *, kernel: str = "linear", d: int,
                 embedding: SetEmbedding | None = None) -> ImplicitMetric:
        c = n_rows(basis)
        return cls(basis, np.zeros((c, c)), kernel=kernel, d=d, embedding=embedding)

    def check(self, X: RowsLike) -> Block:
        B = as_block(X)
        if isinstance(B, SparseBlock) != isinstance(self.basis, SparseBlock):
            raise InputError(
                "the model was learned on "
                + ("sparse" if isinstance(self.basis, SparseBlock) else "dense")
                + " data; give rows of the same kind"
            )
        if not isinstance(B, SparseBlock) and B.shape[1] != self.d:
            raise InputError(f"X has {B.shape[1]} features, but the model was learned on {self.d}")
        return B

    def kernel_values(self, X: RowsLike) -> np.ndarray:
        """``k_x = Phi^T phi(x)`` for every row: float64 (n, c)."""
        return self.kernel(self.check(X), self.basis)

    def pairwise(self, X: RowsLike, Y: RowsLike) -> np.ndarray:
        """``d_A(x_i, y_j)``: float64 (n_X, n_Y)."""
        BX, BY = self.check(X), self.check(Y)
        base = (self.kernel.diag(BX)[:, None] + self.kernel.diag(BY)[None, :]
                - 2 * self.kernel(BX, BY))
        kx, ky = self.kernel(BX, self.basis), self.kernel(BY, self.basis)
        Fx, Fy = kx @ self.kernel_form, ky @ self.kernel_form
        learned = (
            np.einsum("ij,ij->i", Fx, kx)[:, None]
            + np.einsum("ij,ij->i", Fy, ky)[None, :]
            - 2 * Fx @ ky.T
        )
        out: np.ndarray = np.maximum(base + learned, 0.0)
        return out

    def similarity(self, X: RowsLike, Y: RowsLike) -> np.ndarray:
        """``s_A(x, y) = phi(x)^T A phi(y) = k(x, y) + k_x^T F k_y``."""
        BX, BY = self.check(X), self.check(Y)
        out: np.ndarray = (self.kernel(BX, BY)
                           + self.kernel(BX, self.basis) @ self.kernel_form
                           @ self.kernel(BY, self.basis).T)
        return out

    def explicit_G(self) -> np.ndarray:
        """``G = I + Phi S Phi^T`` as a d x d matrix (dense linear kernel only; for tests)."""
        if self.kernel_name != "linear" or isinstance(self.basis, SparseBlock):
            raise InputError("an explicit G exists only for the linear kernel on dense data")
        Phi = np.asarray(self.basis, np.float64).T
        G: np.ndarray = np.eye(self.d) + Phi @ self.S @ Phi.T
        return G
