"""Hash families for hyperplane queries (Jain, Vijayanarasimhan & Grauman, NIPS 2010).

A query is a hyperplane through the origin with normal ``w``; the points wanted are those with
the smallest margin ``|w^T x| / ||w||``.  The families hash database points and query normals
with *different* functions, so that a point collides with a query more often the closer it
lies to the hyperplane (ARCHITECTURE.md section 2):

- H-Hash, two bits per function ``(u, v)``: point ``[u^T x >= 0, v^T x >= 0]``, query
  ``[u^T w >= 0, -v^T w >= 0]``;  ``Pr[collide] = 1/4 - (theta_{x,w} - pi/2)^2 / pi^2``
  (`hhash_collision`), theta the angle between x and w.
- EH-Hash, one bit per function U (d x d Gaussian, drawn symmetric: `EHHash`): point
  ``[x^T U x >= 0]`` (``u^T vec(x x^T)``), query ``[-w^T U w >= 0]``;
  ``Pr[collide] = arccos(cos^2 theta_{x,w}) / pi`` (`ehhash_collision`; the paper writes
  ``arccos(sin^2 theta) / pi`` with theta the angle between x and the *hyperplane*, pi/2
  minus ours).  The query side can use the sampled embedding of the paper's Lemma 3.4
  (``samples`` = t, see `lshdist._kernels.hyperplane.eh_sample_pairs`).

``project`` / ``hash`` are the point side (what the index stores); ``project_queries`` /
``hash_queries`` the query side.  A bias (hyperplanes ``w^T x + b = 0``) is a constant feature
appended to every point (value 1) and to every query (value ``b``), ``bias=True``.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from lshdist._kernels.ehhash import (
    eh_matrix,
    eh_multipliers,
    eh_project_rows,
    eh_project_sampled,
    top_terms,
)
from lshdist._kernels.hashing import gaussian_rows, pack_signs
from lshdist._kernels.hyperplane import content_seeds, eh_sample_pairs
from lshdist.blocks import Block, RowsLike, SparseBlock, as_block, n_rows
from lshdist.errors import InputError
from lshdist.hashing.families import HashFamily, check_bits, gaussian_matrix, sparse_projection
from lshdist.validation import check_finite

log = logging.getLogger(__name__)

#: dense EH-Hash materialises U (bits x D x D float64) up to this many entries (64 MB) and
#: hashes by matrix products; beyond, pairs are generated per row (`eh_project_rows`)
DENSE_U_ENTRIES = 2**23
#: seconds a pair and bit of EH-Hash costs one thread (`eh_project_rows`: 20 Newsgroups rows,
#: 1,024 bits, 0.59-0.63 ns on a 2-core Xeon with AVX-512 under a load of 10); the estimate
#: logged before hashing, corrected by the measured rate as it runs
EH_SECONDS_PER_PAIR_BIT = 0.6e-9
#: EH-Hash work (pairs x bits) from which the estimate and progress are logged (~1 s)
EH_LOG_PAIR_BITS = 2e9
#: an estimate above this many seconds is a warning that names what makes it cheaper
EH_WARN_SECONDS = 300.0
#: progress is logged at every tenth of the work or every this many seconds
EH_PROGRESS_SECONDS = 10.0
#: the feature id of the constant (bias) feature of sparse rows; dense rows get column d
BIAS_FEATURE = np.uint64(2**64 - 1)
FAMILIES = ("h-hash", "eh-hash")


def hhash_collision(theta: np.ndarray | float) -> np.ndarray:
    """H-Hash ``Pr[h(w) = h(x)] = 1/4 - (theta - pi/2)^2 / pi^2``, theta = angle(x, w)."""
    t = np.asarray(theta, np.float64)
    out: np.ndarray = 0.25 - (t - np.pi / 2) ** 2 / np.pi**2
    return out


def ehhash_collision(theta: np.ndarray | float) -> np.ndarray:
    """EH-Hash ``Pr[h(w) = h(x)] = arccos(cos^2 theta) / pi``, theta = angle(x, w)
    (= the paper's ``arccos(sin^2 theta') / pi`` with theta' = theta - pi/2)."""
    t = np.asarray(theta, np.float64)
    out: np.ndarray = np.arccos(np.cos(t) ** 2) / np.pi
    return out


