"""Zarr datasets: bit-exact round trips whatever the shard size, shards read alone, damage."""

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lshdist.blocks import SparseBlock
from lshdist.errors import FormatError, InputError, OutputExistsError
from lshdist.store.dataset import HASHED_D, Dataset, write_dataset

PROPERTY = settings(max_examples=40, deadline=None)

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def dense_rows(draw):
    n = draw(st.integers(1, 40))
    d = draw(st.integers(1, 6))
    X = draw(hnp.arrays(np.float32, (n, d), elements=finite32))
    y = draw(st.none() | hnp.arrays(np.int64, n, elements=st.integers(0, 4)))
    return X, y


@st.composite
def sparse_rows(draw):
    """CSR arrays over 64-bit feature ids (sorted within a row), empty rows allowed."""
    n = draw(st.integers(1, 30))
    ids = st.integers(0, 2**64 - 1) | st.integers(0, 50)
    rows = [sorted(draw(st.sets(ids, max_size=6))) for _ in range(n)]
    indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
    indices = np.array([f for r in rows for f in r], dtype=np.uint64)
    data = draw(hnp.arrays(np.float32, len(indices), elements=finite32))
    return indptr, indices, data


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


@PROPERTY
@given(rows=dense_rows(), shard_rows=st.integers(1, 50))
def test_dense_round_trip_is_bit_exact_for_any_shard_size(rows, shard_rows):
    X, y = rows
    with tempfile.TemporaryDirectory() as tmp:
        ds = write_dataset(Path(tmp) / "ds", X, y, shard_rows=shard_rows)
        back = Dataset(ds.path)
        assert (back.n, back.d, back.kind) == (*X.shape, "dense")
        assert back.n_shards == math.ceil(len(X) / shard_rows)
        np.testing.assert_array_equal(_bits(back.read_all()), _bits(X))
        for shard in back.shards():
            alone = Dataset(ds.path).read_shard(shard.index)  # a fresh reader: nothing cached
            np.testing.assert_array_equal(_bits(alone), _bits(X[shard.start : shard.stop]))
        assert back.shard_bounds[-1] == len(X)
        np.testing.assert_array_equal(back.ids(), np.arange(len(X)))
        if y is None:
            assert back.labels() is None
        else:
            classes = np.array(back.classes).astype(np.int64)
            np.testing.assert_array_equal(classes[back.labels()], y)


@PROPERTY
@given(arrays=sparse_rows(), shard_rows=st.integers(1, 40))
def test_sparse_round_trip_is_bit_exact_for_any_shard_size(arrays, shard_rows):
    indptr, indices, data = arrays
    block = SparseBlock.from_arrays(indptr, indices, data)
    ids = np.arange(len(indptr) - 1, dtype=np.int64) * 7 + 3
    with tempfile.TemporaryDirectory() as tmp:
        ds = write_dataset(Path(tmp) / "ds", block, ids=ids, shard_rows=shard_rows)
        back = Dataset(ds.path)
        assert (back.n, back.d, back.kind, back.nnz) == (
            len(indptr) - 1,
            HASHED_D,
            "sparse",
            len(data),
        )
        for got, want in zip(back.read_all().to_arrays(), (indptr, indices, data)):
            np.testing.assert_array_equal(_bits(got), _bits(want))
        for shard in back.shards():
            alone = Dataset(ds.path).read_shard(shard.index).to_arrays()
            lo, hi = indptr[shard.start], indptr[shard.stop]
            want = (indptr[shard.start : shard.stop + 1] - lo, indices[lo:hi], data[lo:hi])
            for got, w in zip(alone, want):
                np.testing.assert_array_equal(_bits(got), _bits(w))
        np.testing.assert_array_equal(back.ids(), ids)


def test_scipy_sparse_input_keeps_its_dimension(tmp_path):
    X = sp.random(30, 500, density=0.05, format="csr", dtype=np.float32, random_state=0)
    ds = write_dataset(tmp_path / "ds", X, shard_rows=7)
    assert ds.d == 500 and ds.n_shards == 5
    back = ds.read_all()
    np.testing.assert_array_equal(back.over(np.arange(500, dtype=np.uint64)).toarray(), X.toarray())


