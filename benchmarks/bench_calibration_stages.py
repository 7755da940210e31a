"""The staged calibration sample: how often does the point a calibration picks on
a random sample of the queries reach the target on *other* queries — with the whole sample
at once (200 queries, the size drawn for a bulk of 10,000), with 100, and staged (100, grown
to 200 only where `extend_sample` says the narrower margin pays for a bulk of
``ANSWERED`` queries)?

For each dataset (L2, b = 512, the defaults of `MetricIndex(target_recall=0.9)`), the exact
top-10 of ``EVAL + POOL`` test queries is computed once (brute force, float64 distances) and
every grid point's hits per query once (`grid_counts` one query at a time), so a rule is
evaluated on any subset without searching again.  ``EVAL`` queries are the evaluation set:
a point's recall on them is its "true" recall; from the other ``POOL``, ``DRAWS`` random
samples of 200 are drawn, and each rule picks a point from (part of) the same draw.
Reported per rule: the picks' mean true recall, the share below the target and below 0.88,
their mean cost (`Point.cost`, the search time proxy) and the calibration's share of the
sample's truth and grid (100 or 200 queries); for the staged rule, how often it grew.

    cd /work/main && .venv/bin/python benchmarks/bench_calibration_stages.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from lshdist.datasets import load_fashion_mnist, load_letter
from lshdist.index.calibrate import (
    FIRST_STAGE_QUERIES,
    WINDOWS,
    Point,
    choose_point,
    extend_sample,
    grid_axes,
    grid_counts,
    recall_margin,
)
from lshdist.index.searcher import MetricIndex, encode
from lshdist.metric.learned import ExplicitMetric

K, TARGET = 10, 0.9
DRAWS = int(os.environ.get("BENCH_DRAWS", "300"))
EVAL = int(os.environ.get("BENCH_EVAL", "2000"))
POOL = int(os.environ.get("BENCH_POOL", "2000"))
ANSWERED = int(os.environ.get("BENCH_ANSWERED", "10000"))
DATASETS = os.environ.get("BENCH_DATASETS", "fashion,letter").split(",")
FIRST = int(os.environ.get("BENCH_FIRST", str(FIRST_STAGE_QUERIES)))  # the first stage


def exact_topk(X: np.ndarray, Xq: np.ndarray) -> np.ndarray:
    X64, out = X.astype(np.float64), np.empty((len(Xq), K), np.int64)
    n2 = (X64 ** 2).sum(1)
    for a in range(0, len(Xq), 500):
        D = n2[None, :] - 2.0 * (Xq[a:a + 500].astype(np.float64) @ X64.T)
        part = np.argpartition(D, K, axis=1)[:, :K]
        o = np.argsort(np.take_along_axis(D, part, 1), axis=1, kind="stable")
        out[a:a + 500] = np.take_along_axis(part, o, 1)
    return out


def grid_points(rows, H, R, ms, ws, hs, N):
    """The grid's points as a calibration on the queries ``rows`` would see them."""
    rec, rr = H[rows].mean(0), R[rows].mean(0)
    return [Point(m, w, h, float(rec[a, b, j]), float(rr[a, b, j]), float(rr[a, b, j]) / N)
            for a, m in enumerate(ms) for b, w in enumerate(ws) for j, h in enumerate(hs)]


def main() -> None:
    common.pin_threads()
    res = {}
    for name in DATASETS:
        t0 = time.perf_counter()
        if name == "fashion":
            X, _, Xq, _ = load_fashion_mnist(common.data_dir())
        else:
            X, _, Xq, _ = load_letter(common.data_dir())
        X, Xq = np.ascontiguousarray(X, np.float32), np.ascontiguousarray(Xq, np.float32)
        rng = np.random.default_rng(11)
        pick = rng.permutation(len(Xq))[:EVAL + POOL]
        Xq = Xq[pick]
        truth = exact_topk(X, Xq)
        metric = ExplicitMetric.identity(X.shape[1], center=X.mean(0))
        ix = MetricIndex(metric, target_recall=TARGET, seed=0).fit(X, n_threads=2)
        index = ix.index_
        ms, ws, hs = grid_axes(index.n_permutations_, K)
        codes, _ = encode(metric, ix.family_, Xq, query=True)
        shape = (len(Xq), len(ms), len(ws), len(hs))
        H, R = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        for q in range(len(Xq)):
            h, r = grid_counts(index, codes[q:q + 1], truth[q:q + 1], np.array([-1]),
                               np.ones((1, K), bool), ms, ws, hs)
            H[q], R[q] = h.sum(-1) / K, r
        print(f"{name}: N={len(X)}, grids of {len(Xq)} queries in "
              f"{time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        N, width = len(X), float(X.shape[1])
        entries = max(ms) * 2 * max(WINDOWS)

        def points(rows, grid=(H, R, ms, ws, hs, N)):
            return grid_points(rows, *grid)

        perm = rng.permutation(len(Xq))
        ev, pool = perm[:EVAL], perm[EVAL:]
        true_of = {(p.permutations, p.window, p.hamming_keep): p.recall for p in points(ev)}
        rules = {"whole-200": [], f"first-{FIRST}": [], "staged": []}
        grew = 0
        for _ in range(DRAWS):
            s = rng.choice(pool, 200, replace=False)
            p1 = points(s[:FIRST])
            got = {"whole-200": (choose_point(points(s), TARGET, width,
                                              recall_margin(TARGET, 200)), 200),
                   f"first-{FIRST}": (choose_point(p1, TARGET, width,
                                                   recall_margin(TARGET, FIRST)), FIRST)}
            go = extend_sample(p1, TARGET, width, FIRST, 200, ANSWERED, N, entries)[0] > 0
            grew += go
            got["staged"] = got["whole-200"] if go else got[f"first-{FIRST}"]
            for rule, (p, n) in got.items():
                if p is not None:
                    t = true_of[(p.permutations, p.window, p.hamming_keep)]
                    rules[rule].append((t, p.cost(width), n))
        out = {}
        for rule, rows in rules.items():
            g = np.array(rows)
            out[rule] = {"picked": len(g), "true_recall_mean": round(float(g[:, 0].mean()), 4),
                         "below_target": round(float((g[:, 0] < TARGET).mean()), 4),
                         "below_0.88": round(float((g[:, 0] < 0.88).mean()), 4),
                         "true_recall_p5": round(float(np.percentile(g[:, 0], 5)), 4),
                         "cost_mean": round(float(g[:, 1].mean())),
                         "sample_queries_mean": round(float(g[:, 2].mean()), 1)}
            print(name, rule, json.dumps(out[rule]), file=sys.stderr, flush=True)
        out["staged"]["grew"] = grew / DRAWS
        best = choose_point(points(ev), TARGET, width)
        out["oracle"] = {"point": [best.permutations, best.window, best.hamming_keep],
                         "cost": round(best.cost(width)), "recall": round(best.recall, 4)}
        res[name] = out
    path = Path(__file__).resolve().parent / "results" / (
        "calibration_stages.json" if FIRST == FIRST_STAGE_QUERIES
        else f"calibration_stages_first{FIRST}.json")
    path.write_text(json.dumps({"answered": ANSWERED, "draws": DRAWS, "eval": EVAL, "first": FIRST,
                                "pool": POOL, "results": res}, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
