"""The query stage at 1 M rows with Dask's worker malloc setting and with lshdist's, paired
(a diagnostic of the 1 M-row query stage).

Dask spawns workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (``distributed.nanny.pre-spawn-environ``);
lshdist replaces that default with `lshdist.cluster.client.WORKER_MALLOC` and keeps any other
value a user configured — so Dask's behaviour is asked for here as 65,537.  Each round runs
`bench_query_workers.one` (a fresh LocalCluster, ``lshdist query`` defaults, the index
``BENCH_INDEX``) for 1 and 2 workers under both settings, the order reversed on odd rounds;
each run's seconds are printed as JSON lines and written to ``OUT`` (default
``out/bench-worker-malloc.json``).

    cd /work/main && BENCH_INDEX=out/s16/m1/index .venv/bin/python \\
        benchmarks/bench_worker_malloc.py [ROUNDS] [OUT]
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import json
import os
import sys

import dask
import distributed  # noqa: F401  (registers distributed's config defaults)

import bench_query_workers as b
from lshdist.cluster.client import WORKER_MALLOC

DEFAULT_PRE = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))


def main() -> None:
    common.pin_threads()
    b.OUT.mkdir(parents=True, exist_ok=True)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    out = sys.argv[2] if len(sys.argv) > 2 else "out/bench-worker-malloc.json"
    order = [(1, "dask"), (1, "lshdist"), (2, "dask"), (2, "lshdist")]
    rows = []
    for r in range(rounds):
        for w, v in (order if r % 2 == 0 else order[::-1]):
            for key in WORKER_MALLOC:  # the Nanny writes pre-spawn-environ into this process
                os.environ.pop(key, None)
            pre = dict(DEFAULT_PRE)
            if v == "dask":  # Dask's trim threshold, as a user's own setting (lshdist keeps it)
                pre["MALLOC_TRIM_THRESHOLD_"] = 65537
            with dask.config.set({"distributed.nanny.pre-spawn-environ": pre}):
                _, secs, _ = b.one(w)
            rows.append({"round": r, "workers": w, "malloc": v, "seconds": round(secs, 2)})
            print(json.dumps(rows[-1]), flush=True)
    with open(out, "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main()
