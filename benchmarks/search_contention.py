"""Does one segment's search slow down when a second process searches beside it?  Each process
loads its own 100,000-row segment of a stored index, encodes the same 10,000 queries, and times
the search stages (the join, collecting candidates, the re-rank, then the whole search) with a
barrier before each, so that with two processes both run the same stage at once; one process
alone, then two, twice (a diagnostic of the 1 M-row query stage).

    cd /work/main && .venv/bin/python benchmarks/search_contention.py \\
        [INDEX (out/s16/m1/index)] [QUERIES (out/million-fashion/test)] [N (10000)]
"""

import sys
import time
from multiprocessing import Barrier, Process, Queue


def work(index, queries, si, bar, q, n):
    import common

    common.pin_threads()
    import numpy as np

    from lshdist._kernels.search import collect_windows
    from lshdist.cluster import tasks
    from lshdist.store.index import read_manifest, read_segment

    man = read_manifest(index)
    seg = read_segment(index, man["segments"][si], man)
    fam = tasks.load_family(man["model"], man["bits"], man["seed"], man["learned"])
    qc, qp, _ = tasks.encode_queries(queries, 0, n, fam)
    M, W, H = man["permutations"], man["window"], man["hamming_keep"]
    seg.search(qc[:300], qp.take(np.arange(300)), 10, n_permutations=M, window=W, hamming_keep=H)
    res: dict = {}
    for _ in range(2):
        bar.wait()
        t0 = time.perf_counter()
        pos, _ = seg.window_positions(qc, n_permutations=M)
        res.setdefault("join", []).append(time.perf_counter() - t0)
        bar.wait()
        t0 = time.perf_counter()
        outs = [collect_windows(pos[lo:lo + 1024], seg.sorted_rows_[:M], W, seg.codes_,
                                qc[lo:lo + 1024], H) for lo in range(0, n, 1024)]
        res.setdefault("collect", []).append(time.perf_counter() - t0)
        bar.wait()
        t0 = time.perf_counter()
        for i, lo in enumerate(range(0, n, 1024)):
            off, rows, _ = outs[i]
            seg.payload_.rerank(off, rows, qp.take(np.arange(lo, min(lo + 1024, n))), 10,
                                seg.ids_)
        res.setdefault("rerank", []).append(time.perf_counter() - t0)
        bar.wait()
        t0 = time.perf_counter()
        seg.search(qc, qp, 10, n_permutations=M, window=W, hamming_keep=H)
        res.setdefault("search", []).append(time.perf_counter() - t0)
    q.put((si, {k: min(v) for k, v in res.items()}))


def main() -> None:
    a = sys.argv[1:]
    index = a[0] if a else "out/s16/m1/index"
    queries = a[1] if len(a) > 1 else "out/million-fashion/test"
    n = int(a[2]) if len(a) > 2 else 10000
    for procs in (1, 2, 1, 2):
        q: Queue = Queue()
        bar = Barrier(procs)
        ps = [Process(target=work, args=(index, queries, i, bar, q, n)) for i in range(procs)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        for _ in ps:
            si, r = q.get()
            print(f"{procs} process(es), segment {si}: "
                  + ", ".join(f"{k} {v:.3f} s" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
