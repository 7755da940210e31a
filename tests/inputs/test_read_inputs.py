"""`read_inputs` and the readers: every format to (X, y, classes, ids), concatenation, text
weighting, and the messages for bad input."""

import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from lshdist.errors import FormatError, InputError
from lshdist.inputs import detect_format, read_inputs
from lshdist.inputs.formats.delimited import read_csv
from lshdist.inputs.formats.tables import read_parquet
from lshdist.inputs.text import Idf, bag_of_words, feature_ids
from lshdist.store.dataset import Dataset, write_dataset


def write_idx(path: Path, arr: np.ndarray, *, gz: bool = True) -> Path:
    arr = np.asarray(arr, dtype=np.uint8)
    raw = bytes([0, 0, 0x08, arr.ndim]) + np.array(arr.shape, ">i4").tobytes() + arr.tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def write_newsgroups(path: Path, rows: list[tuple[str, str]]) -> Path:
    lines = ["Category\tText", "d\tstring", "class\t"] + [f"{c}\t{t}" for c, t in rows]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


DOCS = [
    ("sci.space", "the moon and the orbit of the moon"),
    ("rec.autos", "a car engine and a car wheel"),
    ("sci.space", "orbit launch rocket"),
    ("rec.autos", "engine oil"),
]


# -- formats ----------------------------------------------------------------------------------
def test_npy_with_labels_file(tmp_path):
    X = np.arange(12, dtype=np.float64).reshape(4, 3)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", np.array(["b", "a", "b", "c"]))
    data = read_inputs([tmp_path / "x.npy"], labels=[tmp_path / "y.npy"])
    np.testing.assert_array_equal(data.X, X)
    assert data.classes == ["a", "b", "c"]
    np.testing.assert_array_equal(data.y, [1, 0, 1, 2])
    assert data.ids is None and data.kind == "dense" and data.d == 3


def test_npz_with_labels_and_ids(tmp_path):
    X = np.random.default_rng(0).random((5, 2)).astype(np.float32)
    np.savez(tmp_path / "a.npz", X=X, y=np.array([3, 1, 3, 10, 2]), ids=np.arange(100, 105))
    data = read_inputs([tmp_path / "a.npz"])
    np.testing.assert_array_equal(data.X, X)
    assert data.classes == ["1", "2", "3", "10"]
    np.testing.assert_array_equal(data.y, [2, 0, 2, 3, 1])
    np.testing.assert_array_equal(data.ids, np.arange(100, 105))


def test_scipy_sparse_npz(tmp_path):
    X = sp.random(6, 40, density=0.2, format="csr", dtype=np.float32, random_state=1)
    sp.save_npz(tmp_path / "s.npz", X)
    data = read_inputs([tmp_path / "s.npz"])
    assert data.kind == "sparse" and data.d == 40 and data.y is None
    cols = np.arange(40, dtype=np.uint64)
    np.testing.assert_array_equal(data.X.over(cols).toarray(), X.toarray())


def test_csv_with_header_and_default_label_column(tmp_path):
    (tmp_path / "a.csv").write_text("f1,label,f2\n1.5,cat,2\n3,dog,4e1\n-1,cat,0\n")
    data = read_csv(tmp_path / "a.csv")
    np.testing.assert_array_equal(data.X, [[1.5, 2], [3, 40], [-1, 0]])
    assert data.classes == ["cat", "dog"] and data.y.tolist() == [0, 1, 0]


def test_csv_without_header_label_by_index_gzipped(tmp_path):
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(b"1,2,7\n3,4,7\n5,6,8\n"))
    data = read_inputs([tmp_path / "a.csv.gz"], label_column="-1")
    np.testing.assert_array_equal(data.X, [[1, 2], [3, 4], [5, 6]])
    assert data.classes == ["7", "8"]


def test_csv_header_override_and_label_by_name(tmp_path):
    (tmp_path / "a.csv").write_text("a,b,c\n1,2,x\n")
    data = read_csv(tmp_path / "a.csv", label_column="c", header=True)
    assert data.X.tolist() == [[1, 2]] and data.classes == ["x"]
    (tmp_path / "b.csv").write_text("1,2\n3,4\n")
    assert read_csv(tmp_path / "b.csv", header=True).X.tolist() == [[3, 4]]


