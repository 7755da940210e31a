"""The implicit unary encoding of weighted histograms (random hyperplanes over it:
`lshdist.hashing.unary`).

A bin of channel c holding ``n`` units (value ``n * q_c``, ``q_c`` the channel's quantum)
becomes ``n`` unary coordinates of value ``sqrt(q_c)``, so ``f(Y) . f(Z) = sum_f q_c
min(n_Y, n_Z) = sum_f min(H_Y, H_Z)``: the intersection kernel is a plain dot product of unary
vectors.  ``r^T f(Y)`` is computed without building f: per bin, ``sqrt(q_c)`` times the sum of
the first n Gaussians of the bin's counter-based stream (`lshdist._kernels.unary`).
"""

from __future__ import annotations

import numpy as np

from lshdist._kernels.unary import unary_ids
from lshdist.blocks import SparseBlock
from lshdist.embed.histogram import channels, sorted_csr
from lshdist.errors import InputError

#: counts above this per bin are refused (the unary cost is linear in them)
MAX_UNITS = 1 << 24


def unary_units(H: SparseBlock, quanta: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``H`` as ``(indptr, ids, units int64, entry values sqrt(q) float64)``.

    Raises `InputError` when a value is not an integer multiple of its channel's quantum (a
    histogram from another embedding, or a zero quantum).
    """
    indptr, ids, values = sorted_csr(H)
    q = np.asarray(quanta, np.float64)[channels(ids)]
    with np.errstate(divide="ignore", invalid="ignore"):
        units = values / q
    n = np.rint(units)
    bad = ~(np.abs(units - n) <= 1e-6 * np.maximum(n, 1.0)) | (n > MAX_UNITS)
    if np.any(bad):
        k = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"histogram value {values[k]} in channel {int(channels(ids[k:k + 1])[0])} is not an "
            f"integer number (<= {MAX_UNITS}) of its quantum {q[k]}; encode histograms with "
            "the quanta of the embedding that made them"
        )
    return indptr, ids, n.astype(np.int64), np.sqrt(q)


def unary_expand(H: SparseBlock, quanta: np.ndarray) -> SparseBlock:
    """The explicit unary vectors ``f(Y)`` (for tests and small checks: cost sum of units)."""
    indptr, ids, units, values = unary_units(H, quanta)
    per_row = np.add.reduceat(units, indptr[:-1]) if len(units) else np.zeros(0, np.int64)
    per_row = np.where(np.diff(indptr) > 0, per_row, 0)
    new_ptr = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64)
    return SparseBlock.from_arrays(new_ptr, unary_ids(ids, units), np.repeat(values, units))
