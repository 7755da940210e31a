"""A learned metric that never silently makes search worse (issue 11).

`select_metric` holds out a stratified validation split of the labelled rows, measures held-out
k-NN accuracy of the prior (L2, or the unlearned kernel) and of ITML under a small grid of
settings, keeps the best setting only if it beats the prior by `MARGIN` and by `Z` standard
errors of a paired sign test (`significant_gain`), and refits it on all the rows.  Otherwise
the prior is the model (``selected: "prior"``) and a warning names both accuracies.

The grid (tried in this order, within ``budget`` seconds; the first entry is the user's own
setting, so that with no time to spare nothing changes):

* explicit: the given setting; gamma x 0.1 and x 10; neighbours per anchor 5 and 20; the
  paper's 1st/99th percentile bounds; random pairs;
* implicit: the given setting; c x 2; gamma x 0.1 and x 10; neighbours 5 and 20; the basis
  route.

The settings are fitted and scored ``n_threads`` at a time (the driver's cores; BLAS held to
one thread each while they run, `lshdist.limits.one_blas_thread`); results are taken in grid
order, so the settings tried give the serial run's choice (when the budget binds, more threads
start more settings within it).  Each grid fit
runs with a fifth of the passes (at least 5) — the selection needs the ranking of
settings, not converged metrics — and the chosen one is refitted with the full passes.  Passes
are also capped by a work budget (`FIT_WORK`), which binds only for high-dimensional data.
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

from lshdist.blocks import RowsLike, as_block, n_rows, take_rows
from lshdist.errors import InputError
from lshdist.limits import one_blas_thread
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric

log = logging.getLogger(__name__)

#: a learned setting must beat the prior (and any setting the one before it in the grid) by
#: this much held-out 1-NN accuracy to be kept: half a point
MARGIN = 0.005
#: and by this many standard errors of a paired sign test (held-out rows are few on small data;
#: the best of several settings on noise-only labels must not pass)
Z = 2.5
#: validation rows: a stratified fraction, at most this many
MAX_VALIDATION = 2000
#: floating-point work of one ITML fit (constraints x passes x 2 d^2): the passes are capped
#: so that a fit takes seconds, not hours, on a 784-d dataset (10,000 pairs: 8 passes, 0.4 s
#: each with the blocked projections — 3.4 s each before them; Letter's 16-d fits are never
#: capped); grid fits get a fifth of it
FIT_WORK = 1e11


def capped_passes(est: Any, dim: int, work: float) -> int:
    """``est.max_iter``, or fewer so that ``n_constraints x passes x 2 dim^2 <= work``."""
    per_pass = 2.0 * float(est.n_constraints) * dim * dim
    return int(max(1, min(int(est.max_iter), work // max(per_pass, 1.0))))


@dataclass(frozen=True)
class Trial:
    """One grid setting and its held-out accuracies."""

    name: str
    changes: dict[str, Any]
    accuracy: dict[int, float]
    seconds: float


@dataclass
class Selection:
    """What `select_metric` chose, and why."""

    selected: str  # "learned" or "prior"
    setting: str
    prior_accuracy: dict[int, float]
    learned_accuracy: dict[int, float]
    trials: list[Trial] = field(default_factory=list)
    n_train: int = 0
    n_validation: int = 0
    seconds: float = 0.0
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "selected": self.selected, "setting": self.setting, "reason": self.reason,
            "prior_accuracy": {str(k): v for k, v in self.prior_accuracy.items()},
            "learned_accuracy": {str(k): v for k, v in self.learned_accuracy.items()},
            "n_train": self.n_train, "n_validation": self.n_validation,
            "seconds": round(self.seconds, 3),
            "trials": [{"name": t.name, "changes": t.changes,
                        "accuracy": {str(k): v for k, v in t.accuracy.items()},
                        "seconds": round(t.seconds, 3)} for t in self.trials],
        }


def stratified_split(y: np.ndarray, fraction: float, seed: int, cap: int = MAX_VALIDATION
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``(train_rows, validation_rows)``: about ``fraction`` of every class held out (at least
    one row of every class with two or more; at most ``cap`` rows in all), sorted."""
    if not 0 < fraction < 1:
        raise InputError(f"validation fraction {fraction}: must be in (0, 1)")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 3]))
    n_val = min(cap, max(1, round(fraction * len(y))))
    share = n_val / len(y)
    val = []
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        if len(rows) < 2:
            continue
        take = min(len(rows) - 1, max(1, round(share * len(rows))))
        val.append(rng.choice(rows, size=take, replace=False))
    v = np.sort(np.concatenate(val)) if val else np.zeros(0, np.int64)
    t = np.setdiff1d(np.arange(len(y)), v)
    return t.astype(np.int64), v.astype(np.int64)


