"""Sparse weighted histograms over hashed bin ids, and their intersection kernel.

A histogram is a row of a `lshdist.blocks.SparseBlock`: the features are 64-bit bin ids whose
top 8 bits are the bin's *channel* (a pyramid level, a neighbourhood rank), and each channel has
a *quantum*: every value is an integer multiple of its channel's quantum, which is what lets
the implicit unary encoding (`lshdist.embed.unary`) reproduce the intersection exactly.
"""

from __future__ import annotations

import numpy as np

from lshdist._kernels.sets import intersection_paired, intersection_pairwise
from lshdist.blocks import Block, SparseBlock
from lshdist.errors import InputError

#: channels per histogram: the top 8 bits of a bin id
N_CHANNELS = 256


def channels(ids: np.ndarray) -> np.ndarray:
    """The channel (top 8 bits) of each bin id: int64."""
    return (np.asarray(ids, np.uint64) >> np.uint64(56)).astype(np.int64)


def histograms(rows: np.ndarray, ids: np.ndarray, counts: np.ndarray, n: int,
               quanta: np.ndarray) -> SparseBlock:
    """Sum ``counts`` per (row, bin id), round to the bins' quanta, and pack the rows.

    Parameters
    ----------
    rows : int64 (m,), the histogram (0..n-1) of each entry
    ids : uint64 (m,), the bin id of each entry
    counts : float64 (m,), what each entry adds to its bin, in units of its channel's quantum
        (a point of weight 1 adds 1)
    n : number of histograms
    quanta : float64 (256,), the value of one unit in each channel (0: the channel is dropped)

    Returns
    -------
    SparseBlock, n rows: bin value ``quanta[channel] * rint(sum of counts)``; empty bins dropped.
    """
    order = np.lexsort((ids, rows))
    r, f, c = rows[order], ids[order], counts[order]
    if len(r):
        new = np.ones(len(r), bool)
        new[1:] = (r[1:] != r[:-1]) | (f[1:] != f[:-1])
        starts = np.flatnonzero(new)
        r, f, c = r[starts], f[starts], np.add.reduceat(c, starts)
    value = np.rint(c) * quanta[channels(f)]
    keep = value > 0
    r, f, value = r[keep], f[keep], value[keep]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
    return SparseBlock.from_arrays(indptr, f, value)


def sorted_csr(H: SparseBlock) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(indptr int64, ids uint64, values float64)`` with the ids ascending within each row."""
    m = H.matrix.copy()
    m.sort_indices()  # local columns follow the sorted global ids, so ids come out sorted
    return (m.indptr.astype(np.int64), H.features[m.indices].astype(np.uint64),
            m.data.astype(np.float64))


def _check_nonnegative(B: Block) -> None:
    data = B.matrix.data if isinstance(B, SparseBlock) else np.asarray(B)
    if data.size and float(np.min(data)) < 0:
        raise InputError("the intersection kernel needs non-negative histograms, but an entry "
                         f"is {float(np.min(data))}")


class IntersectionKernel:
    """``k(Y, Z) = sum_f min(H_Y[f], H_Z[f])`` on weighted histograms (PMK, PDK).

    Parameters
    ----------
    normalize : bool
        Give ``k(Y, Z) / sqrt(k(Y, Y) k(Z, Z))`` instead (1 for identical sets; 0 when either
        histogram is empty).
    """

    name = "intersection"

    def __init__(self, *, normalize: bool = False) -> None:
        self.normalize = normalize

    def _raw(self, A: Block, B: Block) -> np.ndarray:
        _check_nonnegative(A)
        _check_nonnegative(B)
        if isinstance(A, SparseBlock) and isinstance(B, SparseBlock):
            out: np.ndarray = intersection_pairwise(*sorted_csr(A), *sorted_csr(B))
            return out
        if isinstance(A, SparseBlock) or isinstance(B, SparseBlock):
            raise InputError("the kernel needs both blocks dense or both sparse")
        Ad, Bd = np.asarray(A, np.float64), np.asarray(B, np.float64)
        out = np.empty((len(Ad), len(Bd)))
        step = max(1, 2**22 // max(1, Bd.size))  # bound the (step, n_B, d) temporary
        for i in range(0, len(Ad), step):
            out[i:i + step] = np.minimum(Ad[i:i + step, None, :], Bd[None]).sum(axis=2)
        return out

    def _raw_diag(self, A: Block) -> np.ndarray:
        _check_nonnegative(A)
        if isinstance(A, SparseBlock):
            return np.asarray(A.matrix.sum(axis=1), dtype=np.float64).ravel()
        out: np.ndarray = np.asarray(A, np.float64).sum(axis=1)
        return out

    @staticmethod
    def _scale(K: np.ndarray, da: np.ndarray, db: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            out: np.ndarray = np.where(np.multiply.outer(da, db) > 0,
                                       K / np.sqrt(np.multiply.outer(da, db)), 0.0)
        return out

    def __call__(self, A: Block, B: Block) -> np.ndarray:
        K = self._raw(A, B)
        return self._scale(K, self._raw_diag(A), self._raw_diag(B)) if self.normalize else K

    def paired(self, A: Block, B: Block) -> np.ndarray:
        """``k(a_i, b_i)`` row by row: float64 (n,)."""
        _check_nonnegative(A)
        _check_nonnegative(B)
        if isinstance(A, SparseBlock) and isinstance(B, SparseBlock):
            k: np.ndarray = intersection_paired(*sorted_csr(A), *sorted_csr(B))
        elif isinstance(A, SparseBlock) or isinstance(B, SparseBlock):
            raise InputError("the kernel needs both blocks dense or both sparse")
        else:
            k = np.minimum(np.asarray(A, np.float64), np.asarray(B, np.float64)).sum(axis=1)
        if not self.normalize:
            return k
        da, db = self._raw_diag(A), self._raw_diag(B)
        with np.errstate(divide="ignore", invalid="ignore"):
            out: np.ndarray = np.where(da * db > 0, k / np.sqrt(da * db), 0.0)
        return out

    def diag(self, A: Block) -> np.ndarray:
        """``k(a_i, a_i)``: the histogram mass (1 or 0 when normalised)."""
        d = self._raw_diag(A)
        return (d > 0).astype(np.float64) if self.normalize else d
