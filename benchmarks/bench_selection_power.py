"""How often the metric selection keeps a useless learned metric (false keep) and refuses a useful
one (false reject), measured.

Three parts, each a table (``--parts rule,fits,real`` chooses):

* **rule** — the decision rule alone (`lshdist.metric.selection.choose_setting` and
  `paired_test`, the functions `select_metric` calls) on synthetic held-out correctness: per
  trial, ``n`` labelled rows in 5 folds; on the ranking fold 7 settings (or 1) are scored, the
  rule picks one and drops it if it is no better than the prior there; the chosen setting is then
  judged on the other folds' rows.  Each row is right or wrong under the prior and under a
  setting so that a fraction ``r`` of the rows (the discordance) have them disagree and the
  setting's true gain is ``g``: P(only learned right) = (r + g) / 2, P(only prior) = (r - g) / 2,
  independently per row and per setting (independent settings: the largest winner's curse).
  No signal: g = 0; signal: g = +1 point.  Thousands of trials in seconds.
* **fits** — the whole `select_metric` with real ITML fits (defaults but ``--pairs`` constraints)
  on synthetic data of Letter's size (16,000 rows), a seed a trial: *no signal* (labels drawn
  independently of 4 Gaussian features, 4 classes) and *signal* (the label in one feature
  beside 3 larger noise features: a gain of several points, as on the held-out datasets where
  learning helps; the +1-point case is the rule part's and Letter's).
* **real** — `select_metric` with defaults on the real sets: Letter (16,000 training rows of
  `configs/letter.yaml`; the learned metric gains about a point), Letter with its labels
  permuted (no signal), Fashion-MNIST's training images with permuted labels (a 5,000-row
  stratified sample: 784-d fits are the costly ones); a seed a trial (folds, constraints and the
  permutation change with it).

Writes ``benchmarks/results/selection_power_<part>.{json,md}`` for each part run.  The 2 cores
are shared: every trial runs in this one process, one after the other (the numba kernels are
compiled first, outside the timings).

    cd /work/main && .venv/bin/python benchmarks/bench_selection_power.py --parts rule
    cd /work/main && .venv/bin/python benchmarks/bench_selection_power.py --parts fits
    cd /work/main && .venv/bin/python benchmarks/bench_selection_power.py --parts real
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import argparse
import logging
import time

import numpy as np

from lshdist.datasets import load_fashion_mnist, load_letter
from lshdist.metric.itml import ITML
from lshdist.metric.selection import (
    LEVEL,
    MARGIN,
    choose_setting,
    paired_test,
    replace_params,
    sample_rows_stratified,
    select_metric,
)

FOLDS = 5


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson interval of a rate k / n."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def rate_row(kept: int, trials: int, *, signal: bool) -> dict:
    """False keep (no signal) or false reject (signal) with its interval."""
    bad = trials - kept if signal else kept
    lo, hi = wilson(bad, trials)
    return {"trials": trials, "learned kept": kept,
            "error": "false reject" if signal else "false keep",
            "rate": f"{100 * bad / trials:.1f} %",
            "95 % interval": f"{100 * lo:.1f}–{100 * hi:.1f} %"}


# --------------------------------------------------------------------------- rule

def simulate(rng, n: int, r: float, g: float, settings: int) -> bool:
    """One trial of the decision rule on synthetic correctness; True when the learned metric
    would be kept."""
    n0 = n // FOLDS
    p_only_l, p_only_p = (r + g) / 2, (r - g) / 2

    def draw(rows: int) -> tuple[np.ndarray, np.ndarray]:
        prior = rng.random(rows) < 0.5
        u = rng.random(rows)
        # P(learned right | prior right) = 1 - 2 P(only prior); | prior wrong: 2 P(only learned)
        learned = np.where(prior, u >= 2 * p_only_p, u < 2 * p_only_l)
        return learned, prior

    prior0 = rng.random(n0) < 0.5
    oks = []
    for _ in range(settings):
        u = rng.random(n0)
        oks.append(np.where(prior0, u >= 2 * p_only_p, u < 2 * p_only_l))
    best = oks[choose_setting([int(o.sum()) for o in oks], n0)]
    ranking = paired_test(best, prior0)
    if ranking.only_learned <= ranking.only_prior:
        return False
    learned, prior = draw(n - n0)
    if settings == 1:  # no choice made on the ranking fold: its rows count too
        learned, prior = np.concatenate([best, learned]), np.concatenate([prior0, prior])
    return paired_test(learned, prior).keep


def part_rule(trials: int) -> list[dict]:
    rng = np.random.default_rng(2026)
    rows = []
    cases = [(n, r, 0.0) for n in (1_000, 4_000, 16_000) for r in (0.045, 0.15, 0.4)]
    cases += [(16_000, r, 0.01) for r in (0.045, 0.1, 0.15, 0.2)]
    cases += [(4_000, r, 0.01) for r in (0.045, 0.15)]
    for n, r, g in cases:
        for settings in (7, 1):
            t0 = time.perf_counter()
            kept = sum(simulate(rng, n, r, g, settings) for _ in range(trials))
            rows.append({"rows": n, "discordance r": r, "true gain": f"{100 * g:+.1f} pt",
                         "settings": settings, **rate_row(kept, trials, signal=g > 0),
                         "s": round(time.perf_counter() - t0, 1)})
            print(rows[-1], flush=True)
    return rows


# --------------------------------------------------------------------------- fits

def synthetic(seed: int, n: int, signal: bool) -> tuple[np.ndarray, np.ndarray]:
    """4 classes.  Signal: the label plus N(0, 0.6) in feature 0, three N(0, 2^2) noise
    features (L2 sees part of the signal; a metric that shrinks the noise features sees more:
    several points).  No signal: four N(0, 1) features drawn independently of the labels."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, size=n)
    if signal:
        X = rng.normal(scale=2.0, size=(n, 4))
        X[:, 0] = y + rng.normal(scale=0.6, size=n)
    else:
        X = rng.normal(size=(n, 4))
    return X.astype(np.float32), y


