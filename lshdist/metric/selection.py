"""A learned metric that never silently makes search worse, and keeps the gains that are real.

`select_metric` decides between the prior (L2, or the unlearned kernel) and ITML by held-out
k-NN accuracy over **folds**: the labelled rows (at most `MAX_HELD_OUT`, stratified) are split
into ``round(1 / validation)`` stratified folds (2 to `MAX_FOLDS`; 5 by default), and every one
of them is held out once, predicted by a metric fitted on the other rows.

1. **Ranking** (fold 0): every setting of a small grid is fitted on the rows outside fold 0 and
   scored on fold 0, in grid order, within ``budget`` seconds; a later setting replaces the one
   kept so far only if it is better by `MARGIN` (`choose_setting`).  If the chosen setting is no
   better than the prior on fold 0, the prior is kept without more fits.
2. **Decision** (the other folds): the chosen setting is fitted once more per fold, and its
   held-out predictions are compared with the prior's over all the rows of those folds by a
   paired test (`paired_test`): kept only if it gets `MARGIN` of the rows more right **and** a
   one-sided test of "no better" rejects at level `LEVEL` — the larger p-value of the exact
   sign test on the rows where the two disagree and of the clustered McNemar test, rows that
   are each other's nearest row being one cluster (`mutual_clusters`: rows held out in
   different folds vote with each other).  Fold 0 chose the setting, so its rows are left out
   of this test and out of the decision's votes (the best of several settings on the rows that
   picked it is biased upwards, and a fold-0 row that voted for a decision row would be voted
   for back); when a single setting was scored they count.
3. The chosen setting is refitted on all the rows.  Otherwise the prior is the model
   (``selected: "prior"``) and a warning names both accuracies and the test's counts.

Every fit — the grid's, the folds' and the final one — runs the same passes under the same
stopping rule (``max_iter``, ``tol``, and the work cap `FIT_WORK`, which binds only for
high-dimensional data): the settings are judged as they will be deployed, and when time runs
short fewer settings are tried rather than shorter fits.  Passes run, the dual change at the end
and the final constraint violation (`lshdist.metric.itml.bound_violation`) of every fit are
logged and recorded (`Selection.to_json`, in the model's JSON).  The rates this rule keeps a
useless metric and refuses a useful one are measured by `benchmarks/bench_selection_power.py`
and stated in ``docs/metric-selection.md``.

The grid (tried in this order; the first entry is the user's own setting, so that with no time
to spare nothing changes):

* explicit: the given setting; gamma x 0.1 and x 10; neighbours per anchor 5 and 20; the
  paper's 1st/99th percentile bounds; random pairs;
* implicit: the given setting; c x 2; gamma x 0.1 and x 10; neighbours 5 and 20; the basis
  route.

The settings (and then the folds) are fitted and scored ``n_threads`` at a time (the driver's
cores; BLAS held to one thread each while they run, `lshdist.limits.one_blas_thread`); results
are taken in grid order, so the settings tried give the serial run's choice (when the budget
binds, more threads start more settings within it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import binom, norm

from lshdist.blocks import RowsLike, as_block, n_rows, take_rows
from lshdist.errors import InputError
from lshdist.limits import one_blas_thread
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric

log = logging.getLogger(__name__)

#: a learned metric must get this fraction of the held-out rows more right than the prior (half
#: a point of 1-NN accuracy) to be kept; a later grid setting must beat the one kept so far by
#: as much on the ranking fold
MARGIN = 0.005
#: one-sided level of the paired test on the held-out rows (`paired_test`): the probability of
#: keeping a metric no better than the prior, before the margin and the ranking fold's check
#: make it smaller (measured in docs/metric-selection.md: 3 of 100 with real fits)
LEVEL = 0.025
#: labelled rows held out (each once, over the folds): at most this many, stratified
MAX_HELD_OUT = 20_000
#: folds: ``round(1 / validation)``, at least 2 and at most this many
MAX_FOLDS = 10
#: floating-point work of one ITML fit (constraints x passes x 2 d^2): the passes of every fit
#: are capped so that a fit takes seconds, not hours, on a 784-d dataset (10,000 pairs: 8
#: passes, 0.4 s each with the blocked projections; Letter's 16-d fits are never capped)
FIT_WORK = 1e11


def capped_passes(est: Any, dim: int, work: float) -> int:
    """``est.max_iter``, or fewer so that ``n_constraints x passes x 2 dim^2 <= work``."""
    per_pass = 2.0 * float(est.n_constraints) * dim * dim
    return int(max(1, min(int(est.max_iter), work // max(per_pass, 1.0))))


@dataclass(frozen=True)
class FitReport:
    """How far one ITML fit got: passes run, the dual change of the last pass (the stopping
    rule's measure, ``tol`` ends it), the constraints' mean relative violation and the
    fraction violated (`lshdist.metric.itml.bound_violation`), and the seconds it took."""

    passes: int
    conv: float
    violation: float
    violated: float
    seconds: float

    @classmethod
    def of(cls, est: Any, seconds: float) -> FitReport:
        return cls(int(est.n_iter_), float(est.conv_), float(getattr(est, "violation_", np.nan)),
                   float(getattr(est, "violated_", np.nan)), seconds)

    def to_json(self) -> dict[str, Any]:
        return {"passes": self.passes, "conv": self.conv, "violation": round(self.violation, 5),
                "violated": round(self.violated, 5), "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Trial:
    """One grid setting, its held-out accuracies on the ranking fold and its fit."""

    name: str
    changes: dict[str, Any]
    accuracy: dict[int, float]
    seconds: float
    fit: FitReport | None = None


@dataclass(frozen=True)
class PairedTest:
    """The paired comparison of a learned metric with the prior on the same held-out rows."""

    only_learned: int  # rows only the learned metric gets right
    only_prior: int  # rows only the prior gets right
    rows: int
    p_value: float  # one-sided, of "the learned metric is no better" (see `paired_test`)
    inflation: float = 1.0  # variance of b - c over its value for independent rows, b + c

    @property
    def gain(self) -> float:
        """Held-out 1-NN accuracy of the learned metric minus the prior's."""
        return (self.only_learned - self.only_prior) / max(self.rows, 1)

    @property
    def keep(self) -> bool:
        """The gain is at least `MARGIN` and the test rejects "no better" at `LEVEL`."""
        return (self.rows > 0 and self.only_learned - self.only_prior >= MARGIN * self.rows
                and self.p_value <= LEVEL)

    def counts(self) -> str:
        return (f"{self.only_learned} rows only the learned metric gets right, "
                f"{self.only_prior} only the prior, p = {self.p_value:.2g}")

    def to_json(self) -> dict[str, Any]:
        return {"only_learned": self.only_learned, "only_prior": self.only_prior,
                "rows": self.rows, "gain": round(self.gain, 6), "p_value": self.p_value,
                "variance_inflation": round(self.inflation, 4), "margin": MARGIN,
                "level": LEVEL, "keep": self.keep}


def paired_test(learned: np.ndarray, prior: np.ndarray, clusters: np.ndarray | None = None
                ) -> PairedTest:
    """Per-row correctness ``learned`` against ``prior`` (bool, same rows): b rows only the
    learned metric gets right, c only the prior, and the one-sided p-value of "the learned
    metric is no better".

    Without ``clusters``: the exact sign test (McNemar's, exact),
    ``P(Binomial(b + c, 1/2) >= b)``.  With ``clusters`` (int (n,), rows whose outcomes may
    be dependent share a cluster; `mutual_clusters`): also the clustered McNemar test (Durkalski
    et al. 2003), ``z = sum_k d_k / sqrt(sum_k d_k^2)`` with ``d_k`` the cluster's b - c, and the
    larger of the two p-values is taken.  Held-out rows predicted by metrics fitted on each
    other's folds are not independent: two rows each the other's nearest neighbour are right or
    wrong together (on labels no metric can predict, the sign test alone kept a useless metric
    in 4 of 30 trials)."""
    b = int(np.sum(learned & ~prior))
    c = int(np.sum(~learned & prior))
    p = float(binom.sf(b - 1, b + c, 0.5)) if b + c else 1.0
    inflation = 1.0
    if clusters is not None and b + c:
        d = learned.astype(np.int64) - prior.astype(np.int64)
        _, k = np.unique(clusters, return_inverse=True)
        per = np.bincount(k, weights=d)
        var = float(np.sum(per * per))
        inflation = var / (b + c)
        p = max(p, float(norm.sf((b - c) / np.sqrt(var))))
    return PairedTest(b, c, len(learned), p, inflation)


def mutual_clusters(rows: np.ndarray, *nearest: np.ndarray) -> np.ndarray:
    """Cluster numbers (int (n,)) of held-out ``rows`` (global row numbers): rows ``i`` and
    ``j`` are joined when ``j`` is a nearest row of ``i`` and ``i`` one of ``j`` (under any of
    the metrics whose nearest rows, global numbers (n,), are given) — under labels a metric
    cannot predict, the only pairs whose outcomes are correlated (each row's label enters the
    other's vote)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(rows)
    where = np.full(int(max(rows.max(), *(m.max() for m in nearest))) + 1, -1, np.int64)
    where[rows] = np.arange(n)
    src, dst = [], []
    for m in nearest:
        j = where[m]
        ok = j >= 0
        i = np.flatnonzero(ok)
        j = j[ok]
        back = np.zeros(len(i), bool)
        for m2 in nearest:
            back |= m2[j] == rows[i]
        src.append(i[back])
        dst.append(j[back])
    ii, jj = np.concatenate(src), np.concatenate(dst)
    graph = coo_matrix((np.ones(len(ii)), (ii, jj)), shape=(n, n))
    return np.asarray(connected_components(graph, directed=False)[1], np.int64)


def choose_setting(correct: list[int], rows: int) -> int:
    """The grid setting kept: the first, replaced by a later one only if it gets `MARGIN` of
    the ``rows`` more right (``correct``: rows each setting gets right, in grid order)."""
    best = 0
    for i, n_ok in enumerate(correct):
        if n_ok - correct[best] >= MARGIN * rows - 1e-9:
            best = i
    return best


@dataclass
class Selection:
    """What `select_metric` chose, and why."""

    selected: str  # "learned" or "prior"
    setting: str
    prior_accuracy: dict[int, float]  # on the rows the decision was made on
    learned_accuracy: dict[int, float]
    trials: list[Trial] = field(default_factory=list)
    n_train: int = 0  # rows the grid's fits were trained on
    n_validation: int = 0  # held-out rows the decision was made on
    seconds: float = 0.0
    reason: str = ""
    n_folds: int = 0
    n_ranking: int = 0  # rows of the ranking fold
    test: PairedTest | None = None
    fold_fits: list[FitReport] = field(default_factory=list)
    final_fit: FitReport | None = None

    def to_json(self) -> dict[str, Any]:
        def acc(a: dict[int, float]) -> dict[str, float]:
            return {str(k): v for k, v in a.items()}

        return {
            "selected": self.selected, "setting": self.setting, "reason": self.reason,
            "prior_accuracy": acc(self.prior_accuracy),
            "learned_accuracy": acc(self.learned_accuracy),
            "n_train": self.n_train, "n_validation": self.n_validation,
            "folds": self.n_folds, "ranking_rows": self.n_ranking,
            "test": None if self.test is None else self.test.to_json(),
            "seconds": round(self.seconds, 3),
            "trials": [{"name": t.name, "changes": t.changes, "accuracy": acc(t.accuracy),
                        "seconds": round(t.seconds, 3),
                        **({} if t.fit is None else {"fit": t.fit.to_json()})}
                       for t in self.trials],
            "fold_fits": [f.to_json() for f in self.fold_fits],
            "final_fit": None if self.final_fit is None else self.final_fit.to_json(),
        }


def n_folds(validation: float) -> int:
    """Folds for a held-out ``validation`` fraction: ``round(1 / validation)``, within
    ``[2, MAX_FOLDS]``."""
    if not 0 < validation < 1:
        raise InputError(f"validation fraction {validation}: must be in (0, 1)")
    return int(min(MAX_FOLDS, max(2, round(1 / validation))))


def stratified_folds(y: np.ndarray, k: int, seed: int, cap: int = MAX_HELD_OUT
                     ) -> list[np.ndarray]:
    """``k`` disjoint sorted arrays of held-out rows: every class with two or more rows dealt
    round-robin over the folds in a seeded order (so that a fold never holds all of a class,
    and fold sizes differ by at most one row of each class); classes of one row are never held
    out; at most ``cap`` rows in all, every class in proportion.  Empty folds (fewer rows than
    folds) are dropped."""
    if k < 2:
        raise InputError(f"{k} folds: need at least 2")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 3]))
    classes = [np.flatnonzero(y == c) for c in np.unique(y)]
    classes = [r for r in classes if len(r) >= 2]
    total = sum(len(r) for r in classes)
    share = min(1.0, cap / total) if total else 1.0
    fold_of: list[np.ndarray] = []
    rows_of: list[np.ndarray] = []
    start = 0
    for rows in classes:
        take = len(rows) if share >= 1 else min(len(rows), max(1, round(share * len(rows))))
        picked = rng.permutation(rows)[:take]
        rows_of.append(picked)
        fold_of.append((start + np.arange(take)) % k)
        start = (start + take) % k
    if not rows_of:
        return []
    rows_all, folds_all = np.concatenate(rows_of), np.concatenate(fold_of)
    out = [np.sort(rows_all[folds_all == j]).astype(np.int64) for j in range(k)]
    return [f for f in out if len(f)]


def knn_correct(metric: Any, X_train: RowsLike, y_train: np.ndarray, X_val: RowsLike,
                y_val: np.ndarray, ks: list[int], n_classes: int) -> dict[int, np.ndarray]:
    """Per held-out row, whether its k-NN vote under ``metric`` is right (exact neighbours,
    ties by row): bool (n_val,) for every k (`knn_votes` without the nearest rows)."""
    return knn_votes(metric, X_train, y_train, X_val, y_val, ks, n_classes)[0]


def knn_votes(metric: Any, X_train: RowsLike, y_train: np.ndarray, X_val: RowsLike,
              y_val: np.ndarray, ks: list[int], n_classes: int
              ) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Per held-out row, whether its k-NN vote under ``metric`` is right (exact neighbours,
    ties by row): bool (n_val,) for every k; and its nearest row, int64 (n_val,) indices into
    ``X_train``.

    Explicit metrics: the exact scan (`lshdist.index.scan.scan_topk`: float32 products about
    the rows' centre for candidates, then the exact distance of the k + 16 nearest) — 2x
    faster than a float64 distance matrix at 784-d, and exact also for rows far from the
    origin (tested).  Implicit metrics keep the float64 matrix (their sparse payload is slower
    on dense rows)."""
    from lshdist.index.payload import DensePayload
    from lshdist.index.scan import scan_topk
    from lshdist.metric.knn import knn_predict

    kk = min(max(ks), n_rows(X_train))
    if isinstance(metric, ExplicitMetric):
        _, nn = scan_topk(DensePayload(metric.transform(X_train)),
                          DensePayload(metric.transform(X_val)), kk)
    else:
        D = metric.pairwise(X_val, X_train)
        part = (np.argpartition(D, kk - 1, axis=1)[:, :kk] if kk < D.shape[1]
                else np.tile(np.arange(D.shape[1]), (D.shape[0], 1)))
        d = np.take_along_axis(D, part, 1)
        order = np.lexsort((part, d), axis=1)
        nn = np.take_along_axis(part, order, 1)
    lab = y_train[nn]
    return ({k: knn_predict(lab, min(k, kk), n_classes) == y_val for k in ks},
            np.asarray(nn[:, 0], np.int64))


def prior_metric(kind: str, X: RowsLike, learned: Any) -> Any:
    """The unlearned metric of the same kind: identity centred on X (explicit), or the learned
    metric's basis with S = 0 (implicit)."""
    if kind == "explicit":
        Xd = np.asarray(X)
        return ExplicitMetric.identity(Xd.shape[1], center=Xd.mean(axis=0, dtype=np.float64)
                                       .astype(np.float32))
    return ImplicitMetric.identity(learned.basis, kernel=learned.kernel_name, d=learned.d)


def grid(kind: str, est: Any) -> list[tuple[str, dict[str, Any]]]:
    """The settings tried, in order (see the module docstring)."""
    g = [("given", {}),
         ("gamma/10", {"gamma": est.gamma / 10}), ("gamma*10", {"gamma": est.gamma * 10}),
         ("neighbors=5", {"n_neighbors": 5}), ("neighbors=20", {"n_neighbors": 20})]
    if kind == "explicit":
        g += [("bounds=paper", {"percentiles": "paper"}),
              ("random pairs", {"constraints": "random"})]
    else:
        g.insert(1, ("c*2", {"n_basis": est.n_basis * 2}))
        g.append(("route=basis", {"route": "basis"}))
    # settings equal to the given one are not tried twice
    out, seen = [], set()
    for name, ch in g:
        ch = {k: v for k, v in ch.items() if getattr(est, k) != v}
        key = tuple(sorted(ch.items()))
        if key in seen or (name != "given" and not ch):
            continue
        seen.add(key)
        out.append((name, ch))
    return out


def select_metric(make: Callable[[dict[str, Any]], Any], kind: str, X: RowsLike, y: np.ndarray,
                  *, d: int | None, ks: list[int], validation: float, budget: float,
                  force_learned: bool, search: bool, seed: int, n_classes: int,
                  n_threads: int = 1) -> tuple[Any, Any, Selection]:
    """Choose the metric (see the module docstring).

    ``make(changes)`` returns a fresh estimator (ITML or KernelITML) with the user's parameters
    updated by ``changes``.  Returns ``(metric, fitted estimator or None, Selection)``; the
    estimator is None when the prior was selected.  ``n_threads``: grid settings (then folds)
    fitted at once (the same settings tried give the same choice).  ``budget``: seconds within
    which grid settings are started (the user's own is always tried); the decision's fits and
    the final fit come after it.
    """
    t_start = time.perf_counter()
    ks = sorted({1, *ks})
    folds = stratified_folds(y, n_folds(validation), seed)
    if not folds:
        raise InputError(f"no class of the {len(y)} labelled rows has two of them: none can be "
                         "held out to check a learned metric (nor paired as similar); give at "
                         "least two rows of some class")
    B = as_block(X)
    everything = np.arange(n_rows(B))

    def rows_outside(j: int) -> np.ndarray:
        return np.setdiff1d(everything, folds[j]).astype(np.int64)

    def metric_of(est: Any) -> Any:
        return est.metric(d=d) if kind == "implicit" else est.metric()

    def score(metric: Any, ref: np.ndarray, held: np.ndarray
              ) -> tuple[dict[int, np.ndarray], np.ndarray]:
        """Correctness of the ``held`` rows' votes among the ``ref`` rows, and each one's
        nearest row (a global row number)."""
        ok, nearest = knn_votes(metric, take_rows(B, ref), y[ref], take_rows(B, held), y[held],
                                ks, n_classes)
        return ok, ref[nearest]

    base = make({})
    dim = int(base.n_basis) if kind == "implicit" else int(np.asarray(B).shape[1])
    full = capped_passes(base, dim, FIT_WORK)
    if full < int(base.max_iter):
        log.info("selection: ITML passes capped at %d by the work budget (%d pairs, %d-d)",
                 full, base.n_constraints, dim)

    def fit(changes: dict[str, Any], rows: np.ndarray | None, **kw: Any) -> Any:
        """A setting fitted on ``rows`` (all rows: None), with every fit's passes."""
        est = make({**changes, "max_iter": min(full, int(make(changes).max_iter))})
        if rows is None:
            return est.fit(B, y, **kw)
        return est.fit(take_rows(B, rows), y[rows], **kw)

    settings = grid(kind, base) if search else [("given", {})]
    train0, held0 = rows_outside(0), folds[0]

    # The anchors' nearest neighbours are the same for every setting that keeps the seed, the
    # prior and the number of pairs (gamma, the bounds and the neighbours per anchor change
    # only which are used): computed once here for the explicit learner, with both cores,
    # instead of once per setting (the 1 M sample: six settings draw neighbours, ~2 core-s
    # each).
    table = None
    wants = [int(e.n_neighbors) for e in (make(ch) for _, ch in settings)
             if e.constraints == "neighbors"]
    if kind == "explicit" and len(wants) > 1:  # explicit: an ITML, which makes tables
        try:
            table = base.neighbor_table(take_rows(B, train0), wants,
                                        n_threads=max(1, int(n_threads)))
        except InputError:
            table = None  # the fits themselves say why (the given setting's message)

    Votes = tuple[dict[int, np.ndarray], np.ndarray]  # correctness by k, nearest rows

    def attempt(i: int) -> tuple[Any, Votes, FitReport] | str | None:
        """Fit setting ``i`` outside fold 0 and score it on fold 0: ``(metric, correctness,
        fit)``, the reason it could not be fitted, or None when the budget was spent before
        it started."""
        name, ch = settings[i]
        if i and time.perf_counter() - t_start > budget:
            return None
        t0 = time.perf_counter()
        try:
            est = fit(ch, train0, **({"neighbors": table} if table is not None else {}))
        except InputError as exc:  # e.g. c*2 basis points on a small dataset
            if name == "given":
                raise  # the user's own setting must fit: its message says why it cannot
            return str(exc)
        m = metric_of(est)
        return m, score(m, train0, held0), FitReport.of(est, time.perf_counter() - t0)

    def fold(j: int, changes: dict[str, Any], prior: Any, ref: np.ndarray
             ) -> tuple[Votes, Votes, FitReport]:
        """The chosen setting fitted outside fold ``j``; its and the prior's votes for fold
        ``j`` among the ``ref`` rows."""
        t0 = time.perf_counter()
        est = fit(changes, rows_outside(j))
        learned = score(metric_of(est), ref, folds[j])
        return learned, score(prior, ref, folds[j]), FitReport.of(est, time.perf_counter() - t0)

    # The settings are independent: up to `n_threads` are fitted at once (ITML's kernels and
    # BLAS release the GIL); each starts only while the budget lasts, in grid order, and the
    # results are taken in grid order — the choice is the one a serial run makes.
    # Two fits at once, each with a 2-thread BLAS, on 2 cores: 14-16 s for the grid at
    # 784-d (20,000 rows); one BLAS thread each: 8.4-9.4 s; one fit at a time: 11-12 s.
    workers = max(1, min(int(n_threads), max(len(settings), len(folds) - 1)))
    trials: list[Trial] = []
    scored: list[tuple[Any, Votes]] = []
    with (one_blas_thread() if workers > 1 else nullcontext()), ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(attempt, i) for i in range(len(settings))]
        try:
            for (name, ch), fut in zip(settings, futures):
                got = fut.result()
                if got is None:
                    log.info("selection: time budget of %.0fs spent after %d settings", budget,
                             len(trials))
                    break
                if isinstance(got, str):
                    log.info("selection: %s skipped (%s)", name, got)
                    continue
                m, votes, rep = got
                acc = {k: float(v.mean()) for k, v in votes[0].items()}
                trials.append(Trial(name, ch, acc, rep.seconds, rep))
                scored.append((m, votes))
                log.info("selection: %-14s held-out 1-NN %.2f%% on the ranking fold (%d "
                         "passes, dual change %.1e, violation %.3f of %.0f%% pairs, %.1fs)",
                         name, 100 * acc[1], rep.passes, rep.conv, rep.violation,
                         100 * rep.violated, rep.seconds)
        finally:
            for f in futures:  # an error, or the budget spent: nothing more is started
                f.cancel()
        if not trials:
            raise InputError("no ITML setting could be fitted on this data")
        best_i = choose_setting([int(v[0][1].sum()) for _, v in scored], len(held0))
        best, (best_metric, best_votes) = trials[best_i], scored[best_i]
        prior = prior_metric(kind, take_rows(B, train0), best_metric)
        prior_votes = score(prior, train0, held0)
        ranking = paired_test(best_votes[0][1], prior_votes[0][1])
        sel = Selection(selected="learned", setting=best.name, prior_accuracy={},
                        learned_accuracy={}, trials=trials, n_train=len(train0),
                        n_validation=len(held0), n_folds=len(folds), n_ranking=len(held0),
                        test=ranking)
        # the ranking fold chose among the settings scored on it: its rows then tell nothing
        # unbiased about the chosen one, and the decision is made on the other folds
        decide = list(range(1, len(folds))) if len(trials) > 1 and len(folds) > 1 else \
            list(range(len(folds)))
        if ranking.only_learned <= ranking.only_prior or force_learned:
            decide = [0]  # the chosen setting is no better where it was chosen: no more fits
        learned_by: dict[int, Votes] = {0: best_votes}
        prior_by: dict[int, Votes] = {0: prior_votes}
        # Nor do the ranking fold's rows vote in the decision: a row of it whose vote with its
        # nearest decision row made the setting win would vote the same way again, back.
        jobs = {j: pool.submit(fold, j, best.changes, prior,
                               rows_outside(j) if 0 in decide else
                               np.setdiff1d(rows_outside(j), held0))
                for j in decide if j}
        for j, job in jobs.items():
            learned_by[j], prior_by[j], rep = job.result()
            sel.fold_fits.append(rep)
            log.info("selection: fold %d of %d (%d rows): '%s' %.2f%%, prior %.2f%% (%d passes, "
                     "dual change %.1e, violation %.3f, %.1fs)", j + 1, len(folds),
                     len(folds[j]), best.name, 100 * learned_by[j][0][1].mean(),
                     100 * prior_by[j][0][1].mean(), rep.passes, rep.conv, rep.violation,
                     rep.seconds)
    learned_ok = {k: np.concatenate([learned_by[j][0][k] for j in decide]) for k in ks}
    prior_all = {k: np.concatenate([prior_by[j][0][k] for j in decide]) for k in ks}
    clusters = mutual_clusters(np.concatenate([folds[j] for j in decide]),
                               np.concatenate([learned_by[j][1] for j in decide]),
                               np.concatenate([prior_by[j][1] for j in decide]))
    test = paired_test(learned_ok[1], prior_all[1], clusters)
    sel.test, sel.n_validation = test, len(learned_ok[1])
    sel.prior_accuracy = {k: float(v.mean()) for k, v in prior_all.items()}
    sel.learned_accuracy = {k: float(v.mean()) for k, v in learned_ok.items()}
    where = (f"{test.rows} held-out rows of {len(decide)} fold(s)" if decide != [0] else
             f"the {test.rows} rows of the ranking fold")
    if not test.keep and not force_learned:
        sel.selected = "prior"
        sel.reason = (f"no learned setting beats the prior by {100 * MARGIN:.1f} points of "
                      f"held-out 1-NN accuracy at the {LEVEL:g} level of a paired test "
                      f"(prior {100 * sel.prior_accuracy[1]:.2f}%, best learned '{best.name}' "
                      f"{100 * sel.learned_accuracy[1]:.2f}% on {where}: {test.counts()}); the "
                      "model is the prior (pass --force-learned to keep the learned metric)")
        log.warning("%s", sel.reason)
        # (an implicit prior, S = 0, measures ||phi(x) - phi(y)||^2 whatever its basis)
        metric = prior_metric(kind, B, best_metric)
        sel.seconds = time.perf_counter() - t_start
        return metric, None, sel
    sel.reason = (f"'{best.name}' held-out 1-NN {100 * sel.learned_accuracy[1]:.2f}% vs prior "
                  f"{100 * sel.prior_accuracy[1]:.2f}% ({100 * test.gain:+.2f} points on "
                  f"{where}: {test.counts()})"
                  + ("" if test.keep else " — kept by --force-learned"))
    log.info("selection: %s", sel.reason)
    t0 = time.perf_counter()
    final = fit(best.changes, None)
    sel.final_fit = FitReport.of(final, time.perf_counter() - t0)
    log.info("selection: the final fit on all %d rows: %d passes, dual change %.1e, violation "
             "%.3f (%.1fs)", n_rows(B), sel.final_fit.passes, sel.final_fit.conv,
             sel.final_fit.violation, sel.final_fit.seconds)
    sel.seconds = time.perf_counter() - t_start
    return metric_of(final), final, sel


def sample_rows_stratified(y: np.ndarray, size: int, seed: int) -> np.ndarray:
    """At most ``size`` row numbers, every class in proportion (sorted): the rows `learn`
    reads when a dataset is larger than its sample."""
    if size >= len(y):
        return np.arange(len(y), dtype=np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 4]))
    out = []
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        take = max(1, round(size * len(rows) / len(y)))
        out.append(rng.choice(rows, size=min(take, len(rows)), replace=False))
    return np.sort(np.concatenate(out)).astype(np.int64)


def replace_params(est: Any, changes: dict[str, Any]) -> Any:
    """A copy of an unfitted estimator with some parameters changed."""
    import copy

    new = copy.copy(est)
    for k, v in changes.items():
        if not hasattr(new, k):
            raise InputError(f"unknown ITML parameter {k!r}")
        setattr(new, k, v)
    return new


