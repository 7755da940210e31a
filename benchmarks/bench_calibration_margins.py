"""The calibration's recall margin: today's bound, one standard error under the
largest per-query variance r (1 - r), against a margin from the sample's own per-query
variance (``z`` sample standard errors), on smaller samples.  Per-query grids of 4,000 test
queries as in `bench_calibration_stages.py` (L2, defaults); 2,000 of them the evaluation set,
300 random draws from the other 2,000; per rule the picks' true recall (mean, share below
0.9 and 0.88, 5th percentile) and search cost (`Point.cost`, relative to the first rule).
Printed only.

    cd /work/main && .venv/bin/python benchmarks/bench_calibration_margins.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import numpy as np

from bench_calibration_stages import K, TARGET, exact_topk
from lshdist.datasets import load_fashion_mnist, load_letter
from lshdist.index.calibrate import Point, choose_point, grid_axes, grid_counts, recall_margin
from lshdist.index.searcher import MetricIndex, encode
from lshdist.metric.learned import ExplicitMetric

DRAWS, EVAL, POOL = 300, 2000, 2000
#: rule name -> (sample queries, z: None for today's bound)
RULES = {"bound n=200": (200, None), "bound n=100": (100, None), "bound n=50": (50, None),
         "var z=1 n=50": (50, 1.0), "var z=1.5 n=50": (50, 1.5), "var z=2 n=50": (50, 2.0),
         "var z=1.5 n=30": (30, 1.5), "var z=2 n=30": (30, 2.0),
         "var z=2 n=100": (100, 2.0)}


def grids(name: str) -> tuple:
    """Per-query recall and rows re-ranked at every grid point, (queries, M', W, H) each."""
    X, _, Xq, _ = (load_fashion_mnist if name == "fashion" else load_letter)(common.data_dir())
    X, Xq = np.ascontiguousarray(X, np.float32), np.ascontiguousarray(Xq, np.float32)
    rng = np.random.default_rng(11)
    Xq = Xq[rng.permutation(len(Xq))[:EVAL + POOL]]
    truth = exact_topk(X, Xq)
    metric = ExplicitMetric.identity(X.shape[1], center=X.mean(0))
    index = MetricIndex(metric, target_recall=TARGET, seed=0).fit(X, n_threads=2)
    ms, ws, hs = grid_axes(index.index_.n_permutations_, K)
    codes, _ = encode(metric, index.family_, Xq, query=True)
    shape = (len(Xq), len(ms), len(ws), len(hs))
    H, R = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    for q in range(len(Xq)):
        h, r = grid_counts(index.index_, codes[q:q + 1], truth[q:q + 1], np.array([-1]),
                           np.ones((1, K), bool), ms, ws, hs)
        H[q], R[q] = h.sum(-1) / K, r
    return H, R, (ms, ws, hs), len(X), float(X.shape[1]), rng


def points(H, R, axes, N, rows, z=None):
    """The grid's points on the queries ``rows``; with ``z``, each recall lowered by z sample
    standard errors of its own per-query recalls (then chosen with no further margin)."""
    rec, rr = H[rows].mean(0), R[rows].mean(0)
    if z is not None:
        rec = rec - z * np.sqrt(H[rows].var(0, ddof=1) / len(rows))
    ms, ws, hs = axes
    return [Point(m, w, h, float(rec[a, b, j]), float(rr[a, b, j]), float(rr[a, b, j]) / N)
            for a, m in enumerate(ms) for b, w in enumerate(ws) for j, h in enumerate(hs)]


def main() -> None:
    common.pin_threads()
    for name in ("fashion", "letter"):
        H, R, axes, N, width, rng = grids(name)
        perm = rng.permutation(len(H))
        ev, pool = perm[:EVAL], perm[EVAL:]
        true_of = {(p.permutations, p.window, p.hamming_keep): p.recall
                   for p in points(H, R, axes, N, ev)}
        # how much real queries' recalls spread, against the bound the margin assumes
        best = choose_point(points(H, R, axes, N, ev), TARGET, width)
        ms, ws, hs = axes
        at = H[ev, ms.index(best.permutations), ws.index(best.window),
               hs.index(best.hamming_keep)]
        r = float(at.mean())
        print(f"{name}: at {best.permutations, best.window, best.hamming_keep} (the evaluation "
              f"set's own pick) recall {r:.3f}, per-query variance {at.var():.4f} against the "
              f"bound r(1 - r) = {r * (1 - r):.4f} ({r * (1 - r) / at.var():.1f}x)", flush=True)
        got: dict[str, list] = {k: [] for k in RULES}
        for _ in range(DRAWS):
            s = rng.choice(pool, 200, replace=False)
            for rule, (n, z) in RULES.items():
                if z is None:
                    p = choose_point(points(H, R, axes, N, s[:n]), TARGET, width,
                                     recall_margin(TARGET, n))
                else:
                    p = choose_point(points(H, R, axes, N, s[:n], z), TARGET, width, 0.0)
                if p is not None:
                    got[rule].append((true_of[(p.permutations, p.window, p.hamming_keep)],
                                      p.cost(width)))
        base = None
        for rule, rows in got.items():
            g = np.array(rows)
            cost = g[:, 1].mean()
            base = base or cost
            print(f"{name:8s} {rule:16s} picked {len(g):3d}  true recall {g[:, 0].mean():.4f}  "
                  f"below 0.9 {100 * (g[:, 0] < 0.9).mean():5.1f} %  below 0.88 "
                  f"{100 * (g[:, 0] < 0.88).mean():4.1f} %  p5 {np.percentile(g[:, 0], 5):.4f}  "
                  f"cost {cost:9.0f} ({100 * (cost / base - 1):+.1f} %)", flush=True)


if __name__ == "__main__":
    main()
