"""Selection bias of the calibrated operating point: how often does the point a
calibration rule picks on a random sample of queries reach the target on *other* queries?

Shifted Fashion-MNIST, 240,000 rows (``make_million.py --variants 4``, out/scale/data-v4),
L2, b = 512, 128 lists (the defaults).  Of the 2,000 queries with stored exact top-10, 1,000
(chosen at random) are the evaluation set: every grid point's recall on them is its "true"
recall (standard error <= 0.006).  From the other 1,000, ``DRAWS`` random calibration samples
are drawn and each rule picks a point; reported per rule: mean true recall of its picks, the
fraction of picks whose true recall is below the target, and the mean cost (`Point.cost`).

Per-query grid counts (`grid_counts` for one query at a time) are computed once, so a rule is
evaluated on any subset of queries without searching again.

    cd /work/main && .venv/bin/python benchmarks/bench_calibration_bias.py
    # the README's table: the saved 240k model, 100,000-row segments, 4,000 brute-force truths
    cd /work/main && BENCH_DRAWS=1000 BENCH_MODEL=out/scale/n240000/model \
        BENCH_SEGMENT_ROWS=100000 BENCH_QUERIES=out/scale/n240000/queries-24000 \
        BENCH_TRUTH=4000 .venv/bin/python benchmarks/bench_calibration_bias.py
"""

import common  # noqa: F401,I001  (first: pins threads before numpy loads)

import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from lshdist.index.calibrate import (
    HAMMING_FACTORS,
    Point,
    choose_point,
    grid_counts,
    recall_margin,
)
from lshdist.index.searcher import MetricIndex, encode
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import Dataset
from lshdist.store.model import load_model

ROOT = Path(__file__).resolve().parent
DATA = Path(os.environ.get("BENCH_DATA", ROOT.parent / "out" / "scale" / "data-v4"))
DRAWS = int(os.environ.get("BENCH_DRAWS", "200"))
PARTS = int(os.environ.get("BENCH_PARTS", "1"))  # segments whose answers are merged
SEGMENT_ROWS = int(os.environ.get("BENCH_SEGMENT_ROWS", "0"))  # or: segments of this size
MODEL = os.environ.get("BENCH_MODEL")  # a saved model (default: L2, centred)
QUERIES = os.environ.get("BENCH_QUERIES")  # a query dataset (default: DATA/test)
N_TRUTH = int(os.environ.get("BENCH_TRUTH", "0"))  # brute-force truth of this many queries
K, TARGET = 10, 0.9
WINDOWS = (1, 2, 4, 8, 16, 32, 64)


def per_query_counts(parts, Xq, truth, ms, ws, hs):
    """Per query, the merged answer's hits (fraction of its true top-k) and rows re-ranked
    over all parts, for every grid point; ``parts``: (MetricIndex, first row) per part."""
    H = np.zeros((len(Xq), len(ms), len(ws), len(hs)), np.float32)
    R = np.zeros((len(Xq), len(ms), len(ws), len(hs)), np.float32)
    for mi, start in parts:
        codes, _ = encode(mi.metric, mi.family_, Xq, query=True)
        n = len(mi.index_)
        local = truth - start
        rel = (local >= 0) & (local < n)
        for q in range(len(Xq)):
            h, r = grid_counts(mi.index_, codes[q:q + 1], np.where(rel, local, -1)[q:q + 1],
                               np.array([-1]), rel[q:q + 1], ms, ws, hs)
            H[q] += h.sum(-1) / K
            R[q] += r
    return H, R


def brute_truth(metric, X, Xq):
    """Exact top-K rows of ``Xq`` under ``metric`` (its transform, then L2), in chunks."""
    G = metric.transform(X).astype(np.float32)
    Gq = metric.transform(Xq).astype(np.float32)
    g2 = (G.astype(np.float64) ** 2).sum(1)
    out = np.empty((len(Gq), K), np.int64)
    for a in range(0, len(Gq), 500):
        D = g2[None, :] - 2.0 * (Gq[a:a + 500] @ G.T).astype(np.float64)
        part = np.argpartition(D, K, axis=1)[:, :K]
        o = np.argsort(np.take_along_axis(D, part, 1), axis=1, kind="stable")
        out[a:a + 500] = np.take_along_axis(part, o, 1)
    return out