def _csr(B: Block) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR arrays over global feature ids (dense column j is feature j; zeros dropped)."""
    if isinstance(B, SparseBlock):
        return B.to_arrays()
    import scipy.sparse as sp

    m = sp.csr_matrix(np.asarray(B, np.float64))
    return m.indptr.astype(np.int64), m.indices.astype(np.uint64), m.data.astype(np.float64)


def _append_constant(B: Block, values: np.ndarray, feature: int) -> Block:
    """Rows with one more feature (``feature`` for sparse rows, the last column for dense)."""
    if not isinstance(B, SparseBlock):
        return np.ascontiguousarray(np.hstack([B, values[:, None].astype(B.dtype)]))
    indptr, indices, data = B.to_arrays()
    if len(indices) and indices.max() == BIAS_FEATURE:
        raise InputError(f"sparse rows use feature id {int(BIAS_FEATURE)}, reserved for the "
                         "bias feature; drop bias=True or remap that feature")
    counts = np.diff(indptr)
    new_ptr = np.concatenate([[0], np.cumsum(counts + 1)]).astype(np.int64)
    ends = new_ptr[1:] - 1  # the bias entry closes each row
    mask = np.ones(new_ptr[-1], bool)
    mask[ends] = False
    new_idx = np.empty(new_ptr[-1], np.uint64)
    new_dat = np.empty(new_ptr[-1], np.float32)
    new_idx[mask], new_dat[mask] = indices, data
    new_idx[ends], new_dat[ends] = np.uint64(feature), values.astype(np.float32)
    return SparseBlock.from_arrays(new_ptr, new_idx, new_dat)


class HyperplaneFamily(HashFamily):
    """Base of H-Hash and EH-Hash: input checks, the bias feature, the query side."""

    name = "hyperplane"
    metric = None  # the re-rank distance is the margin |w^T x| / ||w||, not a metric's

    def __init__(self, *, d: int, bits: int, seed: int = 0, bias: bool = False):
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 1:
            raise InputError(f"d={d!r}: the number of features must be an integer >= 1")
        self.d = int(d)
        self.bits = check_bits(bits)
        self.seed = int(seed)
        self.bias = bool(bias)

    @property
    def dims(self) -> int:
        """Features the hash functions see (d, plus the bias feature)."""
        return self.d + int(self.bias)

    def _check(self, X: RowsLike, what: str, *, exact: bool = False) -> Block:
        """Rows as a block; ``exact``: dense rows kept in float64 (query normals)."""
        B = as_block(X)
        if not isinstance(B, SparseBlock) and (B.ndim != 2 or B.shape[1] != self.d):
            raise InputError(f"{what} have {B.shape[1] if B.ndim == 2 else B.shape} features, "
                             f"but the hash family has d={self.d}")
        if exact and not isinstance(B, SparseBlock):
            B = np.ascontiguousarray(np.asarray(X), np.float64)
        check_finite(B, name=what)
        return B

    def points(self, X: RowsLike) -> Block:
        """Database rows as the functions see them (the constant 1 appended with a bias)."""
        B = self._check(X, "points")
        if not self.bias:
            return B
        return _append_constant(B, np.ones(n_rows(B)), self._bias_feature(B))

    def queries(self, W: RowsLike, offsets: np.ndarray | None = None) -> Block:
        """Query normals as the functions see them (the offsets b appended with a bias)."""
        return self.with_offsets(self._check(W, "hyperplane normals", exact=True), offsets)

    def with_offsets(self, B: Block, offsets: np.ndarray | None = None) -> Block:
        """Normals already checked (``_check(W, ..., exact=True)``) with the offsets b appended
        as `queries` appends them, without checking the normals again (a hyperplane query's
        normal was checked three times: 0.08 of a 0.18 ms hashing)."""
        if offsets is not None and not self.bias:
            raise InputError("offsets were given, but the hash family has bias=False")
        if not self.bias:
            return B
        q = n_rows(B)
        b = np.zeros(q) if offsets is None else np.asarray(offsets, np.float64).ravel()
        if b.shape != (q,):
            raise InputError(f"offsets has {b.shape[0]} values for {q} hyperplanes")
        bad = np.flatnonzero(~np.isfinite(b))
        if len(bad):  # a NaN margin matches no row: the query would return nothing, silently
            raise InputError(f"offsets hold {len(bad)} NaN or infinite value(s), the first for "
                             f"hyperplane {int(bad[0])} ({b[bad[0]]}); every hyperplane "
                             "w^T x + b = 0 needs a finite b")
        return _append_constant(B, b, self._bias_feature(B))

    def _bias_feature(self, B: Block) -> int:
        return int(BIAS_FEATURE) if isinstance(B, SparseBlock) else self.d

    def project(self, X: RowsLike) -> np.ndarray:
        """Point side, float64 (n, bits): the bits are ``[P >= 0]``."""
        return self._project_points(self.points(X))

    def project_queries(self, W: RowsLike, offsets: np.ndarray | None = None) -> np.ndarray:
        """Query side, float64 (Q, bits)."""
        return self._project_queries(self.queries(W, offsets))

    def hash_points(self, B: Block) -> np.ndarray:
        """Packed point keys of rows `points` already prepared (checked, the constant
        appended): ``hash(X)`` for ``B = points(X)``, without checking and copying X again."""
        keys: np.ndarray = pack_signs(np.ascontiguousarray(self._project_points(B)))
        return keys

    def hash_queries(self, W: RowsLike, offsets: np.ndarray | None = None) -> np.ndarray:
        """Packed query keys, uint64 (Q, ceil(bits / 64))."""
        return self.hash_query_block(self.queries(W, offsets))

    def hash_query_block(self, B: Block) -> np.ndarray:
        """Packed query keys of normals `queries` (or `with_offsets`) already prepared."""
        keys: np.ndarray = pack_signs(np.ascontiguousarray(self._project_queries(B)))
        return keys

    def _project_points(self, B: Block) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def _project_queries(self, B: Block) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError


class HHash(HyperplaneFamily):
    """H-Hash: ``bits / 2`` functions of two bits; bit ``2j`` uses ``u_j``, bit ``2j+1``
    ``v_j``, both rows of the counter-based Gaussians (as Charikar's family draws them)."""

    name = "h-hash"

    def __init__(self, *, d: int, bits: int, seed: int = 0, bias: bool = False):
        super().__init__(d=d, bits=bits, seed=seed, bias=bias)
        if self.bits % 2:
            raise InputError(f"bits={self.bits}: H-Hash uses two bits per function; give an "
                             "even number of bits")
        self._R: np.ndarray | None = None
        self._R32: np.ndarray | None = None
        self._cached: tuple[np.ndarray, np.ndarray] | None = None

    def cache_features(self, features: np.ndarray) -> None:
        """Keep the Gaussians of these feature ids (sparse rows): a query normal over a pool's
        vocabulary then takes its coefficients from memory instead of generating them
        (``len(features) x bits`` float32: the generated values rounded, so a query's key
        differs from the uncached one only where a projection is within float32 rounding of
        0; 20 Newsgroups, 1,024 bits: a query 6.9 -> 4.0 ms against float64, 302 MB instead
        of 604 MB)."""
        f = np.unique(np.append(np.asarray(features, np.uint64), BIAS_FEATURE))
        # float32: half the memory, and a query normal's product reads half the bytes; made
        # 32 MB of float64 at a time (counter-based: the same values as in one piece)
        G = np.empty((len(f), self.bits), np.float32)
        step = max(1, 2**22 // self.bits)
        for lo in range(0, len(f), step):
            G[lo:lo + step] = gaussian_rows(np.uint64(self.seed), f[lo:lo + step], self.bits)
        self._cached = (f, G)

    def _linear(self, B: Block) -> np.ndarray:
        if isinstance(B, SparseBlock):
            if self._cached is None:
                return sparse_projection(B, self.seed, self.bits)
            f, G = self._cached
            pos = np.minimum(np.searchsorted(f, B.features), len(f) - 1)
            if not np.array_equal(f[pos], B.features):  # a feature the cache does not hold
                return sparse_projection(B, self.seed, self.bits)
            import scipy.sparse as sp

            m = B.matrix.tocsr()
            # the rows over the cache's columns: no (nnz x bits) gather of the Gaussians
            over = sp.csr_matrix((m.data.astype(np.float32), pos[m.indices], m.indptr),
                                 shape=(m.shape[0], len(f)))
            out: np.ndarray = np.asarray(over @ G, np.float64)
            return out
        if self._R is None:
            self._R = gaussian_matrix(self.seed, self.dims, self.bits)  # (bits, dims)
        P: np.ndarray = np.asarray(B, np.float64) @ self._R.T
        return P

    def _project_points(self, B: Block) -> np.ndarray:
        return self._linear(B)  # [u^T x, v^T x]

    def _project_queries(self, B: Block) -> np.ndarray:
        if isinstance(B, SparseBlock):
            P = self._linear(B)
        else:
            # float32 coefficients: a hyperplane query reads all bits x dims of them, and at
            # 1,024 bits x 786 the float64 matrix (6.4 MB) is as many bytes as the pool's keys
            # (Fashion-MNIST: 0.14 -> 0.07 ms warm, more when the product evicted it); a sign
            # changes only where |u^T w| < 1e-6 |u||w|, at random either way
            if self._R is None:
                self._R = gaussian_matrix(self.seed, self.dims, self.bits)
            if self._R32 is None:
                self._R32 = self._R.astype(np.float32)
            P = np.asarray(np.asarray(B, np.float32) @ self._R32.T, np.float64)
        P[:, 1::2] *= -1.0  # [u^T w, -v^T w]
        return P


@functools.cache
def gaussian_table() -> np.ndarray:
    """The 4,096 values EH-Hash's Gaussians take: ``Phi^-1((k + 1/2) / 4096)``, scaled to unit
    variance and rounded to float32 (the same on every machine whatever its last-digit
    rounding of ``ndtri``), float64 (4096,); index k = the top 12 bits of a uniform word.
    Tails beyond 3.49 sigma are cut: a pair's Gaussian matters to a key only through sums of
    many of them."""
    from scipy.special import ndtri

    q = ndtri((np.arange(4096) + 0.5) / 4096)
    out: np.ndarray = (q / np.sqrt(np.mean(q**2))).astype(np.float32).astype(np.float64)
    out.setflags(write=False)
    return out


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class EHHash(HyperplaneFamily):
    """EH-Hash: one bit per function, ``[x^T U_b x >= 0]`` for points and
    ``[-w^T U_b w >= 0]`` for query normals, U_b a symmetric Gaussian matrix drawn from
    counters (`lshdist._kernels.ehhash`): for feature ids ``i <= j`` one standard normal
    ``G_b(i, j)`` of ``(seed, b, pair_key(i, j))``, ``U_b[i, i] = G_b(i, i)``,
    ``U_b[i, j] = U_b[j, i] = G_b(i, j) / sqrt(2)``.  Only ``U + U^T`` enters a quadratic form,
    so the projection has the law of the form over an i.i.d. N(0, 1) matrix (the paper's),
    from half the pairs.  Entries are generated only for the pairs of nonzeros a row has.

    Cost: ``nnz (nnz + 1) / 2`` pairs x bits per row (20 Newsgroups' 11,293 training
    documents with the bias feature: 2.2e8 pairs, 2.3e11 pair-bits at 1,024 bits; about
    0.6 ns a pair-bit and thread), logged with an estimate before hashing and with progress
    while it runs; ``n_threads`` rows at a time (driver side; 1 on a worker).

    ``samples`` (t): the query side from the sampled embedding of NIPS 2010 Lemma 3.4 (t entries
    of ``vec(w w^T)`` drawn with probability ``w_i^2 w_j^2 / ||w||^4``, importance weighted:
    an unbiased estimate of ``w^T U w``, O(t bits) per query); None: exact, O(nnz^2 bits /
    2) -- an SVM normal over thousands of a text pool's features costs seconds a query exact.
    The paper's t = O(1/eps'^2); `samples_for` gives ``ceil(1/eps'^2)``.  On 20 Newsgroups'
    SVM normals (6,000-7,800 nonzeros) t = 10,000-100,000 samples give projections whose
    correlation with the exact ones is 0.03-0.07: a key no better than a random one.

    ``terms`` (m): every row and normal is hashed over its m entries of largest ``|value|``
    (`lshdist._kernels.ehhash.top_terms`; the bias feature competes like any entry), so the
    bits are EH-Hash's exactly for the truncated vectors ``x_m`` and ``w_m``:
    ``Pr[collide] = arccos(cos^2 theta(x_m, w_m)) / pi``, which differs from the relation of
    x and w only by the energy the cut drops (``||x - x_m||^2 / ||x||^2``).  Cost at most
    ``m (m + 1) / 2`` pairs x bits a row whatever its nonzeros: a cost one can plan for.  A
    deterministic subset of the pairs -- those of the heaviest coordinates -- not a random
    one: on 20 Newsgroups (with the bias feature) m = 64 keeps 95 % of a document's squared
    norm and 0.95 of its pairs' cost is saved; a normal's 300 largest entries keep 82 % of its
    squared norm and their projections correlate 0.84 with the exact ones (1,000: 0.955).
    None: every entry.
    """

    name = "eh-hash"

    def __init__(self, *, d: int, bits: int, seed: int = 0, bias: bool = False,
                 samples: int | None = None, terms: int | None = None, n_threads: int = 1):
        super().__init__(d=d, bits=bits, seed=seed, bias=bias)
        if samples is not None and (not isinstance(samples, (int, np.integer))
                                    or isinstance(samples, bool) or samples < 1):
            raise InputError(f"samples={samples!r}: t must be an integer >= 1 (or None: the "
                             "exact query embedding)")
        if terms is not None and (not isinstance(terms, (int, np.integer))
                                  or isinstance(terms, bool) or terms < 1):
            raise InputError(f"terms={terms!r}: m must be an integer >= 1 (or None: every "
                             "entry of a row hashed)")
        self.terms = None if terms is None else int(terms)
        if (not isinstance(n_threads, (int, np.integer)) or isinstance(n_threads, bool)
                or n_threads < 1):
            raise InputError(f"n_threads={n_threads!r}: must be an integer >= 1")
        self.samples = None if samples is None else int(samples)
        self.n_threads = int(n_threads)
        self._U: np.ndarray | None = None
        self._mult: np.ndarray | None = None

    @property
    def multipliers(self) -> np.ndarray:
        """The per-bit odd multipliers of the seed, uint64 (bits,)."""
        if self._mult is None:
            self._mult = eh_multipliers(np.uint64(self.seed), self.bits)
        return self._mult

    def hash(self, X: RowsLike, *, n_threads: int = 1) -> np.ndarray:
        """Packed point keys (`HashFamily.hash`); sparse rows on ``max(n_threads,
        self.n_threads)`` threads."""
        saved = self.n_threads
        self.n_threads = max(saved, int(n_threads))
        try:
            return super().hash(X, n_threads=n_threads)
        finally:
            self.n_threads = saved

    def _dense_U(self) -> np.ndarray | None:
        """U as float64 (bits, D, D) for dense rows when it is small enough, else None (the
        same Gaussians as the per-row kernel: features 0..D-1)."""
        D = self.dims
        if D * D * self.bits > DENSE_U_ENTRIES:
            return None
        if self._U is None:
            self._U = eh_matrix(np.arange(D, dtype=np.uint64), np.uint64(self.seed),
                                self.multipliers, gaussian_table())
        return self._U

    def _csr(self, B: Block) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_csr` of the rows, each cut to its ``terms`` largest entries (`top_terms`)."""
        indptr, indices, data = _csr(B)
        if self.terms is None:
            return indptr, indices, data
        out: tuple[np.ndarray, np.ndarray, np.ndarray] = top_terms(indptr, indices, data,
                                                                    self.terms)
        return out

    def _quadratic(self, B: Block, what: str) -> np.ndarray:
        U = None if isinstance(B, SparseBlock) else self._dense_U()
        if U is not None:
            X = np.asarray(B, np.float64)
            if self.terms is not None and self.terms < X.shape[1]:
                import scipy.sparse as sp

                ip, ix, dat = self._csr(B)
                X = sp.csr_matrix((dat, ix.astype(np.int64), ip), shape=X.shape).toarray()
            # x^T U_b x for all b: (n, D) x (D, bits*D) then a row-wise dot with x
            XU = (X @ U.transpose(1, 0, 2).reshape(X.shape[1], -1)).reshape(len(X), self.bits, -1)
            out: np.ndarray = np.einsum("nbj,nj->nb", XU, X)
            return out
        return self._project_pairs(*self._csr(B), what)

    def _project_pairs(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
                       what: str) -> np.ndarray:
        """`eh_project_rows` over all rows, on ``n_threads`` threads in chunks of about a
        hundredth of the work, with the estimate and progress logged for large inputs."""
        n = len(indptr) - 1
        m = np.diff(indptr).astype(np.float64)
        pairs = m * (m + 1) / 2
        work = float(pairs.sum()) * self.bits
        out = np.empty((n, self.bits))
        seed, mult, table = np.uint64(self.seed), self.multipliers, gaussian_table()
        threads = max(1, min(self.n_threads, n))
        if work < EH_LOG_PAIR_BITS:
            eh_project_rows(indptr, indices, data, seed, mult, table, 0, n, out)
            return out
        estimate = work * EH_SECONDS_PER_PAIR_BIT / threads
        log.info("EH-Hash of %d %s: %.3g feature pairs x %d bits = %.3g pair-bits, about %s "
                 "on %d idle core(s) (a loaded machine: longer; progress follows)", n, what,
                 work / self.bits, self.bits, work, _duration(estimate), threads)
        if estimate > EH_WARN_SECONDS:
            cheaper = ("fewer bits (the cost is linear in bits), rows cut to their m largest "
                       "entries (terms=m, --eh-terms m: at most m (m + 1) / 2 pairs a row) or "
                       "H-Hash (linear in the nonzeros)" if what == "points" else
                       "normals cut to their m largest entries (terms=m, --eh-terms m)")
            log.warning("EH-Hash of %d %s will take about %s (%.3g pair-bits: nnz (nnz + 1) / "
                        "2 pairs a row x bits); %s make(s) it cheaper", n, what,
                        _duration(estimate), work, cheaper)
        cum = np.cumsum(pairs)
        cuts = np.searchsorted(cum, np.linspace(0, cum[-1], 101)[1:-1], side="right")
        bounds = np.unique(np.concatenate([[0], cuts, [n]]))
        done = 0.0
        t0 = last = time.perf_counter()
        next_tenth = 0.1

        def run(lo: int, hi: int) -> float:
            eh_project_rows(indptr, indices, data, seed, mult, table, lo, hi, out)
            return float(pairs[lo:hi].sum()) * self.bits

        with ThreadPoolExecutor(threads) as pool:
            for w in pool.map(run, bounds[:-1], bounds[1:]):
                done += w
                now = time.perf_counter()
                if done >= next_tenth * work or now - last >= EH_PROGRESS_SECONDS:
                    rate = (now - t0) / done
                    log.info("EH-Hash of %d %s: %.0f%% in %s (%.2f ns a pair-bit on %d "
                             "thread(s)), about %s left", n, what, 100 * done / work,
                             _duration(now - t0), 1e9 * rate * threads, threads,
                             _duration(rate * (work - done)))
                    last = now
                    while next_tenth * work <= done:
                        next_tenth += 0.1
        return out

    def _project_points(self, B: Block) -> np.ndarray:
        return self._quadratic(B, "points")  # x^T U x

    def _project_queries(self, B: Block) -> np.ndarray:
        if self.samples is None:
            return -self._quadratic(B, "hyperplane normals")  # -w^T U w
        indptr, indices, data = self._csr(B)
        data = np.ascontiguousarray(data, np.float64)
        seeds = content_seeds(indptr, indices, data.view(np.uint64), np.uint64(self.seed))
        fi, fj, wt = eh_sample_pairs(indptr, indices, data, self.samples, seeds)
        P: np.ndarray = eh_project_sampled(fi, fj, wt, np.uint64(self.seed), self.multipliers,
                                           gaussian_table())
        return -P


def samples_for(eps: float) -> int:
    """t = ceil(1 / eps'^2) samples for the sampled EH-Hash query embedding."""
    if not eps > 0:
        raise InputError(f"eps={eps!r}: must be > 0")
    return math.ceil(1.0 / eps**2)


def hyperplane_family(family: str, *, d: int, bits: int, seed: int = 0, bias: bool = False,
                      samples: int | None = None, terms: int | None = None,
                      n_threads: int = 1) -> HyperplaneFamily:
    """``"h-hash"`` or ``"eh-hash"`` by name (``n_threads``: EH-Hash's sparse rows)."""
    if family == "h-hash":
        if samples is not None:
            raise InputError("samples (t) applies to eh-hash only")
        if terms is not None:
            raise InputError("terms (m) applies to eh-hash only")
        return HHash(d=d, bits=bits, seed=seed, bias=bias)
    if family == "eh-hash":
        return EHHash(d=d, bits=bits, seed=seed, bias=bias, samples=samples, terms=terms,
                      n_threads=n_threads)
    raise InputError(f"family={family!r}; choose one of {list(FAMILIES)}")
