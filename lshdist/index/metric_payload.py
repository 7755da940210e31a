"""The re-rank payload of rows under a learned metric (`lshdist.index.payload` holds the
payloads themselves and knows no metric object)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lshdist.blocks import SparseBlock, as_block
from lshdist.errors import InputError
from lshdist.index.payload import DensePayload, KernelPayload
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric

if TYPE_CHECKING:
    from lshdist.blocks import Block, RowsLike
    from lshdist.protocols import Metric


def _sparse_arrays(X: Block) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if isinstance(X, SparseBlock):
        return X.to_arrays()
    # dense rows as CSR over feature ids 0..d-1 (the implicit learner on dense data)
    import scipy.sparse as sp

    m = sp.csr_matrix(np.asarray(X, np.float32))
    return m.indptr.astype(np.int64), m.indices.astype(np.uint64), m.data


def make_payload(metric: Metric, X: RowsLike, *, query: bool = False,
                 kx: np.ndarray | None = None) -> DensePayload | KernelPayload:
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
        zq = kx @ metric.kernel_form
        quad = np.einsum("ij,ij->i", zq, kx)
    sx = metric.kernel.diag(X) + quad
    indptr, indices, data = _sparse_arrays(X)
    return KernelPayload(indptr, indices, data, zq if query else kx, sx)
