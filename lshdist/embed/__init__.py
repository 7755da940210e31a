"""Embeddings of sets of local features as sparse weighted histograms (ARCHITECTURE.md section 2).

`PointSets` holds the sets (ragged), `PyramidMatch` and `ProximityDistribution` map them to
histograms over hashed 64-bit bin ids whose intersection (`IntersectionKernel`) is the PMK or
PDK; `lshdist.embed.unary` is their implicit unary encoding (hashed by
`lshdist.hashing.unary`).
"""

from lshdist.embed.histogram import IntersectionKernel
from lshdist.embed.pointsets import PointSets
from lshdist.embed.proximity import ProximityDistribution
from lshdist.embed.pyramid import PyramidMatch

__all__ = ["IntersectionKernel", "PointSets", "ProximityDistribution", "PyramidMatch"]
