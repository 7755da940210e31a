"""The paper's evaluation on a train/test split: L2-scan, L2-hash, ML-scan, ML-hash.

For each setting and k: k-NN classification accuracy, recall@k of the hashed search against the
exact scan under the same metric, the fraction of the database searched per query (candidates
whose exact distance was computed / N; with ``hamming_keep`` the fraction whose keys were
compared is reported too), the speed-up over the linear scan (hashing of the queries included),
and wall seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from lshdist.blocks import as_block, n_rows
from lshdist.config import IndexConfig
from lshdist.index.searcher import MetricIndex
from lshdist.metric.knn import knn_predict
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric
from lshdist.validation import check_k

if TYPE_CHECKING:
    from lshdist.blocks import RowsLike
    from lshdist.protocols import Metric

log = logging.getLogger(__name__)

SETTINGS = ("L2-scan", "L2-hash", "ML-scan", "ML-hash")


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean over queries of ``|found[:k] & truth[:k]| / k``."""
    hits = [len(np.intersect1d(f[:k][f[:k] >= 0], t[:k])) for f, t in zip(found, truth)]
    return float(np.mean(hits) / k)


def baseline_metric(ml: ExplicitMetric | ImplicitMetric, X_train: RowsLike
                    ) -> ExplicitMetric | ImplicitMetric:
    """The unlearned metric beside a learned one: identity (centred like ``ml``'s hashes) for an
    explicit metric, ``S = 0`` over the same basis for an implicit one."""
    if isinstance(ml, ExplicitMetric):
        return ExplicitMetric.identity(ml.d, center=np.asarray(X_train).mean(axis=0))
    return ImplicitMetric.identity(ml.basis, kernel=ml.kernel_name, d=ml.d,
                                   embedding=ml.embedding)


@dataclass
class HashSettings:
    """The hashed search `evaluate` and `sweep` measure: `IndexConfig`'s parameters, with its
    defaults (defaults live in `lshdist.config`), and rows where the config has paths.  M, W
    and H given are fixed; left None they are calibrated for ``target_recall``, or without a
    target taken as `MetricIndex` takes them (M from epsilon, W = 1, H = 0: all)."""

    bits: int | None = None  # None: `lshdist.config.default_key_bits`
    epsilon: float | None = IndexConfig.epsilon
    n_permutations: int | None = IndexConfig.permutations
    window: int | None = IndexConfig.window
    hamming_keep: int | None = IndexConfig.hamming_keep
    seed: int = IndexConfig.seed
    #: the recall to calibrate the parameters left None for; None: no calibration (the
    #: parameters as given) -- `lshdist evaluate` passes `IndexConfig.target_recall`
    target_recall: float | None = None
    calibration_queries: Any = None  # rows like the real queries to calibrate with
    n_threads: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


