"""ITML at high dimension: lshdist's blocked projections against its constraint-at-a-time loop
and against metric-learn, on Fashion-MNIST (784-d).

Rows: a 20,000-row stratified sample of the Fashion-MNIST training images (the size of
`lshdist learn`'s default sample), pixels scaled to [0, 1].  Constraints: ``BENCH_PAIRS``
(2,000) random pairs from the labels, similar first, the same for every learner; bounds: the
5th / 95th percentiles of squared L2 distances among 200 random rows; gamma = 1, identity prior,
``BENCH_PASSES`` (2) passes (tol 0, so that every learner makes exactly that many).

Learners, in alternating order, ``BENCH_ROUNDS`` (3) paired rounds after a warm-up each:
lshdist's default (`lshdist._kernels.itml.explicit_block` constraints a block: 64 at 784-d),
lshdist one constraint at a time (the unblocked kernel, ``block = 1``), metric-learn
(numpy; timed once per round only when ``BENCH_ML`` is not 0 — it takes minutes).
Reported: median seconds and the per-round ratios (median, min, max), and the relative
Frobenius distance between the learned matrices (the same projections: only rounding differs).

    cd /work/main && .venv/bin/python benchmarks/bench_itml_highdim.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import os
import time

import numpy as np

import lshdist.metric.itml as itml_mod
from lshdist.datasets import load_fashion_mnist
from lshdist.metric.constraints import random_pairs
from lshdist.metric.itml import ITML
from lshdist.metric.selection import sample_rows_stratified

PAIRS = int(os.environ.get("BENCH_PAIRS", "2000"))
PASSES = int(os.environ.get("BENCH_PASSES", "2"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
WITH_ML = os.environ.get("BENCH_ML", "1") != "0"
SAMPLE = 20_000


def main():
    threads = common.pin_threads()
    split = load_fashion_mnist()
    Xall, yall, _, _ = split
    rows = sample_rows_stratified(yall, SAMPLE, 0)
    X = np.ascontiguousarray(Xall[rows], np.float32)
    if X.max() > 1.0:
        X /= 255.0
    y = yall[rows]
    pairs, delta = random_pairs(y, PAIRS, np.random.default_rng(0))
    u, l = common.bounds_from_sample(X)
    print(f"Fashion-MNIST sample {X.shape}; {len(pairs)} random pairs; bounds u={u:.4g} "
          f"l={l:.4g}; {PASSES} passes; threads {threads}", flush=True)

    def fit_lsh(block_one: bool):
        def go():
            saved = itml_mod.explicit_block
            if block_one:
                itml_mod.explicit_block = lambda d: 1
            try:
                return ITML(bounds=(u, l), gamma=1.0, tol=0.0, max_iter=PASSES).fit(
                    X, pairs=pairs, delta=delta)
            finally:
                itml_mod.explicit_block = saved
        return go

    def fit_ml():
        import metric_learn
        return metric_learn.ITML(gamma=1.0, tol=0.0, max_iter=PASSES, prior="identity",
                                 preprocessor=X.astype(np.float64)).fit(pairs, delta,
                                                                        bounds=[u, l])

    learners = {"lshdist, blocked (default)": fit_lsh(False),
                "lshdist, one constraint at a time (block = 1)": fit_lsh(True)}
    if WITH_ML:
        learners["metric-learn ITML (numpy)"] = fit_ml
    for fn in learners.values():  # warm-up: numba compile, caches
        if fn is not fit_ml:
            fn()
    times = {name: [] for name in learners}
    models = {}
    names = list(learners)
    for r in range(ROUNDS):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            t0 = time.perf_counter()
            models[name] = learners[name]()
            times[name].append(time.perf_counter() - t0)
            print(f"  round {r + 1}: {name} {times[name][-1]:.2f} s", flush=True)

    def A_of(name):
        m = models[name]
        return m.A_ if hasattr(m, "A_") else m.get_mahalanobis_matrix()

    ref = names[1]
    base = np.asarray(times[ref])
    rows_out = []
    for name in names:
        t = np.asarray(times[name])
        ratio = base / t
        rel = float(np.linalg.norm(A_of(name) - A_of(ref)) / np.linalg.norm(A_of(ref)))
        extra_cols = {}
        if WITH_ML:
            ml = np.asarray(times[names[-1]]) / t
            extra_cols["metric-learn / this (median [min-max])"] = (
                f"{np.median(ml):.1f} [{ml.min():.1f}-{ml.max():.1f}]")
        rows_out.append({"learner": name, "median s": float(np.median(t)), **extra_cols,
                         "runs s": ", ".join(f"{v:.2f}" for v in t),
                         "block = 1 / this (median [min-max])":
                             f"{np.median(ratio):.2f} [{ratio.min():.2f}-{ratio.max():.2f}]",
                         "||A - A_block1|| / ||A_block1||": rel})
        print(f"{name}: median {np.median(t):.2f} s; block=1 / this "
              f"{np.median(ratio):.2f} [{ratio.min():.2f}-{ratio.max():.2f}]; rel. Frobenius "
              f"to block=1 {rel:.3g}", flush=True)
    notes = [
        f"Fashion-MNIST training images, a {SAMPLE:,}-row stratified sample (seed 0), pixels in "
        f"[0, 1]; {len(pairs):,} random pairs (seed 0), bounds u={u:.4g}, l={l:.4g}; gamma 1, "
        f"identity prior, exactly {PASSES} passes for every learner (tol 0).",
        f"{ROUNDS} paired rounds, the order alternating, after one warm-up of each lshdist "
        "learner; ratios are per round.",
    ]
    common.write_results(
        os.environ.get("BENCH_NAME", "itml_highdim"),
        {"ITML fit, 784-d": rows_out},
        title="ITML at 784-d: blocked projections vs one at a time vs metric-learn",
        notes=notes, peer_modules=("metric_learn",) if WITH_ML else (),
        extra={"times": times, "bounds": [u, l], "pairs": len(pairs), "passes": PASSES},
    )


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - t0:.0f} s")