def knn_correct(metric: Any, X_train: RowsLike, y_train: np.ndarray, X_val: RowsLike,
                y_val: np.ndarray, ks: list[int], n_classes: int) -> dict[int, np.ndarray]:
    """Per held-out row, whether its k-NN vote under ``metric`` is right (exact neighbours,
    ties by row): bool (n_val,) for every k.

    Explicit metrics: the exact scan (`lshdist.index.scan.scan_topk`: float32 products about
    the rows' centre for candidates, then the exact distance of the k + 16 nearest) — 2x
    faster than a float64 distance matrix at 784-d, and exact also for rows far from the
    origin (tested).  Implicit metrics keep the float64 matrix (their sparse payload is slower
    on dense rows)."""
    from lshdist.evaluation import knn_predict
    from lshdist.index.payload import DensePayload
    from lshdist.index.scan import scan_topk

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
    return {k: knn_predict(lab, min(k, kk), n_classes) == y_val for k in ks}


def significant_gain(learned: np.ndarray, prior: np.ndarray) -> tuple[bool, str]:
    """Whether per-row correctness ``learned`` beats ``prior`` by `MARGIN` of the rows and by
    `Z` standard errors of a paired sign test on the rows where they differ (b rows only the
    learned metric gets right, c only the prior: b - c >= Z sqrt(b + c))."""
    b = int(np.sum(learned & ~prior))
    c = int(np.sum(~learned & prior))
    n = len(learned)
    ok = (b - c) >= MARGIN * n and (b - c) >= Z * np.sqrt(b + c)
    return bool(ok), f"{b} rows only the learned metric gets right, {c} only the prior"


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
    estimator is None when the prior was selected.  ``n_threads``: grid settings fitted at
    once (the same settings tried give the same choice).
    """
    t_start = time.perf_counter()
    ks = sorted({1, *ks})
    tr, va = stratified_split(y, validation, seed)
    if len(va) == 0:
        raise InputError(f"no class of the {len(y)} labelled rows has two of them: none can be "
                         "held out to check a learned metric (nor paired as similar); give at "
                         "least two rows of some class")
    B = as_block(X)
    Xtr, Xva, ytr, yva = take_rows(B, tr), take_rows(B, va), y[tr], y[va]

    def metric_of(est: Any) -> Any:
        return est.metric(d=d) if kind == "implicit" else est.metric()

    base = make({})
    dim = int(base.n_basis) if kind == "implicit" else int(np.asarray(Xtr).shape[1])
    short = min(max(5, int(base.max_iter) // 5), capped_passes(base, dim, FIT_WORK / 5))
    full = capped_passes(base, dim, FIT_WORK)
    if full < int(base.max_iter):
        log.info("selection: ITML passes capped at %d (grid %d) by the work budget (%d pairs, "
                 "%d-d)", full, short, base.n_constraints, dim)
    trials: list[Trial] = []
    best: Trial | None = None
    best_metric: Any = None
    best_ok = np.zeros(0, bool)
    prior_ok: dict[int, np.ndarray] | None = None
    prior_acc: dict[int, float] = {}
    settings = grid(kind, base) if search else [("given", {})]

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
            table = base.neighbor_table(Xtr, wants, n_threads=max(1, int(n_threads)))
        except InputError:
            table = None  # the fits themselves say why (the given setting's message)

    def attempt(i: int) -> tuple[Any, dict[int, np.ndarray], float] | str | None:
        """Fit and score setting ``i``: ``(metric, correctness, seconds)``, the reason it
        could not be fitted, or None when the budget was spent before it started."""
        name, ch = settings[i]
        if i and time.perf_counter() - t_start > budget:
            return None
        t0 = time.perf_counter()
        est = make({**ch, "max_iter": short} if search else ch)
        try:
            est.fit(Xtr, ytr, **({"neighbors": table} if table is not None else {}))
        except InputError as exc:  # e.g. c*2 basis points on a small dataset
            if name == "given":
                raise  # the user's own setting must fit: its message says why it cannot
            return str(exc)
        m = metric_of(est)
        return m, knn_correct(m, Xtr, ytr, Xva, yva, ks, n_classes), time.perf_counter() - t0

    # The settings are independent: up to `n_threads` are fitted at once (ITML's kernels and
    # BLAS release the GIL); each starts only while the budget lasts, in grid order, and the
    # results are taken in grid order — the choice is the one a serial run makes.
    # Two fits at once, each with a 2-thread BLAS, on 2 cores: 14-16 s for the grid at
    # 784-d (20,000 rows); one BLAS thread each: 8.4-9.4 s; one fit at a time: 11-12 s.
    workers = max(1, min(int(n_threads), len(settings)))
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
                m, ok, seconds = got
                if prior_ok is None:
                    prior_ok = knn_correct(prior_metric(kind, Xtr, m), Xtr, ytr, Xva, yva, ks,
                                           n_classes)
                    prior_acc = {k: float(v.mean()) for k, v in prior_ok.items()}
                acc = {k: float(v.mean()) for k, v in ok.items()}
                trial = Trial(name, ch, acc, seconds)
                trials.append(trial)
                log.info("selection: %-14s held-out 1-NN %.2f%% (%.1fs)", name, 100 * acc[1],
                         trial.seconds)
                if best is None or acc[1] >= best.accuracy[1] + MARGIN:
                    best, best_metric, best_ok = trial, m, ok[1]
        finally:
            for f in futures:  # an error, or the budget spent: nothing more is started
                f.cancel()
    if best is None or prior_ok is None:
        raise InputError("no ITML setting could be fitted on this data")
    sel = Selection(selected="learned", setting=best.name, prior_accuracy=prior_acc,
                    learned_accuracy=best.accuracy, trials=trials, n_train=len(tr),
                    n_validation=len(va))
    gain = best.accuracy[1] - prior_acc[1]
    better, counts = significant_gain(best_ok, prior_ok[1])
    if not better and not force_learned:
        sel.selected = "prior"
        sel.reason = (f"no learned setting beats the prior by {100 * MARGIN:.1f} points of "
                      f"held-out 1-NN accuracy and {Z:g} standard errors (prior "
                      f"{100 * prior_acc[1]:.2f}%, best learned '{best.name}' "
                      f"{100 * best.accuracy[1]:.2f}%: {counts}); the model is the prior "
                      "(pass --force-learned to keep the learned metric)")
        log.warning("%s", sel.reason)
        # (an implicit prior, S = 0, measures ||phi(x) - phi(y)||^2 whatever its basis)
        metric = prior_metric(kind, X, best_metric)
        sel.seconds = time.perf_counter() - t_start
        return metric, None, sel
    sel.reason = (f"'{best.name}' held-out 1-NN {100 * best.accuracy[1]:.2f}% vs prior "
                  f"{100 * prior_acc[1]:.2f}% ({100 * gain:+.2f} points)"
                  + ("" if better else " — kept by --force-learned"))
    log.info("selection: %s", sel.reason)
    final = make({**best.changes, "max_iter": min(full, int(make(best.changes).max_iter))})
    final.fit(X, y)
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


