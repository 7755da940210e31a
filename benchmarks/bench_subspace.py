"""Subspace-partition index (RSSH) vs the permutation index and FAISS ITQ+LSH on Fashion-MNIST.

60,000 database rows, L2, one process, 2 threads; queries: the first 1,000 and the first 10,000
test images (``BENCH_QUERIES``, comma-separated).  For r in {8, 16, 32, 48, 64, 96, 128} bits
(``BENCH_BITS``):

* `SubspaceIndex(rank=RANK, bits=r)` (alpha estimated per round) re-ranks ``CANDIDATES`` group
  members per query;
* the permutation index (`MetricIndex`, Charikar bits through the data mean, r bits, M=32
  lists, W=16) keeps as many candidates by Hamming distance (``hamming_keep``) before its exact
  re-rank: equal re-ranked count (the measured mean counts are in the table);
* FAISS ``ITQ{r},LSH`` (PCA to r dimensions, ITQ rotation, r sign bits — the learned-hashing
  peer) with an exact re-rank of the same number of candidates (``IndexRefineFlat``, k_factor
  = candidates / k): equal bits, equal re-ranked count.

Recall@1/10/25 against the exact scan (ties by id), 1-NN accuracy on the labels, build and
query seconds (one run each, not paired rounds).  Also the partition's rounds and group sizes
at n = 7,500 / 15,000 / 30,000 / 60,000 (the O(log n) round count), and a plot like the
paper's Fig. 3 (recall@10 against bits) in ``results/subspace_fashion.png``.

    cd /work/main && .venv/bin/python benchmarks/bench_subspace.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import os
import time

import numpy as np

from lshdist.datasets import load_fashion_mnist
from lshdist.index.payload import DensePayload
from lshdist.index.scan import scan_topk
from lshdist.index.searcher import MetricIndex
from lshdist.index.subspace import SubspaceIndex
from lshdist.metric.learned import ExplicitMetric

KS = (1, 10, 25)
BITS = tuple(int(b) for b in os.environ.get("BENCH_BITS", "8,16,32,48,64,96,128").split(","))
RANK = int(os.environ.get("BENCH_RANK", "32"))
CANDIDATES = int(os.environ.get("BENCH_CANDIDATES", "600"))
QUERIES = [int(q) for q in os.environ.get("BENCH_QUERIES", "1000,10000").split(",")]
GROWTH = (7_500, 15_000, 30_000, 60_000)


def recall(I, It, k):
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(I, It)]))


def row(system, bits, I, It, reranked, yq, ytr, build, query):
    out = {"system": system, "queries": len(I), "bits": bits,
           "re-ranked / query": round(float(reranked), 1),
           "fraction": round(float(reranked) / len(ytr), 4)}
    for k in KS:
        out[f"recall@{k}"] = round(recall(I, It, k), 4)
    out["1-NN acc"] = round(float(np.mean(ytr[I[:, 0]] == yq)), 4)
    out["build s"] = round(build, 2)
    out["query s"] = round(query, 2)
    return out


def faiss_itq(faiss, Xtr, Xq, bits: int, k: int, candidates: int):
    """FAISS ITQ{bits},LSH with an exact refine over ``candidates`` rows per query."""
    d = Xtr.shape[1]
    t0 = time.perf_counter()
    base = faiss.index_factory(d, f"ITQ{bits},LSH")
    ix = faiss.IndexRefineFlat(base)
    ix.k_factor = max(1.0, candidates / k)
    ix.train(Xtr)
    ix.add(Xtr)
    t1 = time.perf_counter()
    _, I = ix.search(Xq, k)
    return I.astype(np.int64), t1 - t0, time.perf_counter() - t1


def growth(Xtr) -> list[dict]:
    """Rounds and group sizes of the partition on the first n rows, n growing."""
    out = []
    for n in GROWTH:
        t0 = time.perf_counter()
        ix = SubspaceIndex(rank=RANK, bits=32, n_candidates=CANDIDATES, seed=0).fit(Xtr[:n])
        sizes = ix.group_sizes_
        out.append({"n": n, "rounds": len(ix.rounds_), "log2 n": round(float(np.log2(n)), 2),
                    "groups": len(sizes), "largest group": max(sizes),
                    "smallest group": min(sizes), "build s": round(time.perf_counter() - t0, 2)})
        print(out[-1], flush=True)
    return out


def main():
    import faiss

    common.pin_threads(common.N_THREADS)
    split = load_fashion_mnist(common.data_dir())
    Xtr, ytr = np.asarray(split.X_train, np.float32), np.asarray(split.y_train)
    nq = max(QUERIES)
    Xq_all, yq_all = np.asarray(split.X_test, np.float32)[:nq], np.asarray(split.y_test)[:nq]
    _, It_all = scan_topk(DensePayload(Xtr), DensePayload(Xq_all), max(KS))
    K = max(KS)
    rows, partition = [], {}
    metric = ExplicitMetric.identity(Xtr.shape[1], center=Xtr.mean(axis=0))
    for bits in BITS:
        t0 = time.perf_counter()
        ix = SubspaceIndex(rank=RANK, bits=bits, n_candidates=CANDIDATES, seed=0).fit(Xtr)
        t_sub = time.perf_counter() - t0
        partition[bits] = {"group sizes": ix.group_sizes_, "rounds": len(ix.rounds_)}
        t0 = time.perf_counter()
        pm_fit = None
        for nqi in QUERIES:
            Xq, yq, It = Xq_all[:nqi], yq_all[:nqi], It_all[:nqi]
            t1 = time.perf_counter()
            _, I = ix.query(Xq, K)
            t2 = time.perf_counter()
            reranked = ix.stats_["reranked"].mean()
            rows.append(row("subspace (RSSH)", bits, I, It, reranked, yq, ytr, t_sub, t2 - t1))
            print(rows[-1], flush=True)
            if pm_fit is None:  # the permutation index keeps the 1,000-query re-ranked count
                t0 = time.perf_counter()
                pm_fit = MetricIndex(metric, bits=bits, n_permutations=32, window=16,
                                     hamming_keep=round(reranked), seed=0).fit(Xtr)
                t_pm = time.perf_counter() - t0
                keep = round(reranked)
            t1 = time.perf_counter()
            _, I = pm_fit.query(Xq, K, mode="hash")
            t2 = time.perf_counter()
            rows.append(row("permutation", bits, I, It, pm_fit.stats_["reranked"].mean(), yq,
                            ytr, t_pm, t2 - t1))
            print(rows[-1], flush=True)
            I, tb, tq = faiss_itq(faiss, Xtr, Xq, bits, K, keep)
            rows.append(row("FAISS ITQ+LSH (refine)", bits, I, It, keep, yq, ytr, tb, tq))
            print(rows[-1], flush=True)
    grow = growth(Xtr)
    notes = [
        f"SubspaceIndex(rank={RANK}, bits=r, alpha=None (median/sqrt2 per round), eta=0.1, "
        f"n_probe=1, n_candidates={CANDIDATES}); the permutation index with r Charikar bits "
        "through the data mean, M=32, W=16, hamming_keep = the subspace index's mean re-ranked "
        "count on 1,000 queries; FAISS index_factory('ITQ{r},LSH') (PCA + ITQ rotation + r "
        "sign bits) inside IndexRefineFlat with k_factor = that count / 25 (exact re-rank of "
        "the same number of rows).",
        f"Queries: the first {', '.join(map(str, QUERIES))} test images; one run, times are "
        "indicative only; 2 threads.",
        "Growth: rounds of the partition (rank, r = 32) on the first n training rows.",
    ]
    _, m = common.write_results("subspace_fashion", {"recall": rows, "rounds by n": grow},
                                title=("Fashion-MNIST: subspace-partition index vs permutation "
                                       "index vs FAISS ITQ+LSH at equal bits and re-ranked "
                                       "count"), notes=notes, peer_modules=("faiss",),
                                extra={"partition": partition})
    plot(rows)
    print(m.read_text())


def plot(rows) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qs = sorted({r["queries"] for r in rows})
    fig, axes = plt.subplots(1, len(qs), figsize=(5.2 * len(qs), 4), squeeze=False)
    for ax, nq in zip(axes[0], qs):
        for system in dict.fromkeys(r["system"] for r in rows):
            pts = sorted((r["bits"], r["recall@10"]) for r in rows if r["queries"] == nq
                         and r["system"] == system)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=system)
        ax.set_xlabel("bits r")
        ax.set_ylabel("recall@10")
        ax.set_title(f"Fashion-MNIST, {nq:,} queries, equal re-ranked count")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(common.RESULTS_DIR / "subspace_fashion.png", dpi=110)


if __name__ == "__main__":
    main()
