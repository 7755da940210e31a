"""Where a distributed index and query spend their time: Dask's task stream, summed by task
kind (a diagnostic, not a comparison — no peers, one run).

Learns the model on the dataset if ``WORK/model`` is missing (LearnConfig defaults), builds
the index on a 2-worker LocalCluster calibrated on the query set (as `bench_scale.py` does),
then answers every query with the build's segments held in worker memory (as `lshdist run`).
Prints, per stage: the span, core-seconds and task count per task kind, transfer seconds and
each worker's busy seconds.

    cd /work/main && .venv/bin/python benchmarks/profile_stages.py \\
        [DATA (out/million-fashion/train)] [QUERIES (out/million-fashion/test)] [WORK (out/profile)]
"""

import collections
import dataclasses
import sys
import time
from pathlib import Path

from distributed import get_task_stream

from lshdist.cluster.pipeline import plan_build, plan_query, run_build, run_query
from lshdist.config import ClusterConfig, IndexConfig, LearnConfig, QueryConfig
from lshdist.jobs.common import client_from_config
from lshdist.jobs.learn import learn
from lshdist.store.dataset import Dataset
from lshdist.store.model import save_model

ROOT = Path(__file__).resolve().parent.parent


def summarize(stream: list[dict], span: float) -> None:
    """Core-seconds per task kind (the key's prefix), transfers, and busy time per worker."""
    per: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0.0])
    busy: dict[str, float] = collections.defaultdict(float)
    transfer = 0.0
    for t in stream:
        compute = sum(s["stop"] - s["start"] for s in t["startstops"] if s["action"] == "compute")
        moved = sum(s["stop"] - s["start"] for s in t["startstops"] if s["action"] == "transfer")
        transfer += moved
        key = t["key"][0] if isinstance(t["key"], tuple) else t["key"]
        name = str(key).split("-", 1)[0]
        per[name][0] += compute
        per[name][1] += 1
        per[name][2] += moved
        busy[t["worker"]] += compute
    for name, (secs, n, moved) in sorted(per.items(), key=lambda kv: -kv[1][0]):
        print(f"   {name:32s} {secs:8.2f} core-s  {int(n):5d} tasks  "
              f"inputs fetched {moved:6.2f} s")
    print(f"   {'(transfers)':32s} {transfer:8.2f} s")
    print("   busy per worker:", {w.rsplit(':', 1)[-1]: round(v, 1) for w, v in busy.items()},
          f"span {span:.1f} s")


def main() -> None:
    args = sys.argv[1:]
    data = Path(args[0]) if args else ROOT / "out" / "million-fashion" / "train"
    queries = Path(args[1]) if len(args) > 1 else ROOT / "out" / "million-fashion" / "test"
    work = Path(args[2]) if len(args) > 2 else ROOT / "out" / "profile"
    work.mkdir(parents=True, exist_ok=True)
    ds, qs = Dataset(data), Dataset(queries)
    model = work / "model"
    if not model.exists():
        t0 = time.perf_counter()
        metric, params, _ = learn(ds, LearnConfig())
        save_model(model, metric, params=params, seed=0)
        print(f"learn {time.perf_counter() - t0:.1f} s ({params.get('selected')})")
    with client_from_config(ClusterConfig(workers=2)) as client:
        index = work / "index"
        cfg = dataclasses.replace(IndexConfig(), calibration_queries=str(qs.path))
        t0 = time.perf_counter()
        held: list = []
        with get_task_stream(client) as ts:
            plan = plan_build(data=str(ds.path), model=str(model), out=str(index), cfg=cfg,
                              overwrite=index.exists())
            manifest = run_build(client, plan, hold=held)
        print(f"index {time.perf_counter() - t0:.1f} s:",
              (manifest.get("calibration") or {}).get("reason"))
        summarize(ts.data, time.perf_counter() - t0)
        res = work / "results"
        t0 = time.perf_counter()
        with get_task_stream(client) as ts:
            qp = plan_query(index=str(index), queries=str(qs.path), out=str(res),
                            cfg=QueryConfig(), overwrite=res.exists())
            info = run_query(client, qp, segments=held)
        print(f"query (segments held) {time.perf_counter() - t0:.1f} s: {info['mode']} "
              f"{info['operating_point']}")
        summarize(ts.data, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