def test_existing_output_is_refused_then_replaced_with_overwrite(tmp_path):
    write_dataset(tmp_path / "ds", np.ones((3, 2)))
    with pytest.raises(
        OutputExistsError, match="already exists; choose another path or pass --overwrite"
    ):
        write_dataset(tmp_path / "ds", np.zeros((4, 2)))
    assert Dataset(tmp_path / "ds").n == 3
    write_dataset(tmp_path / "ds", np.zeros((4, 2)), overwrite=True)
    assert Dataset(tmp_path / "ds").n == 4
    assert os.listdir(tmp_path) == ["ds"]


def test_a_failure_inside_the_write_leaves_nothing(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(zarr.Group, "create_array", broken)
    with pytest.raises(OSError, match="disk full"):
        write_dataset(tmp_path / "ds", np.ones((3, 2)))
    assert os.listdir(tmp_path) == []


@pytest.fixture
def dataset(tmp_path) -> Path:
    X = np.arange(40, dtype=np.float32).reshape(20, 2) + 0.5  # float32 rows (not bytes)
    return write_dataset(tmp_path / "ds", X, np.arange(20) % 3, shard_rows=10).path


def test_missing_dataset(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        Dataset(tmp_path / "nope")


def test_directory_that_is_not_a_zarr_group(tmp_path):
    with pytest.raises(FormatError, match=r"is not a Zarr v3 group \(no zarr.json\)"):
        Dataset(tmp_path)


def test_foreign_zarr_group(tmp_path):
    zarr.open_group(str(tmp_path / "g"), mode="w").create_array("a", data=np.arange(3))
    with pytest.raises(FormatError, match="is a Zarr group but not an lshdist dataset"):
        Dataset(tmp_path / "g")


def test_corrupted_group_metadata(dataset):
    (dataset / "zarr.json").write_text("{not json")
    with pytest.raises(FormatError, match=r"zarr.json is corrupted .*; re-ingest the dataset"):
        Dataset(dataset)


def test_group_metadata_that_is_not_utf8(dataset):
    (dataset / "zarr.json").write_bytes(b'{"attributes": {"format": "\xd0\xff"}}')
    with pytest.raises(FormatError, match=r"zarr.json is corrupted .*; re-ingest the dataset"):
        Dataset(dataset)


def test_newer_format_version(dataset):
    meta = json.loads((dataset / "zarr.json").read_text())
    meta["attributes"]["version"] = 99
    (dataset / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(
        FormatError, match="dataset format version 99; this lshdist reads versions 1 to 3"
    ):
        Dataset(dataset)


def test_missing_array(dataset):
    for f in sorted((dataset / "X").rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    (dataset / "X").rmdir()
    with pytest.raises(FormatError, match=r"is corrupted .*re-ingest it"):
        Dataset(dataset)


def test_damaged_chunk_is_a_format_error(dataset):
    chunk = dataset / "X" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[:7])
    ds = Dataset(dataset)
    np.testing.assert_array_equal(ds.read_shard(0)[0], [0.5, 1.5])  # the intact shard still reads
    with pytest.raises(FormatError,
                       match=r"shard 1 \(rows 10:20\) of X does not match its checksum: a chunk "
                             r"is damaged; the dataset is corrupted, re-ingest it"):
        ds.read_shard(1)
    # every time: the chunk's CRC32C is checked before Blosc decodes it (Blosc trusts the
    # sizes in the chunk's header and can read past a truncated chunk's end)
    for _ in range(50):
        with pytest.raises(FormatError, match=r"shard 1 .* does not match its checksum"):
            ds.read_rows(0, 20)


def test_lazy_readers(tmp_path):
    import dask
    import scipy.sparse as sp

    from lshdist.store.dataset import write_dataset

    X = np.arange(50 * 3, dtype=np.float32).reshape(50, 3)
    ds = write_dataset(tmp_path / "d", X, shard_rows=20)
    lazy = ds.to_dask()
    assert lazy.chunks[0] == (20, 20, 10)
    assert np.array_equal(lazy.compute(), X)
    assert np.array_equal(np.vstack(list(ds.iter_shards())), X)
    S = sp.random(30, 100, density=0.1, format="csr", random_state=0, dtype=np.float32)
    sds = write_dataset(tmp_path / "s", S, shard_rows=8)
    blocks = dask.compute(*sds.to_dask())
    assert [b.n_rows for b in blocks] == [8, 8, 8, 6]
    got = sp.vstack([b.over(np.arange(100, dtype=np.uint64)) for b in blocks])
    assert np.array_equal(got.toarray(), S.toarray())


def _set_attr(path: Path, **attrs) -> None:
    """Edit attributes and re-seal them (a careful forger: only the range checks are left)."""
    from lshdist.store.dataset import attrs_checksum

    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"].update(attrs)
    meta["attributes"]["checksum"] = attrs_checksum(meta["attributes"])
    (path / "zarr.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("attrs,match", [
    ({"N": "20"}, "N='20', expected an integer >= 1"),
    ({"N": 19}, r"X is float32 \(20, 2\), the attributes say float32 \(19, 2\)"),
    ({"d": 0}, "d=0, expected an integer >= 1"),
    ({"kind": "ragged"}, "kind='ragged'"),
    ({"n_shards": 3}, "n_shards=3 but N=20 rows in shards of 10"),
    ({"classes": "abc"}, "classes must be a list of names"),
    ({"classes": None}, "y is present but the attributes have no classes"),
])
def test_attributes_are_checked_when_opened(dataset, attrs, match):
    _set_attr(dataset, **attrs)
    with pytest.raises(FormatError, match=match):
        Dataset(dataset)


def test_label_codes_outside_the_classes_are_refused(dataset):
    _set_attr(dataset, classes=["a", "b"])  # codes 0..2 were written
    with pytest.raises(FormatError, match="label codes run from 0 to 2, outside the 2 classes"):
        Dataset(dataset).labels()


def test_sparse_shard_bounds_and_indptr_are_checked(tmp_path):
    X = sp.random(30, 50, density=0.2, format="csr", dtype=np.float32, random_state=0)
    path = write_dataset(tmp_path / "s", X, shard_rows=8).path
    Dataset(path).verify()
    g = zarr.open_group(str(path), mode="r+")
    g["X/shard_bounds"][:] = np.array([0, 8, 16, 24, 31])
    with pytest.raises(FormatError, match="rising from 0 to N=30"):
        Dataset(path)
    g["X/shard_bounds"][:] = np.array([0, 8, 16, 24, 30])
    indptr = g["X/indptr"][:]
    indptr[5] = indptr[6] + 1
    g["X/indptr"][:] = indptr
    with pytest.raises(FormatError, match=r"X/indptr of rows 0:8 does not rise within \[0, "):
        Dataset(path).verify()


def test_verify_reads_everything(tmp_path, reseal):
    """What the checksums cannot catch (a forger re-sealed the edit) the content checks do."""
    X = sp.csr_matrix(np.array([[0, 1, 2, 0], [3, 0, 0, 4]], np.float32))
    path = write_dataset(tmp_path / "s", X).path
    Dataset(path).verify()
    g = zarr.open_group(str(path), mode="r+")
    g["X/indices"][:] = np.array([2, 1, 0, 3], np.uint64)  # row 0 unsorted
    reseal(path)
    with pytest.raises(FormatError, match="feature ids of rows 0:2 are not sorted and unique"):
        Dataset(path).verify()
    g["X/indices"][:] = np.array([1, 2, 0, 0], np.uint64)  # row 1 repeats an id
    reseal(path)
    with pytest.raises(FormatError, match="not sorted and unique"):
        Dataset(path).verify()
    g["X/indices"][:] = np.array([1, 2, 0, 3], np.uint64)
    g["X/data"][:] = np.array([1, np.nan, 3, 4], np.float32)
    reseal(path)
    with pytest.raises(FormatError, match="rows 0:2 of X hold NaN or infinite values"):
        Dataset(path).verify()
    dense = write_dataset(tmp_path / "d", np.full((5, 2), 0.5), shard_rows=2).path
    Dataset(dense).verify()
    gd = zarr.open_group(str(dense), mode="r+")
    gd["X"][3, 1] = np.inf
    reseal(dense)
    with pytest.raises(FormatError, match="rows 2:4 of X hold NaN"):
        Dataset(dense).verify()


def test_duplicated_sparse_entries_are_summed_on_write(tmp_path):
    X = sp.csr_matrix((np.array([1, 2, 5], np.float32), np.array([3, 3, 1]), np.array([0, 3])),
                      shape=(1, 4))
    ds = write_dataset(tmp_path / "s", X)
    ds.verify()
    np.testing.assert_array_equal(ds.read_all().over(np.arange(4, dtype=np.uint64)).toarray(),
                                  [[0, 5, 0, 3]])


def test_write_dense_shards_equals_write_dataset(tmp_path):
    """Shard by shard (never the whole matrix) gives what `write_dataset` gives; wrong shard
    shapes or row counts are refused and leave nothing behind."""
    from lshdist.errors import InputError
    from lshdist.store.dataset import write_dense_shards

    rng = np.random.default_rng(0)
    X = rng.normal(size=(25, 4)).astype(np.float32)
    y = rng.integers(0, 3, 25)
    ref = write_dataset(tmp_path / "ref", X, y, classes=["a", "b", "c"], shard_rows=10)
    got = write_dense_shards(tmp_path / "got", ((X[i:i + 10], y[i:i + 10]) for i in (0, 10, 20)),
                             n=25, d=4, shard_rows=10, classes=["a", "b", "c"])
    assert (got.n, got.d, got.n_shards, got.classes) == (ref.n, ref.d, ref.n_shards, ref.classes)
    assert np.array_equal(got.read_all(), ref.read_all())
    assert np.array_equal(got.labels(), ref.labels()) and np.array_equal(got.ids(), ref.ids())
    assert np.array_equal(got.read_shard(2), X[20:])
    with pytest.raises(InputError, match="shape"):
        write_dense_shards(tmp_path / "bad", iter([(X[:9], y[:9])]), n=25, d=4, shard_rows=10,
                           classes=["a", "b", "c"])
    with pytest.raises(InputError, match="expected n=25"):
        write_dense_shards(tmp_path / "bad", iter([(X[:10], y[:10])]), n=25, d=4,
                           shard_rows=10, classes=["a", "b", "c"])
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("make", [lambda a: a.astype(np.uint8), lambda a: a.astype(np.float32),
                                  lambda a: a.astype(np.int64)])
def test_byte_values_are_stored_as_bytes(tmp_path, make):
    """Rows whose every value is an integer in 0..255 (a uint8 input, or floats or ints that
    all are) are stored as uint8 in a format-3 dataset and read back as the same float32 rows;
    a damaged byte chunk is refused by its checksum like any other."""
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, size=(23, 7))
    ds = write_dataset(tmp_path / "b", make(pixels), shard_rows=10)
    assert ds.attrs["version"] == 3
    assert zarr.open_array(tmp_path / "b" / "X", mode="r").dtype == np.uint8
    got = ds.read_rows(0, 23)
    assert got.dtype == np.float32 and np.array_equal(got, pixels.astype(np.float32))
    rows = np.array([0, 4, 9, 10, 22])
    assert np.array_equal(ds.read_row_set(rows), pixels[rows].astype(np.float32))
    assert np.array_equal(ds.read_shard(2), pixels[20:].astype(np.float32))
    assert ds.byte_valued
    raw = ds.read_byte_rows(3, 17)  # as stored, across a shard boundary
    assert raw.dtype == np.uint8 and np.array_equal(raw, pixels[3:17])
    ds.verify()
    chunk = tmp_path / "b" / "X" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[-5] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"shard 1 \(rows 10:20\) of X"):
        Dataset(tmp_path / "b").read_rows(10, 20)
    with pytest.raises(FormatError, match=r"shard 1 \(rows 10:20\) of X"):
        Dataset(tmp_path / "b").read_byte_rows(12, 14)


