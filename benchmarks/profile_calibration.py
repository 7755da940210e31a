"""Calibration's share of the one-process build on Fashion-MNIST (the target:
"calibration adds <= 25 % to the index build"), by stage:
`MetricIndex(target_recall=0.9).fit(train)` (the build;
calibration is deferred) then `calibrate_for(test)` (what `lshdist evaluate` and a bulk
`query(mode="auto")` run), ``ROUNDS`` rounds after a warm-up round (numba compilation); the
calibration's stages timed by wrapping `lshdist.index.calibrate`'s functions: the exact truth
and the scan's timing (`scan_topk`), the grid (`grid_counts`), the curve (`pooled_points`) and
the timed search of the chosen point (`select`).

    cd /work/main && .venv/bin/python benchmarks/profile_calibration.py [ROUNDS]
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import statistics
import sys
import time

import lshdist.index.calibrate as cal_mod
from lshdist.datasets import load_fashion_mnist
from lshdist.index.searcher import MetricIndex
from lshdist.metric.learned import ExplicitMetric

STAGES = ("scan_topk", "grid_counts", "pooled_points", "select")


def main() -> None:
    common.pin_threads()
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    Xtr, _, Xte, _ = load_fashion_mnist(common.data_dir())
    metric = ExplicitMetric.identity(784, center=Xtr.mean(axis=0))
    stamp: dict[str, float] = {}
    for name in STAGES:
        f = getattr(cal_mod, name)

        def timed(*a, _f=f, _name=name, **kw):
            t0 = time.perf_counter()
            try:
                return _f(*a, **kw)
            finally:
                stamp[_name] = stamp.get(_name, 0.0) + time.perf_counter() - t0
        setattr(cal_mod, name, timed)
    rows = []
    for r in range(rounds + 1):
        stamp.clear()
        t0 = time.perf_counter()
        ix = MetricIndex(metric, target_recall=0.9, calibration_k=10, seed=0).fit(Xtr,
                                                                                  n_threads=2)
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        c = ix.calibrate_for(Xte, n_threads=2, answered=len(Xte))  # as evaluate and query
        cal = time.perf_counter() - t0
        p = c.chosen
        print(f"round {r}{' (warm-up)' if r == 0 else ''}: build {build:.3f} s, calibration "
              f"{cal:.3f} s = {100 * cal / build:.0f} % of it; {c.mode} "
              f"{p and (p.permutations, p.window, p.hamming_keep)}; "
              + ", ".join(f"{k} {v:.3f}" for k, v in stamp.items()), flush=True)
        if r:
            rows.append((build, cal, cal / build))
    med = [statistics.median(x) for x in zip(*rows)]
    print(f"median of {rounds}: build {med[0]:.3f} s, calibration {med[1]:.3f} s, share "
          f"{100 * med[2]:.0f} % (min {100 * min(x[2] for x in rows):.0f}, max "
          f"{100 * max(x[2] for x in rows):.0f})")


if __name__ == "__main__":
    main()
