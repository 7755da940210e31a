"""Hashed hyperplane search on the active-learning pool: recall of the true 10
points nearest each hyperplane, and the margin of the nearest candidate, against a random
candidate set of the same size.

Pool: the 60,000 Fashion-MNIST training images scaled to [0, 1] (784-d), or the 11,293 20
Newsgroups training documents (tf-idf, sparse) with ``BENCH_DATA=news``; ``BENCH_DATA=shifted``
/ ``million``: the 240,000 / 1,020,000 shifted Fashion-MNIST rows of `make_shifted.py` /
`make_million.py` (made beforehand; in one process, 3.2 GB of float32 at 1 M rows, twice over
with the index's payload) -- how the hashed selection's advantage grows with the pool.
Hyperplanes: binary one-vs-all ``LinearSVC`` (class_weight balanced, C=1) of every class
trained on 5 labelled images per class plus ``EXTRA`` random ones (the SVMs of an
active-learning run).  Settings:
H-Hash with and without centring the keys on the pool mean (dense only), bits ``BENCH_BITS``;
candidates from the permutation lists, M lists x W window (``BENCH_MW``, e.g. ``16x16`` = up
to 512 candidates re-ranked), and from mode "rank" (every key's angle score, ``RANK`` = 500
rows re-ranked; ``BENCH_SEARCH=lists,rank``).  Exhaustive: one float32 product with the pool
(dense) or the CSR pool (sparse) and the argmin of |wx + b|, per hyperplane.  Timing: per
hyperplane ``BENCH_REPS`` (15) pairs, exhaustive and hashed, the order alternating from pair to
pair (ABBA); the medians of each and the median (and 25-75th percentiles) of the per-pair
speedups are reported.  The hashed query runs on ``BENCH_QUERY_THREADS`` threads (default
``BENCH_THREADS``, 2), as many as the exhaustive product's BLAS threads.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_active_recall.py

The SVMs see the rows at unit RMS norm as `lshdist active`'s do (``BENCH_SVM_SCALE=none``:
as given, the hyperplanes of the earlier results); centred keys hash the bias constant at
the centred rows' RMS norm (`HyperplaneIndex`'s default).

Dense pools in mode "rank" also get a *stages* table (`stage_times`): hashing the normal,
the key scores and selection, the re-rank, and the whole query, cold (right after an
exhaustive product) and warm.  "index bytes / row": the keys, lists, ids and payload.

``BENCH_FAMILIES=h-hash,eh-hash`` adds EH-Hash, its rows and normals cut to their
``BENCH_EH_TERMS`` largest entries (default 64, `lshdist active`'s; 0: every entry -- on 20
Newsgroups an SVM normal then costs 5-18 s a query at 256 bits).

``BENCH_NAME`` names the results file (default ``active_recall_{BENCH_DATA}``).
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import os
import time
from pathlib import Path

import numpy as np
from sklearn.svm import LinearSVC

from lshdist.blocks import SparseBlock
from lshdist.datasets import load_fashion_mnist, load_newsgroups
from lshdist.index.hyperplane import HyperplaneIndex, rms_norm

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
EH_TERMS = int(os.environ.get("BENCH_EH_TERMS", "64")) or None
#: threads of the hashed query (the exhaustive product has the BLAS threads, as many); one
#: hyperplane's query runs on one of them (`rank_search` shares hyperplanes among threads)
THREADS = int(os.environ.get("BENCH_QUERY_THREADS", str(common.N_THREADS)))


def hyperplanes(X, y, rng):
    """Binary one-vs-all LinearSVCs as `lshdist active` fits them: rows scaled by one factor to
    unit RMS norm (``BENCH_SVM_SCALE=none``: as given), normals returned in the rows' units."""
    rows = np.concatenate([rng.choice(np.flatnonzero(y == c), 5, replace=False)
                           for c in np.unique(y)] + [rng.choice(len(y), EXTRA, replace=False)])
    Xr = X.matrix[rows] if isinstance(X, SparseBlock) else X[rows]
    if SVM_SCALE == "rms":
        s = 1.0 / rms_norm(X)
    else:
        s = 1.0
    out = []
    for c in np.unique(y):
        clf = LinearSVC(class_weight="balanced", dual="auto", max_iter=5000).fit(Xr * s,
                                                                                y[rows] == c)
        out.append((s * clf.coef_.ravel().astype(np.float64), float(clf.intercept_[0])))
    return out


def margins(X, w, b):
    if isinstance(X, SparseBlock):
        p = np.asarray(X.matrix @ w).ravel()
    else:  # float64, 65,536 rows at a time (no float64 copy of a 1 M-row pool)
        p = np.concatenate([X[lo:lo + 65536].astype(np.float64) @ w
                            for lo in range(0, len(X), 65536)])
    return np.abs(p + b) / np.linalg.norm(w)


def load_pool():
    """(rows, labels) of the pool ``BENCH_DATA`` names: the Fashion-MNIST training images in
    [0, 1] float32, the 20 Newsgroups training documents, or the rows of a dataset written by
    `make_shifted.py` (``shifted``: 240,000 rows) or `make_million.py` (``million``: 1,020,000
    rows), pixels scaled to [0, 1] in place."""
    if DATA in ("fashion", "news"):
        split = load_fashion_mnist() if DATA == "fashion" else load_newsgroups()
        X = split.X_train if DATA != "fashion" else (split.X_train / 255.0).astype(np.float32)
        return X, split.y_train
    from lshdist.store.dataset import Dataset

    root = Path(__file__).resolve().parent.parent / "out"
    path = {"shifted": root / "shifted-fashion" / "train",
            "million": root / "million-fashion" / "train"}[DATA]
    if not path.exists():
        raise SystemExit(f"{path} is missing: make it with benchmarks/make_{DATA}.py")
    ds = Dataset(path)
    X = np.asarray(ds.read_all(), np.float32)
    X *= np.float32(1 / 255.0)
    return X, np.asarray(ds.labels())


