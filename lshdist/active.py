"""Pool-based active learning with hashed hyperplane queries (NIPS 2010, section 4), in one
process, run as the paper runs it: one *binary* one-vs-all problem per class.

For every class c a binary linear SVM (scikit-learn's ``LinearSVC``, c against the rest) starts
from the same initial labelled set (``initial`` examples of every class of the pool); each round
*that* classifier's hyperplane ``w_c^T x + b_c = 0`` is the query, the unlabelled pool point
selected is labelled (the pool's labels are the oracle of the experiment) and the binary SVM
retrained.  Selection methods:

- ``h-hash`` / ``eh-hash``: the pool is indexed once (`HyperplaneIndex`, bias as a constant
  feature, keys of the rows as given or centred on the pool mean with ``center``); the
  candidates of the class's hyperplane (``search="rank"``: the ``candidates`` rows of smallest
  angle score; ``"lists"``: the permutation lists) are re-ranked by the exact margin and the
  unlabelled one with the smallest is selected (a random unlabelled point when every
  candidate is labelled);
- ``exhaustive``: the smallest margin over the whole unlabelled pool (one N x d product);
- ``random``: a random unlabelled point.

Per round, class and method: the binary AUROC on the test rows (class c against the rest, on
the SVM's decision values), selection seconds, the selected point's margin
``|w_c^T x + b_c| / ||w_c||`` (computed exactly from the pool rows whatever the method) and the
fraction of the pool whose margin was computed.  Per round and method: the multi-class
accuracy of the argmax of the per-class decision values on the test rows of the classes run.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from lshdist.blocks import Block, SparseBlock, n_rows
from lshdist.config import ActiveConfig
from lshdist.errors import InputError
from lshdist.index.hyperplane import HyperplaneIndex

log = logging.getLogger(__name__)

METHODS = ("h-hash", "eh-hash", "exhaustive", "random")


def _svc(C: float, class_weight: str, seed: int) -> Any:
    try:
        from sklearn.svm import LinearSVC
    except ImportError:  # pragma: no cover - depends on the installation
        raise InputError("lshdist active needs scikit-learn (pip install 'lshdist[test]')"
                         ) from None
    return LinearSVC(C=C, class_weight=None if class_weight == "none" else class_weight,
                     random_state=seed, dual="auto", max_iter=SVM_MAX_ITER)


#: liblinear's iteration cap; a fit that reaches it is counted (``svm_unconverged``)
SVM_MAX_ITER = 5000


def _fit(clf: Any, X: Any, y: np.ndarray) -> bool:
    """Fit; True when liblinear converged (scikit-learn's per-fit ConvergenceWarning is
    counted into the summary and logged once per run instead of printed at every round)."""
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    return int(np.max(clf.n_iter_)) < SVM_MAX_ITER


def _rows(X: Block) -> Any:
    """What scikit-learn takes: the CSR matrix of sparse rows, dense rows as they are."""
    return X.matrix if isinstance(X, SparseBlock) else X


def _norm(w: np.ndarray) -> float:
    """``||w||`` without BLAS: a multi-threaded ``ddot`` of one vector (np.linalg.norm) took
    3-26 ms on a loaded 2-core machine (its threads wait for a core) against 0.05 ms here."""
    return float(np.sqrt(np.einsum("i,i->", w, w)))


def _margin(X: Block, w: np.ndarray, b: float, norm: float | None = None) -> np.ndarray:
    """``|w^T x + b| / ||w||`` of every row, float64 (n,) (``norm``: ``||w||``, if known)."""
    p = X.matrix @ w if isinstance(X, SparseBlock) else X @ w.astype(X.dtype)
    out: np.ndarray = np.abs(np.asarray(p, np.float64).ravel() + b) / (
        _norm(w) if norm is None else norm)
    return out


def _on_features(X: Block, features: np.ndarray | None) -> Block:
    """Sparse rows over a fixed feature list (the pool's), so classifiers see one space."""
    if features is None or not isinstance(X, SparseBlock):
        return X
    return SparseBlock(X.over(features), features)


#: EH-Hash's cut of sparse pools by default (`eh_terms`)
SPARSE_EH_TERMS = 64


def eh_terms(s: ActiveConfig, sparse: bool) -> int | None:
    """EH-Hash's ``terms`` (m) for a pool, None for every entry: the setting (0: every entry),
    by default `SPARSE_EH_TERMS` for sparse pools and every entry for dense ones.

    Why by kind: on 20 Newsgroups the cut costs nothing measurable (candidates' recall@10
    0.085-0.105 cut, 0.110 uncut at 256 bits; learning curve within the runs' spread of the
    exhaustive one) and saves 0.9 of the pool's pairs and seconds a query; on Fashion-MNIST's
    centred pixel rows a cut at 64 of 785 makes the candidates *worse* than random (1,024 bits,
    500 re-ranked: nearest margin 0.027 against 0.015 for 500 random rows): a row's 64 most
    deviant pixels and a normal's 64 largest weights barely overlap, so the cut vectors' angle
    follows their norms, not the margin."""
    if s.eh_terms is None:
        return SPARSE_EH_TERMS if sparse else None
    return s.eh_terms or None


def _query_rows(pool: Block, w: np.ndarray) -> Block:
    """A normal over the pool's columns as a query row (sparse pools: over feature ids)."""
    W = w[None, :]
    if not isinstance(pool, SparseBlock):
        return W
    nz = np.flatnonzero(w)
    return SparseBlock.from_arrays(np.array([0, len(nz)]), pool.features[nz], w[nz])


def check_active(y_pool: np.ndarray, pool_width: int | None, test: Block,
                 settings: ActiveConfig) -> None:
    """What an active-learning run needs of its inputs, checked before any work (and before a
    cluster starts): >= 2 classes, enough rows per class and unlabelled rows for the rounds,
    test rows as wide as the pool's (``pool_width`` None: sparse rows, matched by feature)."""
    s = settings
    all_classes = np.unique(y_pool)
    if len(all_classes) < 2:
        raise InputError("the pool's labels have one class; active learning needs >= 2")
    if s.classes is not None and s.classes > len(all_classes):
        raise InputError(f"classes={s.classes}: the pool has only {len(all_classes)} classes")
    counts = np.array([(y_pool == c).sum() for c in all_classes])
    if counts.min() < s.initial + 1:
        raise InputError(f"class {all_classes[counts.argmin()]} has {counts.min()} pool rows; "
                         f"{s.initial} initial examples per class need at least one more")
    N = len(y_pool)
    if s.rounds > N - s.initial * len(all_classes):
        raise InputError(f"rounds={s.rounds}: the pool has only "
                         f"{N - s.initial * len(all_classes)} unlabelled rows")
    if (pool_width is None) != isinstance(test, SparseBlock):
        kinds = ("sparse", "dense") if pool_width is None else ("dense", "sparse")
        raise InputError(f"the test rows are {kinds[1]}, the pool's {kinds[0]}; give both of "
                         "one kind")
    if pool_width is not None and int(np.shape(test)[1]) != pool_width:
        raise InputError(f"the test rows have {np.shape(test)[1]} features, the pool's "
                         f"{pool_width}; give a test set of the pool's features")


class LocalPool:
    """The pool in this process: its rows, and a `HyperplaneIndex` per hashing method."""

    def __init__(self, pool: Block, settings: ActiveConfig) -> None:
        self.pool = pool
        self.n = n_rows(pool)
        self.features = pool.features if isinstance(pool, SparseBlock) else None
        self._rows = _rows(pool)
        self.settings = settings
        self.indexes: dict[str, HyperplaneIndex] = {}
        self.build_seconds: dict[str, float] = {}

    def build(self, method: str) -> None:
        s = self.settings
        t0 = time.perf_counter()
        self.indexes[method] = HyperplaneIndex(
            # search rank reads no list: one (as on the cluster), not 12 bytes a row for each
            # of --permutations
            family=method, bits=s.bits, window=s.window,
            n_permutations=s.permutations if s.search == "lists" else 1,
            samples=s.eh_samples if method == "eh-hash" else None,
            terms=eh_terms(s, self.features is not None) if method == "eh-hash" else None,
            bias=True,
            center=s.center, seed=s.seed,
        ).fit(self.pool, n_threads=os.cpu_count() or 1)  # EH-Hash: up to m^2 / 2 pairs a row
        self.build_seconds[method] = time.perf_counter() - t0
        log.info("%s index of %d pool rows: %.1fs", method, self.n, self.build_seconds[method])
        # compile / load the query kernels before any selection is timed
        self.indexes[method].query(_query_rows(self.pool, np.ones(_width(self.pool))), 1,
                                   offsets=np.zeros(1), **_search(s))

    def rows(self, rows: np.ndarray) -> Any:
        return self._rows[rows]

    def top(self, method: str, w: np.ndarray, b: float, k: int) -> tuple[np.ndarray, int]:
        """Ids of the k smallest margins the method finds, and the margins it computed."""
        if method == "exhaustive":  # one product over the whole pool
            M = _margin(self.pool, w, b)
            order = np.argpartition(M, k - 1)[:k] if k < len(M) else np.arange(len(M))
            return order[np.lexsort((order, M[order]))], len(M)
        index = self.indexes[method]
        _, ids = index.query(_query_rows(self.pool, w), k, offsets=np.array([b]),
                             **_search(self.settings))
        return ids[0], int(index.stats_["reranked"].sum())


class DistributedPool:
    """The pool on a Dask cluster (`lshdist.cluster.active.ClusterPool` per hashing method;
    the exhaustive baseline runs on the first one's segments)."""

    def __init__(self, client: Any, path: str, settings: ActiveConfig) -> None:
        from lshdist.store.dataset import Dataset

        ds = Dataset(path)
        self.client, self.path, self.settings = client, path, settings
        self.n = ds.n
        self.features = None
        self.pools: dict[str, Any] = {}
        self.build_seconds: dict[str, float] = {}
        self._cache: dict[int, np.ndarray] = {}

    def build(self, method: str) -> None:
        from lshdist.cluster.active import ClusterPool

        s = self.settings
        self.pools[method] = ClusterPool(
            self.client, self.path, family=method, bits=s.bits, seed=s.seed,
            samples=s.eh_samples if method == "eh-hash" else None,
            terms=eh_terms(s, False) if method == "eh-hash" else None,  # dense pools only
            lists=s.permutations if s.search == "lists" else 1, window=s.window,
            center=s.center)
        self.build_seconds[method] = self.pools[method].build_seconds
        self.pools[method].top(np.ones(self.pools[method].d), 0.0, 1, "rank", 1)  # warm

    def _any(self) -> Any:
        if not self.pools:
            self.build("h-hash")
            self.build_seconds.pop("h-hash")
        return next(iter(self.pools.values()))

    def rows(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        missing = np.array([r for r in np.unique(rows) if int(r) not in self._cache], np.int64)
        if len(missing):
            for r, x in zip(missing, self._any().rows(missing)):
                self._cache[int(r)] = x
        return np.stack([self._cache[int(r)] for r in rows])

    def top(self, method: str, w: np.ndarray, b: float, k: int) -> tuple[np.ndarray, int]:
        s = self.settings
        if method == "exhaustive":
            _, ids, scanned = self._any().top(w, b, k, "scan", 1)
        else:
            mode = "rank" if s.search == "rank" else "hash"
            _, ids, scanned = self.pools[method].top(w, b, k, mode, s.candidates)
        return ids, scanned

    def close(self) -> None:
        for p in self.pools.values():
            p.close()


def run_active(pool: Block | None, y_pool: np.ndarray, test: Block, y_test: np.ndarray, *,
               settings: ActiveConfig, progress: Callable[[str], None] | None = None,
               distributed: DistributedPool | None = None) -> dict[str, Any]:
    """Run every method of ``settings.methods`` ``settings.runs`` times, on the rows of
    ``pool`` in this process, or on a pool held by the cluster (``distributed``; ``pool``
    None).

    Returns
    -------
    dict with ``records``: ``{method: {"auroc", "seconds", "margin", "scanned",
    "unconverged" (1 where the SVM fit stopped at the iteration cap): float (runs, classes,
    rounds + 1); "accuracy": float (runs, rounds + 1)}}`` (round 0 = before any
    selection; selection figures at round r are those of the point labelled before it),
    ``build_seconds`` per hashing method, ``n_pool``, ``classes`` (the class codes run),
    ``eh_terms`` (the m EH-Hash's keys were cut to, `eh_terms`; None: every entry).
    """
    s = settings
    methods = s.method_list
    all_classes = np.unique(y_pool)
    if pool is not None:
        check_active(y_pool, None if isinstance(pool, SparseBlock) else pool.shape[1], test, s)
    classes = all_classes[:s.classes] if s.classes is not None else all_classes
    N = len(y_pool)
    P: LocalPool | DistributedPool
    if distributed is not None:
        P = distributed
    elif pool is not None:
        P = LocalPool(pool, s)
    else:
        raise InputError("run_active needs the pool's rows or a distributed pool")
    # float64 once: a float32 matrix times float64 coefficients is upcast at every call
    test_rows = _rows(_on_features(test, P.features)).astype(np.float64)
    log.info("active learning: %d pool rows, %d one-vs-all classes, methods %s, %d rounds x "
             "%d runs: %d SVM fits and %d selections a method; %s", N, len(classes),
             ", ".join(methods), s.rounds, s.runs, len(classes) * (s.rounds + 1) * s.runs,
             len(classes) * s.rounds * s.runs,
             eh_estimate(pool, s, len(classes) * s.rounds * s.runs) if "eh-hash" in methods
             else "the time of a round is logged after the first")
    for m in methods:
        if m in ("h-hash", "eh-hash"):
            P.build(m)
    scale = svm_scale(P, N, s)
    C, R = len(classes), s.rounds
    out: dict[str, dict[str, np.ndarray]] = {m: {
        **{k: np.full((s.runs, C, R + 1), np.nan)
           for k in ("auroc", "seconds", "margin", "scanned")},
        "unconverged": np.zeros((s.runs, C, R + 1)),
        "accuracy": np.full((s.runs, R + 1), np.nan)} for m in methods}
    in_run = np.isin(y_test, classes)  # multi-class accuracy: test rows of the classes run
    clock = _Rounds(s.runs * len(methods) * (R + 1), progress)
    for run in range(s.runs):
        rng0 = np.random.default_rng([s.seed, run])
        start = np.concatenate([rng0.choice(np.flatnonzero(y_pool == c), s.initial,
                                            replace=False) for c in all_classes])
        for m in methods:
            rng = np.random.default_rng([s.seed, run, METHODS.index(m)])
            labelled = np.zeros((C, N), bool)
            labelled[:, start] = True
            rec = out[m]
            for r in range(R + 1):
                evaluate = r % s.eval_every == 0 or r == R
                Wr, br = np.empty((C, test_rows.shape[1])), np.empty(C)
                for ci, c in enumerate(classes):
                    rows = np.flatnonzero(labelled[ci])
                    clf = _svc(s.C, s.class_weight, s.seed)
                    if not _fit(clf, P.rows(rows) * scale, y_pool[rows] == c):
                        rec["unconverged"][run, ci, r] = 1.0
                    # the hyperplane in the pool's units: w_s^T (s x) + b = (s w_s)^T x + b
                    w = scale * np.asarray(clf.coef_, np.float64).ravel()
                    b = float(np.asarray(clf.intercept_).ravel()[0])
                    Wr[ci], br[ci] = w, b
                    if r == R:
                        continue
                    t0 = time.perf_counter()
                    pick, scanned = _select(m, P, labelled[ci], w, b, rng)
                    rec["seconds"][run, ci, r + 1] = time.perf_counter() - t0
                    # the true margin of the selected point (not the one a method reports)
                    rec["margin"][run, ci, r + 1] = _margin(_as_rows(P.rows(np.array([pick])), P),
                                                            w, b, _norm(w))[0]
                    rec["scanned"][run, ci, r + 1] = scanned / N
                    labelled[ci, pick] = True
                if evaluate:
                    # every class's decision values in one pass over the test rows
                    dec = np.asarray(test_rows @ Wr.T, np.float64) + br[None, :]
                    for ci, c in enumerate(classes):
                        rec["auroc"][run, ci, r] = _auroc(y_test == c, dec[:, ci])
                    rec["accuracy"][run, r] = np.mean(
                        classes[dec[in_run].argmax(1)] == y_test[in_run])
                clock.tick(f"run {run + 1}/{s.runs} {m} round {r}/{R}: mean AUROC "
                           f"{np.nanmean(rec['auroc'][run, :, r]):.4f}",
                           r % max(1, R // 10) == 0 or r == R)
            missed = int(rec["unconverged"][run].sum())
            if missed:
                log.warning("run %d/%d %s: %d of %d SVM fits stopped at liblinear's %d "
                            "iterations without converging (rows on a large scale converge "
                            "slowly: --svm-scale rms scales them)", run + 1, s.runs,
                            m, missed, C * (R + 1), SVM_MAX_ITER)
            if progress:
                progress(f"run {run + 1}/{s.runs} {m}: mean AUROC "
                         f"{np.mean(rec['auroc'][run, :, 0]):.4f} -> "
                         f"{np.mean(rec['auroc'][run, :, -1]):.4f}, selection "
                         f"{1e3 * np.nanmean(rec['seconds'][run]):.2f} ms/round")
    return {"records": out, "build_seconds": P.build_seconds, "n_pool": N,
            "classes": [int(c) for c in classes], "svm_scale": scale,
            "eh_terms": eh_terms(s, P.features is not None) if "eh-hash" in methods else None}


class _Rounds:
    """Progress over all rounds of all methods and runs: after the third round an estimate of
    the whole loop from the second and third (the first loads what the rest reuse: 2.65 s
    against 0.4-0.5 s on 20 Newsgroups), then each reported line with the time so far and an
    estimate of the rest (the mean round so far: methods differ, so it is corrected as they
    run)."""

    def __init__(self, total: int, progress: Callable[[str], None] | None) -> None:
        self.total, self.progress, self.done = total, progress, 0
        self.t0 = time.perf_counter()
        self.first = 0.0

    def tick(self, what: str, report: bool) -> None:
        self.done += 1
        if self.progress is None:
            return
        spent = time.perf_counter() - self.t0
        if self.done == 1:
            self.first = spent
        left = (spent - self.first) / max(self.done - 1, 1) * (self.total - self.done)
        if self.done == 3 and self.total > 3:
            self.progress(f"rounds 2-3 took {(spent - self.first) / 2:.2f} s each (the first "
                          f"{self.first:.2f} s): the {self.total} rounds of every run and "
                          f"method about {_minutes(spent + left)}")
        elif report:
            self.progress(f"{what} ({self.done}/{self.total} rounds in "
                          f"{_minutes(spent)}, about {_minutes(left)} left)")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def eh_estimate(pool: Block | None, s: ActiveConfig, queries: int) -> str:
    """The EH-Hash work announced before it starts: the pool's pairs x bits (its rows with the
    bias feature, each cut to ``eh_terms``) and a hyperplane query's bound, at
    `EH_SECONDS_PER_PAIR_BIT` on the cores of this machine (the hashing logs its own estimate
    and progress as it runs)."""
    from lshdist.hashing.hyperplane import EH_SECONDS_PER_PAIR_BIT

    if pool is None:
        return "EH-Hash hashed on the cluster"
    m = eh_terms(s, isinstance(pool, SparseBlock))
    if isinstance(pool, SparseBlock):
        nnz = np.diff(pool.matrix.indptr).astype(np.float64) + 1  # + the bias feature
    else:
        nnz = np.full(n_rows(pool), float(pool.shape[1] + 1))
    if m is not None:
        nnz = np.minimum(nnz, m)
    work = float((nnz * (nnz + 1) / 2).sum()) * s.bits
    threads = os.cpu_count() or 1
    head = (f"EH-Hash of the pool {work:.3g} pair-bits, about "
            f"{_minutes(work * EH_SECONDS_PER_PAIR_BIT / threads)} on {threads} idle core(s), "
            f"rows cut to their {m} largest entries" if m is not None else
            f"EH-Hash of the pool {work:.3g} pair-bits (every entry), about "
            f"{_minutes(work * EH_SECONDS_PER_PAIR_BIT / threads)} on {threads} idle core(s)")
    if s.eh_samples is not None:
        per = s.eh_samples * s.bits * EH_SECONDS_PER_PAIR_BIT
        return (f"{head}; {queries} hyperplane queries sampled, {s.eh_samples} x {s.bits} "
                f"pair-bits each, about {_minutes(per * queries)} in all")
    if m is None:
        return (f"{head}; each of {queries} hyperplane queries nnz(w) (nnz(w) + 1) / 2 x "
                f"{s.bits} pair-bits exact (an SVM normal over thousands of features: seconds "
                "each; --eh-terms m bounds it)")
    per = m * (m + 1) / 2 * s.bits * EH_SECONDS_PER_PAIR_BIT
    return (f"{head}; {queries} hyperplane queries at most {m * (m + 1) // 2 * s.bits:.3g} "
            f"pair-bits each, about {_minutes(per * queries)} in all")


#: pool rows sampled for the SVMs' scale factor
SCALE_SAMPLE = 10_000


def svm_scale(P: LocalPool | DistributedPool, N: int, s: ActiveConfig) -> float:
    """The factor the SVMs' rows are multiplied by: ``1 / sqrt(mean ||x||^2)`` over a seeded
    sample of ``SCALE_SAMPLE`` pool rows (``svm_scale`` "rms"; 1 within float32 rounding for
    unit-norm tf-idf rows), or 1.

    LinearSVC's C trades the margin against the hinge losses in the rows' own units: on pixels
    0-255 (Fashion-MNIST, ||x|| ~ 3,200) C = 1 is nearly a hard margin, liblinear stops at its
    iteration cap on ~7 % of the fits, and margin selection gains no more binary AUROC than
    random selection (100 rounds: +0.0225 vs +0.0241); the same rows at unit RMS norm: +0.0360
    vs +0.0214.  With it the experiment does not depend on the data's units (pixels 0-255 or
    0-1 give the same curves and selections).  One factor for the whole run (pool, test rows,
    every class), so the hyperplanes and margins are those of the rows as given."""
    if s.svm_scale == "none":
        return 1.0
    rng = np.random.default_rng([s.seed, 7])
    sample = np.sort(rng.choice(N, min(N, SCALE_SAMPLE), replace=False))
    from lshdist.index.hyperplane import rms_norm

    X = _as_rows(P.rows(sample), P)
    if n_rows(X) and not np.any(np.asarray(X.row_norms_sq() if isinstance(X, SparseBlock)
                                           else np.abs(X).max(axis=1)) > 0):
        raise InputError("the pool's sampled rows are all zero: no scale for the SVMs; give "
                         "--svm-scale none or other rows")
    return 1.0 / rms_norm(X)


def _as_rows(X: Any, P: LocalPool | DistributedPool) -> Block:
    """Rows as `P.rows` gives them (a CSR matrix for sparse pools) back as a block."""
    if P.features is not None:
        return SparseBlock(X, P.features)
    out: Block = np.asarray(X)
    return out


def _width(X: Block) -> int:
    return len(X.features) if isinstance(X, SparseBlock) else int(X.shape[1])


def _auroc(positive: np.ndarray, score: np.ndarray) -> float:
    """The area under the ROC curve of ``score`` for the boolean labels ``positive`` (NaN with
    one class): the Mann-Whitney statistic over average ranks (ties: the trapezoids of
    scikit-learn's ``roc_auc_score``, equal to it within rounding; 33 of 35 ms a call there
    went to its input checks and label handling, ~20 times a round)."""
    from scipy.stats import rankdata

    n_pos = int(np.count_nonzero(positive))
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(score)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _search(s: ActiveConfig) -> dict[str, Any]:
    """`HyperplaneIndex.query` keywords of the hashing methods' candidate search."""
    if s.search == "rank":
        return {"mode": "rank", "candidates": s.candidates}
    return {"mode": "hash"}


def _select(method: str, P: LocalPool | DistributedPool, labelled: np.ndarray, w: np.ndarray,
            b: float, rng: np.random.Generator) -> tuple[int, int]:
    """(pool row selected, margins computed to select it) for the hyperplane ``(w, b)``."""
    if method == "random":
        return int(rng.choice(np.flatnonzero(~labelled))), 0
    # the top (labelled + 1) hold an unlabelled row whenever the candidates do
    k = min(int(labelled.sum()) + 1, len(labelled))
    ids, scanned = P.top(method, w, b, k)
    ok = (ids >= 0) & ~labelled[np.maximum(ids, 0)]
    if not ok.any():  # every candidate labelled already: fall back to a random point
        return int(rng.choice(np.flatnonzero(~labelled))), scanned
    return int(ids[np.argmax(ok)]), scanned  # ascending margins: the first unlabelled one


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Learning curves: the improvement in binary AUROC over round 0, averaged over the classes
    of a run, then mean and std over runs; the same for multi-class accuracy.  Per method:
    mean (and median) selection time per round and selected margin, fraction scanned, and the
    ratios to exhaustive selection (final AUROC improvement, selection time) when it ran."""
    out: dict[str, Any] = {"n_pool": result["n_pool"], "classes": result["classes"],
                           "svm_scale": result.get("svm_scale", 1.0),
                           # the m EH-Hash's keys were cut to (null: every entry or no EH-Hash)
                           "eh_terms": result.get("eh_terms"),
                           "methods": {}}
    for m, rec in result["records"].items():
        done = ~np.isnan(rec["accuracy"][0])  # the rounds evaluated
        auroc = rec["auroc"][:, :, done]
        imp = np.nanmean(auroc - auroc[:, :, :1], axis=1)  # (runs, rounds evaluated)
        acc = rec["accuracy"][:, done] - rec["accuracy"][:, :1]
        out["methods"][m] = {
            "rounds_evaluated": np.flatnonzero(done).tolist(),
            "auroc_improvement_mean": imp.mean(0).tolist(),
            "auroc_improvement_std": imp.std(0).tolist(),
            "accuracy_improvement_mean": acc.mean(0).tolist(),
            "accuracy_improvement_std": acc.std(0).tolist(),
            "final_auroc_improvement": float(imp[:, -1].mean()),
            "final_auroc_improvement_std": float(imp[:, -1].std()),
            "final_auroc_improvement_per_class": np.nanmean(
                auroc[:, :, -1] - auroc[:, :, 0], axis=0).tolist(),
            "initial_auroc": float(np.nanmean(rec["auroc"][:, :, 0])),
            "final_auroc": float(np.nanmean(rec["auroc"][:, :, -1])),
            "initial_accuracy": float(rec["accuracy"][:, 0].mean()),
            "final_accuracy": float(rec["accuracy"][:, -1].mean()),
            "selection_seconds_per_round": float(np.nanmean(rec["seconds"])),
            # medians: a few far selections (or a busy machine's slow rounds) move the means
            "selection_seconds_per_round_median": float(np.nanmedian(rec["seconds"])),
            "selected_margin_mean": float(np.nanmean(rec["margin"])),
            "selected_margin_median": float(np.nanmedian(rec["margin"])),
            "fraction_scanned": float(np.nanmean(rec["scanned"])),
            # SVM fits that stopped at the iteration cap, of all fits
            "svm_unconverged": float(np.mean(rec["unconverged"])),
            "index_build_seconds": result["build_seconds"].get(m),
        }
    ex = out["methods"].get("exhaustive")
    for v in out["methods"].values():
        if ex is not None:
            v["auroc_improvement_vs_exhaustive"] = (
                v["final_auroc_improvement"] / ex["final_auroc_improvement"]
                if ex["final_auroc_improvement"] else None)
            v["selection_speedup_vs_exhaustive"] = (
                ex["selection_seconds_per_round"] / v["selection_seconds_per_round"]
                if v["selection_seconds_per_round"] > 0 else None)
    return out


def plot(summary: dict[str, Any], out_dir: Any) -> list[str]:
    """learning_curves.png (AUROC and accuracy improvement vs rounds, mean ± std) and
    selection.png (selection time and selected margin per method); returns the file names."""
    from lshdist.plots import _plt

    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for m, v in summary["methods"].items():
        for ax, key in zip(axes, ("auroc", "accuracy")):
            mean = np.array(v[f"{key}_improvement_mean"])
            std = np.array(v[f"{key}_improvement_std"])
            x = np.array(v["rounds_evaluated"])
            ax.plot(x, mean, label=m)
            ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    for ax, key in zip(axes, ("AUROC", "accuracy")):
        ax.set_xlabel("selection rounds")
        ax.set_ylabel(f"improvement in {'mean one-vs-all' if key == 'AUROC' else 'multi-class'} "
                      f"{key}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "learning_curves.png", dpi=100)
    plt.close(fig)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(summary["methods"])
    a1.bar(names, [1e3 * summary["methods"][m]["selection_seconds_per_round"] for m in names])
    a1.set_ylabel("selection time per round (ms)")
    a2.bar(names, [summary["methods"][m]["selected_margin_mean"] for m in names])
    a2.set_ylabel("mean |w^T x + b| / ||w|| of the selected points")
    fig.tight_layout()
    fig.savefig(out_dir / "selection.png", dpi=100)
    plt.close(fig)
    return ["learning_curves.png", "selection.png"]
