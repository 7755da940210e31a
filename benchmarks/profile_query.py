"""Where a separate `lshdist query` spends its time on 1 or 2 workers: Dask's task stream of
one bulk query of a stored index (the segments read back, as `bench_query_workers.py` runs
it), summed by task kind, with each kind's first start and last stop (a diagnostic, one run).
The answers go to ``out/profile-query-WORKERS`` (an earlier run's results there are replaced:
`plan_query` overwrites only lshdist results).

    cd /work/main && .venv/bin/python benchmarks/profile_query.py WORKERS \\
        [INDEX (out/scale/n1020000/index)] [QUERIES (out/million-fashion/test)]
"""

import collections
import sys
import time
from pathlib import Path

from distributed import get_task_stream
from profile_stages import summarize

from lshdist.cluster.pipeline import plan_query, run_query
from lshdist.config import ClusterConfig, QueryConfig
from lshdist.jobs.common import client_from_config

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    args = sys.argv[1:]
    workers = int(args[0]) if args else 2
    index = args[1] if len(args) > 1 else str(ROOT / "out" / "scale" / "n1020000" / "index")
    queries = args[2] if len(args) > 2 else str(ROOT / "out" / "million-fashion" / "test")
    res = ROOT / "out" / f"profile-query-{workers}"
    with client_from_config(ClusterConfig(workers=workers)) as client:
        t0 = time.perf_counter()
        with get_task_stream(client) as ts:
            qp = plan_query(index=index, queries=queries, out=str(res), cfg=QueryConfig(),
                            overwrite=res.exists())
            info = run_query(client, qp)
        span = time.perf_counter() - t0
    print(f"query on {workers} worker(s) {span:.1f} s: {info['mode']} {info['operating_point']}")
    summarize(ts.data, span)
    when: dict[str, list[float]] = collections.defaultdict(lambda: [float("inf"), 0.0])
    for t in ts.data:
        key = t["key"][0] if isinstance(t["key"], tuple) else t["key"]
        name = str(key).split("-", 1)[0]
        for s in t["startstops"]:
            if s["action"] == "compute":
                when[name][0] = min(when[name][0], s["start"])
                when[name][1] = max(when[name][1], s["stop"])
    base = min(v[0] for v in when.values())
    for name, (a, b) in sorted(when.items(), key=lambda kv: kv[1][0]):
        print(f"   {name:28s} {a - base:7.1f} -> {b - base:7.1f} s")


if __name__ == "__main__":
    main()
