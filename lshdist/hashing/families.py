"""Hash families (ARCHITECTURE.md section 2): one interface, fit-free, cheap to broadcast.

Every family maps rows to b-bit keys packed in uint64 words: ``hash(X) -> (n, ceil(b/64))``.
``project(X) -> (n, b)`` gives the real values whose signs are the bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lshdist._kernels.hashing import gaussian_rows, pack_signs
from lshdist.blocks import Block, RowsLike, SparseBlock, as_block
from lshdist.errors import InputError
from lshdist.limits import MAX_BITS
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric

if TYPE_CHECKING:
    from lshdist.protocols import Metric

#: rows projected at once by `HashFamily.hash`: every BLAS call has this shape (so a row's
#: key does not depend on the chunking); a (rows, b) float32 block stays in cache
HASH_BLOCK_ROWS = 256


def check_bits(bits: int) -> int:
    if (not isinstance(bits, (int, np.integer)) or isinstance(bits, bool)
            or not 1 <= bits <= MAX_BITS):
        raise InputError(
            f"bits={bits!r}: the number of hash bits must be an integer in 1..{MAX_BITS}"
        )
    return int(bits)


def gaussian_matrix(seed: int, d: int, bits: int) -> np.ndarray:
    """``R`` (bits x d) of the counter-based Gaussians for features ``0..d-1``."""
    R = gaussian_rows(np.uint64(seed), np.arange(d, dtype=np.uint64), bits)  # (d, bits)
    return np.ascontiguousarray(R.T)


def sparse_projection(X: SparseBlock, seed: int, bits: int) -> np.ndarray:
    """``R phi(x)`` for sparse rows: Gaussians generated only for the block's features."""
    Rf = gaussian_rows(np.uint64(seed), X.features, bits)  # (f, bits)
    return np.asarray(X.matrix.astype(np.float64) @ Rf)


def _rows_f32(X: np.ndarray) -> np.ndarray:
    """Dense rows as float32, without a copy when they already are."""
    return np.asarray(X, dtype=np.float32)