def test_parquet_features_and_label(tmp_path):
    table = pa.table({"a": [1.0, 2.0], "b": pa.array([1, 2], pa.int16()),
                      "flag": [True, False], "y": ["u", "v"]})  # fmt: skip
    pq.write_table(table, tmp_path / "t.parquet")
    data = read_parquet(tmp_path / "t.parquet")
    np.testing.assert_array_equal(data.X, [[1, 1, 1], [2, 2, 0]])
    assert data.classes == ["u", "v"] and data.d == 3
    pq.write_table(table.drop_columns(["y"]), tmp_path / "u.parquet")
    by_name = read_inputs([tmp_path / "u.parquet"], label_column="b")
    assert by_name.classes == ["1", "2"] and by_name.d == 2
    assert read_inputs([tmp_path / "u.parquet"]).y is None


def test_idx_pairs_are_matched_by_name_in_any_order(tmp_path):
    rng = np.random.default_rng(0)
    imgs = {s: rng.integers(0, 256, (n, 3, 2)) for s, n in (("train", 5), ("t10k", 3))}
    labs = {s: rng.integers(0, 10, len(imgs[s])) for s in imgs}
    files = []
    for s in ("t10k", "train"):  # labels first, test split first: pairing is by name
        files.append(write_idx(tmp_path / f"{s}-labels-idx1-ubyte.gz", labs[s]))
    for s in ("train", "t10k"):
        files.append(write_idx(tmp_path / f"{s}-images-idx3-ubyte", imgs[s], gz=False))
    data = read_inputs(files)
    assert data.X.dtype == np.uint8 and data.X.shape == (8, 6)
    np.testing.assert_array_equal(
        data.X, np.concatenate([imgs["train"], imgs["t10k"]]).reshape(8, 6)
    )
    codes = np.array(data.classes).astype(int)[data.y]
    np.testing.assert_array_equal(codes, np.concatenate([labs["train"], labs["t10k"]]))


def test_idx_single_pair_with_other_names(tmp_path):
    a = write_idx(tmp_path / "pics.idx", np.zeros((2, 2, 2)))
    b = write_idx(tmp_path / "tags.idx", [4, 5])
    data = read_inputs([b, a])
    assert data.n == 2 and data.classes == ["4", "5"]


def test_letter_format_is_detected(tmp_path):
    rows = ["T,2,8,3,5,1,8,13,0,6,6,10,8,0,8,0,8", "I,5,12,3,7,2,10,5,5,4,13,3,9,2,8,4,10"]
    (tmp_path / "letter.data").write_text("\n".join(rows) + "\n")
    assert detect_format(tmp_path / "letter.data") == "letter"
    data = read_inputs([tmp_path / "letter.data"])
    assert data.X.shape == (2, 16) and data.classes == ["I", "T"] and data.y.tolist() == [1, 0]


def test_newsgroups_text_becomes_tfidf_rows(tmp_path):
    path = write_newsgroups(tmp_path / "ng.tab.gz", DOCS)
    assert detect_format(path) == "newsgroups"
    data = read_inputs([path])
    assert data.kind == "sparse" and data.d == 2**64 and data.n == 4
    assert data.classes == ["rec.autos", "sci.space"] and data.y.tolist() == [1, 0, 1, 0]
    np.testing.assert_allclose(data.X.row_norms_sq(), 1.0, rtol=1e-6)
    assert data.attrs["text"]["weighting"] == "tfidf" and data.attrs["text"]["idf_source"] == "self"
    counts = read_inputs([path], weighting="counts").X
    words = feature_ids(["the", "moon", "orbit"])
    first = counts.over(np.sort(words)).toarray()[0][np.argsort(np.argsort(words))]
    np.testing.assert_allclose(first / first[2], [3, 2, 1], rtol=1e-6)  # "the" thrice, ...


