"""What two processes get from this machine: compute, random gathers, streaming reads and
page faults, one process alone against two at once (a diagnostic for the "2 workers >= 1.6x 1
worker" target of the scale benchmark: which kinds of work a second worker process speeds up here).

* sgemm: 20 products (2,000 x 784) @ (784 x 2,000), one BLAS thread per process;
* gather: 10 M random reads of int64 from a 400 MB array (memory latency);
* stream: 10 sums over a 400 MB float32 array (bandwidth);
* faults: ``FAULT_GIB`` GiB of new memory written (page faults: what loading a segment pays
  for every array it places; on a fresh VM a first touch of guest memory costs far more).

Each process reports its own seconds; "2" runs two identical processes at once, so 2.0x the
throughput shows as the same seconds as "1".

    cd /work/main && .venv/bin/python benchmarks/machine_scaling.py
"""

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before numpy loads: one core per process

import time
from multiprocessing import Process, Queue

import numpy as np
from numba import njit

FAULT_GIB = float(os.environ.get("FAULT_GIB", "2"))


@njit
def _gather(a, idx, reps):
    s = 0
    for _ in range(reps):
        for i in idx:
            s += a[i]
    return s


def _work(kind: str, q: Queue) -> None:
    rng = np.random.default_rng(os.getpid())
    if kind == "sgemm":
        A = rng.random((2000, 784), dtype=np.float32)
        B = rng.random((784, 2000), dtype=np.float32)
        A @ B
        t0 = time.perf_counter()
        for _ in range(20):
            A @ B
    elif kind == "gather":
        a = np.arange(50_000_000, dtype=np.int64)
        idx = rng.integers(0, len(a), 2_000_000)
        _gather(a, idx[:10], 1)
        t0 = time.perf_counter()
        _gather(a, idx, 5)
    elif kind == "stream":
        a = np.ones(100_000_000, dtype=np.float32)
        a.sum()
        t0 = time.perf_counter()
        for _ in range(10):
            a.sum()
    else:
        t0 = time.perf_counter()
        np.ones(int(FAULT_GIB * 2**30) // 8)
    q.put(time.perf_counter() - t0)


def main() -> None:
    for kind in ("sgemm", "gather", "stream", "faults"):
        for n in (1, 2):
            q: Queue = Queue()
            ps = [Process(target=_work, args=(kind, q)) for _ in range(n)]
            for p in ps:
                p.start()
            for p in ps:
                p.join()
            secs = [q.get() for _ in ps]
            print(f"{kind:6s} {n} process(es): {', '.join(f'{t:.2f}' for t in secs)} s",
                  flush=True)


if __name__ == "__main__":
    main()
