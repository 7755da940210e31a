"""What each database row carries for the exact re-rank, and the query-side counterpart.

Explicit metrics (and plain L2) re-rank on ``z = G x`` (`DensePayload`); implicit metrics on the
sparse (or dense) rows plus their kernel values against the basis (`KernelPayload`).
Payloads are plain arrays so that a segment stores them in Zarr and kernels read them directly.
"""

from __future__ import annotations

import numpy as np

from lshdist._kernels.search import rerank_dense, rerank_sparse
from lshdist.blocks import SparseBlock, as_block
from lshdist.errors import InputError
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric


class DensePayload:
    """``Z`` float32 (N, d): transformed rows; the learned distance is L2 between them."""

    kind = "dense"

    def __init__(self, Z: np.ndarray):
        self.Z = np.ascontiguousarray(Z, dtype=np.float32)

    def __len__(self) -> int:
        return self.Z.shape[0]

    def arrays(self) -> dict[str, np.ndarray]:
        return {"Z": self.Z}

    @classmethod
    def from_arrays(cls, a: dict) -> "DensePayload":
        return cls(a["Z"])

    def take(self, rows) -> "DensePayload":
        return DensePayload(self.Z[rows])

    def rerank(self, offsets, rows, query: "DensePayload", k: int, tiebreak: np.ndarray):
        """Exact top-k of each query's candidates (CSR ``offsets``/``rows``), ties by
        ``tiebreak[row]``: ``(float32 (Q, k), int64 rows (Q, k))``."""
        return rerank_dense(offsets, rows, self.Z, query.Z, k, tiebreak)

    def distances(self, query: "DensePayload") -> np.ndarray:
        """Approximate distances from the queries to all rows (float32 BLAS expansion; the scan
        re-checks its best rows exactly)."""
        Z, Zq = self.Z, query.Z
        if not hasattr(self, "_norms"):
            self._norms = np.einsum("ij,ij->i", Z, Z)
        D = Zq @ Z.T
        D *= -2.0
        D += self._norms[None, :]
        D += np.einsum("ij,ij->i", Zq, Zq)[:, None]
        return D


class KernelPayload:
    """Rows (CSR over uint64 feature ids), kernel values ``kx`` (N, c) and ``sx`` (N,).

    ``sx = ||phi(x)||^2 + k_x^T Q k_x``; on the query side ``kx`` holds ``zq = Q k_q``.
    """

    kind = "kernel"

    def __init__(self, indptr, indices, data, kx, sx):
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices, dtype=np.uint64)
        self.data = np.ascontiguousarray(data, dtype=np.float32)
        self.kx = np.ascontiguousarray(kx, dtype=np.float32)
        self.sx = np.ascontiguousarray(sx, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.sx)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"indptr": self.indptr, "indices": self.indices, "data": self.data,
                "kx": self.kx, "sx": self.sx}

    @classmethod
    def from_arrays(cls, a: dict) -> "KernelPayload":
        return cls(a["indptr"], a["indices"], a["data"], a["kx"], a["sx"])

    def take(self, rows: slice) -> "KernelPayload":
        """Contiguous rows (a slice with step 1)."""
        start, stop, step = rows.indices(len(self))
        if step != 1:
            raise InputError("KernelPayload.take needs a contiguous slice")
        lo, hi = self.indptr[start], self.indptr[stop]
        return KernelPayload(self.indptr[start : stop + 1] - lo, self.indices[lo:hi],
                             self.data[lo:hi], self.kx[start:stop], self.sx[start:stop])

    def block(self, start: int = 0, stop: int | None = None) -> SparseBlock:
        stop = len(self) if stop is None else stop
        lo, hi = self.indptr[start], self.indptr[stop]
        return SparseBlock.from_arrays(self.indptr[start : stop + 1] - lo,
                                       self.indices[lo:hi], self.data[lo:hi])

    def _local(self):
        """Rows over local feature numbers: (sorted unique feature ids, int32 per nonzero)."""
        if not hasattr(self, "_features"):
            self._features, inv = np.unique(self.indices, return_inverse=True)
            self._local_idx = inv.astype(np.int32).ravel()
        return self._features, self._local_idx

    def rerank(self, offsets, rows, query: "KernelPayload", k: int, tiebreak: np.ndarray):
        features, local = self._local()
        pos = np.searchsorted(features, query.indices)
        posc = np.minimum(pos, max(len(features) - 1, 0))
        hit = (pos < len(features)) & (features[posc] == query.indices) if len(features) else (
            np.zeros(len(query.indices), bool))
        qlocal = np.where(hit, posc, -1).astype(np.int32)
        return rerank_sparse(offsets, rows, self.indptr, local, self.data, len(features),
                             self.kx, self.sx, query.indptr, qlocal, query.data,
                             query.kx.astype(np.float64), query.sx, k, tiebreak)

    def distances(self, query: "KernelPayload") -> np.ndarray:
        """Distances from the queries to all rows, float64 (Q, N)."""
        if not hasattr(self, "_block"):
            self._block = self.block()
        cross = query.block().dot_t(self._block)
        cross += query.kx.astype(np.float64) @ self.kx.astype(np.float64).T
        return np.maximum(self.sx[None, :] + query.sx[:, None] - 2 * cross, 0.0)


def _sparse_arrays(X) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if isinstance(X, SparseBlock):
        return X.to_arrays()
    # dense rows as CSR over feature ids 0..d-1 (the implicit learner on dense data)
    import scipy.sparse as sp

    m = sp.csr_matrix(np.asarray(X, np.float32))
    return m.indptr.astype(np.int64), m.indices.astype(np.uint64), m.data


def make_payload(metric, X, *, query: bool = False, kx: np.ndarray | None = None):
    """The re-rank payload of rows ``X`` under ``metric`` (database or query side)."""
    if isinstance(metric, ExplicitMetric):
        return DensePayload(metric.transform(X))
    if not isinstance(metric, ImplicitMetric):
        raise InputError(f"no re-rank payload for a {type(metric).__name__}")
    X = metric.check(as_block(X))
    if metric.is_identity:
        kx = np.zeros((len(_sparse_arrays(X)[0]) - 1, 0))
        quad = np.zeros(kx.shape[0])
        zq = kx
    else:
        kx = metric.kernel_values(X) if kx is None else kx
        zq = kx @ metric.Q
        quad = np.einsum("ij,ij->i", zq, kx)
    sx = metric.kernel.diag(X) + quad
    indptr, indices, data = _sparse_arrays(X)
    return KernelPayload(indptr, indices, data, zq if query else kx, sx)