def test_dataset_input_is_resharded_with_ids_classes_and_attrs(tmp_path):
    X = np.arange(20, dtype=np.float32).reshape(10, 2)
    write_dataset(tmp_path / "a", X, np.array(["x", "y"] * 5), ids=np.arange(10) * 2,
                  shard_rows=3, attrs={"note": "kept"})  # fmt: skip
    data = read_inputs([tmp_path / "a"])
    ds = data.write(tmp_path / "b", shard_rows=4)
    assert ds.n_shards == 3 and ds.classes == ["x", "y"] and ds.attrs["note"] == "kept"
    np.testing.assert_array_equal(ds.read_all(), X)
    np.testing.assert_array_equal(ds.ids(), np.arange(10) * 2)
    np.testing.assert_array_equal(ds.labels(), Dataset(tmp_path / "a").labels())


# -- several inputs ---------------------------------------------------------------------------
def test_inputs_are_concatenated_with_a_union_of_classes(tmp_path):
    np.savez(tmp_path / "a.npz", X=np.zeros((2, 3)), y=np.array([2, 10]))
    np.savez(tmp_path / "b.npz", X=np.ones((3, 3)), y=np.array([1, 2, 2]))
    data = read_inputs([tmp_path / "a.npz", tmp_path / "b.npz"])
    assert data.n == 5 and data.classes == ["1", "2", "10"]
    np.testing.assert_array_equal(np.array(data.classes)[data.y], ["2", "10", "1", "2", "2"])
    assert data.sources == [str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]


def test_inputs_with_different_features_are_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 3)))
    np.save(tmp_path / "b.npy", np.zeros((2, 4)))
    with pytest.raises(
        InputError, match=r"'.*b.npy' has 4 features, but '.*a.npy' has 3; all inputs must"
    ):
        read_inputs([tmp_path / "a.npy", tmp_path / "b.npy"])


def test_dense_and_sparse_inputs_are_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 3)))
    sp.save_npz(tmp_path / "b.npz", sp.csr_matrix(np.eye(3)[:2]))
    with pytest.raises(InputError, match="inputs mix dense and sparse rows"):
        read_inputs([tmp_path / "a.npy", tmp_path / "b.npz"])


def test_labelled_and_unlabelled_inputs_are_refused(tmp_path):
    np.savez(tmp_path / "a.npz", X=np.zeros((2, 3)), y=[0, 1])
    np.save(tmp_path / "b.npy", np.zeros((2, 3)))
    with pytest.raises(InputError, match=r"'.*b.npy' has no labels but '.*a.npz' has"):
        read_inputs([tmp_path / "a.npz", tmp_path / "b.npy"])


def test_options_for_other_formats_are_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 3)))
    with pytest.raises(InputError, match="--label-column applies to csv and parquet inputs"):
        read_inputs([tmp_path / "a.npy"], label_column="y")
    with pytest.raises(InputError, match="--weighting/--idf-from applies to newsgroups inputs"):
        read_inputs([tmp_path / "a.npy"], weighting="counts")
    with pytest.raises(InputError, match="got 2 --labels files for 1 inputs"):
        read_inputs([tmp_path / "a.npy"], labels=["x.npy", "y.npy"])


# -- bad input: messages (the CLI tests check that nothing is left behind) -------------------
def test_nan_gives_count_and_first_row(tmp_path):
    X = np.ones((5, 2))
    X[3, 1] = np.nan
    X[4, 0] = np.inf
    np.save(tmp_path / "a.npy", X)
    with pytest.raises(
        InputError,
        match=r"holds 2 NaN or infinite values \(first in row 3, column \d+\): .*remove or impute"
    ):
        read_inputs([tmp_path / "a.npy"])


def test_nan_in_sparse_input(tmp_path):
    X = sp.csr_matrix(np.array([[0, 1.0], [np.nan, 0]]))
    sp.save_npz(tmp_path / "a.npz", X)
    with pytest.raises(InputError,
                       match=r"holds 1 NaN or infinite values \(first in row 1, column \d+\)"):
        read_inputs([tmp_path / "a.npz"])


def test_empty_csv_cell_counts_as_missing(tmp_path):
    (tmp_path / "a.csv").write_text("1,2\n3,\n")
    with pytest.raises(InputError,
                       match=r"holds 1 NaN or infinite values \(first in row 1, column \d+\)"):
        read_inputs([tmp_path / "a.csv"])


def test_ragged_csv_names_the_line(tmp_path):
    (tmp_path / "a.csv").write_text("a,b,c\n1,2,3\n4,5,6\n7,8\n")
    with pytest.raises(
        InputError, match=r"line 4 has 2 fields, but the first line has 3; every row"
    ):
        read_inputs([tmp_path / "a.csv"])


