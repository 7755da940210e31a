"""Which key bits a permuted prefix reads: recall of the lists drawn three ways, same grid.

* ``random``: 64 uniformly random distinct bits of the b-bit key per list (the first draw);
* ``blocked`` (`lshdist.index.permutation.draw_positions`, the default): 8 whole key bytes per
  list, the lists of a block of b/64 on disjoint bytes, the 64 bits in random order in the
  prefix — 8 byte-table lookups per row instead of ~42;
* ``grouped``: 8 whole random bytes with each byte's bits kept together (tried
  and withdrawn: the leading 8 bits of a list are one key byte).

Per dataset (its test split's first ``BENCH_QUERIES`` rows as queries, the L2 metric: explicit
identity for Letter and Fashion-MNIST, the kernelized identity over 300 basis rows for
20 Newsgroups), seeds 0..``BENCH_SEEDS``-1: one index per draw and seed (b = 512, M = the
grid's largest), recall@10 against the exact scan at three fixed (M, W, H) points, and the
seconds to build the lists (prefixes + sorts, 2 threads).  Reported: mean and standard
deviation over the seeds.

    cd /work/main && .venv/bin/python benchmarks/bench_positions.py        # BENCH_DATA=letter,...
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import os
import statistics
import time

import numpy as np

import lshdist.index.permutation as permutation
from lshdist.blocks import as_block, take_rows
from lshdist.datasets import load_fashion_mnist, load_letter, load_newsgroups
from lshdist.evaluation import recall_at_k
from lshdist.hashing.families import family_for
from lshdist.index.searcher import MetricIndex, encode
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric

SEEDS = int(os.environ.get("BENCH_SEEDS", "5"))
QUERIES = int(os.environ.get("BENCH_QUERIES", "2000"))
DATA = os.environ.get("BENCH_DATA", "letter,fashion,news").split(",")
K = 10
GRIDS = {"letter": [(16, 4, 40), (32, 8, 40), (64, 8, 80)],
         "fashion": [(64, 8, 160), (128, 16, 160), (128, 8, 80)],
         "news": [(128, 32, 1100), (128, 16, 500), (64, 32, 1100)]}


def draw_random(rng, bits, M):
    L = min(64, bits)
    return np.stack([rng.permutation(bits)[:L] for _ in range(M)]).astype(np.int64)


def draw_grouped(rng, bits, M):
    return np.stack([np.concatenate([8 * b + rng.permutation(8)
                                     for b in rng.permutation(bits // 8)[:8]])
                     for _ in range(M)]).astype(np.int64)


DRAWS = {"random": draw_random, "blocked": permutation.draw_positions, "grouped": draw_grouped}


def load(name):
    if name == "letter":
        Xtr, _, Xte, _ = load_letter()
        return Xtr, Xte[:QUERIES], ExplicitMetric.identity(Xtr.shape[1], center=Xtr.mean(0))
    if name == "fashion":
        Xtr, _, Xte, _ = load_fashion_mnist()
        return Xtr, Xte[:QUERIES], ExplicitMetric.identity(Xtr.shape[1], center=Xtr.mean(0))
    Xtr, _, Xte, _ = load_newsgroups()
    B = as_block(Xtr)
    met = ImplicitMetric.identity(take_rows(B, np.arange(300)), d=0)
    return Xtr, take_rows(as_block(Xte), np.arange(QUERIES)), met


def main():
    common.pin_threads()
    rows, raw = [], []
    for name in DATA:
        Xtr, Xq, met = load(name)
        grid = GRIDS[name]
        _, truth = MetricIndex(met).fit(Xtr, n_threads=2).query(Xq, K, mode="scan", n_threads=2)
        m_max = max(g[0] for g in grid)
        per = {d: [] for d in DRAWS}
        for seed in range(SEEDS):
            for draw, fn in DRAWS.items():
                permutation.draw_positions = fn
                try:
                    fam = family_for(met, bits=512, seed=seed, learned=True)
                    codes, payload = encode(met, fam, Xtr)
                    t0 = time.perf_counter()
                    pix = permutation.PermutationIndex(n_permutations=m_max, seed=seed).fit(
                        codes, 512, payload, n_threads=2)
                    lists_s = time.perf_counter() - t0
                finally:
                    permutation.draw_positions = DRAWS["blocked"]
                qc, qp = encode(met, fam, Xq, query=True)
                rec = []
                for m, w, h in grid:
                    _, ids, _ = pix.search(qc, qp, K, n_threads=2, n_permutations=m, window=w,
                                           hamming_keep=h)
                    rec.append(recall_at_k(ids, truth, K))
                per[draw].append((lists_s, *rec))
                raw.append({"data": name, "draw": draw, "seed": seed, "lists s": lists_s,
                            **{f"M={m} W={w} H={h}": r for (m, w, h), r in zip(grid, rec)}})
                print(name, draw, seed, round(lists_s, 3), *[round(r, 4) for r in rec],
                      flush=True)
        for draw, vals in per.items():
            row = {"data": name, "draw": draw}
            labels = ["lists s"] + [f"recall point {j + 1}" for j in range(len(grid))]
            for j, label in enumerate(labels):
                col = [v[j] for v in vals]
                sd = statistics.stdev(col) if len(col) > 1 else 0.0
                row[label] = f"{statistics.mean(col):.4f} ± {sd:.4f}"
            rows.append(row)
    notes = [f"points per dataset (M, W, H): {GRIDS}", f"{SEEDS} seeds, {QUERIES} queries, "
             f"b = 512, k = {K}, 2 threads"]
    common.write_results(os.environ.get("BENCH_NAME", "prefix_positions"),
                         {"recall by draw (mean ± sd over seeds)": rows, "runs": raw},
                         title="Prefix positions: random bits vs blocked whole bytes",
                         notes=notes)


if __name__ == "__main__":
    main()
