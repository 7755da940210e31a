"""A 1,020,000-row database from Fashion-MNIST (shifted copies), its queries and exact truth.

Database: the 60,000 training images, unshifted and moved by each of 16 one- and two-pixel
shifts (dx, dy) in {-2..2}^2 (zero fill), 17 variants x 60,000 rows, labels kept, written shard
by shard (`lshdist.store.dataset.write_dense_shards`: never more than one 20,000-row shard in
memory; stored as uint8, pixel values: 0.8 GB, read as float32).  Row ``v * 60,000 + i`` is
training image ``i`` under variant ``v``.  Queries: the 10,000 test images unshifted and
under 9 shifts — the 8 one-pixel neighbours and (2, 1) — 100,000 rows.
Ground truth: the exact 10 nearest database rows (L2, ties by row) of ``TRUTH_QUERIES`` queries
drawn at random from all 100,000 (`query_order`: the first 2,000 of a fixed permutation, so that
they lie in every prefix of it — a benchmark that asks fewer queries takes a prefix; truth version
1 took the first 2,000 rows, all unshifted images, whose recall was 0.025 below the whole set's),
computed once in database chunks (float32 BLAS, then exact re-check)
and stored as ``OUT/truth.npz`` (int64 ids, float32 squared distances; no pickle).  Everything
is deterministic; an existing output is reused when its attributes match.

    cd /work/main && .venv/bin/python benchmarks/make_million.py [--out out/million-fashion]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from lshdist.datasets import load_fashion_mnist
from lshdist.store.dataset import Dataset, write_dense_shards

SHARD_ROWS = 20_000
VERSION = 2  # 2: the rows stored as uint8 (dataset format 3)
K = 10
TRUTH_QUERIES = 2_000
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "out" / "million-fashion"
TRUTH_VERSION = 2


def query_order(n_queries: int) -> np.ndarray:
    """A fixed random order of the query rows: a benchmark asking Q queries takes
    ``sorted(query_order(n)[:Q])``; the truth sample is ``sorted(query_order(n)[:2,000])``."""
    return np.random.default_rng(11).permutation(n_queries).astype(np.int64)
#: database variants: the original, then 16 shifts (the 8 one-pixel ones and 8 two-pixel ones)
DB_SHIFTS = [(0, 0), (0, -1), (0, 1), (-1, 0), (1, 0), (-1, -1), (-1, 1), (1, -1), (1, 1),
             (0, -2), (0, 2), (-2, 0), (2, 0), (-2, -2), (-2, 2), (2, -2), (2, 2)]
#: query variants: the original, the 8 one-pixel shifts and (2, 1)
Q_SHIFTS = [(0, 0), (0, -1), (0, 1), (-1, 0), (1, 0), (-1, -1), (-1, 1), (1, -1), (1, 1),
            (2, 1)]


def shift(X: np.ndarray, dx: int, dy: int, side: int = 28) -> np.ndarray:
    """Images (n, side*side) moved by (dx, dy) pixels (x right, y down), zero fill."""
    img = X.reshape(len(X), side, side)
    out = np.zeros_like(img)
    ys = slice(max(dy, 0), side + min(dy, 0))
    yd = slice(max(-dy, 0), side + min(-dy, 0))
    xs = slice(max(dx, 0), side + min(dx, 0))
    xd = slice(max(-dx, 0), side + min(-dx, 0))
    out[:, ys, xs] = img[:, yd, xd]
    return out.reshape(len(X), side * side)


def exact_topk(db: Dataset, Q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest rows of ``db`` (ids, squared L2; ties by id) for every query, one
    shard at a time: float32 BLAS candidates (k + 16 per shard), then exact float64 distances."""
    qn = np.einsum("ij,ij->i", Q, Q)
    best_d = np.full((len(Q), 0), np.inf)
    best_i = np.zeros((len(Q), 0), np.int64)
    ids = db.ids()
    for s in range(db.n_shards):
        lo = int(db.shard_bounds[s])
        X = np.asarray(db.read_shard(s), np.float32)
        D = qn[:, None] - 2.0 * (Q @ X.T) + np.einsum("ij,ij->i", X, X)[None, :]
        kk = min(k + 16, X.shape[0])
        cand = np.argpartition(D, kk - 1, axis=1)[:, :kk]
        diff = Q[:, None, :].astype(np.float64) - X[cand].astype(np.float64)
        exact = np.einsum("qcd,qcd->qc", diff, diff)
        best_d = np.concatenate([best_d, exact], axis=1)
        best_i = np.concatenate([best_i, ids[lo + cand]], axis=1)
        order = np.lexsort((best_i, best_d), axis=1)[:, :k]
        best_d = np.take_along_axis(best_d, order, 1)
        best_i = np.take_along_axis(best_i, order, 1)
    return best_i, best_d.astype(np.float32)