def test_ragged_newsgroups_row_names_the_line(tmp_path):
    path = write_newsgroups(tmp_path / "ng.tab.gz", DOCS)
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()) + b"a\tb\tc\n"))
    with pytest.raises(InputError, match="line 8 has 3 tab-separated fields, but the header has 2"):
        read_inputs([path])


def test_label_count_must_match_rows(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((4, 2)))
    np.save(tmp_path / "y.npy", np.zeros(3, dtype=int))
    with pytest.raises(
        InputError,
        match=r"'.*y.npy' has 3 labels, but '.*x.npy' has 4 rows; give one label per row",
    ):
        read_inputs([tmp_path / "x.npy"], labels=[tmp_path / "y.npy"])


def test_idx_label_count_must_match_images(tmp_path):
    a = write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((3, 2, 2)))
    b = write_idx(tmp_path / "train-labels-idx1-ubyte.gz", [1, 2])
    with pytest.raises(InputError, match=r"has 2 labels, but images file .* has 3 images"):
        read_inputs([a, b])


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("a.csv", b"", "is empty; give a file with at least one row"),
        ("a.csv", b"x,y\n", "has no data rows; give a file with at least one row"),
        ("a.npy", None, r"is empty \(shape \(0, 3\)\); give at least one row"),
        ("ng.tab", b"Category\tText\nd\tstring\nclass\t\n", "has no documents"),
    ],
)
def test_empty_input(tmp_path, name, content, message):
    if content is None:
        np.save(tmp_path / name, np.zeros((0, 3)))
    else:
        (tmp_path / name).write_bytes(content)
    with pytest.raises(InputError, match=message):
        read_inputs([tmp_path / name])


def test_unknown_format(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(
        FormatError, match=r"cannot tell the format of '.*a.bin' .*pass --format, one of: npy"
    ):
        read_inputs([tmp_path / "a.bin"])
    with pytest.raises(InputError, match="unknown format 'xls'; expected one of"):
        read_inputs([tmp_path / "a.bin"], format="xls")


def test_non_numeric_csv_feature_names_column_and_line(tmp_path):
    (tmp_path / "a.csv").write_text("a,b\n1,2\n3,x7\n")
    with pytest.raises(
        InputError, match=r"column 'b' holds the non-numeric value 'x7' on line 3; features must"
    ):
        read_inputs([tmp_path / "a.csv"])


def test_non_numeric_parquet_and_npy(tmp_path):
    pq.write_table(pa.table({"a": [1.0], "s": ["x"]}), tmp_path / "t.parquet")
    with pytest.raises(
        InputError, match="column 's' has type string, but features must be numeric"
    ):
        read_inputs([tmp_path / "t.parquet"])
    np.save(tmp_path / "s.npy", np.array([["a", "b"]]))
    with pytest.raises(InputError, match="holds <U1 values, but features must be numeric"):
        read_inputs([tmp_path / "s.npy"])


def test_pickled_npy_is_refused(tmp_path):
    np.save(tmp_path / "o.npy", np.array([[{}]], dtype=object), allow_pickle=True)
    with pytest.raises(FormatError, match=r"holds Python objects .*lshdist never unpickles"):
        read_inputs([tmp_path / "o.npy"])


def test_label_column_not_found(tmp_path):
    (tmp_path / "a.csv").write_text("a,b\n1,2\n")
    with pytest.raises(
        InputError, match=r"label column 'c' not found .*its columns are \['a', 'b'\]"
    ):
        read_inputs([tmp_path / "a.csv"], label_column="c")


def test_truncated_idx(tmp_path):
    path = write_idx(tmp_path / "i.idx", np.zeros((4, 2, 2)), gz=False)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(
        FormatError, match=r"holds 13 data bytes, but its header announces 4 x 2 x 2"
    ):
        read_inputs([path])


def test_idx_with_no_items(tmp_path):
    images = write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((0, 28, 28)))
    with pytest.raises(
        InputError,
        match=r"'.*train-images-idx3-ubyte.gz' holds no data: its header announces 0 x 28 x 28 "
        r"uint8 values \(0 items\), expected at least one item .*give an IDX file with at least",
    ):
        read_inputs([images])
    pixels = write_idx(tmp_path / "p-images-idx3-ubyte", np.zeros((2, 0, 3)), gz=False)
    with pytest.raises(InputError, match=r"announces 2 x 0 x 3 uint8 values \(0 values per item\)"):
        read_inputs([pixels])


