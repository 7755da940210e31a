"""`lshdist learn` with the metric-selection grid fitted one setting at a time against its
default (as many settings at once as the driver has cores, and the sample's shards read as
many at a time): the same choice, how much sooner.

Data: a dataset directory (``BENCH_DATA``, default ``out/million-fashion/train`` from
`make_million.py`; any dataset `lshdist ingest` wrote), LearnConfig defaults (a 20,000-row
stratified sample, the grid within its budget).  ``BENCH_ROUNDS`` (3) paired rounds after a
warm-up, the order alternating; reported: median seconds of each, the ratio serial / default
per round (median, min, max), and that both chose the same setting with the same held-out
accuracies (checked, not assumed).

    cd /work/main && .venv/bin/python benchmarks/bench_learn.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import os
import time
from pathlib import Path

from lshdist.config import LearnConfig
from lshdist.jobs.learn import learn
from lshdist.limits import available_cores
from lshdist.store.dataset import Dataset

DATA = Path(os.environ.get("BENCH_DATA", Path(__file__).resolve().parent.parent / "out"
                           / "million-fashion" / "train"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def main():
    common.pin_threads()
    ds = Dataset(DATA)
    seen = {}

    def run(threads):
        def go():
            t0 = time.perf_counter()
            _, params, _ = learn(ds, LearnConfig(grid_threads=threads))
            secs = time.perf_counter() - t0
            sel = params["selection"]
            seen.setdefault(threads, []).append(
                (params["selected"], sel["setting"],
                 [(t["name"], t["accuracy"]) for t in sel["trials"]]))
            return {"total s": secs, "settings tried": len(sel["trials"])}
        return go

    cores = available_cores()
    default = f"grid {cores} at a time (default)"
    systems = {default: run(None), "grid serial": run(1)}
    res = common.paired_rounds(systems, ref="grid serial", rounds=ROUNDS)
    # ratio per round: this / serial; the speed-up is its inverse
    summary = common.paired_summary(res["runs"], "grid serial", keys=("total s",))
    choices = {str(k): v for k, v in seen.items()}
    same = all(v == choices["1"][0] for vs in choices.values() for v in vs)
    rows = [{"learn": name, "median s": row["total s"],
             "serial / this (median)": 1 / row["ratio median"],
             "serial / this (min-max)": f"{1 / row['ratio max']:.2f}-{1 / row['ratio min']:.2f}",
             "runs s": row["runs total s"]} for name, row in summary.items()]
    print(common.md_table(rows))
    print(f"same choice and held-out accuracies in every run: {same}")
    if not same:
        raise SystemExit("the grid's choice depended on the threads: a defect")
    common.write_results(os.environ.get("BENCH_NAME", "learn_grid_threads"),
                         {"learn: grid settings at once vs one at a time": rows},
                         title=f"lshdist learn on {DATA.name}: the metric-selection grid "
                               "fitted concurrently",
                         notes=[f"data {DATA}, {ds.n:,} rows x {ds.d}; LearnConfig defaults; "
                                f"{ROUNDS} paired rounds after a warm-up; same choice: {same}"])


if __name__ == "__main__":
    main()
