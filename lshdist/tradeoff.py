"""The data of the trade-off plots (`lshdist.plots`), measured on the real queries.

Two questions a user asks of an index, answered for the unlearned (L2) and the learned (ML)
metric side by side:

* what recall does each extra cost buy?  The calibration grid's Pareto front (the points no
  cheaper point beats in recall, by `Point.cost`) at the evaluation's b, each point searched
  again on a sample of the test queries: its recall@k against the exact scan, its time per
  query (hashing of the queries included, as the scan's time is measured alike), the rows
  re-ranked (exact distances computed) and the keys compared (Hamming distances of the
  distinct candidates) per query;
* how many bits?  With the operating point held fixed, the rows re-ranked are fixed by the
  Hamming cut H and the cost hardly moves with b; what b changes is the cost of reaching the
  recall target.  So every b is calibrated for the same target (on the test queries, as
  ``evaluate`` does) and its chosen point measured as above, with its k-NN accuracy.

`measure_tradeoff` returns plain JSON-able dicts (written to ``tradeoff.json``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from lshdist.blocks import as_block, n_rows, take_rows
from lshdist.evaluation import recall_at_k
from lshdist.hashing.families import HashFamily
from lshdist.index.calibrate import Calibration, Point, sample_rows
from lshdist.index.searcher import MetricIndex, answer, encode, hash_rows, kernel_values
from lshdist.limits import one_blas_thread
from lshdist.metric.knn import knn_predict

if TYPE_CHECKING:
    from lshdist.blocks import RowsLike
    from lshdist.index.permutation import PermutationIndex
    from lshdist.protocols import Metric, RerankPayload

log = logging.getLogger(__name__)

#: test queries each point is measured on (a seeded sample; time per query is stable well
#: below this, and the exact truth of 2,000 Fashion-MNIST queries costs ~1 s)
MEASURE_QUERIES = 2000
#: front points measured and drawn (evenly spread along the front, the chosen one kept)
MAX_FRONT_POINTS = 14
#: the points of a curve are timed in rounds, one run of each point a round, at least
#: `MIN_ROUNDS` rounds and more (up to `MAX_ROUNDS`) while they took under
#: `SECONDS_PER_POINT` a point; each point's fastest run is kept.  Interleaving spreads a
#: shared machine's bursts over all points instead of one (on this 2-core machine one
#: 1,000-query Letter search took 28-148 ms from run to run, the first in a process 635 ms)
#: — and the CPU time of the process is kept beside the wall time: under a load average of
#: 9 its spread was half the wall time's (40-85 against 73-207 ms)
MIN_ROUNDS = 3
MAX_ROUNDS = 9
SECONDS_PER_POINT = 0.3


def pareto_front(points: Sequence[Point], width: float) -> list[Point]:
    """The points no cheaper point (`Point.cost`) beats or equals in recall, by cost."""
    front, top = [], -1.0
    for p in sorted(points, key=lambda p: (p.cost(width), p.permutations, p.window,
                                           p.hamming_keep)):
        if p.recall > top:
            front.append(p)
            top = p.recall
    return front


def thin_front(front: Sequence[Point], keep: Sequence[Point | None], n: int) -> list[Point]:
    """At most ``n`` points of ``front`` spread evenly along it (its first and last kept),
    plus the points of ``keep`` that are on it."""
    if len(front) <= n:
        return list(front)
    picked = {round(float(i)) for i in np.linspace(0, len(front) - 1, n)}
    marked = [(p.permutations, p.window, p.hamming_keep) for p in keep if p is not None]
    return [p for i, p in enumerate(front)
            if i in picked or (p.permutations, p.window, p.hamming_keep) in marked]


def thread_budget(n_threads: int) -> AbstractContextManager[None]:
    """What the timed runs may use: with one search thread, BLAS held to one thread too
    (`one_blas_thread`).  With BLAS's own threads, hashing 2,000 Letter queries at b = 512
    took 440-1,100 ms on this loaded 2-core machine (load average 12), against 18-54 ms on
    one thread: the hashing, not the search, would have set every point's time."""
    return one_blas_thread() if n_threads == 1 else nullcontext()


