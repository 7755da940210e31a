"""In-memory blocks of rows: dense float32 arrays, or sparse rows over 64-bit feature ids.

Sparse data carries 64-bit feature ids (hashed tokens, pyramid bins), far too many to be scipy
column numbers.  A `SparseBlock` holds a scipy CSR matrix over *local* columns plus the sorted
global feature id of each column, so products between two blocks align their columns without
any global vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TypeAlias, TypeVar, overload

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike

from lshdist.errors import InputError


@dataclass(frozen=True)
class SparseBlock:
    """Rows of a sparse dataset.

    Attributes
    ----------
    matrix : scipy.sparse.csr_matrix, shape (n, f), float32
        Rows over local columns; column ``j`` is global feature ``features[j]``.
    features : ndarray, shape (f,), uint64
        Sorted, unique global feature ids of the local columns.
    """

    matrix: sp.csr_matrix
    features: np.ndarray

    @classmethod
    def from_arrays(cls, indptr: ArrayLike, indices: ArrayLike, data: ArrayLike) -> SparseBlock:
        """Build from CSR arrays whose ``indices`` are global (uint64) feature ids."""
        indptr_ = np.asarray(indptr, dtype=np.int64)
        indices_ = np.asarray(indices, dtype=np.uint64)
        data_ = np.asarray(data, dtype=np.float32)
        features, local = np.unique(indices_, return_inverse=True)
        n = len(indptr_) - 1
        m = sp.csr_matrix(
            (data_, local.astype(np.int64).ravel(), indptr_ - indptr_[0]), shape=(n, len(features))
        )
        return cls(m, features)

    @classmethod
    def from_csr(cls, X: sp.spmatrix) -> SparseBlock:
        """Wrap a scipy matrix whose column numbers are the feature ids."""
        X = sp.csr_matrix(X, dtype=np.float32)
        return cls.from_arrays(X.indptr, X.indices.astype(np.uint64), X.data)

    @property
    def shape(self) -> tuple[int, int]:
        n, f = self.matrix.shape
        return n, f

    @property
    def n_rows(self) -> int:
        n: int = self.matrix.shape[0]
        return n

    @property
    def nnz(self) -> int:
        return int(self.matrix.nnz)

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSR arrays with global uint64 feature ids: ``(indptr, indices, data)``."""
        m = self.matrix
        return (
            m.indptr.astype(np.int64),
            self.features[m.indices].astype(np.uint64),
            m.data.astype(np.float32),
        )

    def take(self, rows: RowIndex) -> SparseBlock:
        """Rows ``rows`` (any integer index array), same feature space."""
        return SparseBlock(self.matrix[np.asarray(rows)], self.features)

    def over(self, features: np.ndarray) -> sp.csr_matrix:
        """This block as a CSR matrix over the columns ``features`` (sorted uint64).

        Entries whose feature is not in ``features`` are dropped: they contribute nothing to a
        product with a matrix over ``features``.
        """
        pos = np.searchsorted(features, self.features)
        ok = pos < len(features)
        ok[ok] = features[pos[ok]] == self.features[ok]
        src = np.flatnonzero(ok)
        select = sp.csr_matrix(
            (np.ones(len(src), np.float32), (src, pos[src])),
            shape=(len(self.features), len(features)),
        )
        return sp.csr_matrix(self.matrix @ select)

    def dot_t(self, other: SparseBlock) -> np.ndarray:
        """Dense ``self @ other.T``, shape (n_self, n_other), float64."""
        common = np.intersect1d(self.features, other.features, assume_unique=True)
        a = self.over(common).astype(np.float64)
        b = other.over(common).astype(np.float64)
        return np.asarray((a @ b.T).todense())

    def row_norms_sq(self) -> np.ndarray:
        """Squared L2 norm of every row, float64."""
        m = self.matrix
        return np.asarray(m.multiply(m).sum(axis=1), dtype=np.float64).ravel()


def vstack_sparse(blocks: list[SparseBlock]) -> SparseBlock:
    """Stack sparse blocks row-wise into one block over the union of their features."""
    parts = [b.to_arrays() for b in blocks]
    indptr = [np.zeros(1, np.int64)]
    offset = 0
    for p, _, _ in parts:
        indptr.append(p[1:] - p[0] + offset)
        offset += int(p[-1] - p[0])
    return SparseBlock.from_arrays(
        np.concatenate(indptr),
        np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.uint64),
        np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.float32),
    )


#: rows in memory: a dense (n, d) array or a `SparseBlock`
Block: TypeAlias = "np.ndarray | SparseBlock"
#: one kind of rows throughout (dense, sparse, or either)
BlockT = TypeVar("BlockT", bound=Block)
#: integer row numbers
RowIndex: TypeAlias = "np.ndarray | Sequence[int]"
#: rows as callers give them: anything `as_block` takes (array-like, scipy sparse matrix, block)
RowsLike: TypeAlias = "ArrayLike | SparseBlock | sp.spmatrix"


def row_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """``n`` rows in ``parts`` (at least 1) contiguous, nearly equal ranges ``(start, stop)``;
    empty ranges left out (none for ``n = 0``).  How work is shared among threads."""
    b = np.linspace(0, n, max(1, int(parts)) + 1).astype(int)
    return [(int(b[i]), int(b[i + 1])) for i in range(len(b) - 1) if b[i + 1] > b[i]]


R = TypeVar("R")


def on_row_ranges(fn: Callable[[int, int], R], n: int, parts: int, *,
                  threaded: Callable[[], AbstractContextManager[object]] = nullcontext
                  ) -> list[R]:
    """``fn(start, stop)`` over the `row_ranges` of ``n`` rows in ``parts``, each range on a
    thread of its own (the kernels it calls release the GIL), results in the ranges' order.
    One range — or none, ``n = 0``: ``fn(0, n)`` — runs on the caller's thread.  ``threaded``:
    a context entered around the threads only (e.g. `lshdist.limits.one_blas_thread`: each
    thread's BLAS on one core).  The one way work is shared among a process's threads."""
    spans = row_ranges(n, parts)
    if len(spans) <= 1:
        return [fn(0, n)]
    with threaded(), ThreadPoolExecutor(len(spans)) as pool:
        return list(pool.map(lambda span: fn(*span), spans))


def n_rows(X: RowsLike) -> int:
    """Rows of a dense array or a `SparseBlock`."""
    return X.n_rows if isinstance(X, SparseBlock) else int(np.asarray(X).shape[0])


@overload
def take_rows(X: BlockT, rows: RowIndex) -> BlockT: ...
@overload
def take_rows(X: RowsLike, rows: RowIndex) -> Block: ...
def take_rows(X: RowsLike, rows: RowIndex) -> Block:
    """Rows of a dense array or a `SparseBlock`."""
    return X.take(rows) if isinstance(X, SparseBlock) else np.asarray(X)[rows]


@overload
def as_block(X: SparseBlock) -> SparseBlock: ...
@overload
def as_block(X: np.ndarray) -> np.ndarray: ...
@overload
def as_block(X: RowsLike) -> Block: ...
def as_block(X: RowsLike) -> Block:
    """Dense float32 C array, or a `SparseBlock` (a scipy matrix becomes one)."""
    if isinstance(X, SparseBlock):
        return X
    if sp.issparse(X):
        return SparseBlock.from_csr(X)
    X = np.asarray(X)
    if X.dtype.kind not in "biuf":
        raise InputError(f"X has dtype {X.dtype}, but features must be numeric")
    return np.ascontiguousarray(X, dtype=np.float32)