def test_idx_cut_inside_its_header(tmp_path):
    (tmp_path / "h.idx").write_bytes(bytes([0, 0, 0x08, 3, 0, 0, 0, 5]))
    with pytest.raises(
        FormatError, match=r"ends inside its header \(it announces 3 dimensions, 16 header bytes"
    ):
        read_inputs([tmp_path / "h.idx"])


def test_parquet_label_column_of_lists(tmp_path):
    pq.write_table(pa.table({"a": [1.0, 2.0], "tags": [[1], [2, 3]]}), tmp_path / "t.parquet")
    with pytest.raises(
        InputError, match=r"label column 'tags' has type list<.*>, but labels must be integers or"
    ):
        read_inputs([tmp_path / "t.parquet"], label_column="tags")


def test_damaged_gzip_and_npz_members(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (500, 4, 4))
    good = write_idx(tmp_path / "i.idx.gz", pixels).read_bytes()
    (tmp_path / "i.idx.gz").write_bytes(good[:-200] + bytes(100) + good[-100:])
    with pytest.raises(FormatError, match="is a corrupted gzip file"):
        read_inputs([tmp_path / "i.idx.gz"])
    np.savez(tmp_path / "a.npz", X=np.arange(1000.0).reshape(100, 10))
    raw = bytearray((tmp_path / "a.npz").read_bytes())
    raw[500] ^= 0xFF  # inside the stored X.npy: its CRC no longer matches
    (tmp_path / "a.npz").write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=r"array 'X' is damaged .*write the file again"):
        read_inputs([tmp_path / "a.npz"])


def test_foreign_zarr_group_and_plain_directory(tmp_path):
    import zarr

    zarr.open_group(str(tmp_path / "g"), mode="w").create_array("a", data=np.arange(3))
    with pytest.raises(FormatError, match="is a Zarr group but not an lshdist dataset"):
        read_inputs([tmp_path / "g"])
    (tmp_path / "d").mkdir()
    with pytest.raises(FormatError, match=r"is a directory but not a Zarr group \(no zarr.json\)"):
        read_inputs([tmp_path / "d"])


# -- text weighting ---------------------------------------------------------------------
def test_idf_of_a_stored_dataset_equals_that_of_its_counts(tmp_path):
    path = write_newsgroups(tmp_path / "ng.tab.gz", DOCS)
    read_inputs([path]).write(tmp_path / "train", shard_rows=3)
    stored, direct = (
        Idf.from_dataset(tmp_path / "train"),
        Idf.from_counts(bag_of_words([t for _, t in DOCS])),
    )
    np.testing.assert_array_equal(stored.features, direct.features)
    np.testing.assert_array_equal(stored.values, direct.values)
    assert stored.n_documents == 4


def test_test_split_weighted_with_train_idf_drops_unseen_words(tmp_path):
    train = write_newsgroups(tmp_path / "train.tab.gz", DOCS)
    test = write_newsgroups(
        tmp_path / "test.tab.gz", [("sci.space", "moon zebra"), ("rec.autos", "zebra")]
    )
    read_inputs([train]).write(tmp_path / "train", shard_rows=10)
    data = read_inputs([test], idf_from=tmp_path / "train")
    assert data.attrs["text"]["idf_source"] == str(tmp_path / "train")
    moon = feature_ids(["moon"])
    np.testing.assert_array_equal(data.X.features, moon)  # "zebra" never seen in training
    assert data.X.matrix.toarray().tolist() == [[1.0], [0.0]]  # a row left empty stays empty
    write_dataset(tmp_path / "dense", np.ones((2, 2)))
    with pytest.raises(FormatError, match="is a dense dataset without text attributes"):
        read_inputs([test], idf_from=tmp_path / "dense")
    with pytest.raises(
        InputError, match="--idf-from needs --weighting tfidf, got --weighting counts"
    ):
        read_inputs([test], idf_from=tmp_path / "train", weighting="counts")