@pytest.mark.parametrize("X", [np.array([[0.5, 1.0]], np.float32), np.array([[256.0, 1.0]]),
                               np.array([[-1, 3]]), np.array([[300, 3]]),
                               np.array([[-0.0, 3.0]], np.float32)])
def test_other_values_stay_float32(tmp_path, X):
    """Rows that are not all bytes stay float32 -- -0.0 too: as a byte it would read back as
    +0.0, and the rows' round trip is bit for bit."""
    ds = write_dataset(tmp_path / "f", X)
    assert ds.attrs["version"] == 2 and not ds.byte_valued
    assert zarr.open_array(tmp_path / "f" / "X", mode="r").dtype == np.float32
    with pytest.raises(InputError, match="is not stored as bytes; read its rows with read_rows"):
        ds.read_byte_rows(0, 1)
    back = ds.read_all()
    assert np.array_equal(back.view(np.uint32), X.astype(np.float32).view(np.uint32))


def test_byte_dataset_whose_x_is_not_bytes(tmp_path):
    """A format-3 dataset's X must be uint8: float32 rows there are refused as damage."""
    write_dataset(tmp_path / "b", np.full((4, 2), 7, np.uint8))
    write_dataset(tmp_path / "f", np.full((4, 2), 7.5, np.float32))
    for f in (tmp_path / "b" / "X").rglob("*"):
        if f.is_file():
            f.unlink()
    for f in (tmp_path / "f" / "X").rglob("*"):
        if f.is_file():
            rel = f.relative_to(tmp_path / "f" / "X")
            (tmp_path / "b" / "X" / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "b" / "X" / rel).write_bytes(f.read_bytes())
    with pytest.raises(FormatError, match=r"X is float32 \(4, 2\), the attributes say uint8"):
        Dataset(tmp_path / "b")


