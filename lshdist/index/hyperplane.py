"""Hyperplane queries: the points nearest to hyperplanes ``w^T x = 0`` (NIPS 2010).

Database points are hashed with the point side of H-Hash or EH-Hash
(`lshdist.hashing.hyperplane`), query normals with the query side; the permutation lists
(`PermutationIndex`) find candidates exactly as for k-NN queries, and the candidates are
re-ranked by the margin ``|w^T x| / ||w||`` (`MarginDensePayload`, `MarginSparsePayload`).
`HyperplaneIndex` is the one-process API; the distributed job is
`lshdist.cluster.hyperplane`.

Two ways to find candidates from the same keys (``mode``):

- ``"hash"``: the permutation lists (Charikar's search for keys that share long prefixes with
  the query's), as the paper runs it;
- ``"rank"``: every key's *angle score* (`angle_scores`: for H-Hash ``|D_u - D_v|``, the
  difference of the disagreements on the u and the v bits; for EH-Hash the Hamming distance),
  the ``candidates`` rows of smallest score re-ranked exactly.  One pass over the keys
  (b / 8 bytes a row), no list.  Why: a pool row at angle theta = pi/2 - delta from a normal
  collides with the query under either family with a probability only quadratic in delta
  (H-Hash ``1/4 - delta^2/pi^2`` per function, EH-Hash ``arccos(sin^2 delta)/pi``), and in
  high dimensions nearly every row is within a few tenths of a radian of perpendicular
  (Fashion-MNIST, an SVM's normal: median |cos theta| 0.08-0.13), so prefix agreement hardly
  tells rows apart; H-Hash's two bits per function also carry the angle itself, linearly:
  ``E[D_u - D_v] = F (2 theta/pi - 1)`` over F functions.  Measured: docs/design/notes.md and
  docs/benchmarks.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from lshdist._kernels.hyperplane import (
    rank_candidates,
    rerank_margin_dense,
    rerank_margin_sparse,
)
from lshdist.blocks import (
    Block,
    RowsLike,
    SparseBlock,
    as_block,
    n_rows,
    on_row_ranges,
    row_ranges,
)
from lshdist.config import HYPERPLANE_MODES, check_mode
from lshdist.errors import InputError, NotFittedError
from lshdist.hashing.hyperplane import HHash, HyperplaneFamily, hyperplane_family
from lshdist.index.payload import REL_F64_PAYLOAD, csr_take, f64_slack, refuse_overflow
from lshdist.index.permutation import PermutationIndex
from lshdist.index.scan import scan_topk
from lshdist.index.searcher import permutation_seed
from lshdist.validation import check_k

if TYPE_CHECKING:
    from lshdist.protocols import RerankPayload

#: hyperplane query modes: the permutation lists, a ranking of every key, the exact scan
MODES = HYPERPLANE_MODES
#: rows re-ranked per hyperplane by mode "rank" (the paper scanned N rho = 500 points)
RANK_CANDIDATES = 500

#: sparse H-Hash keeps the Gaussians of the pool's features up to this many (512 MB float32:
#: 20 Newsgroups' 73,712 features x 1,024 bits take 302 MB)
CACHED_GAUSSIANS = 2**27
#: dense rows centred or scaled for their keys, hashed this many at a time (`encode_points`:
#: 103 MB of float64 at 785 features)
ENCODE_BLOCK_ROWS = 16_384


def _inverse_norms(W: Block, d: int | None) -> np.ndarray:
    """``1 / ||w||`` over the first ``d`` features of dense rows (the normal, not the bias
    column), or all features of sparse rows (the bias feature excluded by the caller)."""
    if isinstance(W, SparseBlock):
        n = np.sqrt(W.row_norms_sq())
    else:
        n = np.linalg.norm(np.asarray(W, np.float64)[:, :d], axis=1)
    if np.any(n == 0):
        raise InputError(f"hyperplane {int(np.flatnonzero(n == 0)[0])} has a zero normal "
                         "vector w; every query needs ||w|| > 0")
    out: np.ndarray = 1.0 / n
    return out


class MarginDensePayload:
    """Dense rows ``X`` float32 (N, D) (points) or normals (queries: float64, with
    ``inv_norm`` (Q,)); the distance is ``|w^T x| / ||w||``.  Normals stay float64: a margin
    near 0 is a difference of large terms, and rounding w to float32 would cost it digits."""

    kind = "margin-dense"

    def __init__(self, X: ArrayLike, inv_norm: ArrayLike | None = None):
        dtype = np.float32 if inv_norm is None else np.float64
        self.X = np.ascontiguousarray(X, dtype=dtype)
        self.inv_norm = None if inv_norm is None else np.ascontiguousarray(inv_norm, np.float64)

    def prepare(self, n_threads: int = 1) -> None:
        """Nothing to make ahead (the re-rank reads the arrays as stored)."""

    def __len__(self) -> int:
        return int(self.X.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        return {"X": self.X}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> MarginDensePayload:
        """From stored arrays: ``X`` float32 (N, D).

        Raises
        ------
        InputError
            If an array is missing, extra, or of the wrong dtype or shape.
        """
        if set(a) != {"X"}:
            raise InputError(f"a margin-dense payload has arrays ['X'], got {sorted(a)}")
        X = np.asarray(a["X"])
        if X.dtype != np.float32 or X.ndim != 2:
            raise InputError(f"payload array 'X' must be 2-d float32, got {X.ndim}-d {X.dtype}")
        return cls(X)

    @property
    def width(self) -> float:
        return float(self.X.shape[1])

    def take(self, rows: slice | np.ndarray) -> MarginDensePayload:
        return MarginDensePayload(self.X[rows],
                                  None if self.inv_norm is None else self.inv_norm[rows])

    def _query_norms(self, query: MarginDensePayload) -> np.ndarray:
        if query.inv_norm is None:
            raise InputError("the query payload has no normal norms: encode queries with "
                             "encode_hyperplanes")
        if query.X.shape[1] != self.X.shape[1]:
            raise InputError(f"hyperplanes have {query.X.shape[1]} columns, the index's points "
                             f"{self.X.shape[1]}")
        return query.inv_norm

    def rerank(self, offsets: np.ndarray, rows: np.ndarray, query: MarginDensePayload, k: int,
               tiebreak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inv = self._query_norms(query)
        dist, top = rerank_margin_dense(offsets, rows, self.X, query.X, inv, k, tiebreak)
        return refuse_overflow(dist, top, "margin")

    def scan_slack(self, query: MarginDensePayload) -> tuple[np.ndarray, np.ndarray, float]:
        """`distances` and the re-rank are float64 sums of the same exact products:
        ``|w^T x|`` is within a float64 rounding of ``|w| |x|``, times ``1 / |w|``."""
        inv = self._query_norms(query)
        if not hasattr(self, "_x_max"):  # in row blocks: no float64 copy of the whole pool
            self._x_max = float(np.sqrt(max(
                (np.square(self.X[a:b], dtype=np.float64).sum(axis=1).max()
                 for a, b in row_ranges(len(self), max(1, len(self) // 65536))),
                default=0.0)))
        w = np.linalg.norm(query.X, axis=1)
        return np.zeros(len(query)), f64_slack(self._x_max * w * inv), REL_F64_PAYLOAD

    def distances(self, query: MarginDensePayload) -> np.ndarray:
        """``|w^T x| / ||w||`` from every query to every row, float64 (Q, N)."""
        inv = self._query_norms(query)
        D: np.ndarray = np.abs(query.X @ self.X.T.astype(np.float64))
        D *= inv[:, None]
        return D


class MarginSparsePayload:
    """Sparse rows (CSR over uint64 feature ids) of points, or of normals with ``inv_norm``."""

    kind = "margin-sparse"

    def __init__(self, indptr: ArrayLike, indices: ArrayLike, data: ArrayLike,
                 inv_norm: ArrayLike | None = None):
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices, dtype=np.uint64)
        self.data = np.ascontiguousarray(data, dtype=np.float32)
        self.inv_norm = None if inv_norm is None else np.ascontiguousarray(inv_norm, np.float64)

    def prepare(self, n_threads: int = 1) -> None:
        """Number the rows' features locally (`_local`) before a search's threads share it."""
        self._local()

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def arrays(self) -> dict[str, np.ndarray]:
        return {"indptr": self.indptr, "indices": self.indices, "data": self.data}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> MarginSparsePayload:
        """From stored arrays: ``indptr`` int64 (N+1,) ascending from 0 to nnz, ``indices``
        uint64 (nnz,), ``data`` float32 (nnz,).

        Raises
        ------
        InputError
            If an array is missing, extra, of the wrong dtype, or ``indptr`` does not delimit
            ``indices``.
        """
        if set(a) != {"indptr", "indices", "data"}:
            raise InputError("a margin-sparse payload has arrays ['data', 'indices', 'indptr'], "
                             f"got {sorted(a)}")
        for name, dtype in (("indptr", np.int64), ("indices", np.uint64), ("data", np.float32)):
            v = np.asarray(a[name])
            if v.dtype != dtype or v.ndim != 1:
                raise InputError(f"payload array {name!r} must be 1-d {np.dtype(dtype)}, got "
                                 f"{v.ndim}-d {v.dtype}")
        indptr, nnz = a["indptr"], len(a["indices"])
        if (len(indptr) < 1 or len(a["data"]) != nnz or indptr[0] != 0 or indptr[-1] != nnz
                or np.any(np.diff(indptr) < 0)):
            raise InputError(f"margin-sparse payload: indptr must ascend from 0 to nnz={nnz} "
                             "and data have nnz entries")
        return cls(a["indptr"], a["indices"], a["data"])

    @property
    def width(self) -> float:
        return float(self.indptr[-1]) / max(len(self), 1)

    def take(self, rows: slice | np.ndarray) -> MarginSparsePayload:
        """Rows ``rows``: a slice with step 1, or an integer array (any order)."""
        indptr, (indices, data) = csr_take(self.indptr, (self.indices, self.data), rows)
        return MarginSparsePayload(indptr, indices, data,
                                   None if self.inv_norm is None else self.inv_norm[rows])

    def block(self) -> SparseBlock:
        return SparseBlock.from_arrays(self.indptr, self.indices, self.data)

    def _local(self) -> tuple[np.ndarray, np.ndarray]:
        if not hasattr(self, "_features"):
            features, inv = np.unique(self.indices, return_inverse=True)
            # both set before either is seen: a search's other thread tests `_features`
            self._local_idx = inv.astype(np.int32).ravel()
            self._features = features
        return self._features, self._local_idx

    def _query_norms(self, query: MarginSparsePayload) -> np.ndarray:
        if query.inv_norm is None:
            raise InputError("the query payload has no normal norms: encode queries with "
                             "encode_hyperplanes")
        return query.inv_norm

    def rerank(self, offsets: np.ndarray, rows: np.ndarray, query: MarginSparsePayload, k: int,
               tiebreak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inv = self._query_norms(query)
        features, local = self._local()
        pos = np.searchsorted(features, query.indices)
        posc = np.minimum(pos, max(len(features) - 1, 0))
        hit = ((pos < len(features)) & (features[posc] == query.indices) if len(features)
               else np.zeros(len(query.indices), bool))
        qlocal = np.where(hit, posc, -1).astype(np.int32)
        dist, top = rerank_margin_sparse(offsets, rows, self.indptr, local, self.data,
                                         len(features), query.indptr, qlocal,
                                         query.data.astype(np.float64), inv, k, tiebreak)
        return refuse_overflow(dist, top, "margin")

    def scan_slack(self, query: MarginSparsePayload) -> tuple[np.ndarray, np.ndarray, float]:
        """As `MarginDensePayload.scan_slack`, over the sparse rows' norms."""
        inv = self._query_norms(query)
        if not hasattr(self, "_x_max"):
            self._x_max = float(np.sqrt(self.block().row_norms_sq().max())) if len(self) else 0.0
        w = np.sqrt(query.block().row_norms_sq())
        return np.zeros(len(query)), f64_slack(self._x_max * w * inv), REL_F64_PAYLOAD

    def distances(self, query: MarginSparsePayload) -> np.ndarray:
        inv = self._query_norms(query)
        if not hasattr(self, "_block"):
            self._block = self.block()
        D: np.ndarray = np.abs(query.block().dot_t(self._block)) * inv[:, None]
        return D


