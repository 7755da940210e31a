"""The one-process 1 M-row measurement: 1,020,000 x 784 (`make_million.py`), 100,000 queries, k=10.

lshdist's one-process `MetricIndex` (L2, ``target_recall=0.9``, no other parameter; build =
``fit``, query = ``query(Q, 10)`` auto, which calibrates on 200 of the queries) against, in the
same run, FAISS ``IndexFlatL2`` timed on the 2,000-query truth sample and scaled linearly to
100,000 queries (exact for brute force; said in the output) and FAISS ``IVFFlat`` (nlist =
sqrt(N) ~ 1,024, trained on 40 rows per list, nprobe swept; the cheapest total reaching
recall@10 0.9 on the sample, its search also timed on the sample and scaled) — both through
`bench_scale.faiss_peers`, as the scale benchmark runs them.  Recall@10 on the 2,000 queries
with stored exact truth.  One run each (the 1 M build is long); 2 threads; peak RSS of the
process reported.

    cd /work/main && .venv/bin/python benchmarks/bench_million.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import resource
import time

import numpy as np

import faiss

import bench_scale
import make_million
from lshdist.evaluation import recall_at_k
from lshdist.index.searcher import MetricIndex
from lshdist.metric.learned import ExplicitMetric

K = 10
TARGET = 0.9


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main():
    T = common.N_THREADS
    pinned = common.pin_threads(T)
    ds, qs, truth = make_million.make()
    t0 = time.perf_counter()
    X = np.ascontiguousarray(ds.read_all(), np.float32)
    Q = np.ascontiguousarray(qs.read_all(), np.float32)
    t_read = time.perf_counter() - t0
    tq_rows = truth["queries"] if "queries" in truth else np.arange(len(truth["ids"]))
    tids = truth["ids"]
    d = X.shape[1]
    print(f"database {X.shape}, queries {Q.shape}, truth {len(tids)}, threads {pinned}, "
          f"read {t_read:.1f} s, rss {rss_gib():.1f} GiB", flush=True)
    rows = []

    # lshdist
    met = ExplicitMetric.identity(d, center=X.mean(0))
    MetricIndex(met, target_recall=TARGET).fit(X[:5000], n_threads=T).query(Q[:4000], K,
                                                                            n_threads=T)
    t0 = time.perf_counter()
    ix = MetricIndex(met, target_recall=TARGET).fit(X, n_threads=T)
    tb = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, ids = ix.query(Q, K, n_threads=T)
    tq = time.perf_counter() - t0
    cal = ix.query_calibration_
    r = recall_at_k(ids[tq_rows], tids, K)
    p = cal.chosen
    rows.append({"system": "lshdist MetricIndex(target_recall=0.9)", "setting":
                 f"M={p.permutations}, W={p.window}, H={p.hamming_keep}" if p else "scan",
                 "recall@10 (2,000 sample)": r, "build s": tb, "query s": tq,
                 "total s": tb + tq, "note": f"calibration {cal.seconds:.1f} s in the query; "
                 f"peak RSS so far {rss_gib():.1f} GiB"})
    print(rows[-1], flush=True)
    del ix

    # FAISS flat and IVFFlat (nprobe swept, the cheapest total at the target), as the scale
    # benchmark runs them: search on the truth sample, scaled to all queries
    for r in bench_scale.faiss_peers(faiss, X, Q[tq_rows], tids, len(Q), T):
        r["recall@10 (2,000 sample)"] = r.pop("recall@10")
        rows.append(r)
        print(r, flush=True)
    lsh = rows[0]["total s"]
    for row in rows:
        row["peer / lshdist"] = row["total s"] / lsh
    print(common.md_table(rows))
    common.write_results("million_fashion",
                         {"Summary (k=10, 2 threads, 1,020,000 x 100,000, one run)": rows},
                         title="k-NN on 1,020,000 shifted Fashion-MNIST rows",
                         notes=["One run per system; FAISS flat timed on the 2,000 truth queries "
                                "and scaled to 100,000 (brute force is linear in Q).",
                                "lshdist one process; the 2-worker distributed run at 1 M was "
                                "not measured here."],
                         extra={})


if __name__ == "__main__":
    main()
