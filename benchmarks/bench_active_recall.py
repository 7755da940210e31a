"""Hashed hyperplane search on the active-learning pool (issue 13): recall of the true 10
points nearest each hyperplane, and the margin of the nearest candidate, against a random
candidate set of the same size.

Pool: the 60,000 Fashion-MNIST training images scaled to [0, 1] (784-d), or the 11,293 20
Newsgroups training documents (tf-idf, sparse) with ``BENCH_DATA=news``.  Hyperplanes: binary
one-vs-all ``LinearSVC`` (class_weight balanced, C=1) of every class trained on 5 labelled
images per class plus ``EXTRA`` random ones (the SVMs of an active-learning run).  Settings:
H-Hash with and without centring the keys on the pool mean (dense only), bits ``BENCH_BITS``;
candidates from the permutation lists, M lists x W window (``BENCH_MW``, e.g. ``16x16`` = up
to 512 candidates re-ranked), and from mode "rank" (every key's angle score, ``RANK`` = 500
rows re-ranked; ``BENCH_SEARCH=lists,rank``).  Exhaustive: one float32 product with the pool
(dense) or the CSR pool (sparse) and the argmin of |wx + b|, per hyperplane.  Timing: per
hyperplane ``BENCH_REPS`` (15) pairs, exhaustive and hashed, the order alternating from pair to
pair (ABBA); the medians of each
and the median (and 25-75th percentiles) of the per-pair speedups are reported.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_active_recall.py

The SVMs see the rows at unit RMS norm as `lshdist active`'s do (``BENCH_SVM_SCALE=none``:
as given, the hyperplanes of the earlier results); centred keys hash the bias constant at
the centred rows' RMS norm (`HyperplaneIndex`'s default).

``BENCH_NAME`` names the results file (default ``active_recall_{BENCH_DATA}``).
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import os
import time

import numpy as np
from sklearn.svm import LinearSVC

from lshdist.blocks import SparseBlock
from lshdist.datasets import load_fashion_mnist, load_newsgroups
from lshdist.index.hyperplane import HyperplaneIndex

DATA = os.environ.get("BENCH_DATA", "fashion")
BITS = tuple(int(b) for b in os.environ.get("BENCH_BITS", "64,256").split(","))
MW = tuple(tuple(int(v) for v in s.split("x"))
           for s in os.environ.get("BENCH_MW", "16x16").split(","))
FAMILIES = tuple(os.environ.get("BENCH_FAMILIES", "h-hash").split(","))
SEARCH = tuple(os.environ.get("BENCH_SEARCH", "lists,rank").split(","))
CENTRES = tuple(c == "1" for c in os.environ.get("BENCH_CENTRE", "1,0").split(","))
RANK = 500
EXTRA = int(os.environ.get("EXTRA", "100"))
REPS = int(os.environ.get("BENCH_REPS", "15"))  # alternated timing pairs per hyperplane
K = 10
SVM_SCALE = os.environ.get("BENCH_SVM_SCALE", "rms")


def hyperplanes(X, y, rng):
    """Binary one-vs-all LinearSVCs as `lshdist active` fits them: rows scaled by one factor to
    unit RMS norm (``BENCH_SVM_SCALE=none``: as given), normals returned in the rows' units."""
    rows = np.concatenate([rng.choice(np.flatnonzero(y == c), 5, replace=False)
                           for c in np.unique(y)] + [rng.choice(len(y), EXTRA, replace=False)])
    Xr = X.matrix[rows] if isinstance(X, SparseBlock) else X[rows]
    if SVM_SCALE == "rms":
        sq = (X.row_norms_sq().mean() if isinstance(X, SparseBlock)
              else float(np.einsum("ij,ij->", X, X, dtype=np.float64)) / len(X))
        s = 1.0 / np.sqrt(sq)
    else:
        s = 1.0
    out = []
    for c in np.unique(y):
        clf = LinearSVC(class_weight="balanced", dual="auto", max_iter=5000).fit(Xr * s,
                                                                                y[rows] == c)
        out.append((s * clf.coef_.ravel().astype(np.float64), float(clf.intercept_[0])))
    return out


