"""`MetricIndex`: a learned metric, its hash family and a `PermutationIndex`, in one process."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from lshdist.blocks import Block, RowsLike, as_block, n_rows, take_rows
from lshdist.config import KNN_MODES, SEARCH_MODES, check_mode, default_key_bits
from lshdist.errors import InputError, NotFittedError
from lshdist.hashing.families import LearnedImplicit, family_for
from lshdist.index.calibrate import (
    SAMPLE_QUERIES,
    Calibration,
    MergedGrid,
    Point,
    calibrate,
    query_sample_size,
    sample_rows,
)
from lshdist.index.metric_payload import make_payload
from lshdist.index.params import resolve_permutations
from lshdist.index.payload import DensePayload
from lshdist.index.permutation import PackedSegment, PermutationIndex, merge_topk
from lshdist.index.scan import scan_topk
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric
from lshdist.validation import check_finite

if TYPE_CHECKING:
    from lshdist.hashing.families import HashFamily
    from lshdist.index.recall_check import MeasuredRecall
    from lshdist.protocols import Metric, RerankPayload

#: query sets of at least this many rows are re-calibrated on a sample of themselves (the
#: sample's exact neighbours then cost at most 1/20 of the full scan)
RECALIBRATE_QUERIES = 20 * SAMPLE_QUERIES
log = logging.getLogger(__name__)


def encode(metric: Metric, family: HashFamily, X: RowsLike, *, query: bool = False,
           n_threads: int = 1, hashed: bool = True) -> tuple[np.ndarray, RerankPayload]:
    """Keys and re-rank payload of rows ``X``; kernel values are computed once for both;
    ``n_threads``: threads of the (dense, float32) hashing (`HashFamily.hash`).
    ``hashed=False``: the payload only (keys of shape (Q, 0)) — what the exact scan reads;
    hashing sparse rows draws a Gaussian per nonzero and bit, 14 ms a 20 Newsgroups query,
    more than the scan's own product.

    Rows of uint8 values (`lshdist.store.dataset.Dataset.read_byte_rows`) under the identity
    metric are encoded without their float32 copy: hashed a block at a time, the payload held
    on its exact grid (`DensePayload.from_bytes`) -- the keys and payload of the same rows in
    float32."""
    if (isinstance(X, np.ndarray) and X.dtype == np.uint8 and X.ndim == 2
            and payload_is_rows(metric)):
        metric.check(X[:0])  # (the columns checked; bytes are finite)
        codes = (family.hash(X, n_threads=n_threads) if hashed
                 else np.zeros((len(X), 0), np.uint64))
        return codes, DensePayload.from_bytes(X)
    B = metric.check(as_block(X))
    check_finite(B, name="the queries (Xq)" if query else "the rows (X)")
    kx = kernel_values(metric, B)
    if not hashed:
        return (np.zeros((n_rows(B), 0), np.uint64),
                make_payload(metric, B, query=query, kx=kx))
    codes = hash_rows(family, B, kx, n_threads)
    payload: RerankPayload = make_payload(metric, B, query=query, kx=kx)
    return codes, payload


def payload_is_rows(metric: Metric) -> bool:
    """Whether ``metric``'s re-rank payload of a row is the row itself (an explicit identity
    metric): rows stored as bytes are then encoded as read (`encode`)."""
    return isinstance(metric, ExplicitMetric) and metric.is_identity


def kernel_values(metric: Metric, B: Block) -> np.ndarray | None:
    """The kernel values of checked rows ``B`` against a learned implicit metric's basis
    (what its keys and its re-rank payload both read); None for other metrics."""
    if isinstance(metric, ImplicitMetric) and not metric.is_identity:
        return metric.kernel_values(B)
    return None


def hash_rows(family: HashFamily, B: Block, kx: np.ndarray | None, n_threads: int = 1
              ) -> np.ndarray:
    """Keys of checked rows ``B`` (``kx``: their `kernel_values`, which the learned implicit
    family adds to its own Gaussian projections of the rows) — the work a hashed search does
    and the exact scan does not; the one place both `encode` and the timings call."""
    if isinstance(family, LearnedImplicit):
        return family.hash_with(B, kx)
    return family.hash(B, n_threads=n_threads)


def answer(index: PermutationIndex | PackedSegment, qcodes: np.ndarray,
           qpayload: RerankPayload, k: int, *, mode: str, bulk: bool = True, n_threads: int = 1,
           n_permutations: int | None = None, window: int | None = None,
           hamming_keep: int | None = None
           ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Top-k of encoded queries against one fitted `PermutationIndex` (or every part of a
    `PackedSegment`, merged by distance and id), hashed or by exact scan:
    ``(dist (Q, k), ids (Q, k), stats)``; ``stats["reranked"]`` (Q,) counts the exact
    distances computed per query.  ``n_permutations``/``window``/``hamming_keep``: the
    operating point of a hashed search (default: the index's).  The one place the modes are
    dispatched."""
    if isinstance(index, PackedSegment):
        each = [answer(p, qcodes, qpayload, k, mode=mode, bulk=bulk, n_threads=n_threads,
                       n_permutations=n_permutations, window=window, hamming_keep=hamming_keep)
                for p in index.parts]
        dist, ids = merge_topk([f[0] for f in each], [f[1] for f in each], k)
        return dist, ids, {key: np.sum([f[2][key] for f in each], axis=0) for key in each[0][2]}
    if mode == "scan":
        dist, ids = scan_topk(index.payload_, qpayload, k, ids=index.ids_, n_threads=n_threads)
        return dist, ids, {"reranked": np.full(len(ids), len(index), np.int64)}
    check_mode(mode, SEARCH_MODES)
    found: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] = index.search(
        qcodes, qpayload, k, bulk=bulk, n_threads=n_threads, n_permutations=n_permutations,
        window=window, hamming_keep=hamming_keep)
    return found