def run_selection(X, y, seed: int, **itml) -> dict:
    t0 = time.perf_counter()
    _, _, sel = select_metric(lambda ch: replace_params(ITML(seed=seed, **itml), ch), "explicit",
                              X, y, d=None, ks=[1], validation=0.2, budget=120.0,
                              force_learned=False, search=True, seed=seed,
                              n_classes=int(y.max()) + 1, n_threads=common.N_THREADS)
    out = sel.to_json()
    out["wall"] = time.perf_counter() - t0
    return out


def summary(name: str, sels: list[dict], *, signal: bool) -> dict:
    kept = sum(s["selected"] == "learned" for s in sels)
    gains = [100 * (s["learned_accuracy"]["1"] - s["prior_accuracy"]["1"]) for s in sels]
    return {"data": name, **rate_row(kept, len(sels), signal=signal),
            "held-out gain (pt, mean)": float(np.mean(gains)),
            "variance inflation (median)": float(np.median(
                [s["test"]["variance_inflation"] for s in sels])),
            "decision rows (median)": int(np.median([s["n_validation"] for s in sels])),
            "selection s (median)": float(np.median([s["wall"] for s in sels]))}


def part_fits(trials: int, signal_trials: int, pairs: int, n: int) -> list[dict]:
    rows = []
    for signal in (False, True):
        sels = []
        for t in range(signal_trials if signal else trials):
            X, y = synthetic(1000 + t, n, signal)
            sels.append(run_selection(X, y, seed=t, n_constraints=pairs))
        rows.append(summary(f"synthetic {'signal' if signal else 'no signal'}, {n} rows",
                            sels, signal=signal))
        print(rows[-1], flush=True)
    return rows


# --------------------------------------------------------------------------- real

def part_real(trials: int) -> list[dict]:
    rows = []
    X, y, _, _ = load_letter()
    X, y = X[:16_000], y[:16_000]  # configs/letter.yaml's training rows
    for permuted in (False, True):
        sels = []
        for t in range(trials):
            yt = np.random.default_rng(500 + t).permutation(y) if permuted else y
            sels.append(run_selection(X, yt, seed=t))
            print(sels[-1]["selected"], sels[-1]["reason"], f"{sels[-1]['wall']:.1f}s", flush=True)
        rows.append(summary("Letter" + (", permuted labels" if permuted else ""), sels,
                            signal=not permuted))
        print(rows[-1], flush=True)
    Xf, yf, _, _ = load_fashion_mnist()
    keep = sample_rows_stratified(yf, 5_000, 0)
    Xf, yf = np.ascontiguousarray(Xf[keep]), yf[keep]
    sels = []
    for t in range(trials):
        sels.append(run_selection(Xf, np.random.default_rng(700 + t).permutation(yf), seed=t))
        print(sels[-1]["selected"], sels[-1]["reason"], f"{sels[-1]['wall']:.1f}s", flush=True)
    rows.append(summary("Fashion-MNIST (5,000-row sample), permuted labels", sels,
                        signal=False))
    print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="rule")
    ap.add_argument("--rule-trials", type=int, default=4000)
    ap.add_argument("--fit-trials", type=int, default=100, help="no-signal trials")
    ap.add_argument("--signal-trials", type=int, default=30)
    ap.add_argument("--fit-rows", type=int, default=16_000)
    ap.add_argument("--pairs", type=int, default=1000, help="constraints of the synthetic fits")
    ap.add_argument("--real-trials", type=int, default=4)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("lshdist").setLevel(logging.ERROR)  # the prior kept warns every trial
    parts = args.parts.split(",")
    notes = [f"margin {MARGIN} (held-out 1-NN accuracy), level {LEVEL} (one-sided paired test: "
             "the larger p-value of the exact sign test and the clustered McNemar test over "
             f"mutual nearest rows), {FOLDS} folds",
             "false keep: the learned metric selected on data where it cannot help (no signal "
             "or permuted labels); false reject: the prior kept where the learned metric helps"]
    if {"fits", "real"} & set(parts):
        t0 = time.perf_counter()  # compile the kernels once, outside the timed trials
        run_selection(*synthetic(0, 400, True), seed=0, n_constraints=100)
        notes.append(f"numba compilation and warm-up: {time.perf_counter() - t0:.1f} s")
    for part in parts:
        if part == "rule":
            title, rows = ("The decision rule on synthetic held-out predictions",
                           part_rule(args.rule_trials))
        elif part == "fits":
            title, rows = ("select_metric with ITML fits, synthetic data",
                           part_fits(args.fit_trials, args.signal_trials, args.pairs,
                                     args.fit_rows))
        elif part == "real":
            title, rows = "select_metric with ITML fits, real data", part_real(args.real_trials)
        else:
            raise SystemExit(f"unknown part {part!r}: choose rule, fits or real")
        j, m = common.write_results(f"selection_power_{part}", {title: rows},
                                    title=f"Metric selection: false keep and false reject, "
                                          f"measured ({part})", notes=notes)
        print(f"wrote {j} and {m}", flush=True)


if __name__ == "__main__":
    main()
