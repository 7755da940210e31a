"""The query stage on 1 and on 2 Dask workers, paired: does a second worker give
>= 1.6x?

`bench_scale.py` measures each worker count once, minutes apart; this benchmark takes an index
`bench_scale.py` left on disk (``BENCH_INDEX``, default ``out/scale/n1020000/index``) and the
query set (``BENCH_QUERIES``, default ``out/million-fashion/test``, all 100,000 rows) and runs
``lshdist query`` (QueryConfig defaults: mode auto, the index's operating point) on a fresh
LocalCluster of 1 and of 2 workers, alternating which goes first, ``BENCH_ROUNDS`` (3) rounds
after nothing else: a cold start each time, as a user's `lshdist query` is (the index is read
back from disk, numba's cache is warm from `bench_scale.py`).  Reported: each run's seconds
(cluster start-up apart), the per-round ratio 1-worker / 2-worker (median [min-max]), and
that both answered the same (checked, not assumed).

    cd /work/main && .venv/bin/python benchmarks/bench_query_workers.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from lshdist.cluster.pipeline import plan_query, run_query
from lshdist.config import ClusterConfig, QueryConfig
from lshdist.jobs.common import client_from_config
from lshdist.store.dataset import Dataset
from lshdist.store.results import read_results

ROOT = Path(__file__).resolve().parent.parent
INDEX = Path(os.environ.get("BENCH_INDEX", ROOT / "out" / "scale" / "n1020000" / "index"))
QUERIES = Path(os.environ.get("BENCH_QUERIES", ROOT / "out" / "million-fashion" / "test"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
OUT = ROOT / "out" / "bench-query-workers"


def one(workers: int) -> tuple[float, float, np.ndarray]:
    res = OUT / f"results-{workers}"
    shutil.rmtree(res, ignore_errors=True)
    t0 = time.perf_counter()
    with client_from_config(ClusterConfig(workers=workers)) as client:
        start = time.perf_counter() - t0
        t0 = time.perf_counter()
        qp = plan_query(index=str(INDEX), queries=str(QUERIES), out=str(res), cfg=QueryConfig())
        run_query(client, qp)
        secs = time.perf_counter() - t0
    _, nb, _, _ = read_results(res, Dataset(QUERIES).ids())
    return start, secs, np.asarray(nb)


def main():
    common.pin_threads()
    OUT.mkdir(parents=True, exist_ok=True)
    runs, answers = [], {}
    for r in range(ROUNDS):
        for w in ((1, 2) if r % 2 == 0 else (2, 1)):
            start, secs, nb = one(w)
            if w in answers:
                assert np.array_equal(answers[w], nb), "a worker count answered differently"
            answers[w] = nb
            runs.append({"round": r + 1, "workers": w, "cluster start s": start,
                         "query s": secs, "load": common.loadavg()})
            print(f"round {r + 1}: {w} worker(s) {secs:.1f} s (start {start:.1f} s)", flush=True)
    same = bool(np.array_equal(answers[1], answers[2]))
    ratios = []
    for r in range(1, ROUNDS + 1):
        t = {x["workers"]: x["query s"] for x in runs if x["round"] == r}
        ratios.append(t[1] / t[2])
    med = {w: statistics.median(x["query s"] for x in runs if x["workers"] == w) for w in (1, 2)}
    summary = [{"1 worker s (median)": med[1], "2 workers s (median)": med[2],
                "1 / 2 per round (median [min-max])":
                    f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}]",
                "same answers": same, "queries": Dataset(QUERIES).n, "index": str(INDEX)}]
    print(summary[0], flush=True)
    common.write_results(os.environ.get("BENCH_NAME", "query_workers"),
                         {"query stage, 1 vs 2 workers": summary, "runs": runs},
                         title="lshdist query on 1 and 2 Dask workers, paired rounds")


if __name__ == "__main__":
    main()