def evaluate(X_train: RowsLike, y_train: ArrayLike, X_test: RowsLike, y_test: ArrayLike, *,
             l2_metric: Metric, ml_metric: Metric, ks: Iterable[int] = (1, 4),
             settings: HashSettings | None = None, n_classes: int | None = None,
             recall_k: int | None = None) -> list[dict[str, Any]]:
    """Records, one per setting and k (see module doc).

    ``l2_metric`` is the unlearned metric (identity), ``ml_metric`` the learned one; hashing
    uses Charikar's hyperplanes for L2 and the learned family for ML.
    """
    settings = settings or HashSettings()
    ks = sorted({check_k(k) for k in ks})
    kmax = max(ks + ([recall_k] if recall_k else []))
    y_train = np.asarray(y_train)
    y_test = np.asarray(y_test)
    n_classes = int(n_classes or max(y_train.max(), y_test.max()) + 1)
    N = len(y_train)
    records: list[dict[str, Any]] = []
    for name, metric, learned in (("L2", l2_metric, False), ("ML", ml_metric, True)):
        t0 = time.perf_counter()
        ix = MetricIndex(metric, bits=settings.bits, n_permutations=settings.n_permutations,
                         epsilon=settings.epsilon, window=settings.window,
                         hamming_keep=settings.hamming_keep, learned=learned,
                         seed=settings.seed, target_recall=settings.target_recall,
                         calibration_queries=settings.calibration_queries,
                         calibration_k=recall_k or kmax,
                         # recall is measured below on every test query, not on a sample
                         check_recall=False).fit(X_train, n_threads=settings.n_threads)
        t_build = time.perf_counter() - t0
        on_queries = settings.target_recall is not None and settings.calibration_queries is None
        # a batch of queries known in advance: calibrate on a sample of them (what
        # MetricIndex.query(mode="auto") does for a large query set); else on the rows given
        cal = (ix.calibrate_for(X_test, n_threads=settings.n_threads,
                                answered=n_rows(as_block(X_test))) if on_queries
               else ix.calibration_)
        calibrated_on = (None if cal is None else "the test queries" if on_queries
                         else "database rows" if settings.calibration_queries is None
                         else "calibration queries")
        t0 = time.perf_counter()
        _, scan_ids = ix.query(X_test, kmax, mode="scan", n_threads=settings.n_threads)
        t_scan = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, hash_ids = ix.query(X_test, kmax, mode="hash", n_threads=settings.n_threads)
        t_hash = time.perf_counter() - t0
        if cal is not None:
            t_build += cal.seconds  # calibration belongs to the build (fit defers it)
        stats = ix.stats_
        auto = ix.mode_  # what mode="auto" answers with
        log.info("%s: build %.2fs, scan %.2fs, hash %.2fs; auto: %s%s", name, t_build, t_scan,
                 t_hash, auto, f" ({cal.reason})" if cal else "")
        for mode, ids, secs in (("scan", scan_ids, t_scan), ("hash", hash_ids, t_hash)):
            lab = np.where(ids >= 0, y_train[np.maximum(ids, 0)], -1)
            for k in ks:
                pred = knn_predict(lab, k, n_classes)
                rk = recall_k or k
                rec = {
                    "setting": f"{name}-{mode}",
                    "k": k,
                    "knn_accuracy": float((pred == y_test).mean()),
                    "recall_at_k": 1.0 if mode == "scan" else recall_at_k(ids, scan_ids, rk),
                    "recall_k": rk,
                    "fraction_searched":
                        1.0 if mode == "scan" else float(stats["reranked"].mean() / N),
                    "fraction_keys_compared":
                        0.0 if mode == "scan" else float(stats["distinct"].mean() / N),
                    "speedup": 1.0 if mode == "scan" else float(t_scan / t_hash),
                    "seconds": float(secs),
                    "build_seconds": float(t_build),
                    "bits": ix.bits,
                    "permutations": int(getattr(ix, "op_permutations_", None)
                                        or ix.index_.n_permutations_),
                    "window": int(ix.index_.window),
                    "hamming_keep": int(ix.index_.hamming_keep),
                    "auto_mode": auto,
                    "auto_seconds": float(t_hash if auto == "hash" else t_scan),
                    "calibration_seconds": float(cal.seconds) if cal else 0.0,
                    "calibrated_on": calibrated_on,
                    "calibration": cal.reason if cal else None,
                }
                records.append(rec)
    return records


def sweep(X_train: RowsLike, y_train: ArrayLike, X_test: RowsLike, y_test: ArrayLike, *,
          l2_metric: Metric, ml_metric: Metric, param: str, values: Iterable[float],
          settings: HashSettings, k: int = 1, recall_k: int = 10,
          n_classes: int | None = None) -> list[dict[str, Any]]:
    """Hashed search for every value of one parameter (``bits``, ``window``, ``epsilon`` or
    ``n_permutations``), L2 and ML: accuracy at ``k``, recall@``recall_k`` against the exact scan
    (computed once per metric), fraction searched.  The data of the paper's Fig. 2 plots."""
    from dataclasses import replace

    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    n_classes = int(n_classes or max(y_train.max(), y_test.max()) + 1)
    kmax = max(k, recall_k)
    N = len(y_train)
    out: list[dict[str, Any]] = []
    for name, metric, learned in (("L2", l2_metric, False), ("ML", ml_metric, True)):
        truth = None
        for v in values:
            change: dict[str, Any] = {param: v}  # a field of HashSettings, int or float
            s = replace(settings, **change)
            if param == "epsilon":
                s = replace(s, n_permutations=None)
            ix = MetricIndex(metric, bits=s.bits, n_permutations=s.n_permutations,
                             epsilon=s.epsilon, window=s.window, hamming_keep=s.hamming_keep,
                             learned=learned, seed=s.seed, check_recall=False).fit(X_train)
            if truth is None:
                _, truth = ix.query(X_test, kmax, mode="scan", n_threads=s.n_threads)
            _, ids = ix.query(X_test, kmax, mode="hash", n_threads=s.n_threads)
            lab = np.where(ids >= 0, y_train[np.maximum(ids, 0)], -1)
            out.append({
                "setting": f"{name}-hash", "param": param, "value": v, "k": k,
                "knn_accuracy": float((knn_predict(lab, k, n_classes) == y_test).mean()),
                "recall_at_k": recall_at_k(ids, truth, recall_k), "recall_k": recall_k,
                "fraction_searched": float(ix.stats_["reranked"].mean() / N),
            })
            log.debug("sweep %s %s=%s: %s", name, param, v, out[-1])
    return out
