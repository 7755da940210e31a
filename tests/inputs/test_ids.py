"""Row ids: from an id column, an ``.npz`` or a dataset; unique within a dataset; shifted."""

import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lshdist.errors import InputError
from lshdist.inputs import read_inputs
from lshdist.store.dataset import write_dataset


def test_csv_id_column_becomes_the_ids_not_a_feature(tmp_path):
    (tmp_path / "a.csv").write_text("f1,id,label,f2\n1.5,70,cat,2\n3,12,dog,4\n-1,55,cat,0\n")
    data = read_inputs([tmp_path / "a.csv"], id_column="id")
    assert data.ids.dtype == np.int64 and data.ids.tolist() == [70, 12, 55]
    np.testing.assert_array_equal(data.X, [[1.5, 2], [3, 4], [-1, 0]])
    assert data.d == 2 and data.classes == ["cat", "dog"]
    (tmp_path / "b.csv").write_text("9,1,2\n4,3,4\n")  # no header: the column by index
    assert read_inputs([tmp_path / "b.csv"], id_column="0").ids.tolist() == [9, 4]


def test_parquet_id_column(tmp_path):
    ids = pa.array([2**40, -3, 7], pa.int64())
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0], "key": ids, "y": [0, 1, 0]}), tmp_path / "t.pq")
    data = read_inputs([tmp_path / "t.pq"], format="parquet", id_column="key")
    assert data.ids.tolist() == [2**40, -3, 7] and data.d == 1 and data.y.tolist() == [0, 1, 0]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_duplicate_ids_in_a_column_name_the_first_duplicate(tmp_path, fmt):
    ids, a = [8, 3, 5, 3, 8], [1.0, 2.0, 3.0, 4.0, 5.0]
    path = tmp_path / f"t.{fmt}"
    if fmt == "csv":
        path.write_text("id,a\n" + "".join(f"{i},{v}\n" for i, v in zip(ids, a)))
    else:
        pq.write_table(pa.table({"id": ids, "a": a}), path)
    with pytest.raises(
        InputError,
        match=r"t\.\w+:id' has duplicate ids: id 3 is on rows 1 and 3; ids must be unique "
        r"within a dataset: fix the id column, or drop --id-column",
    ):
        read_inputs([path], id_column="id")


def test_bad_id_columns(tmp_path):
    (tmp_path / "f.csv").write_text("id,a\n5,1\n7.5,2\n")
    with pytest.raises(
        InputError, match=r"id column 'id' holds '7.5' on line 3, which is not an int64 integer"
    ):
        read_inputs([tmp_path / "f.csv"], id_column="id")
    (tmp_path / "n.csv").write_text("id,a\n5,1\n,2\n")
    with pytest.raises(
        InputError, match=r"id column 'id' of '.*n.csv' misses 1 values \(first in row 1\)"
    ):
        read_inputs([tmp_path / "n.csv"], id_column="id")
    pq.write_table(pa.table({"id": [1.0, 2.0], "a": [1.0, 2.0]}), tmp_path / "f.parquet")
    with pytest.raises(InputError, match=r"id column 'id' of .* has type double, but ids must be"):
        read_inputs([tmp_path / "f.parquet"], id_column="id")
    (tmp_path / "l.csv").write_text("id,a,label\n1,2,x\n")
    with pytest.raises(
        InputError, match=r"column 'label' of .* is both the label column and the id column"
    ):
        read_inputs([tmp_path / "l.csv"], id_column="label")
    with pytest.raises(InputError, match=r"id column 'key' not found in .*\['id', 'a', 'label'\]"):
        read_inputs([tmp_path / "l.csv"], id_column="key")
    np.save(tmp_path / "x.npy", np.ones((2, 2)))
    with pytest.raises(InputError, match="--id-column applies to csv and parquet inputs"):
        read_inputs([tmp_path / "x.npy"], id_column="id")


def test_duplicate_ids_in_an_npz_or_a_dataset(tmp_path, reseal):
    np.savez(tmp_path / "a.npz", X=np.ones((4, 2)), ids=np.array([10, 11, 12, 11]))
    with pytest.raises(
        InputError,
        match=r"a.npz:ids' has duplicate ids: id 11 is on rows 1 and 3; .*fix the 'ids' array",
    ):
        read_inputs([tmp_path / "a.npz"])
    with pytest.raises(InputError, match="ids has duplicates: id 4 is on rows 0 and 1"):
        write_dataset(tmp_path / "ds", np.ones((3, 2)), ids=np.array([4, 4, 5]))
    write_dataset(tmp_path / "ds", np.ones((3, 2)), ids=np.array([4, 3, 5]))
    import zarr

    zarr.open_group(str(tmp_path / "ds"), mode="r+")["ids"][1] = 4
    reseal(tmp_path / "ds")  # a sealed dataset with a repeated id
    with pytest.raises(InputError, match="has duplicate ids: id 4 is on rows 0 and 1"):
        read_inputs([tmp_path / "ds"])


def test_ids_repeated_across_inputs_are_refused(tmp_path):
    np.savez(tmp_path / "a.npz", X=np.ones((2, 2)), ids=np.array([9, 1]))
    np.savez(tmp_path / "b.npz", X=np.ones((3, 2)), ids=np.array([2, 3, 9]))
    with pytest.raises(
        InputError,
        match=r"row id 9 is in both '.*a.npz' and '.*b.npz'; ids must be unique within a "
        r"dataset: .*--id-offset",
    ):
        read_inputs([tmp_path / "a.npz", tmp_path / "b.npz"])
    np.savez(tmp_path / "c.npz", X=np.ones((1, 2)), ids=np.array([0]))
    data = read_inputs([tmp_path / "a.npz", tmp_path / "c.npz"])
    assert data.ids.tolist() == [9, 1, 0]


def test_inputs_with_and_without_ids_are_numbered(tmp_path, caplog):
    np.savez(tmp_path / "a.npz", X=np.ones((2, 2)), ids=np.array([9, 1]))
    np.save(tmp_path / "b.npy", np.ones((1, 2)))
    with caplog.at_level(logging.WARNING, logger="lshdist.inputs"):
        data = read_inputs([tmp_path / "a.npz", tmp_path / "b.npy"])
    assert data.ids is None and "numbering all rows 0..N-1" in caplog.text


def test_id_offset_shifts_default_and_given_ids(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((4, 2)))
    data = read_inputs([tmp_path / "x.npy"], id_offset=1000)
    assert data.ids.tolist() == [1000, 1001, 1002, 1003]
    assert data.rows(1, 3).ids.tolist() == [1001, 1002]
    np.savez(tmp_path / "a.npz", X=np.ones((2, 2)), ids=np.array([7, 3]))
    assert read_inputs([tmp_path / "a.npz"], id_offset=10).ids.tolist() == [17, 13]
    assert read_inputs([tmp_path / "x.npy"], id_offset=0).ids is None


def test_id_offset_out_of_range(tmp_path):
    np.savez(tmp_path / "a.npz", X=np.ones((2, 2)), ids=np.array([0, 2**62]))
    with pytest.raises(
        InputError,
        match=r"id offset 4611686018427387904 moves id 4611686018427387904 beyond the int64 "
        r"maximum 9223372036854775807; give an offset <= 4611686018427387903",
    ):
        read_inputs([tmp_path / "a.npz"], id_offset=2**62)
    with pytest.raises(InputError, match="id offset -1 is negative; give an offset >= 0"):
        read_inputs([tmp_path / "a.npz"], id_offset=-1)