def points(H, R, rows, ms, ws, hs, N):
    rec = H[rows].mean(0)
    rr = R[rows].mean(0)
    out = []
    for a, m in enumerate(ms):
        for b, w in enumerate(ws):
            for j, h in enumerate(hs):
                out.append(Point(m, w, h, float(rec[a, b, j]), float(rr[a, b, j]),
                                 float(rr[a, b, j]) / N))
    return out


def main():
    t0 = time.perf_counter()
    train = Dataset(str(DATA / "train"))
    test = Dataset(QUERIES or str(DATA / "test"))
    X = train.read_rows(0, train.n)
    N = len(X)
    if MODEL:  # the model's metric (what the distributed job hashes and re-ranks with)
        metric, _ = load_model(MODEL)
    else:
        metric = ExplicitMetric.identity(X.shape[1], center=X.mean(0))
    if N_TRUTH:  # exact truth of N_TRUTH random queries, by brute force under the metric
        rng0 = np.random.default_rng(5)
        qrows = np.sort(rng0.choice(test.n, N_TRUTH, replace=False))
        Xq = test.read_row_set(qrows)
        truth = brute_truth(metric, X, Xq)
    else:
        z = np.load(DATA / "truth.npz")
        qrows, truth = z["queries"], z["ids"].astype(np.int64)
        Xq = test.read_rows(0, test.n)[qrows]
    bounds = (np.linspace(0, N, PARTS + 1).astype(int) if not SEGMENT_ROWS
              else np.array([*range(0, N, SEGMENT_ROWS), N]))
    parts = [(MetricIndex(metric, target_recall=TARGET).fit(X[a:b], n_threads=2), a)
             for a, b in itertools.pairwise(bounds)]
    ms = [8, 16, 32, 64, 128]
    ws = list(WINDOWS)
    hs = [0, *[f * K for f in HAMMING_FACTORS]]
    print(f"index of {N} rows in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    H, R = per_query_counts(parts, Xq, truth, ms, ws, hs)
    print(f"per-query grids in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    rng = np.random.default_rng(7)
    perm = rng.permutation(len(Xq))
    ev, pool = perm[:len(perm) // 2], perm[len(perm) // 2:]
    true_pts = points(H, R, ev, ms, ws, hs, N)
    true_of = {(p.permutations, p.window, p.hamming_keep): p.recall for p in true_pts}
    width = float(X.shape[1])

    def rule_plain(sample, n):
        s = sample[:n]
        return choose_point(points(H, R, s, ms, ws, hs, N), TARGET, width,
                            recall_margin(TARGET, n))

    def rule_split(sample, n):
        a, b = sample[:n:2], sample[1:n:2]
        pa, pb = points(H, R, a, ms, ws, hs, N), points(H, R, b, ms, ws, hs, N)
        rb = {(p.permutations, p.window, p.hamming_keep): p.recall for p in pb}
        ok = [p for p in pa if p.recall >= TARGET + recall_margin(TARGET, len(a))
              and rb[(p.permutations, p.window, p.hamming_keep)] >= TARGET]
        return min(ok, key=lambda p: (p.cost(width), p.permutations, p.window,
                                      p.hamming_keep)) if ok else None

    rules = {f"plain-{n}": (rule_plain, n) for n in (200, 400, 600, 1000) if n <= len(pool)}
    rules.update({f"split-{n}": (rule_split, n) for n in (200, 400) if n <= len(pool)})
    res = {}
    for name, (rule, n) in rules.items():
        got = []
        for _ in range(DRAWS):
            sample = rng.choice(pool, n, replace=False)
            p = rule(sample, n)
            if p is not None:
                key = (p.permutations, p.window, p.hamming_keep)
                got.append((true_of[key], p.cost(width), p.recall, p.fraction_searched))
        g = np.array(got)
        res[name] = {"picked": len(g), "true_recall_mean": float(g[:, 0].mean()),
                     "below_target": float((g[:, 0] < TARGET).mean()),
                     "true_recall_p10": float(np.percentile(g[:, 0], 10)),
                     "sample_recall_mean": float(g[:, 2].mean()),
                     "cost_mean": float(g[:, 1].mean()),
                     "searched_mean": float(g[:, 3].mean())}
        print(name, json.dumps(res[name]), file=sys.stderr)
    best = choose_point(true_pts, TARGET, width)
    res["oracle"] = {"point": [best.permutations, best.window, best.hamming_keep],
                     "cost": best.cost(width), "recall": best.recall}
    out = ROOT / "results" / f"calibration_bias_{'model' if MODEL else 'l2'}_{len(parts)}seg.json"
    out.write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
