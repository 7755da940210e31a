"""The real datasets of the tests, benchmarks and demos, as train/test splits.

Files are looked up in `data_dir()` (layout: ``letter/``, ``fashion-mnist/``, ``20newsgroups/``,
as in the project's shared ``datasets`` folder) and read with the readers of
`lshdist.inputs`, the same code as ``lshdist ingest``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from lshdist.blocks import SparseBlock, as_block
from lshdist.errors import InputError
from lshdist.inputs.combine import merge_labels
from lshdist.inputs.data import InputData
from lshdist.inputs.formats.delimited import read_letter
from lshdist.inputs.formats.idx import read_idx
from lshdist.inputs.formats.newsgroups import read_newsgroups
from lshdist.inputs.text import Idf, weight_rows

logger = logging.getLogger(__name__)

ENV_VAR = "LSHDIST_DATA_DIR"
#: class names of Fashion-MNIST, in the order of its label codes 0..9
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip


@dataclass(frozen=True)
class Split:
    """A train/test split; unpacks as ``X_train, y_train, X_test, y_test``.

    Attributes
    ----------
    X_train, X_test : float32 ndarray (n, d) or SparseBlock
    y_train, y_test : int32 ndarray (n,)
        Label codes, indices into ``classes``.
    classes : list of str
    """

    X_train: np.ndarray | SparseBlock
    y_train: np.ndarray
    X_test: np.ndarray | SparseBlock
    y_test: np.ndarray
    classes: list[str]

    def __iter__(self) -> Iterator[np.ndarray | SparseBlock]:
        return iter((self.X_train, self.y_train, self.X_test, self.y_test))


def data_dir() -> Path:
    """The folder holding the real datasets.

    ``$LSHDIST_DATA_DIR`` if set, else ``../shared/datasets`` beside the repository checkout.

    Raises
    ------
    InputError
        If neither exists.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise InputError(
                f"{ENV_VAR}={env!r} is not a directory; point it at the datasets folder"
            )
        return path
    repo = Path(__file__).resolve().parent.parent
    path = (repo.parent / "shared" / "datasets").resolve()
    if path.is_dir():
        return path
    raise InputError(
        f"no data directory: {ENV_VAR} is not set and {str(path)!r} does not exist; set "
        f"{ENV_VAR} to the folder holding letter/, fashion-mnist/ and 20newsgroups/"
    )


def _file(root: str | os.PathLike[str] | None, *parts: str) -> Path:
    path = Path(root if root is not None else data_dir()).joinpath(*parts)
    if not path.is_file():
        raise InputError(
            f"{str(path)!r} not found; expected {'/'.join(parts)} in the data directory"
        )
    return path


def _labels(parts: list[InputData]) -> tuple[np.ndarray, list[str]]:
    """Label codes and classes of the concatenated ``parts`` (every real dataset has labels)."""
    y, classes = merge_labels(parts)
    if y is None or classes is None:
        raise InputError(f"{parts[0].sources[0]!r} has no labels; give the labelled file")
    return y, classes


def load_letter(root: str | os.PathLike[str] | None = None) -> Split:
    """UCI Letter Recognition: the first 16,000 rows train, the last 4,000 test.

    Returns
    -------
    Split
        float32 (n, 16) integer-valued features; 26 classes ``'A'..'Z'``.
    """
    data = read_letter(_file(root, "letter", "letter-recognition.data"))
    X = cast(np.ndarray, as_block(data.X))  # a delimited file gives dense rows
    y, classes = _labels([data])
    return Split(X[:16_000], y[:16_000], X[16_000:], y[16_000:], classes)


def load_fashion_mnist(root: str | os.PathLike[str] | None = None) -> Split:
    """Fashion-MNIST: 60,000 train and 10,000 test images of 28 x 28 pixels.

    Returns
    -------
    Split
        float32 (n, 784) raw pixel values 0..255 (not rescaled: scale them if a method needs
        it); 10 classes, named as in `FASHION_MNIST_CLASSES`.
    """
    parts = []
    for split in ("train", "t10k"):
        images = _file(root, "fashion-mnist", f"{split}-images-idx3-ubyte.gz")
        labels = _file(root, "fashion-mnist", f"{split}-labels-idx1-ubyte.gz")
        parts.append(read_idx(images, labels))
    y, classes = _labels(parts)
    if classes != [str(i) for i in range(10)]:
        raise InputError(f"Fashion-MNIST labels are {classes}, expected the codes 0..9")
    n = parts[0].n
    X_train, X_test = (as_block(p.X) for p in parts)
    return Split(X_train, y[:n], X_test, y[n:], list(FASHION_MNIST_CLASSES))


def load_newsgroups(weighting: str = "tfidf", root: str | os.PathLike[str] | None = None) -> Split:
    """20 Newsgroups: 11,293 train and 7,528 test documents as sparse rows.

    Tokens are hashed to 64-bit feature ids (`lshdist.inputs.text`).  With ``'tfidf'`` the
    IDF is that of the training split, applied to both splits (test words the training split
    never saw are dropped); rows have unit L2 norm.

    Returns
    -------
    Split
        `SparseBlock` rows (float32); 20 classes, the newsgroup names.
    """
    parts = [
        read_newsgroups(_file(root, "20newsgroups", f"20newsgroups-{split}.tab.gz"))
        for split in ("train", "test")
    ]
    n = parts[0].n
    counts = [p.X for p in parts if isinstance(p.X, SparseBlock)]  # text rows are sparse
    idf = Idf.from_counts(counts[0]) if weighting == "tfidf" else None
    y, classes = _labels(parts)
    X_train, X_test = (weight_rows(c, weighting, idf) for c in counts)
    return Split(X_train, y[:n], X_test, y[n:], classes)


def load_digits(test_size: int = 297) -> Split:
    """scikit-learn's bundled digits (1,797 x 64, 10 classes): the last ``test_size`` rows test.

    Returns
    -------
    Split
        float32 (n, 64) pixel values 0..16; classes ``'0'..'9'``.
    """
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError:
        raise ImportError("load_digits needs scikit-learn: pip install 'lshdist[test]'") from None
    digits = sk_load_digits()
    X, y = as_block(digits.data), digits.target.astype(np.int32)
    n = len(y) - int(test_size)
    if not 0 < n < len(y):
        raise InputError(f"test_size={test_size}: must be in [1, {len(y) - 1}]")
    return Split(X[:n], y[:n], X[n:], y[n:], [str(c) for c in digits.target_names])
