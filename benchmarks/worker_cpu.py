"""CPU seconds of every thread of every process during one bulk query on a LocalCluster of 1 or
2 workers (psutil's per-thread times, before and after): how much of the span each worker's
task thread was actually on a CPU, and what the event loops, Zarr's I/O threads and the driver
(scheduler and Nannies) took beside it (a diagnostic of the 1 M-row query stage).

    cd /work/main && .venv/bin/python benchmarks/worker_cpu.py WORKERS \\
        [INDEX (out/s16/m1/index)] [QUERIES (out/million-fashion/test)]
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def threads() -> list[tuple[str, float, float]]:
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    return [(names.get(t.id, str(t.id)), t.user_time, t.system_time)
            for t in psutil.Process().threads()]


def show(before: list, after: list, label: str) -> None:
    was = {n: (u, s) for n, u, s in before}
    total = 0.0
    for n, u, s in after:
        du, ds = u - was.get(n, (0, 0))[0], s - was.get(n, (0, 0))[1]
        total += du + ds
        if du + ds > 0.2:
            print(f"   {label} {n[:40]:40s} user {du:7.1f} s  system {ds:6.1f} s")
    print(f"  {label} total {total:.1f} CPU-s")


def main() -> None:
    from lshdist.cluster.pipeline import plan_query, run_query
    from lshdist.config import ClusterConfig, QueryConfig
    from lshdist.jobs.common import client_from_config

    a = sys.argv[1:]
    workers = int(a[0]) if a else 2
    index = a[1] if len(a) > 1 else str(ROOT / "out" / "s16" / "m1" / "index")
    queries = a[2] if len(a) > 2 else str(ROOT / "out" / "million-fashion" / "test")
    res = ROOT / "out" / f"worker-cpu-{workers}"
    with client_from_config(ClusterConfig(workers=workers)) as client:
        w0, d0 = client.run(threads), threads()
        t0 = time.perf_counter()
        qp = plan_query(index=index, queries=queries, out=str(res), cfg=QueryConfig(),
                        overwrite=res.exists())
        run_query(client, qp)
        span = time.perf_counter() - t0
        w1, d1 = client.run(threads), threads()
    print(f"query on {workers} worker(s): {span:.1f} s")
    for k in w1:
        show(w0[k], w1[k], "worker")
    show(d0, d1, "driver (scheduler, Nannies)")


if __name__ == "__main__":
    main()