MarginPayload = MarginDensePayload | MarginSparsePayload


def _payload(B: Block, inv_norm: np.ndarray | None = None) -> MarginPayload:
    if isinstance(B, SparseBlock):
        return MarginSparsePayload(*B.to_arrays(), inv_norm=inv_norm)
    return MarginDensePayload(B, inv_norm)


def encode_points(family: HyperplaneFamily, X: RowsLike, center: np.ndarray | None = None,
                  bias_scale: float = 1.0) -> tuple[np.ndarray, MarginPayload]:
    """Point-side keys and margin payload of database rows (the bias feature appended);
    ``center`` (d,): the keys hash ``x - center`` (dense rows), the payload keeps ``x``;
    ``bias_scale`` c: the keys hash ``(x, c)`` (as ``(x / c, 1)``: the signs are the same),
    the payload keeps ``(x, 1)``."""
    B = family.points(X)
    if center is None and bias_scale == 1.0:
        keys: np.ndarray = family.hash_points(B)  # B: X checked, the constant appended once
    elif center is None and isinstance(X, SparseBlock):
        keys = family.hash(SparseBlock(X.matrix * (1.0 / bias_scale), X.features))
    else:
        # the rows as hashed, ENCODE_BLOCK_ROWS at a time: float64 copies of a whole pool
        # (three: converted, centred, scaled -- 19 GB for 1 M Fashion-MNIST rows) are never
        # made.  The keys are those of the whole array but where a projection is within a
        # float64 rounding of 0 (a BLAS may sum a row differently by its place in a block; the
        # cluster's segments are blocks too): tested equal, 40,000 rows x 256 bits
        Xa = np.asarray(X)
        keys = np.empty((len(Xa), (family.bits + 63) // 64), np.uint64)
        for lo in range(0, len(Xa), ENCODE_BLOCK_ROWS):
            Xd = Xa[lo:lo + ENCODE_BLOCK_ROWS].astype(np.float64)  # a copy: X is not changed
            if center is not None:
                Xd -= center[None, :]
            Xd /= bias_scale
            keys[lo:lo + ENCODE_BLOCK_ROWS] = family.hash(Xd)
    return keys, _payload(B)


def row_sums(X: np.ndarray) -> tuple[np.ndarray, float, int]:
    """``(sum of the dense rows (d,), sum of their squared norms, rows)`` in float64, summed
    8,192 rows at a time: no float64 copy of the rows (a 1 M-row pool's is 6.3 GB).  The pool
    centre and RMS norm in one process (`HyperplaneIndex.fit`, `rms_norm`) and on the cluster
    (each worker's rows, the sums gathered)."""
    total = np.zeros(X.shape[1])
    sq = 0.0
    for lo in range(0, len(X), 8192):
        Xd = np.asarray(X[lo:lo + 8192], np.float64)
        total += Xd.sum(axis=0)
        sq += float(np.einsum("ij,ij->", Xd, Xd))
    return total, sq, len(X)


def encode_hyperplanes(family: HyperplaneFamily, W: RowsLike,
                       offsets: np.ndarray | None = None, center: np.ndarray | None = None,
                       bias_scale: float = 1.0) -> tuple[np.ndarray, MarginPayload]:
    """Query-side keys and payload of hyperplane normals ``W`` (and offsets b with a bias);
    ``center``: the keys hash ``(w, b + w^T center)``, the same hyperplane in the centred
    coordinates of `encode_points`; ``bias_scale`` c: ``(w, b / c)``, the same hyperplane
    for the points ``(x / c, 1)``; the payload keeps ``(w, b)``."""
    raw = family._check(W, "hyperplane normals", exact=True)  # the one check of the normals
    inv = _inverse_norms(raw, family.d)
    B = family.with_offsets(raw, offsets)
    if center is None and bias_scale == 1.0:
        keys = family.hash_query_block(B)
    else:
        b = (np.zeros(n_rows(raw)) if offsets is None
             else np.asarray(offsets, np.float64).ravel())
        if center is not None:
            b = b + np.asarray(raw, np.float64) @ center
        keys = family.hash_query_block(family.with_offsets(raw, b / bias_scale))
    return keys, _payload(B, inv)


def rms_from_sums(sq: float, n: int, center: np.ndarray | None = None) -> float:
    """The RMS norm of n rows whose squared norms sum to ``sq`` (of ``x - center`` when
    ``center`` is their mean: ``sqrt(sq / n - ||center||^2)``); 1 for rows all zero or none."""
    if n == 0:
        return 1.0
    ms = sq / n - (float(center @ center) if center is not None else 0.0)
    return float(np.sqrt(ms)) if np.isfinite(ms) and ms > 0 else 1.0


def rms_norm(X: RowsLike, center: np.ndarray | None = None,
             sums: tuple[np.ndarray, float, int] | None = None) -> float:
    """The root-mean-square norm of the rows (of ``x - center``), the bias constant at the
    data's scale (`HyperplaneIndex` ``bias_scale``), `rms_from_sums`; ``sums``: the rows'
    `row_sums`, already made (not read again)."""
    B = as_block(X)
    if sums is None:
        sums = ((np.zeros(0), float(B.row_norms_sq().sum()), n_rows(B))
                if isinstance(B, SparseBlock) else row_sums(np.asarray(B)))
    return rms_from_sums(sums[1], sums[2], center)


def default_bias_scale(X: RowsLike, center: np.ndarray | None, given: float | None,
                       sums: tuple[np.ndarray, float, int] | None = None) -> float:
    """The bias constant c the keys hash: ``given``, else the RMS norm of the centred rows when
    they are centred, else 1.

    Why: a point ``(x, c)`` and a query ``(w, b / c)`` are at an angle whose cosine, across
    rows, spreads most (the signal the angle scores estimate) when
    ``c^2 = R |b| / ||w||`` -- R the rows' RMS norm, ``|b| / ||w||`` the hyperplane's distance
    from the origin of the hashed coordinates.  Rows as given (pixels: far from the origin) and
    SVMs fitted with a penalised intercept pass near the origin: c = 1 (Fashion-MNIST in
    [0, 1], 500 of 20,000 rows re-ranked: nearest margin 0.00086; c = R: 0.033).  Centred rows
    put the origin in the data, and a one-vs-rest hyperplane within about R of it: c = R
    (the SVMs of rows at unit RMS norm: nearest 0.0017 against 0.0024 with c = 1 and 0.0116
    uncentred; 500 random rows 0.016)."""
    if given is not None:
        return float(given)
    return rms_norm(X, center, sums) if center is not None else 1.0


class HyperplaneIndex:
    """Points nearest to query hyperplanes, by H-Hash or EH-Hash keys and the permutation
    lists; scikit-learn-shaped ``fit(X)`` / ``query(W, k)``.

    Parameters
    ----------
    family : ``"h-hash"`` or ``"eh-hash"``
    bits : key length (H-Hash: two per function, so even)
    n_permutations, epsilon, window, hamming_keep : see `PermutationIndex` (default W=1, H=0)
    samples : EH-Hash: t for the sampled query embedding (None: exact)
    terms : EH-Hash: rows and normals hashed over their m largest entries (None: every entry;
        `lshdist.hashing.hyperplane.EHHash`)
    bias : hyperplanes ``w^T x + b = 0`` (``offsets`` b given to ``query``)
    center : dense rows: the keys hash ``x - mu`` (mu the mean of the fitted rows, ``center_``)
        and queries ``(w, b + w^T mu)``, the same hyperplane in centred coordinates.  Points
        that all lie in one narrow cone (non-negative pixels) otherwise get nearly the same
        random-projection bits.  Only the keys change: candidates are re-ranked on the rows as
        given, so every margin reported is that of the uncentred rows exactly.  Needs
        ``bias=True`` (a centred hyperplane has an offset); ignored for sparse rows (centring
        would make them dense), ``center_`` is then None.
    bias_scale : with ``bias``, the constant c of the bias feature the keys hash: points
        ``(x, c)``, queries ``(w, b / c)`` (the payload and every margin keep ``(x, 1)`` and
        ``(w, b)``).  None (default): with ``center`` the root-mean-square norm of the centred
        rows, else 1 (`default_bias_scale` says why; ``bias_scale_``).
    seed : seeds the hash functions and the permutations

    ``query`` returns ``(distances (Q, k), ids (Q, k))``, ascending ``|w^T x + b| / ||w||``.
    """

    def __init__(self, *, family: str = "h-hash", bits: int = 64,
                 n_permutations: int | None = None, epsilon: float | None = None,
                 window: int = 1, hamming_keep: int = 0, samples: int | None = None,
                 terms: int | None = None, bias: bool = False, center: bool = False,
                 bias_scale: float | None = None,
                 seed: int = 0) -> None:
        self.family = family
        self.bits = bits
        self.n_permutations = n_permutations
        self.epsilon = epsilon
        self.window = window
        self.hamming_keep = hamming_keep
        self.samples = samples
        self.terms = terms
        self.bias = bias
        self.center = center
        self.bias_scale = bias_scale
        self.seed = seed

    def fit(self, X: RowsLike, ids: np.ndarray | None = None, *, n_threads: int = 1
            ) -> HyperplaneIndex:
        B = as_block(X)
        if self.center and not self.bias:
            raise InputError("center=True needs bias=True: a hyperplane through the origin is "
                             "not through the origin of centred coordinates")
        d = 1 if isinstance(B, SparseBlock) else int(B.shape[1])
        self.family_ = hyperplane_family(self.family, d=d, bits=self.bits, seed=self.seed,
                                         bias=self.bias, samples=self.samples,
                                         terms=self.terms,
                                         n_threads=n_threads)
        self.center_: np.ndarray | None = None
        sums = None  # one pass over the rows gives the centre and the bias constant
        if self.center and not isinstance(B, SparseBlock) and len(B):
            sums = row_sums(np.asarray(B))
            self.center_ = sums[0] / sums[2]
        if (isinstance(B, SparseBlock) and isinstance(self.family_, HHash)
                and len(B.features) * self.bits <= CACHED_GAUSSIANS):
            # a query normal spans thousands of the pool's features: their Gaussians are
            # generated once here, not at every query (29 of 31 ms a query on 20 Newsgroups)
            self.family_.cache_features(B.features)
        self.bias_scale_ = 1.0
        if self.bias:
            self.bias_scale_ = default_bias_scale(B, self.center_, self.bias_scale, sums)
            if not np.isfinite(self.bias_scale_) or self.bias_scale_ <= 0:
                raise InputError(f"bias_scale={self.bias_scale!r}: the bias constant must be a "
                                 "positive number (or None: the rows' RMS norm)")
        codes, payload = encode_points(self.family_, B, self.center_, self.bias_scale_)
        self.index_ = PermutationIndex(
            n_permutations=self.n_permutations, epsilon=self.epsilon, window=self.window,
            hamming_keep=self.hamming_keep, seed=permutation_seed(self.seed),
        ).fit(codes, self.family_.bits, payload, ids, n_threads=n_threads)
        return self

    def query(self, W: RowsLike, k: int, *, offsets: np.ndarray | None = None,
              mode: str = "hash", candidates: int = RANK_CANDIDATES, n_threads: int = 1
              ) -> tuple[np.ndarray, np.ndarray]:
        """``(distances float32 (Q, k), ids int64 (Q, k))`` by margin, ascending;
        ``mode="rank"``: the ``candidates`` rows of smallest angle score re-ranked (module
        docstring); ``mode="scan"``: exact over all points.  ``self.stats_``: candidates per
        query of the last hashed or ranked query."""
        if not hasattr(self, "index_"):
            raise NotFittedError("this HyperplaneIndex is not fitted; call fit(X) first")
        check_mode(mode, MODES)
        k = check_k(k)
        qcodes, qpayload = encode_hyperplanes(self.family_, W, offsets, self.center_,
                                              self.bias_scale_)
        dist, ids, stats = search_hyperplanes(self.index_, qcodes, qpayload, k, mode=mode,
                                              n_threads=n_threads, candidates=candidates,
                                              paired=isinstance(self.family_, HHash))
        if mode != "scan":
            self.stats_ = stats
        return dist, ids


def search_hyperplanes(index: PermutationIndex, qcodes: np.ndarray, qpayload: RerankPayload,
                       k: int, *, mode: str = "hash", n_threads: int = 1,
                       n_permutations: int | None = None, window: int | None = None,
                       hamming_keep: int | None = None, candidates: int = RANK_CANDIDATES,
                       paired: bool = True
                       ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Top-k margins of encoded hyperplanes against one fitted segment, hashed, ranked or by
    exact scan: ``(dist (Q, k), ids (Q, k), stats)``; ``stats["reranked"]`` (Q,) counts the
    exact margins computed per query.  ``n_permutations``/``window``/``hamming_keep`` override
    the segment's own for this call; ``candidates`` and ``paired`` (H-Hash keys) are those of
    mode ``"rank"``."""
    check_mode(mode, MODES)
    if mode == "rank":
        return rank_search(index, qcodes, qpayload, k, candidates=candidates, paired=paired,
                           n_threads=n_threads)
    if mode == "scan":
        dist, ids = scan_topk(index.payload_, qpayload, k, ids=index.ids_, n_threads=n_threads)
        return dist, ids, {"reranked": np.full(len(ids), len(index), np.int64)}
    found: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] = index.search(
        qcodes, qpayload, k, n_threads=n_threads, n_permutations=n_permutations, window=window,
        hamming_keep=hamming_keep)
    return found


def candidate_shares(candidates: int, rows: list[int]) -> list[int]:
    """Rows re-ranked per segment when a hyperplane's ``candidates`` are shared by segments of
    ``rows`` rows: in proportion, rounded up (at least 1 each), so that the total is the
    asked-for number up to the rounding and does not grow with the number of segments."""
    n = max(sum(rows), 1)
    return [max(1, -(-int(candidates) * int(r) // n)) for r in rows]


def rank_search(index: PermutationIndex, qcodes: np.ndarray, qpayload: RerankPayload, k: int,
                *, candidates: int = RANK_CANDIDATES, paired: bool = True, n_threads: int = 1
                ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Mode ``"rank"`` on one segment: every key's angle score, the ``candidates`` smallest
    re-ranked by the exact margin (ties of the score by row, of the margin by id).
    ``n_threads``: the hyperplanes shared among threads.  (One hyperplane's key scan split
    among threads was tried: 1.46x at 1 M rows with the kernels called directly, none through
    a query -- 11.3 against 10.7 ms -- and dropped.  The cause, measured: the query's own
    BLAS product (hashing the normal) leaves OpenBLAS's second thread spinning on the other
    core for a while, and the split's second thread shares that core: 6.8 ms split without a
    product before it, 10.1 ms after one, 9.2 ms on one thread either way.)"""
    if isinstance(candidates, bool) or not isinstance(candidates, (int, np.integer)) \
            or candidates < 1:
        raise InputError(f"candidates={candidates!r}: rows re-ranked per hyperplane must be an "
                         "integer >= 1")
    if paired and index.bits_ % 2:
        raise InputError(f"paired angle scores need H-Hash keys (an even number of bits); the "
                         f"segment's keys have {index.bits_}")
    Q = qcodes.shape[0]
    if qcodes.ndim != 2 or qcodes.shape[1] != index.codes_.shape[1]:
        raise InputError(f"hyperplane keys have shape {qcodes.shape}; the segment's keys have "
                         f"{index.codes_.shape[1]} words of 64 bits: hash the hyperplanes with "
                         "the family the segment was built with")
    index.payload_.prepare(n_threads)  # what the re-rank keeps, made before threads share it
    max_score = 64 * int(index.codes_.shape[1])

    def run(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        offsets, rows = rank_candidates(index.codes_, np.ascontiguousarray(qcodes[lo:hi]),
                                        paired, int(candidates), int(index.bits_), max_score)
        dist, top = index.payload_.rerank(offsets, rows, qpayload.take(np.arange(lo, hi)), k,
                                          index.ids_)
        return dist, top

    results = on_row_ranges(run, Q, n_threads)
    dist = np.concatenate([r[0] for r in results]).astype(np.float32)
    top = np.concatenate([r[1] for r in results])
    ids = np.where(top >= 0, index.ids_[np.maximum(top, 0)], -1)
    reranked = np.full(Q, min(int(candidates), len(index)), np.int64)
    return dist, ids, {"distinct": reranked.copy(), "reranked": reranked}
