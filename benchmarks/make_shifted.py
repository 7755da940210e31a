"""The shifted Fashion-MNIST database (240,000 rows) and its queries, as lshdist datasets.

Database: the 60,000 training images, each shifted by one pixel up, down, left and right
(zero fill at the uncovered edge; the original images are not included), stacked in that order:
rows ``s * 60,000 + i`` hold training image ``i`` shifted by ``SHIFTS[s]``; ids 0..239,999;
labels kept.  Queries: the 10,000 test images, unshifted.  Both are written with
`lshdist.store.dataset.write_dataset` (shard_rows 20,000), deterministic (no randomness); the
SHA-256 of the database's float32 pixels is printed and stored in the dataset attributes.

    cd /work/main && .venv/bin/python benchmarks/make_shifted.py [--out out/shifted-fashion]

writes ``OUT/train`` (240,000 x 784) and ``OUT/test`` (10,000 x 784).  An existing output is
reused if its attributes match (``--overwrite`` rewrites it).
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np

from lshdist.datasets import load_fashion_mnist
from lshdist.store.dataset import Dataset, write_dataset

SHIFTS = ("up", "down", "left", "right")
SHARD_ROWS = 20_000
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "out" / "shifted-fashion"
VERSION = 1


def shift(X: np.ndarray, direction: str, side: int = 28) -> np.ndarray:
    """Images (n, side*side) moved by one pixel towards ``direction``, zero fill."""
    img = X.reshape(len(X), side, side)
    out = np.zeros_like(img)
    if direction == "up":
        out[:, :-1, :] = img[:, 1:, :]
    elif direction == "down":
        out[:, 1:, :] = img[:, :-1, :]
    elif direction == "left":
        out[:, :, :-1] = img[:, :, 1:]
    elif direction == "right":
        out[:, :, 1:] = img[:, :, :-1]
    else:
        raise ValueError(direction)
    return out.reshape(len(X), side * side)


def shifted_database(X: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.concatenate([shift(X, s) for s in SHIFTS]), dtype=np.float32)


def make(out: Path = DEFAULT_OUT, *, overwrite: bool = False) -> tuple[Dataset, Dataset]:
    """Write (or reuse) ``out/train`` and ``out/test``; returns both datasets."""
    split = load_fashion_mnist()
    train, test = out / "train", out / "test"
    if not overwrite and train.exists() and test.exists():
        ds, qs = Dataset(train), Dataset(test)
        a = ds.attrs if hasattr(ds, "attrs") else {}
        want = (4 * len(split.X_train), split.X_train.shape[1], len(split.X_test))
        if (ds.n, ds.d, qs.n) == want and a.get("shifted_version") == VERSION:
            print(f"reusing {train} ({ds.n:,} rows) and {test} ({qs.n:,} rows)")
            return ds, qs
    X = shifted_database(np.asarray(split.X_train, np.float32))
    y = np.tile(np.asarray(split.y_train), len(SHIFTS))
    digest = hashlib.sha256(X.tobytes()).hexdigest()
    out.mkdir(parents=True, exist_ok=True)
    attrs = {"shifted_version": VERSION, "shifts": list(SHIFTS), "source": "fashion-mnist train",
             "sha256_X": digest}
    ds = write_dataset(train, X, y, classes=list(split.classes), shard_rows=SHARD_ROWS,
                       overwrite=overwrite or train.exists(), attrs=attrs)
    qs = write_dataset(test, np.asarray(split.X_test, np.float32), np.asarray(split.y_test),
                       classes=list(split.classes), shard_rows=SHARD_ROWS,
                       overwrite=overwrite or test.exists(),
                       attrs={"source": "fashion-mnist t10k (unshifted)"})
    print(f"wrote {train} ({ds.n:,} x {ds.d}, {ds.n // SHARD_ROWS} shards, sha256 {digest}) "
          f"and {test} ({qs.n:,} rows)")
    return ds, qs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args()
    make(a.out, overwrite=a.overwrite)


if __name__ == "__main__":
    main()
