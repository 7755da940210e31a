"""Hash families (ARCHITECTURE.md section 2): one interface, fit-free, cheap to broadcast.

Every family maps rows to b-bit keys packed in uint64 words: ``hash(X) -> (n, ceil(b/64))``.
``project(X) -> (n, b)`` gives the real values whose signs are the bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lshdist._kernels.hashing import gaussian_rows, pack_signs, pack_signs_exact
from lshdist.blocks import Block, RowsLike, SparseBlock, as_block, on_row_ranges
from lshdist.errors import InputError
from lshdist.limits import MAX_BITS, one_blas_thread
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric

if TYPE_CHECKING:
    from lshdist.protocols import Metric

#: rows projected at once by `HashFamily.hash`: a (rows, b) float32 block stays in cache
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
    #: dense rows are projected by float32 BLAS (`_f32_terms`) with exact signs near 0 (`hash`)
    float32_blas = False
    #: (W^T, tol |w|, tol |off|) of `hash`'s exact signs, made at the first call
    _exact: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    bits: int
    seed: int
    #: the metric whose candidates are re-ranked (None: a baseline family without one)
    metric: Metric | None

    def __init__(self, *, bits: int, seed: int = 0) -> None:
        """Every family's key length and seed, checked here once (`check_bits`: a family
        built from code, not from a config, meets the config's rule too)."""
        self.bits = check_bits(bits)
        self.seed = int(seed)

    def project(self, X: RowsLike) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def _f32_terms(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Float32 families: the rows as float32, ``W`` (d, b) and ``off`` (b,) float32 with
        ``project(X) = X W - off``."""  # pragma: no cover - interface
        raise NotImplementedError

    def hash(self, X: RowsLike, *, n_threads: int = 1) -> np.ndarray:
        """Packed keys, uint64 (n, ceil(bits / 64)).

        Dense rows of the float32 families are projected by BLAS in blocks of
        `HASH_BLOCK_ROWS` rows, and every sign within float32 rounding of 0 is settled by the
        float64 product summed in one fixed order (`pack_signs_exact`): a row's key does not
        depend on how the rows were chunked (shards, segments, query batches) nor on the BLAS
        build or CPU -- BLAS kernels sum a row differently by its position in the block.
        ``n_threads`` > 1: the rows in that many parts, each projected by single-threaded BLAS
        and packed on its own thread (`pack_signs_exact` is serial: with one caller, BLAS
        used both cores and the packing one; Fashion-MNIST 60,000 rows, b = 512, 2 threads:
        0.31 -> 0.24 s).  The keys are the same whatever ``n_threads``."""
        if self.float32_blas and isinstance(X, np.ndarray) and X.ndim == 2:
            # rows stored as bytes are made float32 a block at a time (the same numbers)
            as_bytes = X.dtype == np.uint8
            X32, W, off = self._f32_terms(X[:0] if as_bytes else X)
            if as_bytes:
                X32 = X
            if self._exact is None:
                # twice the error bound (d + 2) u of a float32 product of length d, then the
                # subtraction, rounded up to float32 (the comparison's precision)
                tol = 2.0 * (W.shape[0] + 2) * 2.0 ** -24
                W64 = W.astype(np.float64)
                wtol = tol * 1.01 * np.sqrt(np.einsum("kb,kb->b", W64, W64))
                otol = tol * 1.01 * np.abs(off.astype(np.float64))
                self._exact = (np.ascontiguousarray(W.T), wtol.astype(np.float32),
                               otol.astype(np.float32))
            Wt, wtol32, otol32 = self._exact
            n = len(X32)
            out = np.empty((n, (self.bits + 63) // 64), dtype=np.uint64)

            def rows(start: int, stop: int) -> None:
                for lo in range(start, stop, HASH_BLOCK_ROWS):
                    blk = np.ascontiguousarray(X32[lo:min(lo + HASH_BLOCK_ROWS, stop)],
                                               dtype=np.float32)
                    P = blk @ W - off
                    xnorm = np.sqrt(np.einsum("ij,ij->i", blk, blk))
                    out[lo:lo + len(blk)] = pack_signs_exact(P, blk, xnorm, Wt, off, wtol32,
                                                             otol32)

            on_row_ranges(rows, n, min(int(n_threads), n // (4 * HASH_BLOCK_ROWS)),
                          threaded=one_blas_thread)
            return out
        keys: np.ndarray = pack_signs(np.ascontiguousarray(self.project(X)))
        return keys


class RandomHyperplanes(HashFamily):
    """Charikar's ``h_r(x) = [r^T x >= 0]``, the unlearned baseline (dense or sparse rows)."""

    name = "charikar"
    float32_blas = True

    def __init__(self, *, d: int, bits: int, seed: int = 0, center: np.ndarray | None = None,
                 metric: Metric | None = None):
        super().__init__(bits=bits, seed=seed)
        self.metric = metric  # the metric its candidates are re-ranked under (if any)
        self.d = int(d)
        self.center = center
        self._R: np.ndarray | None = None
        self._offset: np.ndarray

    def _terms(self) -> tuple[np.ndarray, np.ndarray]:
        if self._R is None:
            R = gaussian_matrix(self.seed, self.d, self.bits)
            self._R = np.ascontiguousarray(R.T.astype(np.float32))  # (d, b)
            c = np.zeros(self.d) if self.center is None else np.asarray(self.center, np.float64)
            self._offset = (R @ c).astype(np.float32)
        return self._R, self._offset

    def _f32_terms(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if X.shape[1] != self.d:
            raise InputError(f"X has {X.shape[1]} features, but the hash family has d={self.d}")
        R, off = self._terms()
        return _rows_f32(X), R, off

    def project(self, X: RowsLike) -> np.ndarray:
        B = as_block(X)
        if isinstance(B, SparseBlock):
            return sparse_projection(B, self.seed, self.bits)
        X32, R, off = self._f32_terms(B)
        P: np.ndarray = X32 @ R - off
        return P


class LearnedExplicit(HashFamily):
    """``h_{r,A}(x) = [r^T G (x - mu) >= 0]`` with ``RG`` (b x d) precomputed (eq. 10; kept
    transposed, in float32); ``mu`` is the metric's centre (zero when it has none: the
    paper's form)."""

    name = "learned-explicit"
    float32_blas = True
    metric: ExplicitMetric

    def __init__(self, metric: ExplicitMetric, *, bits: int, seed: int = 0):
        super().__init__(bits=bits, seed=seed)
        self.metric = metric
        R = gaussian_matrix(self.seed, metric.d, self.bits)
        # R I is R, exactly (each entry r 1 plus zeros): the prior skips the d x d x b product
        RG = R if metric.is_identity else R @ metric.G
        c = metric.center
        self.offset = np.zeros(self.bits) if c is None else RG @ c.astype(np.float64)
        # the product runs in float32 (the rows' own precision; half the bytes and twice the
        # flops of float64): the signs differ from float64 only where |r^T G (x - mu)| is
        # within float32 rounding of 0, and database and queries are hashed by this one path.
        # Only this copy is kept (RG in float64 would be sent with every family broadcast)
        self._RGt32 = np.ascontiguousarray(RG.T.astype(np.float32))  # (d, b)
        self._offset32 = self.offset.astype(np.float32)

    def _f32_terms(self, X: RowsLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _rows_f32(self.metric.check(X)), self._RGt32, self._offset32

    def project(self, X: RowsLike) -> np.ndarray:
        """``RG (x - mu)`` for every row, float32 (n, b)."""
        X32, W, off = self._f32_terms(X)
        P: np.ndarray = X32 @ W - off
        return P


class LearnedImplicit(HashFamily):
    """``h(phi(x)) = [r^T phi(x) + sum_j gamma^r_j k(x_j, x) >= 0]`` (eq. 11).

    ``gamma^r = S^T (Phi^T r)``, one column per bit in ``Gamma`` (c x b).  For sparse rows the
    entries of r are counter-based Gaussians generated only at the input's features.
    """

    name = "learned-implicit"
    metric: ImplicitMetric

    def __init__(self, metric: ImplicitMetric, *, bits: int, seed: int = 0):
        super().__init__(bits=bits, seed=seed)
        self.metric = metric
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