def permutation_seed(seed: int) -> int:
    """The permutations' seed, distinct from the hash coefficients' seed."""
    return int(np.random.SeedSequence([int(seed), 1]).generate_state(1)[0])


#: lists built for calibration when neither M nor epsilon is given (the first M' <= this
#: are tried; Fashion-MNIST needs 64-128 at recall 0.9, Letter 16)
CALIBRATION_PERMUTATIONS = 128


def calibrated_lists(n: int, *, n_permutations: int | None, epsilon: float | None) -> int:
    """Lists to build for calibration: M or M(epsilon) when given, else
    `CALIBRATION_PERMUTATIONS` (at most what epsilon=1 would give for ``n`` rows: a tiny
    database needs no more)."""
    if n_permutations is not None or epsilon is not None:
        return resolve_permutations(n, epsilon=epsilon, permutations=n_permutations)
    return min(CALIBRATION_PERMUTATIONS, max(8, resolve_permutations(n, epsilon=1.0,
                                                                     permutations=None)))


def calibrate_index(index: PermutationIndex, metric: Metric, family: HashFamily, X: RowsLike,
                    *, k: int, target: float, seed: int, fixed: dict[str, int | None],
                    queries: RowsLike | None = None,
                    merged: MergedGrid | None = None,
                    n_threads: int = 1, answered: int | None = None,
                    drawn: RowsLike | None = None) -> Calibration:
    """Calibrate a fitted index built on rows ``X``: a sample of its own rows as queries
    (leave-one-out), or of ``queries`` when given (rows like the real queries: a database
    whose rows have near-copies of themselves — augmented data — makes its own rows easier
    queries than the real ones); the parameters in ``fixed`` (not None) kept as given;
    ``merged``: the grid of a merged answer measured over every segment
    (`lshdist.index.calibrate.calibrate`): this index is then only timed; ``answered``: the
    queries the chosen point will answer, when known (the sample is then used in stages,
    `lshdist.index.calibrate.calibrate`).  ``drawn``: the sample's rows, already drawn as
    this function draws them (`lshdist.cluster.tasks.calibration_sample`: of ``queries``,
    or of ``X``, which is then not read)."""
    if queries is not None:
        Q = as_block(queries)
        if drawn is None:
            pick = sample_rows(n_rows(Q), query_sample_size(n_rows(Q)), seed)
            Xq = take_rows(Q, pick)
        else:
            Xq = as_block(drawn)
        qrows = np.full(n_rows(Xq), -1, dtype=np.int64)  # not database rows: none left out
    else:
        qrows = sample_rows(len(index), SAMPLE_QUERIES, seed)
        Xq = take_rows(as_block(X), qrows) if drawn is None else as_block(drawn)
        if n_rows(Xq) != len(qrows):
            raise InputError(f"the calibration sample has {n_rows(Xq)} rows, expected "
                             f"{len(qrows)} of the index's own")
    qcodes, qpayload = encode(metric, family, Xq, query=True)
    # hashing a query is work the hashed search does and the scan does not (the payload,
    # with any kernel values, serves both): timed here, kernel values computed beforehand.
    # The learned implicit family's own projections (a Gaussian per nonzero and bit) were
    # once left out: on Reuters R52 (6,533 documents, kernel ITML) auto chose a hashed search
    # "1.6x faster than the scan" that ran 3x slower than it
    B = metric.check(as_block(Xq))
    kx = kernel_values(metric, B)
    t0 = time.perf_counter()
    hash_rows(family, B, kx)
    hash_overhead = (time.perf_counter() - t0) / len(qrows)
    m, w, h = (fixed.get(key) for key in ("permutations", "window", "hamming_keep"))
    return calibrate(index, qrows, qcodes, qpayload, k=k, target=target,
                     permutations=None if m is None else [m],
                     windows=None if w is None else [w],
                     hamming_keeps=None if h is None else [h], hash_overhead=hash_overhead,
                     merged=merged, n_threads=n_threads, answered=answered)


