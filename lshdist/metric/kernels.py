"""Base kernels ``k(x, y)`` for the kernelized learner, on dense arrays and `SparseBlock` rows.

A kernel is a small object with ``name``, ``__call__(A, B) -> (n_A, n_B)`` and
``diag(A) -> (n_A,)`` (``k(x, x)``).  The intersection kernel of the pyramid-match embeddings
plugs into the same interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from lshdist.blocks import Block, SparseBlock
from lshdist.errors import InputError

if TYPE_CHECKING:
    from lshdist.protocols import Kernel


class LinearKernel:
    """``k(x, y) = x^T y`` on dense rows or on sparse rows over 64-bit feature ids."""

    name = "linear"

    def __call__(self, A: Block, B: Block) -> np.ndarray:
        if isinstance(A, SparseBlock) != isinstance(B, SparseBlock):
            raise InputError("the kernel needs both blocks dense or both sparse")
        if isinstance(A, SparseBlock):
            return A.dot_t(cast(SparseBlock, B))  # both sparse: checked above
        out: np.ndarray = np.asarray(A, np.float64) @ np.asarray(B, np.float64).T
        return out

    def paired(self, A: Block, B: Block) -> np.ndarray:
        """``k(a_i, b_i)`` row by row: float64 (n,)."""
        if isinstance(A, SparseBlock):
            Bs = cast(SparseBlock, B)  # the callers pair rows of one kind
            common = np.union1d(A.features, Bs.features)
            a, b = A.over(common), Bs.over(common)
            return np.asarray(a.multiply(b).sum(axis=1), dtype=np.float64).ravel()
        Af, Bf = np.asarray(A, np.float64), np.asarray(B, np.float64)
        out: np.ndarray = np.einsum("ij,ij->i", Af, Bf)
        return out

    def diag(self, A: Block) -> np.ndarray:
        if isinstance(A, SparseBlock):
            return A.row_norms_sq()
        Af = np.asarray(A, np.float64)
        out: np.ndarray = np.einsum("ij,ij->i", Af, Af)
        return out


KERNELS = {"linear": LinearKernel}


def get_kernel(name: str) -> Kernel:
    """The kernel called ``name``."""
    try:
        return KERNELS[name]()
    except KeyError:
        raise InputError(
            f"unknown kernel {name!r}; choose one of {sorted(KERNELS)}"
        ) from None