class HashFamily:
    """Base: b bits from ``project``."""

    name = "base"
    #: dense rows are hashed in fixed-size blocks (`hash`): set by the float32 BLAS families
    fixed_blocks = False
    bits: int
    seed: int
    #: the metric whose candidates are re-ranked (None: a baseline family without one)
    metric: Metric | None

    def project(self, X: RowsLike) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def hash(self, X: RowsLike) -> np.ndarray:
        """Packed keys, uint64 (n, ceil(bits / 64)).

        Dense rows of the float32 families are projected in blocks of exactly
        `HASH_BLOCK_ROWS` rows (the last one padded with zero rows): BLAS then multiplies every
        row with the same kernel and summation order whatever the number of rows asked, so a
        row's key does not depend on how the rows were chunked (shards, segments, query
        batches) — float32 rounding near 0 would otherwise flip a bit between chunkings."""
        if self.fixed_blocks and isinstance(X, np.ndarray) and X.ndim == 2:
            n = len(X)
            out = np.empty((n, (self.bits + 63) // 64), dtype=np.uint64)
            pad = np.zeros((HASH_BLOCK_ROWS, X.shape[1]), dtype=np.float32)
            for lo in range(0, n, HASH_BLOCK_ROWS):
                hi = min(lo + HASH_BLOCK_ROWS, n)
                if hi - lo == HASH_BLOCK_ROWS:
                    block = X[lo:hi]
                else:
                    pad[: hi - lo] = X[lo:hi]
                    pad[hi - lo:] = 0.0
                    block = pad
                P = self.project(block)
                out[lo:hi] = pack_signs(np.ascontiguousarray(P[: hi - lo]))
            return out
        keys: np.ndarray = pack_signs(np.ascontiguousarray(self.project(X)))
        return keys


class RandomHyperplanes(HashFamily):
    """Charikar's ``h_r(x) = [r^T x >= 0]``, the unlearned baseline (dense or sparse rows)."""

    name = "charikar"
    fixed_blocks = True

    def __init__(self, *, d: int, bits: int, seed: int = 0, center: np.ndarray | None = None,
                 metric: Metric | None = None):
        self.metric = metric  # the metric its candidates are re-ranked under (if any)
        self.d = int(d)
        self.bits = check_bits(bits)
        self.seed = int(seed)
        self.center = center
        self._R: np.ndarray | None = None
        self._offset: np.ndarray

    def project(self, X: RowsLike) -> np.ndarray:
        B = as_block(X)
        if isinstance(B, SparseBlock):
            return sparse_projection(B, self.seed, self.bits)
        if B.shape[1] != self.d:
            raise InputError(f"X has {B.shape[1]} features, but the hash family has d={self.d}")
        if self._R is None:
            R = gaussian_matrix(self.seed, self.d, self.bits)
            self._R = np.ascontiguousarray(R.T.astype(np.float32))  # (d, b)
            c = np.zeros(self.d) if self.center is None else np.asarray(self.center, np.float64)
            self._offset = (R @ c).astype(np.float32)
        P: np.ndarray = _rows_f32(B) @ self._R - self._offset
        return P


class LearnedExplicit(HashFamily):
    """``h_{r,A}(x) = [r^T G (x - mu) >= 0]`` with ``RG`` (b x d) precomputed (eq. 10);
    ``mu`` is the metric's centre (zero when it has none: the paper's form)."""

    name = "learned-explicit"
    fixed_blocks = True
    metric: ExplicitMetric

    def __init__(self, metric: ExplicitMetric, *, bits: int, seed: int = 0):
        self.metric = metric
        self.bits = check_bits(bits)
        self.seed = int(seed)
        self.RG = gaussian_matrix(self.seed, metric.d, self.bits) @ metric.G
        c = metric.center
        self.offset = np.zeros(self.bits) if c is None else self.RG @ c.astype(np.float64)
        # the product runs in float32 (the rows' own precision; half the bytes and twice the
        # flops of float64): the signs differ from float64 only where |r^T G (x - mu)| is
        # within float32 rounding of 0, and database and queries are hashed by this one path
        self._RGt32 = np.ascontiguousarray(self.RG.T.astype(np.float32))  # (d, b)
        self._offset32 = self.offset.astype(np.float32)

    def project(self, X: RowsLike) -> np.ndarray:
        """``RG (x - mu)`` for every row, float32 (n, b)."""
        Xd = self.metric.check(X)
        P: np.ndarray = _rows_f32(Xd) @ self._RGt32 - self._offset32
        return P


class LearnedImplicit(HashFamily):
    """``h(phi(x)) = [r^T phi(x) + sum_j gamma^r_j k(x_j, x) >= 0]`` (eq. 11).

    ``gamma^r = S^T (Phi^T r)``, one column per bit in ``Gamma`` (c x b).  For sparse rows the
    entries of r are counter-based Gaussians generated only at the input's features.
    """

    name = "learned-implicit"
    metric: ImplicitMetric

    def __init__(self, metric: ImplicitMetric, *, bits: int, seed: int = 0):
        self.metric = metric
        self.bits = check_bits(bits)
        self.seed = int(seed)
        self._dense_R: np.ndarray | None = None
        PhiR = self._direct(metric.basis)  # (c, b): Phi^T r for every bit
        self.Gamma = metric.S.T @ PhiR

    def _direct(self, X: Block) -> np.ndarray:
        if isinstance(X, SparseBlock):
            return sparse_projection(X, self.seed, self.bits)
        if self._dense_R is None:
            self._dense_R = gaussian_matrix(self.seed, self.metric.d, self.bits)
        P: np.ndarray = np.asarray(X, np.float64) @ self._dense_R.T
        return P

    def project_with(self, X: Block, kx: np.ndarray | None) -> np.ndarray:
        """Projection when the kernel values ``kx`` (n, c) are already computed (None: S = 0)."""
        P = self._direct(X)
        return P if kx is None else P + kx @ self.Gamma

    def hash_with(self, X: Block, kx: np.ndarray | None) -> np.ndarray:
        keys: np.ndarray = pack_signs(np.ascontiguousarray(self.project_with(X, kx)))
        return keys

    def project(self, X: RowsLike) -> np.ndarray:
        B = self.metric.check(X)
        return self.project_with(B, self.metric.kernel_values(B))


def family_for(metric: Metric, *, bits: int, seed: int = 0, learned: bool = True) -> HashFamily:
    """The hash family of a metric: learned (default) or Charikar's baseline."""
    if not learned:
        return RandomHyperplanes(d=metric.d, bits=bits, seed=seed,
                                 center=getattr(metric, "center", None), metric=metric)
    if isinstance(metric, ExplicitMetric):
        return LearnedExplicit(metric, bits=bits, seed=seed)
    if isinstance(metric, ImplicitMetric):
        return LearnedImplicit(metric, bits=bits, seed=seed)
    raise InputError(f"no hash family for {type(metric).__name__}")
