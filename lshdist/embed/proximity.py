"""The proximity distribution kernel (Ling & Soatto 2007) as a sparse weighted histogram.

Each local feature is quantised to a visual word of a k-means codebook.  For every point p and
every r in 1..R, let q_r be p's r-th nearest other point in image coordinates (ties broken by
the point's position in its set).  Bin ``(a, b, c)`` counts the pairs (p, q_r) with
``word(p) = a``, ``word(q_r) = b`` and ``r <= c``: the cumulative distribution over
neighbourhood sizes of how often word b lies near word a.  The PDK is the intersection of these
histograms.  Bin ids are 64-bit hashes of the ordered word pair with c in the top 8 bits (the
channel); quanta are 1 (integer counts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy.cluster.vq import kmeans2

from lshdist._kernels.sets import pair_ids
from lshdist.blocks import SparseBlock
from lshdist.embed.histogram import N_CHANNELS, histograms
from lshdist.embed.pointsets import PointSets
from lshdist.errors import InputError, NotFittedError

if TYPE_CHECKING:
    from typing_extensions import Self

#: tag hashed into every PDK bin id
PDK_TAG = 0x50444B


def _int_param(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise InputError(f"{name}={value!r}: must be an integer in {lo}..{hi}")
    return int(value)


class ProximityDistribution:
    """Point sets (with image coordinates) to PDK histograms.

    Parameters
    ----------
    n_words : int >= 1
        Size of the codebook of visual words (k-means over the features).
    neighbors : int, 1..255
        R, the largest neighbourhood rank counted.
    max_fit_points : int
        k-means runs on at most this many points, sampled with the seed.
    seed : int
        Seeds the sample and k-means (scipy's ``kmeans2`` with k-means++ starts: scipy is a
        core dependency, scikit-learn only a test one).
    """

    def __init__(self, *, n_words: int = 64, neighbors: int = 8, max_fit_points: int = 100_000,
                 seed: int = 0) -> None:
        self.n_words = n_words
        self.neighbors = neighbors
        self.max_fit_points = max_fit_points
        self.seed = seed

    def fit(self, sets: PointSets) -> Self:
        """Learn the codebook from the sets' features."""
        k = _int_param("n_words", self.n_words, 1, 2**31 - 1)
        _int_param("neighbors", self.neighbors, 1, N_CHANNELS - 1)
        m = _int_param("max_fit_points", self.max_fit_points, 1, 2**62)
        V = sets.values
        if len(V) < k:
            raise InputError(f"n_words={k}, but the sets hold only {len(V)} points; "
                             "choose fewer words or give more sets")
        rng = np.random.default_rng(self.seed)
        sample = V if len(V) <= m else V[rng.choice(len(V), m, replace=False)]
        codebook, _ = kmeans2(sample.astype(np.float64), k, minit="++", seed=rng)
        #: visual words: float64 (n_words, d)
        self.codebook_ = codebook
        self.d_ = sets.d
        quanta = np.zeros(N_CHANNELS)
        quanta[1:self.neighbors + 1] = 1.0
        #: value of one count in each channel (neighbourhood size c): float64 (256,)
        self.quanta_ = quanta
        return self

    def words(self, sets: PointSets) -> np.ndarray:
        """The visual word of every point: int64 (T,)."""
        if not hasattr(self, "codebook_"):
            raise NotFittedError("this ProximityDistribution is not fitted; call fit(sets) "
                                 "first")
        if sets.d != self.d_:
            raise InputError(f"the sets have {sets.d} features, but the codebook was fitted "
                             f"on {self.d_}")
        C = self.codebook_
        cc = np.einsum("ij,ij->i", C, C)
        out = np.empty(len(sets.values), np.int64)
        step = max(1, 2**22 // max(1, len(C)))
        for i in range(0, len(out), step):
            X = sets.values[i:i + step].astype(np.float64)
            out[i:i + step] = np.argmin(cc[None, :] - 2 * X @ C.T, axis=1)
        return out

    def transform(self, sets: PointSets) -> SparseBlock:
        """PDK histograms, one row per set (ids uint64, integer counts as float32)."""
        w = self.words(sets)
        if sets.coords is None:
            raise InputError("the PDK needs image coordinates of the points; build the sets "
                             "with coords=")
        R = int(self.neighbors)
        rows, ids = [], []
        for s in range(len(sets)):
            lo, hi = int(sets.offsets[s]), int(sets.offsets[s + 1])
            n = hi - lo
            if n < 2:
                continue
            xy = sets.coords[lo:hi].astype(np.float64)
            D = ((xy[:, None, :] - xy[None, :, :]) ** 2).sum(axis=2)
            np.fill_diagonal(D, np.inf)
            order = np.argsort(D, axis=1, kind="stable")[:, :min(R, n - 1)]  # (n, r)
            a_words, b_words = w[lo:hi], w[lo:hi][order]
            for c in range(1, R + 1):
                r = min(c, n - 1)
                a = np.repeat(a_words, r)
                b = np.ascontiguousarray(b_words[:, :r]).ravel()
                ids.append(pair_ids(PDK_TAG, c, a, b))
                rows.append(np.full(len(a), s, np.int64))
        if not ids:
            return histograms(np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0),
                              len(sets), self.quanta_)
        cat_ids = np.concatenate(ids)
        return histograms(np.concatenate(rows), cat_ids, np.ones(len(cat_ids)), len(sets),
                          self.quanta_)

    def fit_transform(self, sets: PointSets) -> SparseBlock:
        return self.fit(sets).transform(sets)
