"""Dataset shards are sealed: every read checks the shards it touches against the checksums
written at ingest, and names the shard that does not match; the attributes are sealed too.

A flipped byte that still decodes, a deleted chunk (Zarr reads it back as fill values without a
word) and an edited attribute were all read before the checksums, and answered.
"""

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

from lshdist.cli import main
from lshdist.embed.pointsets import PointSets
from lshdist.errors import FormatError, InputError
from lshdist.store.dataset import Dataset, write_dataset, write_dense_shards, write_pointsets


def _dense(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 4)).astype(np.float32)
    return write_dataset(tmp_path / "dense", X, rng.integers(0, 3, 30),
                         ids=rng.permutation(1000)[:30], shard_rows=10).path


def _sparse(tmp_path: Path) -> Path:
    X = sp.random(30, 50, density=0.2, format="csr", dtype=np.float32, random_state=0)
    return write_dataset(tmp_path / "sparse", X, shard_rows=10).path


def _sets(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 5, 30)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    values = rng.normal(size=(int(offsets[-1]), 3)).astype(np.float32)
    coords = rng.uniform(0, 9, size=(int(offsets[-1]), 2)).astype(np.float32)
    return write_pointsets(tmp_path / "sets", PointSets(values, offsets, None, coords),
                           shard_rows=10).path


def _change(path: Path, array: str, index: int) -> None:
    """Change one stored value in place through Zarr, as a flipped bit that still decodes."""
    a = zarr.open_group(str(path), mode="r+")[array]
    v = np.asarray(a[index:index + 1])
    a[index:index + 1] = v + 1 if v.dtype.kind in "iu" else v * 2 + 1
    assert not np.array_equal(np.asarray(a[index:index + 1]), v)


def _read_all(ds: Dataset) -> None:
    if ds.stored_kind == "pointsets":
        ds.read_sets(0, ds.n)
    else:
        ds.read_all()
    ds.ids()
    ds.labels()


@pytest.mark.parametrize("kind,array,index,shard,name", [
    ("dense", "X", 15, 1, "X"),
    ("dense", "ids", 29, 2, "ids"),
    ("dense", "y", 3, 0, "y"),
    ("sparse", "X/data", -1, 2, "X"),
    ("sparse", "X/indices", 0, 0, "X"),
    ("sparse", "ids", 12, 1, "ids"),
    ("sets", "P/values", -1, 2, "P"),
    ("sets", "P/coords", 0, 0, "P"),
])
def test_a_changed_value_is_refused_naming_its_shard(tmp_path, kind, array, index, shard, name):
    path = {"dense": _dense, "sparse": _sparse, "sets": _sets}[kind](tmp_path)
    n = zarr.open_group(str(path), mode="r")[array].shape[0]
    _change(path, array, index % n)
    lo, hi = 10 * shard, 10 * shard + 10
    match = rf"shard {shard} \(rows {lo}:{hi}\) of {name} does not match its checksum"
    with pytest.raises(FormatError, match=match):
        _read_all(Dataset(path))
    with pytest.raises(FormatError, match=match):
        Dataset(path).verify()
    if name in ("X", "P"):  # the other shards still read
        other = (shard + 1) % 3
        ds = Dataset(path)
        if kind == "sets":
            ds.read_sets(10 * other, 10 * other + 10)
        else:
            ds.read_shard(other)


@pytest.mark.parametrize("kind,array", [("dense", "X"), ("dense", "ids"), ("dense", "y"),
                                        ("sparse", "X/indptr"), ("sets", "P/offsets")])
def test_a_deleted_chunk_is_refused(tmp_path, kind, array):
    """Zarr reads a missing chunk as fill values: only the checksum notices."""
    path = {"dense": _dense, "sparse": _sparse, "sets": _sets}[kind](tmp_path)
    chunks = sorted(p for p in (path / array / "c").rglob("*") if p.is_file())
    chunks[-1].unlink()
    with pytest.raises(FormatError, match=r"does not match its checksum: a chunk is damaged or "
                                          r"missing|does not rise within"):
        _read_all(Dataset(path))