def make(out: Path = DEFAULT_OUT, *, overwrite: bool = False, variants: int | None = None
         ) -> tuple[Dataset, Dataset, dict]:
    """Write (or reuse) ``out/train``, ``out/test`` and ``out/truth.npz``; ``variants``: only
    the first that many database variants (60,000 rows each; the smaller sizes of the scale
    benchmark), default all 17."""
    shifts = DB_SHIFTS[: variants or len(DB_SHIFTS)]
    split = load_fashion_mnist()
    Xtr = np.asarray(split.X_train, np.float32)
    ytr = np.asarray(split.y_train)
    n_img, d = Xtr.shape
    n = n_img * len(shifts)
    attrs = {"million_version": VERSION, "db_shifts": shifts, "source": "fashion-mnist train"}
    train, test, truth_p = out / "train", out / "test", out / "truth.npz"
    if not overwrite and train.exists() and test.exists():
        ds, qs = Dataset(train), Dataset(test)
        if ds.n == n and ds.d == d and ds.attrs.get("million_version") == VERSION:
            if truth_p.exists():
                with np.load(truth_p, allow_pickle=False) as z:
                    truth = {k: z[k] for k in z.files}
                if int(truth.get("version", 1)) == TRUTH_VERSION:
                    print(f"reusing {train} ({ds.n:,} rows), {test} ({qs.n:,}), {truth_p}")
                    return ds, qs, truth
            print(f"reusing {train} ({ds.n:,} rows), {test} ({qs.n:,}); new truth")
            return ds, qs, write_truth(ds, qs, truth_p)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    per = n_img // SHARD_ROWS

    def shards():
        for dx, dy in shifts:
            V = shift(Xtr, dx, dy)
            for j in range(per):
                sl = slice(j * SHARD_ROWS, (j + 1) * SHARD_ROWS)
                yield V[sl], ytr[sl]

    ds = write_dense_shards(train, shards(), n=n, d=d, shard_rows=SHARD_ROWS,
                            classes=list(split.classes), overwrite=overwrite or train.exists(),
                            attrs=attrs, dtype=np.uint8)
    t_db = time.perf_counter() - t0
    Xte = np.asarray(split.X_test, np.float32)
    Q = np.concatenate([shift(Xte, dx, dy) for dx, dy in Q_SHIFTS])
    yq = np.tile(np.asarray(split.y_test), len(Q_SHIFTS))
    from lshdist.store.dataset import write_dataset

    qs = write_dataset(test, Q, yq, classes=list(split.classes), shard_rows=SHARD_ROWS,
                       overwrite=overwrite or test.exists(),
                       attrs={"source": "fashion-mnist t10k", "q_shifts": Q_SHIFTS})
    print(f"wrote {train} ({ds.n:,} x {d}, {ds.n_shards} shards, {t_db:.1f} s), {test} "
          f"({qs.n:,} rows)")
    return ds, qs, write_truth(ds, qs, truth_p)


def write_truth(ds: Dataset, qs: Dataset, truth_p: Path) -> dict:
    """Exact top-k of the truth sample (`query_order`), stored as ``truth_p``."""
    rows = np.sort(query_order(qs.n)[:TRUTH_QUERIES])
    Q = np.asarray(qs.read_row_set(rows), np.float32)
    t0 = time.perf_counter()
    tid, tdist = exact_topk(ds, Q, K)
    truth = {"ids": tid, "dist": tdist, "queries": rows,
             "version": np.asarray(TRUTH_VERSION)}
    np.savez(truth_p, **truth)
    print(f"truth of {TRUTH_QUERIES:,} sampled queries ({time.perf_counter() - t0:.1f} s)")
    return truth


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--variants", type=int, default=None,
                   help="database variants (60,000 rows each; default all 17)")
    a = p.parse_args()
    make(a.out, overwrite=a.overwrite, variants=a.variants)


if __name__ == "__main__":
    main()
