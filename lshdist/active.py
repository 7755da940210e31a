"""Pool-based active learning with hashed hyperplane queries (NIPS 2010, section 4), in one
process.

Linear SVMs one-vs-all (scikit-learn's ``LinearSVC``) start from ``initial`` labelled examples
per class; each round selects one unlabelled pool point, reveals its label (the pool's labels
are the oracle of the experiment) and retrains.  Selection methods:

- ``h-hash`` / ``eh-hash``: the pool is indexed once (`HyperplaneIndex`, bias as a constant
  feature); each round every class's hyperplane ``w_c^T x + b_c = 0`` is a query; among the
  candidates not yet labelled, the one with the smallest margin ``|w_c^T x + b_c| / ||w_c||``
  over all classes is selected (a random unlabelled point when no candidate is left);
- ``exhaustive``: the smallest margin over the whole unlabelled pool;
- ``random``: a random unlabelled point.

Per round and method: test accuracy and AUROC (macro, one-vs-rest), selection seconds, the
selected point's margin (to the nearest class hyperplane, computed exactly whatever the
method), and the fraction scanned: margins computed / (pool rows x hyperplanes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lshdist.blocks import Block, SparseBlock, n_rows, take_rows
from lshdist.config import ActiveConfig
from lshdist.errors import InputError
from lshdist.index.hyperplane import HyperplaneIndex

log = logging.getLogger(__name__)

METHODS = ("h-hash", "eh-hash", "exhaustive", "random")


def _svc(C: float, seed: int) -> Any:
    try:
        from sklearn.svm import LinearSVC
    except ImportError:  # pragma: no cover - depends on the installation
        raise InputError("lshdist active needs scikit-learn (pip install 'lshdist[test]')"
                         ) from None
    return LinearSVC(C=C, random_state=seed, dual="auto", max_iter=5000)


def _hyperplanes(clf: Any) -> tuple[np.ndarray, np.ndarray]:
    """(W (c, d), b (c,)): one-vs-all normals (zero ones dropped); a binary problem has one."""
    W = np.asarray(clf.coef_, np.float64)
    b = np.asarray(clf.intercept_, np.float64)
    keep = np.linalg.norm(W, axis=1) > 0
    return W[keep], b[keep]


def _margins(X: Block, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|W x + b| / ||w||: float64 (n, c)."""
    P = X.matrix @ W.T if isinstance(X, SparseBlock) else X @ W.T.astype(X.dtype)
    out: np.ndarray = np.abs(np.asarray(P) + b[None, :]) / np.linalg.norm(W, axis=1)[None, :]
    return out


def _scores(clf: Any, X: Block, y: np.ndarray, n_classes: int) -> tuple[float, float]:
    """(accuracy, macro one-vs-rest AUROC) on the test rows."""
    from sklearn.metrics import roc_auc_score

    Xs = X.matrix if isinstance(X, SparseBlock) else X
    acc = float(np.mean(clf.predict(Xs) == y))
    D = clf.decision_function(Xs)
    if n_classes == 2:
        return acc, float(roc_auc_score(y, D))
    # macro one-vs-rest over the classes present in the test rows, on the SVM scores
    aucs = [roc_auc_score(y == c, D[:, i]) for i, c in enumerate(clf.classes_)
            if 0 < (y == c).sum() < len(y)]
    return acc, float(np.mean(aucs))


def _on_features(X: Block, features: np.ndarray | None) -> Block:
    """Sparse rows over a fixed feature list (the pool's), so classifiers see one space."""
    if features is None or not isinstance(X, SparseBlock):
        return X
    return SparseBlock(X.over(features), features)