def test_write_dense_shards_as_bytes(tmp_path):
    """``dtype=uint8``: stored as bytes (format 3, the same rows read back); a shard with a
    value that is not a byte is refused and nothing is left behind."""
    from lshdist.store.dataset import write_dense_shards

    X = np.random.default_rng(2).integers(0, 256, size=(25, 4)).astype(np.float32)
    ds = write_dense_shards(tmp_path / "u", ((X[i:i + 10], None) for i in (0, 10, 20)), n=25,
                            d=4, shard_rows=10, dtype=np.uint8)
    assert ds.attrs["version"] == 3 and np.array_equal(ds.read_all(), X)
    bad = X.copy()
    bad[12, 1] = 0.5
    with pytest.raises(InputError, match=r"shard 1 holds values that are not integers in "
                                         r"0\.\.255 \(or -0\.0\); .*store them as float32"):
        write_dense_shards(tmp_path / "bad", ((bad[i:i + 10], None) for i in (0, 10, 20)),
                           n=25, d=4, shard_rows=10, dtype=np.uint8)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(InputError, match="float32 or uint8"):
        write_dense_shards(tmp_path / "bad", iter([]), n=1, d=1, shard_rows=1, dtype=np.int16)


def test_every_chunk_is_written_all_zero_ones_included(tmp_path):
    """Zarr's default skips a chunk equal to the fill value after comparing each one with it
    (most of a write's time); lshdist writes every chunk, so a missing one is damage."""
    X = np.zeros((30, 3), np.float32)
    X[10:20] = 1.0  # shards 0 and 2 all zero
    write_dataset(tmp_path / "ds", X, np.zeros(30, np.int64), shard_rows=10)
    assert sorted(p.name for p in (tmp_path / "ds" / "X" / "c").iterdir()) == ["0", "1", "2"]
    assert sorted(p.name for p in (tmp_path / "ds" / "y" / "c").iterdir()) == ["0", "1", "2"]
    np.testing.assert_array_equal(Dataset(tmp_path / "ds").read_rows(0, 30), X)