def query_rows(X, w):
    if not isinstance(X, SparseBlock):
        return w[None, :]
    nz = np.flatnonzero(w)
    return SparseBlock.from_arrays(np.array([0, len(nz)]), X.features[nz], w[nz])


def index_bytes(idx):
    """Bytes the fitted index holds: every array of the permutation index (keys, lists, ids)
    and of its margin payload (the rows)."""
    arrays = [v for v in vars(idx.index_).values() if isinstance(v, np.ndarray)]
    arrays += [v for v in vars(idx.index_).values() if isinstance(v, list)
               for v in v if isinstance(v, np.ndarray)]
    return sum(a.nbytes for a in arrays) + sum(a.nbytes for a in idx.index_.payload_.arrays()
                                               .values())


def stage_times(idx, planes, exhaustive):
    """Where a dense mode-rank query's time goes, per hyperplane: hashing the normal
    (`encode_hyperplanes`), every key's angle score and the ``RANK`` smallest
    (`rank_candidates`, one thread), the exact re-rank, and the whole `HyperplaneIndex.query`
    on ``THREADS`` threads (the rest: checks and bookkeeping); medians
    over ``REPS`` repeats of each hyperplane, *cold* (each right after an exhaustive product,
    which evicts the keys and coefficients from cache, as in the paired timing) and *warm*
    (the same query again at once)."""
    from lshdist._kernels.hyperplane import rank_candidates
    from lshdist.index.hyperplane import encode_hyperplanes

    ix = idx.index_
    words = ix.codes_.shape[1]
    got = {(state, part): [] for state in ("cold", "warm")
           for part in ("hash normal", "scores + select", "re-rank", "query")}
    for w, b in planes:
        for _ in range(REPS):
            exhaustive(w, b)
            for state in ("cold", "warm"):
                t0 = time.perf_counter()
                qc, qp = encode_hyperplanes(idx.family_, w[None, :], np.array([b]), idx.center_,
                                            idx.bias_scale_)
                t1 = time.perf_counter()
                off, cand = rank_candidates(ix.codes_, qc, idx.family == "h-hash", RANK,
                                            int(ix.bits_), 64 * words)
                t2 = time.perf_counter()
                ix.payload_.rerank(off, cand, qp, K, ix.ids_)
                t3 = time.perf_counter()
                got[state, "hash normal"].append(t1 - t0)
                got[state, "scores + select"].append(t2 - t1)
                got[state, "re-rank"].append(t3 - t2)
            exhaustive(w, b)
            for state in ("cold", "warm"):
                t0 = time.perf_counter()
                idx.query(w[None, :], K, offsets=np.array([b]), mode="rank", candidates=RANK,
                          n_threads=THREADS)
                got[state, "query"].append(time.perf_counter() - t0)
    return {f"{part} ms ({state})": 1e3 * float(np.median(v)) for (state, part), v in got.items()}


def main():
    X, y = load_pool()
    rng = np.random.default_rng(0)
    planes = hyperplanes(X, y, rng)
    exact = [margins(X, w, b) for w, b in planes]
    truth = [np.argsort(m, kind="stable")[:K] for m in exact]
    rows, stages = [], []
    centres = CENTRES if not isinstance(X, SparseBlock) else (False,)
    Xf = X.matrix if isinstance(X, SparseBlock) else X

    def exhaustive(w, b):  # the exhaustive selection as a user writes it (float32 for dense)
        wf = w if isinstance(X, SparseBlock) else w.astype(np.float32)
        return np.abs(Xf @ wf + b).argmin()
    for fam in FAMILIES:
        for bits in BITS:
            for center in centres:
                t0 = time.perf_counter()
                terms = EH_TERMS if fam == "eh-hash" else None
                idx = HyperplaneIndex(family=fam, bits=bits, n_permutations=MW[0][0],
                                      window=MW[0][1], bias=True, center=center, terms=terms
                                      ).fit(X, n_threads=common.N_THREADS)
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
                        idx.query(query_rows(X, w), K, offsets=np.array([b]),  # warm
                                  n_threads=THREADS, **kw)
                        for rep in range(REPS):  # paired; the order alternates (ABBA)
                            for which in ((0, 1) if rep % 2 == 0 else (1, 0)):
                                t0 = time.perf_counter()
                                if which == 0:
                                    exhaustive(w, b)
                                    ex_secs.append(time.perf_counter() - t0)
                                else:
                                    _, ids = idx.query(query_rows(X, w), K,
                                                       offsets=np.array([b]),
                                                       n_threads=THREADS, **kw)
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
                                 "terms": (terms or "all") if fam == "eh-hash" else "-",
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
                                 "build s": build,
                                 "index bytes / row": index_bytes(idx) / len(m)})
                    print(rows[-1], flush=True)
                    if search == "rank" and not isinstance(X, SparseBlock):
                        stages.append({"family": fam, "bits": bits, "centred": center,
                                       **stage_times(idx, planes, exhaustive)})
                        print(stages[-1], flush=True)
    common.write_results(os.environ.get("BENCH_NAME", f"active_recall_{DATA}"),
                         {"recall": rows, "stages": stages} if stages else {"recall": rows},
                         title=f"Hyperplane search recall on the active-learning pool ({DATA})")


if __name__ == "__main__":
    main()
