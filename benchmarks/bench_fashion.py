"""k-NN search on Fashion-MNIST (60,000 database x 10,000 queries, 784-d, k=10, L2), 2 threads.

lshdist's one-process `MetricIndex` with no tuning flags but the target recall
(``MetricIndex(ExplicitMetric.identity(784, center=mean), target_recall=0.9)``: M, W and H are
calibrated inside ``fit``; ``query(Xte, 10)`` answers in the calibrated mode) against, in the
same run and on the same vectors:

* FAISS ``IndexFlatL2`` (exact; also the ground truth, computed once before anything else),
* FAISS ``IVFFlat`` (train + add + search; nlist in {sqrt N, 2 sqrt N, 4 sqrt N} x nprobe in
  {1, 2, 4, 8, 16} swept once, the best total at recall@10 >= 0.9 enters the paired runs),
* hnswlib (M=16, ef_construction=200; ef swept on one build, the first ef reaching 0.9),
* FAISS ``IndexLSH`` (exhaustive Hamming, no re-rank; bits swept, the best recall enters).

Timing: after a warm-up round, ``BENCH_ROUNDS`` (default 3) paired rounds; each round runs every
system once (build + query from scratch), in alternating order; per round the ratio peer total /
lshdist total; reported: medians and the ratios' median [min-max].  numba compilation is
measured on a small cold-cache warm-up and reported apart.  2 threads everywhere.

    cd /work/main && .venv/bin/python benchmarks/bench_fashion.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import math
import os
import time

import numpy as np

import faiss
import hnswlib

from lshdist.datasets import load_fashion_mnist
from lshdist.evaluation import recall_at_k
from lshdist.index.searcher import MetricIndex
from lshdist.metric.learned import ExplicitMetric

K = 10
TARGET = 0.90
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
NPROBES = [1, 2, 4, 8, 16]
IVF_TRAIN_PER_LIST = 40  # training rows per inverted list (faiss warns below 39)
LSH_BITS = [256, 512, 1024, 2048]
HNSW_M, HNSW_EFC = 16, 200
HNSW_EFS = [10, 12, 16, 20, 24, 32, 48, 64]


def main():
    t_start = time.perf_counter()
    T = common.N_THREADS
    pinned = common.pin_threads(T)
    Xtr, _ytr, Xte, _yte = load_fashion_mnist()  # honours LSHDIST_DATA_DIR
    N, Q, d = len(Xtr), len(Xte), Xtr.shape[1]
    print(f"Fashion-MNIST database {Xtr.shape}, queries {Xte.shape}, k={K}, threads {pinned}, "
          f"load {common.loadavg()}", flush=True)

    # ------------------------------------------------ ground truth: FAISS flat, once
    def flat_job():
        return common.faiss_flat(faiss, Xtr, Xte, K)

    tb, tq, I_true = flat_job()
    print(f"ground truth: FAISS IndexFlatL2 {tb + tq:.2f} s", flush=True)

    def rec(ids):
        return recall_at_k(np.asarray(ids, np.int64), I_true, K)

    # ------------------------------------------------ lshdist: numba compile, reported apart
    met = ExplicitMetric.identity(d, center=Xtr.mean(0))

    def lsh_small():
        t0 = time.perf_counter()
        ix = MetricIndex(met, target_recall=TARGET).fit(Xtr[:2000], n_threads=T)
        ix.query(Xte[:20], K, n_threads=T)
        return time.perf_counter() - t0

    t_cold = lsh_small()
    t_warm = lsh_small()
    compile_rows = [{"stage": "MetricIndex(target_recall=0.9) fit 2,000 rows + query 20",
                     "first call s (cold cache)": t_cold, "second call s": t_warm,
                     "compile ≈ s": t_cold - t_warm}]
    print(f"lshdist numba compile (cold cache) ≈ {t_cold - t_warm:.2f} s", flush=True)

    def lsh_job():
        t0 = time.perf_counter()
        ix = MetricIndex(met, target_recall=TARGET).fit(Xtr, n_threads=T)
        tb = time.perf_counter() - t0
        _, ids = ix.query(Xte, K, n_threads=T)
        tq = time.perf_counter() - t0 - tb
        # fit defers calibration; the bulk query calibrated on a sample of itself (inside tq)
        cal = getattr(ix, "query_calibration_", None) or ix.calibration_
        p = cal.chosen
        return {"build s": tb, "query s": tq, "total s": tb + tq, "recall@10": rec(ids),
                "calibration s": cal.seconds, "calibration / total": cal.seconds / (tb + tq),
                "mode": ix.last_mode_,
                "setting": (f"M={p.permutations}, W={p.window}, H={p.hamming_keep}" if p
                            else "exact scan"),
                "% searched": (100 * float(ix.stats_["reranked"].mean()) / N
                               if ix.last_mode_ == "hash" else 100.0),
                "calibrated recall": p.recall if p else None}

    # ------------------------------------------------ FAISS IVFFlat sweep (selection, once)
    train_order = np.random.default_rng(0).permutation(N)

    def ivf_build(nlist):
        quant = faiss.IndexFlatL2(d)
        ix = faiss.IndexIVFFlat(quant, d, nlist)
        ix.train(Xtr[np.sort(train_order[:min(N, IVF_TRAIN_PER_LIST * nlist)])])
        ix.add(Xtr)
        return ix

    ivf_rows = []
    for f in (1, 2, 4):
        nlist = int(f * math.sqrt(N))
        t0 = time.perf_counter()
        ix = ivf_build(nlist)
        t_b = time.perf_counter() - t0
        for nprobe in NPROBES:
            ix.nprobe = nprobe
            t0 = time.perf_counter()
            _, ids = ix.search(Xte, K)
            t_q = time.perf_counter() - t0
            r = rec(ids)
            ivf_rows.append({"nlist": nlist, "nprobe": nprobe, "recall@10": r,
                             "train+add s": t_b, "search s": t_q, "total s": t_b + t_q})
            print(f"IVFFlat nlist={nlist} nprobe={nprobe}: recall {r:.4f}, train+add {t_b:.2f} "
                  f"s, search {t_q:.2f} s", flush=True)
        del ix
    ivf_ok = [r for r in ivf_rows if r["recall@10"] >= TARGET]
    ivf_best = min(ivf_ok, key=lambda r: r["total s"]) if ivf_ok else max(
        ivf_rows, key=lambda r: r["recall@10"])

    def ivf_job(nlist=ivf_best["nlist"], nprobe=ivf_best["nprobe"]):
        t0 = time.perf_counter()
        ix = ivf_build(nlist)
        tb = time.perf_counter() - t0
        ix.nprobe = nprobe
        _, ids = ix.search(Xte, K)
        tq = time.perf_counter() - t0 - tb
        return {"build s": tb, "query s": tq, "total s": tb + tq, "recall@10": rec(ids)}

    # ------------------------------------------------ hnswlib sweep (one build, ef swept)
    def hnsw_build():
        ix = hnswlib.Index(space="l2", dim=d)
        ix.init_index(max_elements=N, M=HNSW_M, ef_construction=HNSW_EFC, random_seed=100)
        ix.set_num_threads(T)
        ix.add_items(Xtr, np.arange(N), num_threads=T)
        return ix

    t0 = time.perf_counter()
    hix = hnsw_build()
    t_hb = time.perf_counter() - t0
    hnsw_rows = []
    for ef in HNSW_EFS:
        hix.set_ef(ef)
        t0 = time.perf_counter()
        ids, _ = hix.knn_query(Xte, k=K, num_threads=T)
        t_q = time.perf_counter() - t0
        r = rec(ids)
        hnsw_rows.append({"ef": ef, "recall@10": r, "build s": t_hb, "query s": t_q,
                          "total s": t_hb + t_q})
        print(f"hnswlib ef={ef}: recall {r:.4f}, build {t_hb:.2f} s, query {t_q:.3f} s",
              flush=True)
    del hix
    hnsw_ok = [r for r in hnsw_rows if r["recall@10"] >= TARGET]
    hnsw_ef = (hnsw_ok[0] if hnsw_ok else hnsw_rows[-1])["ef"]

    def hnsw_job(ef=hnsw_ef):
        t0 = time.perf_counter()
        ix = hnsw_build()
        tb = time.perf_counter() - t0
        ix.set_ef(ef)
        ids, _ = ix.knn_query(Xte, k=K, num_threads=T)
        tq = time.perf_counter() - t0 - tb
        return {"build s": tb, "query s": tq, "total s": tb + tq, "recall@10": rec(ids)}

    # ------------------------------------------------ FAISS IndexLSH sweep
    def lsh_faiss_build(nbits):
        ix = faiss.IndexLSH(d, nbits, True, False)
        ix.add(Xtr)
        return ix

    flsh_rows = []
    for nbits in LSH_BITS:
        t0 = time.perf_counter()
        ix = lsh_faiss_build(nbits)
        t_b = time.perf_counter() - t0
        _, ids = ix.search(Xte, K)
        t_q = time.perf_counter() - t0 - t_b
        r = rec(ids)
        flsh_rows.append({"nbits": nbits, "recall@10": r, "build s": t_b, "query s": t_q,
                          "total s": t_b + t_q})
        print(f"IndexLSH {nbits} bits: recall {r:.4f}, build {t_b:.2f} s, query {t_q:.2f} s",
              flush=True)
        del ix
    flsh_ok = [r for r in flsh_rows if r["recall@10"] >= TARGET]
    flsh_bits = (min(flsh_ok, key=lambda r: r["total s"]) if flsh_ok
                 else max(flsh_rows, key=lambda r: r["recall@10"]))["nbits"]

    def flsh_job(nbits=flsh_bits):
        t0 = time.perf_counter()
        ix = lsh_faiss_build(nbits)
        tb = time.perf_counter() - t0
        _, ids = ix.search(Xte, K)
        tq = time.perf_counter() - t0 - tb
        return {"build s": tb, "query s": tq, "total s": tb + tq, "recall@10": rec(ids)}

    def flat_round():
        tb, tq, ids = flat_job()
        return {"build s": tb, "query s": tq, "total s": tb + tq, "recall@10": rec(ids)}

    # ------------------------------------------------ paired alternated rounds
    names = {
        "lshdist": ("lshdist MetricIndex(target_recall=0.9), query auto", lsh_job),
        "flat": ("FAISS IndexFlatL2 (exact)", flat_round),
        "ivf": ("FAISS IVFFlat (train + add + search)", ivf_job),
        "hnsw": (f"hnswlib (M={HNSW_M}, efC={HNSW_EFC}), build + query", hnsw_job),
        "flsh": ("FAISS IndexLSH (no re-rank)", flsh_job),
    }
    print(f"paired rounds: 1 warm-up + {ROUNDS}", flush=True)
    paired = common.paired_rounds({k: v[1] for k, v in names.items()}, "lshdist", ROUNDS, 1)
    summ = common.paired_summary(paired["runs"], "lshdist")
    lsh_runs = [r["lshdist"] for r in paired["runs"]]
    settings = {
        "lshdist": "; ".join(sorted({r["setting"] + f" ({r['mode']})" for r in lsh_runs})),
        "flat": "–",
        "ivf": f"nlist={ivf_best['nlist']}, nprobe={ivf_best['nprobe']}",
        "hnsw": f"ef={hnsw_ef}" + ("" if hnsw_ok else " (never reached 0.9)"),
        "flsh": f"{flsh_bits} bits" + ("" if flsh_ok else
                                       f" (best recall; none of {LSH_BITS} reaches 0.9)"),
    }
    summary = []
    for key, (label, _) in names.items():
        s = summ[key]
        summary.append({"system": label, "setting": settings[key], "recall@10": s["recall@10"],
                        "build s": s["build s"], "query s": s["query s"],
                        "total s": s["total s"],
                        "peer / lshdist (median [min–max])": common.fmt_ratio(s),
                        "runs total s": ", ".join(f"{v:.2f}" for v in s["runs total s"])})
    cal_frac = [r["calibration / total"] for r in lsh_runs]
    cal_rows = [{"round": i + 1, "build s": r["build s"], "query s": r["query s"],
                 "calibration s (in query)": r["calibration s"],
                 "calibration / total": r["calibration / total"],
                 "setting": r["setting"], "calibrated recall": r["calibrated recall"],
                 "recall@10 (10,000 test queries)": r["recall@10"],
                 "% searched": r["% searched"]}
                for i, r in enumerate(lsh_runs)]
    cal_med = float(np.median(cal_frac))
    flat_ratio = summ["flat"]["ratio median"]
    ivf_ratio = summ["ivf"]["ratio median"]
    acceptance = [
        {"item": "lshdist build + query no slower than FAISS IVFFlat's best total at 0.9",
         "measured": f"IVF / lshdist = {common.fmt_ratio(summ['ivf'])}",
         "verdict": "met" if ivf_ratio >= 1 else "MISSED"},
        {"item": "(information) calibration (on the queries, in the query time) / lshdist total",
         "measured": f"{100 * cal_med:.1f} % (median; rounds "
                     + ", ".join(f"{100 * v:.1f}" for v in cal_frac) + ")",
         "verdict": "–"},
        {"item": "lshdist recall@10 >= 0.9",
         "measured": f"{summ['lshdist']['recall@10']:.4f}",
         "verdict": "met" if summ["lshdist"]["recall@10"] >= TARGET else "MISSED"},
        {"item": "(information) FAISS flat / lshdist", "measured": common.fmt_ratio(summ["flat"]),
         "verdict": "lshdist faster" if flat_ratio > 1 else "FAISS flat faster"},
    ]
    warm = paired["warmup"][0]
    warm_rows = [{"system": names[k][0], "total s": v["total s"], "load": v["load"]}
                 for k, v in warm.items()]
    print(common.md_table(summary))
    print(common.md_table(acceptance))
    notes = [
        f"Ground truth: FAISS IndexFlatL2, computed once before anything else; recall@10 = mean "
        f"over the {Q:,} queries of |ids ∩ true ids| / 10.",
        f"Paired rounds: 1 warm-up round then {ROUNDS} rounds; every round builds and queries "
        "every system from scratch, in the order lshdist, flat, IVF, hnswlib, IndexLSH on even "
        "rounds and reversed on odd ones; 'peer / lshdist' is that round's peer total divided "
        "by lshdist's total in the same round: median [min–max] over rounds. 'load' is the "
        "1-minute load average after each run (in the JSON).",
        f"Threads: {T} everywhere (OMP/MKL/OPENBLAS/NUMBA env vars before numpy, "
        "faiss.omp_set_num_threads, hnswlib set_num_threads + num_threads=, MetricIndex "
        f"fit/query n_threads={T}).",
        "lshdist: `MetricIndex(ExplicitMetric.identity(784, center=Xtr.mean(0)), "
        "target_recall=0.9)`, no other parameter; build = `fit(Xtr)` (hash, 128 lists, "
        "encode + 128 lists; calibration is deferred to the first query); query = "
        "`query(Xte, 10)` (mode auto: a bulk query set of >= 4,000 rows is calibrated on a "
        "200-query sample of itself — exact truth, recall grid, timed search and scan — and "
        "answered at the point chosen; that cost is inside the query time). 'calibration s' "
        "is `query_calibration_.seconds`.",
        "IVFFlat: nlist = int(f·sqrt(N)) for f in 1, 2, 4, trained on the first 40·nlist rows "
        "of a seeded permutation (faiss default k-means), add all 60,000 rows; each nlist "
        "trained once for the sweep (one run per point, used only to pick the setting); the "
        "cheapest total at recall >= 0.9 then runs in the paired rounds.",
        "hnswlib: space 'l2', random_seed=100; ef swept on one build (sweep table), the first "
        "ef reaching 0.9 runs build + query in the paired rounds.",
        "FAISS IndexLSH: `IndexLSH(784, nbits, rotate_data=True, train_thresholds=False)`, "
        "ranking by Hamming distance only (no re-rank); it never reaches 0.9, the row shows "
        "the best-recall setting.",
        "numba compile: fit 2,000 rows + 20 queries with a cold cache minus the same call "
        "warm; not in any steady-state figure.",
    ]
    tables = {
        f"Summary: paired rounds at recall@10 >= {TARGET} (k={K}, {T} threads, "
        f"median of {ROUNDS})": summary,
        "Acceptance": acceptance,
        "lshdist per round: calibration share, chosen point": cal_rows,
        "FAISS IVFFlat sweep (one run per point)": ivf_rows,
        f"hnswlib sweep (M={HNSW_M}, ef_construction={HNSW_EFC}, one build)": hnsw_rows,
        "FAISS IndexLSH sweep (one run per point)": flsh_rows,
        "Warm-up round (not counted)": warm_rows,
        "lshdist numba compilation (reported apart, cold cache)": compile_rows,
    }
    j, m = common.write_results(
        os.environ.get("BENCH_NAME", "fashion_mnist_knn"), tables,
        title="k-NN search on Fashion-MNIST: lshdist (calibrated) vs FAISS vs hnswlib",
        notes=notes, peer_modules=("faiss", "hnswlib"),
        extra={"paired": paired, "summary": summ, "loadavg_during": [
            v["load"] for r in paired["runs"] for v in r.values()]})
    print(f"wrote {j} and {m}; total {time.perf_counter() - t_start:.0f} s; load "
          f"{common.loadavg()}")


if __name__ == "__main__":
    main()
