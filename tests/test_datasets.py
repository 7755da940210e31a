"""The real-data loaders: sizes, dtypes, classes, and the same rows as ``lshdist ingest``."""

import numpy as np
import pytest

from lshdist import datasets
from lshdist.blocks import SparseBlock
from lshdist.cli import main
from lshdist.errors import InputError
from lshdist.store.dataset import Dataset


def test_data_dir_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LSHDIST_DATA_DIR", str(tmp_path))
    assert datasets.data_dir() == tmp_path
    monkeypatch.setenv("LSHDIST_DATA_DIR", str(tmp_path / "nope"))
    with pytest.raises(InputError, match=r"LSHDIST_DATA_DIR=.*nope' is not a directory"):
        datasets.data_dir()


def test_missing_files_are_named(tmp_path):
    with pytest.raises(InputError, match=r"letter-recognition.data' not found; expected letter/"):
        datasets.load_letter(root=tmp_path)


def test_load_letter(data_root):
    split = datasets.load_letter()
    Xtr, ytr, Xte, yte = split
    assert Xtr.shape == (16_000, 16) and Xte.shape == (4_000, 16)
    assert Xtr.dtype == np.float32 and ytr.dtype == np.int32 and len(yte) == 4_000
    assert split.classes == [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    assert split.classes[ytr[0]] == "T" and Xtr[0, :3].tolist() == [2, 8, 3]
    assert split.classes[yte[-1]] == "A"  # the last line of the file
    assert set(np.unique(yte)) == set(range(26))


def test_load_fashion_mnist(data_root):
    split = datasets.load_fashion_mnist()
    assert split.X_train.shape == (60_000, 784) and split.X_test.shape == (10_000, 784)
    assert split.X_train.dtype == np.float32 and split.X_train.max() == 255
    assert split.classes[0] == "T-shirt/top" and len(split.classes) == 10
    assert np.bincount(split.y_train).tolist() == [6000] * 10
    assert np.bincount(split.y_test).tolist() == [1000] * 10


def test_load_newsgroups_equals_ingest_of_train_then_test_with_its_idf(data_root, tmp_path):
    split = datasets.load_newsgroups()
    assert isinstance(split.X_train, SparseBlock) and isinstance(split.X_test, SparseBlock)
    assert split.X_train.n_rows == 11_293 and split.X_test.n_rows == 7_528
    assert split.X_train.n_rows + split.X_test.n_rows == 18_821
    assert len(split.classes) == 20 and split.classes[0] == "alt.atheism"
    assert set(np.unique(split.y_test)) == set(range(20))
    np.testing.assert_allclose(split.X_test.row_norms_sq(), 1.0, rtol=1e-5)

    d = data_root / "20newsgroups"
    assert (
        main(["ingest", str(d / "20newsgroups-train.tab.gz"), "--out", str(tmp_path / "tr")]) == 0
    )
    assert main(["ingest", str(d / "20newsgroups-test.tab.gz"), "--out", str(tmp_path / "te"),
                 "--idf-from", str(tmp_path / "tr")]) == 0  # fmt: skip
    for name, X, y in (("tr", split.X_train, split.y_train), ("te", split.X_test, split.y_test)):
        ds = Dataset(tmp_path / name)
        for got, want in zip(ds.read_all().to_arrays(), X.to_arrays()):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.array(ds.classes)[ds.labels()], np.array(split.classes)[y])


def test_load_newsgroups_counts(data_root):
    split = datasets.load_newsgroups(weighting="counts")
    # the unseen test words are kept without an IDF to drop them
    assert split.X_test.features.size > 50_000
    np.testing.assert_allclose(split.X_train.row_norms_sq(), 1.0, rtol=1e-5)


def test_load_digits():
    Xtr, _, Xte, yte = split = datasets.load_digits()
    assert Xtr.shape == (1_500, 64) and Xte.shape == (297, 64) and Xtr.dtype == np.float32
    assert split.classes == [str(i) for i in range(10)] and set(np.unique(yte)) == set(range(10))
    assert Xtr.max() == 16