def test_a_flipped_byte_in_any_chunk_file_is_refused(tmp_path):
    path = _dense(tmp_path)
    for f in sorted(p for p in path.rglob("*") if p.is_file() and "c" in p.parts):
        good = f.read_bytes()
        raw = bytearray(good)
        raw[len(raw) // 2] ^= 0x10
        f.write_bytes(bytes(raw))
        with pytest.raises(FormatError, match=r"shard \d \(rows \d+:\d+\) of (X|ids|y)"):
            _read_all(Dataset(path))
        f.write_bytes(good)
    _read_all(Dataset(path))


def test_the_lazy_reader_checks_too(tmp_path):
    path = _dense(tmp_path)
    _change(path, "X", 25)
    lazy = Dataset(path).to_dask()
    np.testing.assert_array_equal(lazy[:20].compute(), Dataset(path).read_rows(0, 20))
    with pytest.raises(FormatError, match=r"shard 2 \(rows 20:30\) of X"):
        lazy.compute()


def test_rows_inside_one_shard_are_checked_with_it(tmp_path):
    path = _dense(tmp_path)
    ref = Dataset(path).read_all()
    np.testing.assert_array_equal(Dataset(path).read_rows(12, 17), ref[12:17])
    assert Dataset(path).read_rows(7, 7).shape == (0, 4)
    with pytest.raises(InputError, match=r"rows 5:31 out of range 0\.\.30"):
        Dataset(path).read_rows(5, 31)
    _change(path, "X", 19)
    with pytest.raises(FormatError, match=r"shard 1 \(rows 10:20\) of X"):
        Dataset(path).read_rows(12, 13)


@pytest.mark.parametrize("edit", [{"N": 31}, {"classes": ["a", "b", "z"]}, {"source": "x"}])
def test_edited_attributes_are_refused(tmp_path, edit):
    path = _dense(tmp_path)
    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"].update(edit)
    (path / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=r"the attributes in zarr.json do not match their "
                                          r"checksum .*edited or damaged; re-ingest"):
        Dataset(path)


@pytest.mark.parametrize("sums", [None, {"X": ["0" * 64] * 3}, {"X": [], "ids": []},
                                  "abc", {"X": ["x"] * 3, "ids": ["x"] * 3, "y": ["x"] * 3}])
def test_malformed_checksums_are_refused_even_when_sealed(tmp_path, sums):
    from lshdist.store.dataset import attrs_checksum

    path = _dense(tmp_path)
    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"]["checksums"] = sums
    meta["attributes"]["checksum"] = attrs_checksum(meta["attributes"])
    (path / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=r"checksums=.* is not .*sha256 digests"):
        Dataset(path)


def test_labels_without_their_checksums_are_refused(tmp_path, reseal):
    path = _dense(tmp_path)
    shutil.rmtree(path / "y")
    with pytest.raises(FormatError, match="labels y and their checksums do not go together"):
        Dataset(path)


def test_duplicated_ids_are_refused_at_write_and_by_verify(tmp_path, reseal):
    X = np.ones((6, 2), np.float32)
    with pytest.raises(InputError, match="ids has duplicates: id 7 is on rows 1 and 4"):
        write_dataset(tmp_path / "a", X, ids=[3, 7, 1, 2, 7, 9])
    assert not (tmp_path / "a").exists()
    path = write_dataset(tmp_path / "b", X, ids=[3, 7, 1, 2, 8, 9], shard_rows=4).path
    zarr.open_group(str(path), mode="r+")["ids"][4] = 7
    reseal(path)  # a checksum-valid dataset with a repeated id
    Dataset(path).read_all()
    with pytest.raises(FormatError, match="id 7 is on rows 1 and 4: ids must be unique"):
        Dataset(path).verify()


def test_every_writer_seals_its_shards(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(25, 3)).astype(np.float32)
    y = rng.integers(0, 2, 25)
    ds = write_dense_shards(tmp_path / "d", ((X[i:i + 10], y[i:i + 10]) for i in (0, 10, 20)),
                            n=25, d=3, shard_rows=10, classes=["a", "b"])
    ds.verify()
    assert ds.attrs["checksums"] == write_dataset(tmp_path / "w", X, y, classes=["a", "b"],
                                                  shard_rows=10).attrs["checksums"]
    _change(ds.path, "y", 24)
    with pytest.raises(FormatError, match=r"shard 2 \(rows 20:25\) of y"):
        Dataset(ds.path).labels()
    Dataset(_sets(tmp_path)).verify()
    Dataset(_sparse(tmp_path)).verify()


def _make_legacy(path: Path) -> None:
    """What an earlier lshdist wrote: format version 1, no checksums."""
    meta = json.loads((path / "zarr.json").read_text())
    for key in ("checksums", "checksum"):
        del meta["attributes"][key]
    meta["attributes"]["version"] = 1
    (path / "zarr.json").write_text(json.dumps(meta))


def test_a_dataset_without_checksums_is_refused_and_ingest_converts_it(tmp_path, caplog,
                                                                       capsys):
    path = _dense(tmp_path)
    ref = Dataset(path)
    _make_legacy(path)
    with pytest.raises(FormatError, match=r"written by an earlier lshdist \(dataset format "
                                          r"version 1, without checksums\).*lshdist ingest"):
        Dataset(path)
    assert main(["verify", str(path)]) == 2
    assert "without checksums" in capsys.readouterr().err
    with caplog.at_level(logging.WARNING, logger="lshdist.store.dataset"):
        old = Dataset(path, legacy=True)
        np.testing.assert_array_equal(old.read_all(), ref.read_all())
    assert "no checksums" in caplog.text
    assert main(["ingest", str(path), "--out", str(tmp_path / "new"), "--shard-rows", "10"]) == 0
    new = Dataset(tmp_path / "new")
    new.verify()
    np.testing.assert_array_equal(new.read_all(), ref.read_all())
    np.testing.assert_array_equal(new.ids(), ref.ids())
    assert new.attrs["checksums"] == ref.attrs["checksums"]
