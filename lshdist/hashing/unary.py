"""Random hyperplanes over the implicit unary encoding of weighted histograms.

``r^T f(Y)`` is computed without building f (`lshdist.embed.unary`): per bin, ``sqrt(q_c)``
times the sum of the first n Gaussians of the bin's counter-based stream
(`lshdist._kernels.unary`).
"""

from __future__ import annotations

import numpy as np

from lshdist._kernels.unary import unary_projection
from lshdist.blocks import SparseBlock
from lshdist.embed.unary import unary_units
from lshdist.errors import InputError
from lshdist.hashing.families import HashFamily, check_bits


def unary_project(H: SparseBlock, quanta: np.ndarray, *, seed: int, bits: int) -> np.ndarray:
    """``r^T f(Y)`` for every row of ``H`` and every bit: float64 (n, bits)."""
    indptr, ids, units, values = unary_units(H, quanta)
    out: np.ndarray = unary_projection(np.uint64(seed), indptr, ids, units, values,
                                       check_bits(bits))
    return out



class UnaryHyperplanes(HashFamily):
    """Charikar's bits ``[r^T f(Y) >= 0]`` over the unary encoding of histograms.

    Two histograms collide on a bit with probability ``1 - theta / pi``, theta the angle of
    their unary vectors: ``cos theta`` is the normalised intersection kernel.
    """

    name = "unary-charikar"

    def __init__(self, quanta: np.ndarray, *, bits: int, seed: int = 0) -> None:
        super().__init__(bits=bits, seed=seed)
        self.metric = None
        self.quanta = np.asarray(quanta, np.float64)

    def project(self, X: object) -> np.ndarray:
        if not isinstance(X, SparseBlock):
            raise InputError(f"unary hashing takes histograms (a SparseBlock), "
                             f"got {type(X).__name__}")
        return unary_project(X, self.quanta, seed=self.seed, bits=self.bits)