def run_active(pool: Block, y_pool: np.ndarray, test: Block, y_test: np.ndarray, *,
               settings: ActiveConfig,
               progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every method of ``settings.methods`` ``settings.runs`` times; returns the
    per-round records ``{method: {metric: float (runs, rounds + 1)}}`` (round 0 = before any
    selection) and the per-method index build seconds."""
    s = settings
    methods = s.method_list
    classes = np.unique(y_pool)
    if len(classes) < 2:
        raise InputError("the pool's labels have one class; active learning needs >= 2")
    counts = np.array([(y_pool == c).sum() for c in classes])
    if counts.min() < s.initial + 1:
        raise InputError(f"class {classes[counts.argmin()]} has {counts.min()} pool rows; "
                         f"{s.initial} initial examples per class need at least one more")
    N = n_rows(pool)
    if s.rounds > N - s.initial * len(classes):
        raise InputError(f"rounds={s.rounds}: the pool has only "
                         f"{N - s.initial * len(classes)} unlabelled rows")
    features = pool.features if isinstance(pool, SparseBlock) else None
    test = _on_features(test, features)
    indexes: dict[str, HyperplaneIndex] = {}
    build_s: dict[str, float] = {}
    for m in methods:
        if m in ("h-hash", "eh-hash"):
            t0 = time.perf_counter()
            indexes[m] = HyperplaneIndex(
                family=m, bits=s.bits, n_permutations=s.permutations, window=s.window,
                samples=s.eh_samples if m == "eh-hash" else None, bias=True, seed=s.seed,
            ).fit(pool)
            build_s[m] = time.perf_counter() - t0
            log.info("%s index of %d pool rows: %.1fs", m, N, build_s[m])
    keys = ("auroc", "accuracy", "seconds", "margin", "scanned")
    out = {m: {k: np.full((s.runs, s.rounds + 1), np.nan) for k in keys} for m in methods}
    pool_rows = pool.matrix if isinstance(pool, SparseBlock) else pool
    for run in range(s.runs):
        rng0 = np.random.default_rng([s.seed, run])
        start = np.concatenate([rng0.choice(np.flatnonzero(y_pool == c), s.initial,
                                            replace=False) for c in classes])
        for m in methods:
            rng = np.random.default_rng([s.seed, run, METHODS.index(m)])
            labelled = np.zeros(N, bool)
            labelled[start] = True
            rec = out[m]
            for r in range(s.rounds + 1):
                rows = np.flatnonzero(labelled)
                clf = _svc(s.C, s.seed).fit(pool_rows[rows], y_pool[rows])
                rec["accuracy"][run, r], rec["auroc"][run, r] = _scores(
                    clf, test, y_test, len(classes))
                if r == s.rounds:
                    break
                W, b = _hyperplanes(clf)
                t0 = time.perf_counter()
                pick, scanned = _select(m, pool, labelled, W, b, indexes.get(m), rng)
                rec["seconds"][run, r + 1] = time.perf_counter() - t0
                # the true margin of the selected point (not the one a method reports)
                rec["margin"][run, r + 1] = _margins(take_rows(pool, [pick]), W, b).min()
                rec["scanned"][run, r + 1] = scanned / (N * len(W))
                labelled[pick] = True
            if progress:
                progress(f"run {run + 1}/{s.runs} {m}: AUROC {rec['auroc'][run, 0]:.4f} -> "
                         f"{rec['auroc'][run, -1]:.4f}, selection "
                         f"{1e3 * np.nanmean(rec['seconds'][run]):.2f} ms/round")
    return {"records": out, "build_seconds": build_s, "n_pool": N,
            "n_classes": len(classes)}


def _select(method: str, pool: Block, labelled: np.ndarray, W: np.ndarray, b: np.ndarray,
            index: HyperplaneIndex | None, rng: np.random.Generator) -> tuple[int, int]:
    """(pool row selected, margins computed to select it)."""
    free = np.flatnonzero(~labelled)
    if method == "random":
        return int(rng.choice(free)), 0
    if method == "exhaustive":  # one product over the whole pool, labelled rows masked
        M = _margins(pool, W, b).min(axis=1)
        M[labelled] = np.inf
        return int(np.argmin(M)), len(free) * len(W)
    if index is None:
        raise InputError(f"no index was built for method {method!r}")
    k = 8
    Wq: Block = W
    if isinstance(pool, SparseBlock):  # normals over the pool's local columns -> feature ids
        nz = np.nonzero(W)
        counts = np.bincount(nz[0], minlength=len(W))
        Wq = SparseBlock.from_arrays(np.concatenate([[0], np.cumsum(counts)]),
                                     pool.features[nz[1]], W[nz])
    dist, ids = index.query(Wq, k, offsets=b)
    ok = (ids >= 0) & ~labelled[np.maximum(ids, 0)]
    scanned = int(index.stats_["reranked"].sum())
    if not ok.any():  # every candidate labelled already: fall back to a random point
        return int(rng.choice(free)), scanned
    dd = np.where(ok, dist, np.inf)
    qi, ci = np.unravel_index(int(np.argmin(dd)), dd.shape)
    return int(ids[qi, ci]), scanned


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Mean and std over runs of every curve (AUROC and accuracy improvement over round 0),
    and per-method averages of selection time, selected margin and fraction scanned."""
    out: dict[str, Any] = {"n_pool": result["n_pool"], "n_classes": result["n_classes"],
                           "methods": {}}
    for m, rec in result["records"].items():
        imp = rec["auroc"] - rec["auroc"][:, :1]
        acc = rec["accuracy"] - rec["accuracy"][:, :1]
        out["methods"][m] = {
            "auroc_improvement_mean": imp.mean(0).tolist(),
            "auroc_improvement_std": imp.std(0).tolist(),
            "accuracy_improvement_mean": acc.mean(0).tolist(),
            "accuracy_improvement_std": acc.std(0).tolist(),
            "final_auroc_improvement": float(imp[:, -1].mean()),
            "final_accuracy": float(rec["accuracy"][:, -1].mean()),
            "selection_seconds_per_round": float(np.nanmean(rec["seconds"])),
            "selected_margin_mean": float(np.nanmean(rec["margin"])),
            "fraction_scanned": float(np.nanmean(rec["scanned"])),
            "index_build_seconds": result["build_seconds"].get(m),
        }
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
            x = np.arange(len(mean))
            ax.plot(x, mean, label=m)
            ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    for ax, key in zip(axes, ("AUROC", "accuracy")):
        ax.set_xlabel("selection rounds")
        ax.set_ylabel(f"improvement in {key}")
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