def margins(X, w, b):
    p = X.matrix @ w if isinstance(X, SparseBlock) else X.astype(np.float64) @ w
    return np.abs(np.asarray(p).ravel() + b) / np.linalg.norm(w)


def query_rows(X, w):
    if not isinstance(X, SparseBlock):
        return w[None, :]
    nz = np.flatnonzero(w)
    return SparseBlock.from_arrays(np.array([0, len(nz)]), X.features[nz], w[nz])


def main():
    split = load_fashion_mnist() if DATA == "fashion" else load_newsgroups()
    X = split.X_train if DATA != "fashion" else (split.X_train / 255.0).astype(np.float32)
    y = split.y_train
    rng = np.random.default_rng(0)
    planes = hyperplanes(X, y, rng)
    exact = [margins(X, w, b) for w, b in planes]
    truth = [np.argsort(m, kind="stable")[:K] for m in exact]
    rows = []
    centres = CENTRES if not isinstance(X, SparseBlock) else (False,)
    Xf = X.matrix if isinstance(X, SparseBlock) else X

    def exhaustive(w, b):  # the exhaustive selection as a user writes it (float32 for dense)
        wf = w if isinstance(X, SparseBlock) else w.astype(np.float32)
        return np.abs(Xf @ wf + b).argmin()
    for fam in FAMILIES:
        for bits in BITS:
            for center in centres:
                t0 = time.perf_counter()
                idx = HyperplaneIndex(family=fam, bits=bits, n_permutations=MW[0][0],
                                      window=MW[0][1], bias=True, center=center).fit(X)
                build = time.perf_counter() - t0
                searches = ([("lists", M, W) for M, W in MW if "lists" in SEARCH]
                             + ([("rank", 0, 0)] if "rank" in SEARCH else []))
                for search, M, W in searches:
                    kw = {"mode": "rank", "candidates": RANK} if search == "rank" else {}
                    if search == "lists":
                        idx.index_.window = W  # the same lists, another window
                    rec, top, rnd_rec, rnd_top, scanned, secs, ex_secs = ([] for _ in range(7))
                    for (w, b), m, t in zip(planes, exact, truth):
                        exhaustive(w, b)
                        idx.query(query_rows(X, w), K, offsets=np.array([b]), **kw)  # warm
                        for rep in range(REPS):  # paired; the order alternates (ABBA)
                            for which in ((0, 1) if rep % 2 == 0 else (1, 0)):
                                t0 = time.perf_counter()
                                if which == 0:
                                    exhaustive(w, b)
                                    ex_secs.append(time.perf_counter() - t0)
                                else:
                                    _, ids = idx.query(query_rows(X, w), K,
                                                       offsets=np.array([b]), **kw)
                                    secs.append(time.perf_counter() - t0)
                        n = int(idx.stats_["reranked"][0])
                        scanned.append(n)
                        rec.append(len(np.intersect1d(ids[0], t)) / K)
                        top.append(m[ids[0, 0]])
                        r = rng.choice(len(m), n, replace=False)
                        rnd_rec.append(len(np.intersect1d(r, t)) / K)
                        rnd_top.append(m[r].min())
                    ratio = np.array(ex_secs) / np.array(secs)
                    rows.append({"family": fam, "bits": bits, "centred": center,
                                 "search": "rank" if search == "rank" else f"lists {M}x{W}",
                                 "re-ranked": np.mean(scanned),
                                 "recall@10": np.mean(rec), "random recall@10": np.mean(rnd_rec),
                                 "nearest margin": np.mean(top),
                                 "random nearest margin": np.mean(rnd_top),
                                 "true nearest margin": np.mean([m.min() for m in exact]),
                                 "query ms": 1e3 * np.median(secs),
                                 "exhaustive ms": 1e3 * np.median(ex_secs),
                                 "speedup": np.median(ratio),
                                 "speedup 25-75 %": "{:.1f}-{:.1f}".format(
                                     *np.percentile(ratio, [25, 75])),
                                 "build s": build})
                    print(rows[-1], flush=True)
    common.write_results(os.environ.get("BENCH_NAME", f"active_recall_{DATA}"), {"recall": rows},
                         title=f"Hyperplane search recall on the active-learning pool ({DATA})")


if __name__ == "__main__":
    main()
