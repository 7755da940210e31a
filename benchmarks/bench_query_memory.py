"""Query memory: peak RSS of the Dask workers and of the driver of ``lshdist query``
with 1,000 and with 16,000 queries against the same index (``--k K --sizes A,B``: another k,
other query counts).

The README promises "at most two query chunks per worker are in flight, so memory does not grow
with the number of queries".  Acceptance: the workers' peak RSS with 1k and 16k queries differs
by < 20 % (k = 100); at k = 1,000, 20,000 queries peak at <= 1.5x the RSS of 2,000
(``--k 1000 --sizes 2000,20000 --max-ratio 1.5``).

Setup: Fashion-MNIST, the first 20,000 training images indexed under the identity (L2) metric
(`ExplicitMetric.identity(784)`) with ``lshdist index`` defaults on 2 workers; queries are test
images (16,000 = the 10,000 test images, then the first 6,000 again, with their own ids).
``lshdist query --k 100 --mode hash`` (or ``--k K``; hash pinned: ``auto`` may pick the scan
by a timing) with every other option at its default runs as a subprocess (the driver) on a
LocalCluster of 2 worker processes (``--workers 2``); psutil samples every 0.1 s
the RSS of the driver and of each of its child processes (the workers; multiprocessing's
resource tracker is left out).  Rounds alternate 1k/16k (16k first on odd rounds) after one
warm-up round; figures are medians of 3 rounds.

Run: ``.venv/bin/python benchmarks/bench_query_memory.py`` (writes
``benchmarks/results/query_memory.md``; with another k, ``query_memory_kK.md``).
"""

import common  # noqa: F401, I001  (first: pins threads, picks the numba cache)

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from lshdist.cluster.driver import chunk_rows, query_chunks
from lshdist.config import QueryConfig
from lshdist.datasets import load_fashion_mnist
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import DEFAULT_SHARD_ROWS, write_dataset
from lshdist.store.model import save_model

ROOT = Path(__file__).resolve().parent
LSHDIST = str(Path(sys.executable).parent / "lshdist")
N_INDEX, K, ROUNDS = 20_000, 100, 3
SIZES = (1_000, 16_000)
MAX_RATIO = 1.20  # worker peak, the larger query set over the smaller
MiB = 2**20


def sample(pid: int, stop: threading.Event, out: dict) -> None:
    """Peak RSS of ``pid`` and of each child process, every 0.1 s until ``stop``."""
    driver = psutil.Process(pid)
    peaks: dict[int, int] = {}
    names: dict[int, str] = {}
    drv, workers_sum = 0, 0
    while not stop.is_set():
        try:
            drv = max(drv, driver.memory_info().rss)
            kids = driver.children(recursive=True)
        except psutil.Error:
            break
        total = 0
        for c in kids:
            try:
                if c.pid not in names:
                    names[c.pid] = " ".join(c.cmdline())
                if "resource_tracker" in names[c.pid]:
                    continue
                rss = c.memory_info().rss
            except psutil.Error:
                continue
            peaks[c.pid] = max(peaks.get(c.pid, 0), rss)
            total += rss
        workers_sum = max(workers_sum, total)
        time.sleep(0.1)
    out.update(driver=drv, workers=sorted(peaks.values(), reverse=True),
               workers_sum=workers_sum)


def run_query(work: Path, n: int) -> dict:
    out = work / f"res-{n}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [LSHDIST, "query", "--index", str(work / "idx"), "--queries", str(work / f"q{n}"),
           "--k", str(K), "--mode", "hash", "--out", str(out), "--workers", "2"]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stop, got = threading.Event(), {}
    t = threading.Thread(target=sample, args=(p.pid, stop, got))
    t.start()
    _, err = p.communicate()
    stop.set()
    t.join()
    if p.returncode != 0:
        raise SystemExit(f"query failed ({p.returncode}): {err.decode()[-2000:]}")
    got.update(seconds=time.perf_counter() - t0, n=n,
               worker_peak=got["workers"][0] if got["workers"] else 0)
    return got


