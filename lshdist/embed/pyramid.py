"""The pyramid match kernel (Grauman & Darrell 2005) as a sparse weighted histogram.

Level ``i`` (0..L-1) of the pyramid has uniform bins of side ``finest_side * 2**i`` over the
features shifted by one random vector (seeded).  With ``I_i`` the number of points matched in
level-i bins (the intersection of the level-i histograms), the PMK is
``sum_i w_i (I_i - I_{i-1})`` (``I_{-1} = 0``) for non-increasing weights ``w_i`` (default
``1 / 2**i``).  Regrouped, it is ``sum_i (w_i - w_{i+1}) I_i`` (``w_L = 0``): one histogram
intersection once level i's counts are scaled by ``w_i - w_{i+1} >= 0``, which is the embedding
built here.  Bin ids are 64-bit hashes of (level, bin coordinates) with the level in the top
8 bits (the channel), never indices into a vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from lshdist._kernels.sets import pyramid_bin_ids
from lshdist.blocks import SparseBlock
from lshdist.embed.histogram import N_CHANNELS, histograms
from lshdist.embed.pointsets import PointSets
from lshdist.errors import InputError, NotFittedError

if TYPE_CHECKING:
    from typing_extensions import Self

#: tag hashed into every PMK bin id (other embeddings use other tags)
PMK_TAG = 0x504D4B


class PyramidMatch:
    """Point sets to PMK histograms.

    Parameters
    ----------
    levels : int, 1..255
        L, the number of pyramid levels.  Choose ``finest_side * 2**(L-1)`` about twice the
        range of the features, so the coarsest level matches (nearly) everything.
    finest_side : float > 0
        Bin side at level 0, in feature units.
    weights : sequence of L non-increasing non-negative floats, or None
        ``w_i``, the similarity credited to a match first made at level i (None: ``1 / 2**i``).
    count_resolution : float > 0
        Bin counts (sums of point weights) are rounded to this resolution, so every histogram
        value is an integer number of units and the unary encoding is exact.  With unit point
        weights (the default) counts are integers and nothing is rounded; with other weights
        the kernel is that of the rounded counts (an error of at most half a unit per bin and
        level), and the unary cost grows as 1 / count_resolution.
    seed : int
        Seeds the random shift of the grid.
    """

    def __init__(self, *, levels: int = 8, finest_side: float = 1.0,
                 weights: Sequence[float] | None = None, count_resolution: float = 1.0,
                 seed: int = 0) -> None:
        self.levels = levels
        self.finest_side = finest_side
        self.weights = weights
        self.count_resolution = count_resolution
        self.seed = seed

    def _level_weights(self) -> np.ndarray:
        L = self.levels
        if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or not 1 <= L < N_CHANNELS:
            raise InputError(f"levels={L!r}: the number of levels must be an integer in "
                             f"1..{N_CHANNELS - 1}")
        if not (np.isfinite(self.finest_side) and self.finest_side > 0):
            raise InputError(f"finest_side={self.finest_side!r}: the bin side must be > 0")
        if not (np.isfinite(self.count_resolution) and self.count_resolution > 0):
            raise InputError(f"count_resolution={self.count_resolution!r}: must be > 0")
        if self.weights is None:
            return 0.5 ** np.arange(L, dtype=np.float64)
        w = np.asarray(self.weights, dtype=np.float64)
        if w.shape != (L,):
            raise InputError(f"weights has {w.size} entries, but levels={L}: give one per level")
        if not np.isfinite(w).all() or np.any(w < 0) or np.any(np.diff(w) > 0):
            raise InputError(f"weights {w.tolist()} must be finite, non-negative and "
                             "non-increasing (a coarser match may not count more)")
        return w

    def fit(self, sets: PointSets) -> Self:
        """Check the parameters and draw the grid shift for ``sets.d`` dimensions."""
        w = self._level_weights()
        rng = np.random.default_rng(self.seed)
        self.d_ = sets.d
        self.level_weights_ = w
        self.shift_ = rng.uniform(0.0, self.finest_side * 2.0 ** (self.levels - 1), self.d_)
        quanta = np.zeros(N_CHANNELS)
        quanta[:self.levels] = (w - np.append(w[1:], 0.0)) * self.count_resolution
        #: value of one unit of count in each channel (level): float64 (256,)
        self.quanta_ = quanta
        return self

    def transform(self, sets: PointSets) -> SparseBlock:
        """PMK histograms, one row per set (ids uint64, values float32)."""
        if not hasattr(self, "shift_"):
            raise NotFittedError("this PyramidMatch is not fitted; call fit(sets) first")
        if sets.d != self.d_:
            raise InputError(f"the sets have {sets.d} features, but the pyramid was fitted "
                             f"on {self.d_}")
        L = self.levels
        ids = pyramid_bin_ids(sets.values.astype(np.float64), self.shift_,
                              float(self.finest_side), L, PMK_TAG)  # (T, L)
        w = np.ones(len(sets.values)) if sets.weights is None else sets.weights.astype(float)
        counts = np.repeat(w / self.count_resolution, L)
        rows = np.repeat(sets.set_of_point(), L)
        return histograms(rows, ids.ravel(), counts, len(sets), self.quanta_)

    def fit_transform(self, sets: PointSets) -> SparseBlock:
        return self.fit(sets).transform(sets)
