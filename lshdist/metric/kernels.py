"""Base kernels ``k(x, y)`` for the kernelized learner, on dense arrays and `SparseBlock` rows.

A kernel is a small object with ``name``, ``__call__(A, B) -> (n_A, n_B)`` and
``diag(A) -> (n_A,)`` (``k(x, x)``).  The intersection kernel of the pyramid-match embeddings
plugs into the same interface.
"""

from __future__ import annotations

import numpy as np

from lshdist.blocks import SparseBlock
from lshdist.errors import InputError


class LinearKernel:
    """``k(x, y) = x^T y`` on dense rows or on sparse rows over 64-bit feature ids."""

    name = "linear"

    def __call__(self, A, B) -> np.ndarray:
        if isinstance(A, SparseBlock) != isinstance(B, SparseBlock):
            raise InputError("the kernel needs both blocks dense or both sparse")
        if isinstance(A, SparseBlock):
            return A.dot_t(B)
        return np.asarray(A, np.float64) @ np.asarray(B, np.float64).T

    def paired(self, A, B) -> np.ndarray:
        """``k(a_i, b_i)`` row by row: float64 (n,)."""
        if isinstance(A, SparseBlock):
            common = np.union1d(A.features, B.features)
            a, b = A.over(common), B.over(common)
            return np.asarray(a.multiply(b).sum(axis=1), dtype=np.float64).ravel()
        A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
        return np.einsum("ij,ij->i", A, B)

    def diag(self, A) -> np.ndarray:
        if isinstance(A, SparseBlock):
            return A.row_norms_sq()
        A = np.asarray(A, np.float64)
        return np.einsum("ij,ij->i", A, A)


KERNELS = {"linear": LinearKernel}


def get_kernel(name: str):
    """The kernel called ``name``."""
    try:
        return KERNELS[name]()
    except KeyError:
        raise InputError(
            f"unknown kernel {name!r}; choose one of {sorted(KERNELS)}"
        ) from None