def best_time(run: Callable[[], Any]) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of ``run``: the fastest of `MIN_ROUNDS` runs or more (as
    `measure_points`)."""
    wall, cpu, total, n = float("inf"), float("inf"), 0.0, 0
    while n < MIN_ROUNDS or (n < MAX_ROUNDS and total < SECONDS_PER_POINT):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        dt = time.perf_counter() - t0
        wall, cpu = min(wall, dt), min(cpu, time.process_time() - c0)
        total, n = total + dt, n + 1
    return wall, cpu


def measure_points(index: PermutationIndex, points: Sequence[Point], qcodes: np.ndarray,
                   qpayload: RerankPayload, hashing: tuple[float, float], yq: np.ndarray,
                   y_train: np.ndarray, truth: np.ndarray, *, k: int, recall_k: int,
                   n_classes: int, n_threads: int) -> list[dict[str, Any]]:
    """Search the encoded queries at each of ``points`` of ``index``: recall@``recall_k``
    against ``truth`` (their exact ids), ``k``-NN accuracy, time per query (interleaved
    rounds, see `MIN_ROUNDS`; plus ``hashing``, the (wall, CPU) seconds of hashing the
    queries), rows re-ranked and keys compared per query."""
    kmax = max(k, recall_k)
    Q = len(qcodes)
    out: list[dict[str, Any]] = []
    wall = [float("inf")] * len(points)
    cpu = [float("inf")] * len(points)
    rounds, total = 0, 0.0
    with thread_budget(n_threads):
        while rounds < MIN_ROUNDS or (rounds < MAX_ROUNDS
                                      and total < SECONDS_PER_POINT * len(points)):
            for i, p in enumerate(points):
                t0, c0 = time.perf_counter(), time.process_time()
                _, ids, stats = answer(index, qcodes, qpayload, kmax, mode="hash",
                                       n_threads=n_threads, n_permutations=p.permutations,
                                       window=p.window, hamming_keep=p.hamming_keep)
                dt = time.perf_counter() - t0
                cpu[i] = min(cpu[i], time.process_time() - c0)
                wall[i], total = min(wall[i], dt), total + dt
                if rounds == 0:
                    lab = np.where(ids >= 0, y_train[np.maximum(ids, 0)], -1)
                    out.append({
                        "permutations": p.permutations, "window": p.window,
                        "hamming_keep": p.hamming_keep, "calibration_recall": p.recall,
                        "recall": recall_at_k(ids, truth, recall_k),
                        "knn_accuracy": float((knn_predict(lab, k, n_classes) == yq).mean()),
                        "reranked": float(stats["reranked"].mean()),
                        "keys_compared": float(stats["distinct"].mean())})
            rounds += 1
    for rec, w, c in zip(out, wall, cpu):
        rec["seconds_per_query"] = (w + hashing[0]) / Q
        rec["cpu_seconds_per_query"] = (c + hashing[1]) / Q
    return out


def measure_tradeoff(X_train: RowsLike, y_train: ArrayLike, X_test: RowsLike, y_test: ArrayLike,
                     *, metrics: Sequence[tuple[str, Metric, bool]], bits: int,
                     bits_values: Sequence[int], target: float, k: int = 1,
                     recall_k: int = 10, seed: int = 0, n_classes: int | None = None,
                     n_threads: int = 1, max_queries: int = MEASURE_QUERIES) -> dict[str, Any]:
    """The trade-off curves of ``metrics`` — (name, metric, learned hash functions) — on a
    train/test split (see the module doc).

    Returns a dict: ``front`` {name: [measured point, ...] by cost}, ``chosen`` {name: the
    calibration's point measured, or None}, ``mode`` {name: "hash" or "scan"} (what
    ``query(mode="auto")`` answers with), ``calibration`` {name: `Calibration.to_json`},
    ``bits_sweep`` {name: [one record per b]}, ``scan`` {name: seconds per query,
    accuracy}, and the settings (``n_database``, ``n_queries``, ``k``, ``recall_k``,
    ``target``, ``bits``, ``threads``), ``load`` (the larger 1-minute load average seen at
    the start and the end; the times are of a shared machine), ``identity`` {name: the
    metric is the identity}."""
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    n_classes = int(n_classes or max(y_train.max(), y_test.max()) + 1)
    Xt = as_block(X_test)
    pick = sample_rows(n_rows(Xt), max_queries, seed)
    Xq, yq = take_rows(Xt, pick), y_test[pick]
    kmax = max(k, recall_k)
    answered = n_rows(Xt)
    out: dict[str, Any] = {
        "n_database": len(y_train), "n_queries": len(pick), "k": k, "recall_k": recall_k,
        "target": target, "bits": bits, "threads": n_threads, "load": _load(),
        "front": {}, "chosen": {},
        "mode": {}, "calibration": {}, "bits_sweep": {}, "scan": {},
        "identity": {name: bool(getattr(m, "is_identity", False)) for name, m, _ in metrics}}
    for name, metric, learned in metrics:
        truth: np.ndarray | None = None
        sweep: list[dict[str, Any]] = []
        for b in sorted({*bits_values, bits}):
            ix = MetricIndex(metric, bits=b, learned=learned, seed=seed, target_recall=target,
                             calibration_k=recall_k).fit(X_train, n_threads=n_threads)
            cal = ix.calibrate_for(X_test, n_threads=n_threads, answered=answered)
            # the queries encoded once: the searches and the scan are timed on their keys and
            # re-rank payload (the payload, G x or kernel values, serves both alike); hashing
            # them is timed apart and added to the hashed search's time, as calibration does
            qcodes, qpayload = encode(metric, ix.family_, Xq, query=True, n_threads=n_threads)
            hashing = hash_time(metric, ix.family_, Xq, n_threads)
            if truth is None:  # the exact neighbours do not depend on b
                _, truth, _ = answer(ix.index_, qcodes, qpayload, kmax, mode="scan",
                                     n_threads=n_threads)
                lab = np.where(truth >= 0, y_train[np.maximum(truth, 0)], -1)
                scan_acc = float((knn_predict(lab, k, n_classes) == yq).mean())
            if b == bits:
                w, c = scan_time(ix.index_, qcodes, qpayload, kmax, n_threads)
                out["scan"][name] = {"seconds_per_query": w / len(pick),
                                     "cpu_seconds_per_query": c / len(pick),
                                     "knn_accuracy": scan_acc}
            common: dict[str, Any] = dict(k=k, recall_k=recall_k, n_classes=n_classes,
                                          n_threads=n_threads)
            ref = cal.reference
            front = ([] if b != bits else
                     thin_front(pareto_front(cal.points, cal.width), [ref], MAX_FRONT_POINTS))
            # the chosen point is on the front (the cheapest at its recall), unless it is the
            # best timed one of a calibration that kept the scan
            pts = front + ([ref] if ref is not None and not any(_same(p, ref) for p in front)
                           else [])
            measured = measure_points(ix.index_, pts, qcodes, qpayload, hashing, yq, y_train,
                                      truth, **common)
            at = next((r for p, r in zip(pts, measured) if ref is not None and _same(p, ref)),
                      None)
            sweep.append({"bits": b, "mode": cal.mode, "point": at,
                          "reached": cal.chosen is not None or (
                              ref is not None and ref.recall >= target)})
            log.info("trade-off %s b=%d: %s at %s", name, b, cal.mode, at)
            if b == bits:
                out["calibration"][name] = cal.to_json()
                out["mode"][name] = cal.mode
                out["chosen"][name] = at
                out["front"][name] = measured[:len(front)]
        out["bits_sweep"][name] = sweep
    out["load"] = max(out["load"], _load())
    return out


def _load() -> float:
    """The machine's 1-minute load average (0 where the system does not say)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def hash_time(metric: Metric, family: HashFamily, Xq: RowsLike, n_threads: int
              ) -> tuple[float, float]:
    """(wall, CPU) seconds of hashing the queries ``Xq`` (`hash_rows`: their kernel values,
    which the re-rank payload holds anyway, computed beforehand; the learned implicit family's
    own Gaussian projections of the rows counted)."""
    B = metric.check(as_block(Xq))
    kx = kernel_values(metric, B)
    with thread_budget(n_threads):
        return best_time(lambda: hash_rows(family, B, kx, n_threads))


def scan_time(index: PermutationIndex, qcodes: np.ndarray, qpayload: RerankPayload, k: int,
              n_threads: int) -> tuple[float, float]:
    """(wall, CPU) seconds of the exact scan of the encoded queries (`best_time`)."""
    with thread_budget(n_threads):
        return best_time(lambda: answer(index, qcodes, qpayload, k, mode="scan",
                                        n_threads=n_threads))


def _same(p: Point, q: Point) -> bool:
    return (p.permutations, p.window, p.hamming_keep) == (q.permutations, q.window,
                                                          q.hamming_keep)


def calibration_of(data: dict[str, Any], name: str) -> Calibration:
    """The `Calibration` of ``name`` in `measure_tradeoff`'s output."""
    return Calibration.from_json(data["calibration"][name])