class MetricIndex:
    """Hash-and-search (or scan) under a metric; scikit-learn-shaped ``fit`` / ``query``.

    Parameters
    ----------
    metric : `ExplicitMetric` or `ImplicitMetric` (identity ones give the L2 baselines)
    bits : b, key length
    n_permutations, epsilon, window, hamming_keep : see `PermutationIndex`; with a
        ``target_recall`` the ones left None are chosen by calibration
    learned : learned hash functions (True) or Charikar's baseline (False)
    seed : seeds the hash coefficients and the permutations
    target_recall : recall@``calibration_k`` against the exact scan to calibrate for (None:
        no calibration; W defaults to 1 and H to 0)
    calibration_k : the k of that recall
    calibration_queries : rows like the real queries to calibrate with (default: a sample of
        the database's own rows, leave-one-out)
    recalibrate : with a target, a ``query(mode="auto")`` of at least `RECALIBRATE_QUERIES`
        rows first calibrates again on a sample of those queries (`query_sample_size`: their
        exact neighbours cost about 2 % of a scan), so that the operating point fits the queries
        actually asked — a database's own rows can be easier queries than the real ones
    check_recall : a hashed ``query`` also answers a seeded sample of its queries by the exact
        scan (`lshdist.index.recall_check.check_size`: 2 %, 50 to 500 of them) and records the
        recall@k it measured, with its 95 % interval, in ``measured_recall_``; with
        ``mode="auto"`` and a target, a shortfall re-calibrates on the queries (checked again),
        and a proven miss is answered by the scan (`lshdist.index.recall_check.enforce`)

    With a target, calibration happens when first needed, not in ``fit``: a bulk
    ``query(mode="auto")`` calibrates on a sample of its own queries (``query_calibration_``);
    any other query, or reading ``calibration_`` or ``mode_``, calibrates on the database's rows
    (or ``calibration_queries``) once.  ``query(mode="auto")`` answers at the chosen operating
    point, or by the exact scan where it is no slower.
    """

    def __init__(self, metric: Metric, *, bits: int | None = None,
                 n_permutations: int | None = None,
                 epsilon: float | None = None, window: int | None = None,
                 hamming_keep: int | None = None, learned: bool = True, seed: int = 0,
                 target_recall: float | None = None, calibration_k: int = 10,
                 calibration_queries: RowsLike | None = None, recalibrate: bool = True,
                 check_recall: bool = True) -> None:
        self.metric = metric
        # None: an index built without its queries (`lshdist.config.default_key_bits`)
        self.bits = (default_key_bits(isinstance(metric, ExplicitMetric)) if bits is None
                     else bits)
        self.n_permutations = n_permutations
        self.epsilon = epsilon
        self.window = window
        self.hamming_keep = hamming_keep
        self.learned = learned
        self.seed = seed
        self.target_recall = target_recall
        self.calibration_k = calibration_k
        self.calibration_queries = calibration_queries
        self.recalibrate = recalibrate
        self.check_recall = check_recall

    def fit(self, X: RowsLike, ids: np.ndarray | None = None, *, n_threads: int = 1
            ) -> MetricIndex:
        self.family_ = family_for(self.metric, bits=self.bits, seed=self.seed,
                                  learned=self.learned)
        codes, payload = encode(self.metric, self.family_, X, n_threads=n_threads)
        lists = self.n_permutations
        if self.target_recall is not None:
            lists = calibrated_lists(len(codes), n_permutations=self.n_permutations,
                                     epsilon=self.epsilon)
        self.index_ = PermutationIndex(
            n_permutations=lists, epsilon=None if lists else self.epsilon,
            window=1 if self.window is None else self.window,
            hamming_keep=0 if self.hamming_keep is None else self.hamming_keep,
            seed=permutation_seed(self.seed),
        ).fit(codes, self.family_.bits, payload, ids, n_threads=n_threads)
        # the re-rank's in-memory structures (the dense payload's uint8 copy) belong to the
        # build: made here on every thread, not inside the first timed or bulk search
        payload.prepare(n_threads)
        self.fixed_: dict[str, int | None] = {
            "permutations": lists if (self.n_permutations or self.epsilon) else None,
            "window": self.window, "hamming_keep": self.hamming_keep}
        # calibration is deferred to when it is first needed: a bulk query calibrates on a
        # sample of itself, which makes one on the database's rows wasted work
        self._calibration: Calibration | None = None
        self._query_calibrated = False
        self._rows = X if self.target_recall is not None else None
        self._mode = "hash"
        return self

    @property
    def calibration_(self) -> Calibration | None:
        """The calibration on the database's own rows (leave-one-out) or on
        ``calibration_queries``; computed on first use (None without a target)."""
        self._check_fitted()
        if self.target_recall is not None and self._calibration is None:
            cal = calibrate_index(self.index_, self.metric, self.family_, self._rows,
                                  k=self.calibration_k, target=self.target_recall,
                                  seed=self.seed, fixed=self.fixed_,
                                  queries=self.calibration_queries)
            self._calibration = cal
            log.info("calibration (%.1fs): %s — %s", cal.seconds, cal.mode, cal.reason)
            if not self._query_calibrated:  # a calibration on real queries takes precedence
                self._use(cal)
        return self._calibration

    @property
    def mode_(self) -> str:
        """What ``query(mode="auto")`` answers with (calibrating first where needed)."""
        if self.target_recall is not None and not self._query_calibrated:
            self.calibration_  # noqa: B018  (computes it on first use)
        return self._mode

    def _use(self, cal: Calibration) -> None:
        self.set_operating_point(cal.mode, cal.reference)

    def _check_fitted(self) -> None:
        if not hasattr(self, "index_"):
            raise NotFittedError("this MetricIndex is not fitted; call fit(X) first")

    def set_operating_point(self, mode: str, point: Point | None) -> None:
        """Answer ``mode="auto"`` queries with ``mode`` at ``point`` (M, W, H)."""
        self._mode = mode
        self._point = point
        if point is not None:
            self.index_.window = point.window
            self.index_.hamming_keep = point.hamming_keep
            self.op_permutations_ = point.permutations

    def query(self, Xq: RowsLike, k: int, *, mode: str = "auto", bulk: bool = True,
              n_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``(distances, ids)``, each (Q, k), ascending.  ``mode``: ``"hash"``, ``"scan"``, or
        ``"auto"`` (the calibrated choice; hashed without calibration).  ``self.stats_`` holds
        per-query candidate counts of the last hashed query; ``self.last_mode_`` the mode used."""
        self._check_fitted()
        check_mode(mode, KNN_MODES)
        asked = mode
        recalibrated = False
        if mode == "auto":
            if (self.target_recall is not None and self.recalibrate
                    and n_rows(as_block(Xq)) >= RECALIBRATE_QUERIES):
                self.calibrate_for(Xq, n_threads=n_threads, answered=n_rows(as_block(Xq)))
                recalibrated = True
            mode = self.mode_
        elif mode == "hash":
            self.mode_  # noqa: B018  (the calibrated operating point, computed on first use)
        qcodes, qpayload = encode(self.metric, self.family_, Xq, query=True,
                                 n_threads=n_threads, hashed=mode != "scan")

        def run(mode: str, codes: np.ndarray, payload: RerankPayload
                ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
            return answer(self.index_, codes, payload, k, mode=mode, bulk=bulk,
                          n_threads=n_threads,
                          n_permutations=getattr(self, "op_permutations_", None))

        dist, ids, stats = run(mode, qcodes, qpayload)
        if self.check_recall:
            final = self._checked(Xq, k, mode, asked == "auto", ids, recalibrated, n_threads,
                                  lambda m: run(m, *encode(self.metric, self.family_, Xq,
                                                           query=True, n_threads=n_threads,
                                                           hashed=m != "scan")))
            if final is not None:
                mode, (dist, ids, stats) = final
        self.last_mode_ = mode
        if mode == "hash":
            self.stats_ = stats
        return dist, ids

    def _checked(self, Xq: RowsLike, k: int, mode: str, auto: bool, ids: np.ndarray,
                 recalibrated: bool, n_threads: int,
                 rerun: Callable[[str], tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]
                 ) -> tuple[str, tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]] | None:
        """Measure this query's recall on a seeded sample of its rows (`measured_recall_`)
        and keep the promise (`lshdist.index.recall_check.enforce`); returns the answers of
        a mode or point the check moved to (None: the answers stand)."""
        from lshdist.index.recall_check import check_rows, enforce, measured

        Q = len(ids)
        cal = getattr(self, "query_calibration_", None) or self._calibration
        target = self.target_recall
        first = getattr(self, "_point", None)
        rows = check_rows(Q, self.seed)
        sample: list[Any] = []  # the sample's keys, payload and exact answer, once needed

        def measure(point: Point | None, estimate: float | None) -> MeasuredRecall:
            if not sample:
                scodes, spayload = encode(self.metric, self.family_,
                                          take_rows(as_block(Xq), rows), query=True,
                                          n_threads=n_threads)
                sample.extend([scodes, spayload, answer(
                    self.index_, scodes, spayload, k, mode="scan", n_threads=n_threads)[1]])
            scodes, spayload, truth = sample
            if point is first:
                found = ids[rows]
            else:
                found = answer(self.index_, scodes, spayload, k, mode="hash",
                               n_threads=n_threads,
                               n_permutations=getattr(self, "op_permutations_", None))[1]
            return measured(found, truth, k, Q, mode="hash", target=target, estimate=estimate)

        def recalibrate() -> tuple[str, Any, str, float | None]:
            c = self.calibrate_for(Xq, n_threads=n_threads, answered=Q)
            return c.mode, c.reference, c.reason, None if c.chosen is None else c.chosen.recall

        d = enforce(mode=mode, point=first, estimate=None if cal is None or first is None
                    else first.recall, target=target, auto=auto, n_queries=Q, k=k,
                    measure=measure,
                    recalibrate=None if (recalibrated or cal is None or not self.recalibrate)
                    else recalibrate)
        self.measured_recall_ = d.recall
        log.info("%s", d.recall.line())
        if d.mode == mode and d.point is first:
            return None
        if d.mode == "hash" and d.point is not None:
            self.set_operating_point("hash", d.point)
        return d.mode, rerun(d.mode)

    def calibrate_for(self, Xq: RowsLike, *, n_threads: int = 1, answered: int | None = None
                      ) -> Calibration:
        """Calibrate again on a sample of the queries ``Xq`` (the parameters given at
        construction kept) and answer later ``auto`` and ``hash`` queries at the point chosen;
        the curve is kept in ``query_calibration_``; ``n_threads`` count its grid.
        ``answered``: how many queries the point will answer, when known (``Xq`` itself, for
        a bulk query): the sample is then used in stages, grown only where that pays
        (`lshdist.index.calibrate.calibrate`); None: the whole sample."""
        self._check_fitted()
        if self.target_recall is None:
            raise InputError("calibrate_for needs a target_recall")
        cal = calibrate_index(self.index_, self.metric, self.family_, Xq,
                              k=self.calibration_k, target=self.target_recall, seed=self.seed,
                              fixed=self.fixed_, queries=Xq, n_threads=n_threads,
                              answered=answered)
        self.query_calibration_ = cal
        self._query_calibrated = True
        self._use(cal)
        log.info("calibration on %d of the %d queries (%.1fs): %s — %s", cal.n_queries,
                 n_rows(as_block(Xq)), cal.seconds, cal.mode, cal.reason)
        return cal