def main() -> None:
    global K, SIZES, ROUNDS, MAX_RATIO
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=K)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="SMALL,BIG query counts")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--segment-rows", type=int, default=None,
                   help="the index's segments (default lshdist's, 100,000: one segment, on "
                        "one worker; 10,000: two, one a worker)")
    p.add_argument("--max-ratio", type=float, default=MAX_RATIO,
                   help="acceptance: worker peak with BIG over SMALL queries at most this")
    args = p.parse_args()
    small, big = (int(x) for x in args.sizes.split(","))
    K, SIZES, ROUNDS, MAX_RATIO = args.k, (small, big), args.rounds, args.max_ratio
    work = Path(tempfile.mkdtemp(prefix="lshdist-qmem-"))
    try:
        split = load_fashion_mnist()
        Xtr, Xte = np.asarray(split.X_train), np.asarray(split.X_test)
        write_dataset(work / "db", Xtr[:N_INDEX])
        for n in SIZES:
            rows = np.arange(n) % len(Xte)
            write_dataset(work / f"q{n}", Xte[rows], ids=np.arange(100_000, 100_000 + n))
        save_model(work / "model", ExplicitMetric.identity(Xtr.shape[1]))
        seg = [] if args.segment_rows is None else ["--segment-rows", str(args.segment_rows)]
        index_cmd = [LSHDIST, "index", "--data", str(work / "db"), "--model",
                     str(work / "model"), "--out", str(work / "idx"), "--workers", "2", *seg]
        subprocess.run(index_cmd, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        for n in SIZES:  # warm-up round (numba compile, page cache)
            run_query(work, n)
        runs: dict[int, list[dict]] = {n: [] for n in SIZES}
        for r in range(ROUNDS):
            for n in (SIZES if r % 2 == 0 else SIZES[::-1]):
                got = run_query(work, n)
                runs[n].append(got)
                print(f"round {r} n={n}: worker peak {got['worker_peak'] / MiB:.0f} MiB "
                      f"(all workers {got['workers_sum'] / MiB:.0f} MiB), driver "
                      f"{got['driver'] / MiB:.0f} MiB, {got['seconds']:.1f}s", flush=True)
        write_report(runs, index_cmd)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def write_report(runs: dict[int, list[dict]], index_cmd: list[str]) -> None:
    small, big = SIZES
    per_task = chunk_rows(QueryConfig.query_chunk, K)
    n_chunks = {n: len(query_chunks([*range(0, n, DEFAULT_SHARD_ROWS), n], per_task))
                for n in SIZES}  # the query datasets are written with the default shards
    rows = []
    ratios = {}
    for key, what in (("worker_peak", "worker peak RSS (largest worker)"),
                      ("workers_sum", "workers' RSS, summed (peak of the sum)"),
                      ("driver", "driver peak RSS")):
        a, b = med(runs[small], key), med(runs[big], key)
        ratios[key] = b / a
        rows.append(f"| {what} | {a / MiB:.0f} | {b / MiB:.0f} | {b / a:.2f} |")
    ok = ratios["worker_peak"] <= MAX_RATIO
    per_run = "\n".join(
        f"| {r} | {n:,} | {runs[n][r]['worker_peak'] / MiB:.0f} | "
        f"{', '.join(f'{w / MiB:.0f}' for w in runs[n][r]['workers'])} | "
        f"{runs[n][r]['driver'] / MiB:.0f} | {runs[n][r]['seconds']:.1f} |"
        for r in range(ROUNDS) for n in SIZES)
    mem = psutil.virtual_memory().total / 2**30
    extra = "".join(" " + a for a in index_cmd[10:])  # the options after --workers 2
    text = f"""# Query memory: {small:,} vs {big:,} queries, k = {K:,}

Machine: {platform.node()}, {os.cpu_count()} cores, {mem:.0f} GiB RAM (shared with other
engineers, noisy), Python {platform.python_version()}, {platform.platform()}.
Date: {datetime.datetime.now().strftime("%Y-%m-%d %H:%M")}.

Command: `.venv/bin/python benchmarks/bench_query_memory.py`.  Index: the first {N_INDEX:,}
Fashion-MNIST training images, identity (L2) metric, `{" ".join(["lshdist", *index_cmd[1:2]])}
... --workers 2{extra}` with its defaults otherwise.  Queries: `lshdist query --index IDX
--queries Q --k {K} --mode hash --out RES --workers 2`, every other option at its default
(`--query-chunk` {QueryConfig.query_chunk:,}, {per_task:,} queries a task at k = {K:,}:
{n_chunks[big]} chunks of the {big:,} queries, {n_chunks[small]} of the {small:,});
Q = {small:,} or {big:,} test images (the 10,000 test images, repeated from the first as
needed, each row with its own id).
RSS sampled with psutil every 0.1 s: the driver (the `lshdist query` process) and each of its
child processes (the 2 workers; multiprocessing's resource tracker left out).  One warm-up round,
then {ROUNDS} rounds alternating the two sizes; medians.

| median of {ROUNDS} | {small:,} queries, MiB | {big:,} queries, MiB | ratio |
|---|---|---|---|
{chr(10).join(rows)}

Acceptance (worker peak RSS with {big:,} queries at most {MAX_RATIO:.2f}x that with {small:,}):
**{"met" if ok else "MISSED"}** (ratio {ratios["worker_peak"]:.2f}).

Per run:

| round | queries | largest worker MiB | workers MiB | driver MiB | seconds |
|---|---|---|---|---|---|
{per_run}
"""
    out = ROOT / "results" / ("query_memory.md" if K == 100 else f"query_memory_k{K}.md")
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
