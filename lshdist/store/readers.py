"""Readers: one input file to the rows, labels and ids that `write_dataset` stores.

One reader per input format, each returning an `InputData`; `read_input` detects the format and
calls the right one.  Several inputs (concatenation, IDX pairing, text weighting) are the job of
`lshdist.store.inputs.read_inputs`.

Formats (and how each is recognised when ``--format`` is not given):

- ``npy`` (magic): a dense 2-d numeric array; labels from ``--labels FILE.npy``.
- ``npz`` (magic): arrays ``X`` (and ``y``, ``ids``), or a ``scipy.sparse.save_npz`` matrix.
- ``csv`` (extension ``.csv``/``.data``/``.txt``; ``.tab``/``.tsv`` are tab-separated; ``.gz``
  allowed): numbers, an optional header, labels in ``--label-column`` (default: a header
  column ``label`` or ``y``).
- ``parquet`` (magic): numeric feature columns and a label column (default ``label`` or ``y``).
- ``idx`` (magic 0x00000803 images, 0x00000801 labels, gzip allowed): Fashion-MNIST style
  images files, each paired with its labels file.
- ``letter`` (content): UCI Letter, a capital letter then 16 integers, no header.
- ``newsgroups`` (content of a ``.tab``/``.tsv``/``.txt``): tab-separated, 3 header rows,
  columns ``Category`` and ``Text``; text becomes hashed token counts (`lshdist.store.text`).
- ``zarr`` (a directory with ``zarr.json``): an lshdist dataset, to re-shard.

Every problem with the input is raised as `InputError` or `FormatError` before anything is
written, naming the file, what was expected, what came, and the fix.
"""

from __future__ import annotations

import csv
import gzip
import io
import logging
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from lshdist.blocks import SparseBlock
from lshdist.errors import FormatError, InputError
from lshdist.store.dataset import Dataset, write_dataset
from lshdist.store.text import bag_of_words
from lshdist.validation import check_finite

logger = logging.getLogger(__name__)

FORMATS = ("npy", "npz", "csv", "parquet", "idx", "letter", "newsgroups", "zarr")
_DEFAULT_LABEL_COLUMNS = ("label", "y")
_GZIP_MAGIC = b"\x1f\x8b"
# IDX type byte -> big-endian dtype (http://yann.lecun.com/exdb/mnist/)
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_LETTER_LINE = re.compile(r"^[A-Za-z],(?:\s*-?\d+\s*,){15}\s*-?\d+\s*$")
# what reading a damaged (gzip) file may raise
_READ_ERRORS = (OSError, EOFError, zlib.error, UnicodeDecodeError, csv.Error)
_SCIPY_CSR_KEYS = {"indptr", "indices", "data", "shape", "format"}  # scipy.sparse.save_npz
_SCIPY_COO_KEYS = {"row", "col", "data", "shape", "format"}
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# attributes write_dataset sets itself; the rest of a source dataset's attributes are kept
_CORE_ATTRS = {"format", "version", "N", "d", "kind", "nnz", "shard_rows", "n_shards", "classes"}


@dataclass
class InputData:
    """Rows read from one or more inputs, ready for `write_dataset`.

    Attributes
    ----------
    X : ndarray (N, d) of any numeric dtype, or SparseBlock (N, features)
    y : int32 array (N,) or None
        Label codes, indices into ``classes``.
    classes : list of str or None
    ids : int64 array (N,) or None
        Row ids when the input carried them (a re-sharded dataset); else ``0..N-1`` is written.
    d : int
        Number of features (for sparse rows: the feature space, ``2**64`` for hashed ids).
    sources : list of str
        The files read, in row order.
    format : str
        The input format (one of `FORMATS`).
    is_text : bool
        ``X`` holds raw token counts still to be weighted (`inputs.read_inputs` does).
    attrs : dict
        Extra dataset attributes (JSON-serialisable).
    """

    X: np.ndarray | SparseBlock
    y: np.ndarray | None
    classes: list[str] | None
    ids: np.ndarray | None
    d: int
    sources: list[str]
    format: str
    is_text: bool = False
    attrs: dict = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "sparse" if isinstance(self.X, SparseBlock) else "dense"

    @property
    def n(self) -> int:
        return self.X.n_rows if isinstance(self.X, SparseBlock) else int(self.X.shape[0])

    def rows(self, start: int, stop: int) -> "InputData":
        """Rows ``start:stop`` only (a train/test split of one file); ids keep their values."""
        n = self.n
        if not (0 <= start < stop <= n):
            raise InputError(
                f"rows {start}:{stop} are out of range: the input has {n} rows; "
                f"give START:STOP with 0 <= START < STOP <= {n}"
            )
        sel = np.arange(start, stop)
        X = self.X.take(sel) if isinstance(self.X, SparseBlock) else self.X[start:stop]
        ids = sel.astype(np.int64) if self.ids is None else self.ids[start:stop]
        y = None if self.y is None else self.y[start:stop]
        attrs = {**self.attrs, "rows": [start, stop]}
        return InputData(X, y, self.classes, ids, self.d, self.sources, self.format,
                         self.is_text, attrs)

    def write(
        self, path: str | os.PathLike, *, shard_rows: int, overwrite: bool = False
    ) -> Dataset:
        """Write these rows as a dataset at ``path`` (atomically, see `write_dataset`)."""
        attrs = {**self.attrs, "source": {"format": self.format, "inputs": self.sources}}
        return write_dataset(
            path,
            self.X,
            self.y,
            ids=self.ids,
            classes=self.classes,
            d=self.d if self.kind == "sparse" else None,
            shard_rows=shard_rows,
            overwrite=overwrite,
            attrs=attrs,
        )


# -- format detection -------------------------------------------------------------------------
def _head(path: Path, n: int = 1024) -> bytes:
    """The first ``n`` bytes of ``path``, decompressed if it is gzip."""
    with open(path, "rb") as f:
        raw = f.read(n)
    if raw[:2] == _GZIP_MAGIC:
        try:
            with gzip.open(path, "rb") as f:
                return f.read(n)
        except _READ_ERRORS as exc:
            raise FormatError(f"{str(path)!r} is a corrupted gzip file ({exc})") from None
    return raw


def _open_text(path: Path):
    """``path`` as a text stream (gzip or plain, UTF-8)."""
    with open(path, "rb") as f:
        gz = f.read(2) == _GZIP_MAGIC
    if gz:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _extension(path: Path) -> str:
    """The last suffix of ``path`` other than ``.gz``, lower-cased ('' if none)."""
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    return suffixes[-1] if suffixes else ""


def _delimiter(path: Path) -> str:
    return "\t" if _extension(path) in (".tab", ".tsv") else ","


def _first_line(head: bytes) -> str:
    return head.split(b"\n", 1)[0].decode("utf-8", errors="replace").rstrip("\r")


def _is_idx(head: bytes) -> bool:
    return (
        len(head) >= 8
        and head[0] == 0
        and head[1] == 0
        and head[2] in _IDX_TYPES
        and 1 <= head[3] <= 8
    )


def detect_format(path: str | os.PathLike) -> str:
    """The format of ``path`` from its magic bytes, content or extension (one of `FORMATS`)."""
    path = Path(path)
    if path.is_dir():
        if (path / "zarr.json").is_file():
            return "zarr"
        raise FormatError(
            f"{str(path)!r} is a directory but not a Zarr group (no zarr.json); "
            "give a data file or a dataset written by `lshdist ingest`"
        )
    if not path.is_file():
        raise InputError(f"input {str(path)!r} does not exist")
    head = _head(path)
    if not head:
        raise InputError(f"input {str(path)!r} is empty; give a file with at least one row")
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"PK\x03\x04"):
        return "npz"
    if head.startswith(b"PAR1"):
        return "parquet"
    if _is_idx(head):
        return "idx"
    ext = _extension(path)
    if ext in (".csv", ".data", ".txt", ".tab", ".tsv"):
        line = _first_line(head)
        if _LETTER_LINE.match(line):
            return "letter"
        if ext in (".tab", ".tsv", ".txt") and {"Category", "Text"} <= set(line.split("\t")):
            return "newsgroups"
        return "csv"
    raise FormatError(
        f"cannot tell the format of {str(path)!r} (extension {ext or 'none'!r}, first bytes "
        f"{head[:8].hex(' ')}); pass --format, one of: {', '.join(FORMATS)}"
    )


# -- shared checks ----------------------------------------------------------------------------
def _check_dense(X: np.ndarray, source: str) -> np.ndarray:
    """Check a dense feature matrix read from ``source``; keep its dtype (uint8 stays uint8)."""
    if X.dtype.kind not in "biuf":
        raise InputError(
            f"{source!r} holds {X.dtype} values, but features must be numeric; "
            "convert or drop the non-numeric columns"
        )
    if X.ndim != 2:
        fix = "; for one feature per row use X.reshape(-1, 1)" if X.ndim == 1 else ""
        raise InputError(
            f"{source!r} holds an array of shape {X.shape}, expected 2-d (rows x features){fix}"
        )
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise InputError(
            f"{source!r} is empty (shape {X.shape}); give at least one row and one feature"
        )
    if X.dtype.kind == "f":
        check_finite(X, name=repr(source))
        if X.dtype.itemsize > 4:
            big = np.abs(X) > _FLOAT32_MAX
            if big.any():
                row = int(np.flatnonzero(big.any(axis=1))[0])
                raise InputError(
                    f"{source!r} holds {int(big.sum())} values beyond the float32 range "
                    f"(first in row {row}); lshdist stores float32: rescale the features"
                )
    return X


def _labels_from_values(values: np.ndarray, source: str) -> tuple[np.ndarray, list[str]]:
    """Integer codes and class names of raw label values (numbers or strings)."""
    values = np.asarray(values)
    if values.ndim != 1:
        raise InputError(
            f"labels of {source!r} have shape {values.shape}, expected 1-d (one per row)"
        )
    if values.dtype.kind == "O":
        missing = np.array([v is None for v in values], dtype=bool)
        if missing.any():
            raise InputError(
                f"labels of {source!r} miss {int(missing.sum())} values (first in row "
                f"{int(np.flatnonzero(missing)[0])}); give every row a label"
            )
        values = values.astype(str)
    if values.dtype.kind == "S":
        values = values.astype(str)
    if values.dtype.kind == "U":
        try:  # labels written as integers sort as integers ("2" before "10")
            values = values.astype(np.int64)
        except ValueError:
            pass
    if values.dtype.kind == "f":
        bad = ~np.isfinite(values) | (np.mod(values, 1) != 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(
                f"labels of {source!r} hold {int(bad.sum())} values that are not class codes "
                f"(first {values[i]!r} in row {i}); labels must be integers or names"
            )
        values = values.astype(np.int64)
    if values.dtype.kind not in "biuU":
        raise InputError(
            f"labels of {source!r} have dtype {values.dtype}; expected integers or names"
        )
    classes, codes = np.unique(values, return_inverse=True)
    return codes.ravel().astype(np.int32), [str(c) for c in classes.tolist()]


def attach_labels(data: InputData, values, source: str) -> InputData:
    """Set the labels of ``data`` from raw values (one per row) read from ``source``."""
    values = np.asarray(values)
    if values.ndim != 1:
        raise InputError(
            f"labels of {source!r} have shape {values.shape}, expected 1-d (one per row)"
        )
    if len(values) != data.n:
        raise InputError(
            f"{source!r} has {len(values)} labels, but {data.sources[0]!r} has {data.n} rows; "
            "give one label per row"
        )
    data.y, data.classes = _labels_from_values(values, source)
    return data


# -- numpy ------------------------------------------------------------------------------------
def _np_load(path: Path):
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise FormatError(
                f"{str(path)!r} holds Python objects (pickled); lshdist never unpickles: "
                "save a numeric array (np.save(path, X.astype(np.float32)))"
            ) from None
        raise FormatError(f"{str(path)!r} is not a readable NumPy file ({exc})") from None
    except Exception as exc:  # a damaged header or archive: many types, from many layers
        raise FormatError(
            f"{str(path)!r} is not a readable NumPy file ({type(exc).__name__}: {exc})"
        ) from None


def read_npy(path: str | os.PathLike, *, labels: str | os.PathLike | None = None) -> InputData:
    """A dense ``.npy`` matrix, labels optionally from a 1-d ``.npy`` file."""
    path = Path(path)
    X = _np_load(path)
    if not isinstance(X, np.ndarray):
        raise FormatError(f"{str(path)!r} is a .npz archive, not .npy; read it with --format npz")
    X = _check_dense(X, str(path))
    data = InputData(X, None, None, None, int(X.shape[1]), [str(path)], "npy")
    if labels is not None:
        attach_labels(data, read_labels_file(labels), str(labels))
    return data


def read_labels_file(path: str | os.PathLike) -> np.ndarray:
    """Labels saved with ``np.save`` (any 1-d array of integers or names)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"labels file {str(path)!r} does not exist")
    y = _np_load(path)
    if not isinstance(y, np.ndarray):
        raise FormatError(
            f"labels file {str(path)!r} is not a .npy array; save labels with np.save"
        )
    return y


def read_npz(path: str | os.PathLike) -> InputData:
    """An ``.npz`` with arrays ``X`` (and optional ``y``, ``ids``), or a scipy sparse matrix."""
    path = Path(path)
    source = str(path)
    z = _np_load(path)
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise FormatError(f"{source!r} is a .npy file, not .npz; read it with --format npy")
    with z:
        keys = set(z.files)
        if _SCIPY_CSR_KEYS <= keys or _SCIPY_COO_KEYS <= keys:
            try:
                X = sp.csr_matrix(sp.load_npz(path))
            except Exception as exc:  # scipy raises ValueError/KeyError for broken members
                raise FormatError(
                    f"{source!r} is not a readable scipy sparse matrix ({exc})"
                ) from None
            if X.dtype.kind not in "biuf":
                raise InputError(f"{source!r} holds {X.dtype} values, but features must be numeric")
            if X.shape[0] == 0:
                raise InputError(f"{source!r} is empty (shape {X.shape}); give at least one row")
            check_finite(X, name=repr(source))
            return InputData(
                SparseBlock.from_csr(X), None, None, None, int(X.shape[1]), [source], "npz"
            )
        if "X" not in keys:
            raise FormatError(
                f"{source!r} holds arrays {sorted(keys)}; expected 'X' (and optionally 'y', "
                "'ids'), or a matrix saved with scipy.sparse.save_npz"
            )
        members = {k: _npz_member(z, k, source) for k in ("X", "y", "ids") if k in keys}
    X = _check_dense(members["X"], source)
    data = InputData(X, None, None, None, int(X.shape[1]), [source], "npz")
    if "y" in members:
        attach_labels(data, members["y"], f"{source}:y")
    if "ids" in members:
        data.ids = _check_ids(members["ids"], data.n, f"{source}:ids")
    return data


def _npz_member(z, key: str, source: str) -> np.ndarray:
    try:
        return np.asarray(z[key])
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise FormatError(
                f"{source!r}: array {key!r} holds Python objects (pickled); lshdist never "
                "unpickles: save numeric arrays"
            ) from None
        raise FormatError(f"{source!r}: array {key!r} is damaged ({exc})") from None
    except Exception as exc:  # bad CRC, bad header, truncated member...
        raise FormatError(
            f"{source!r}: array {key!r} is damaged ({type(exc).__name__}: {exc}); "
            "write the file again"
        ) from None


def _check_ids(ids: np.ndarray, n: int, source: str) -> np.ndarray:
    if ids.dtype.kind not in "iu" or ids.shape != (n,):
        raise InputError(
            f"{source!r} has {ids.dtype} ids of shape {ids.shape}; expected {n} integers"
        )
    return ids.astype(np.int64)


# -- tables: CSV and Parquet ------------------------------------------------------------------
def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _looks_like_header(rows: list[list[str]]) -> bool:
    """A first row of names: none of it is a number, or a column is a number only below it."""
    first = rows[0]
    if not any(_is_number(f) for f in first):
        return True
    if len(rows) > 1:
        return any(not _is_number(a) and _is_number(b) for a, b in zip(first, rows[1]))
    return False


def _label_index(
    spec: str | int | None, names: list[str] | None, ncols: int, source: str
) -> int | None:
    """Position of the label column given by name or index (None: no labels)."""
    if spec is None:
        if names is not None:
            for default in _DEFAULT_LABEL_COLUMNS:
                if default in names:
                    return names.index(default)
        return None
    spec = str(spec)
    if names is not None and spec in names:
        return names.index(spec)
    try:
        i = int(spec)
    except ValueError:
        have = f"its columns are {names}" if names is not None else "it has no header row"
        raise InputError(
            f"label column {spec!r} not found in {source!r} ({have}); give a column name or "
            f"an index in [-{ncols}, {ncols})"
        ) from None
    if not -ncols <= i < ncols:
        raise InputError(
            f"label column index {i} is out of range for {source!r}, which has {ncols} columns; "
            f"give an index in [-{ncols}, {ncols})"
        )
    return i % ncols


def _table_to_data(table, names: list[str], label: int | None, source: str, fmt: str) -> InputData:
    """Numeric feature columns + optional label column of a pyarrow table."""
    if table.num_rows == 0:
        raise InputError(f"{source!r} has no data rows; give a file with at least one row")
    features = [i for i in range(table.num_columns) if i != label]
    if not features:
        raise InputError(
            f"{source!r} has no feature column besides the label column {names[label]!r}"
        )
    X = np.empty((table.num_rows, len(features)), dtype=np.float64)
    for j, i in enumerate(features):
        X[:, j] = table.column(i).to_numpy()  # nulls become NaN
    data = InputData(_check_dense(X, source), None, None, None, len(features), [source], fmt)
    if label is not None:
        attach_labels(data, table.column(label).to_numpy(), f"{source}:{names[label]}")
    return data


def _csv_error(
    path: Path, exc: Exception, names: list[str], ncols: int, delimiter: str, header: bool
) -> InputError:
    """Turn a pyarrow CSV error into a message with the offending line (found by re-scanning)."""
    text = str(exc)
    try:
        return _find_bad_csv_line(path, text, names, ncols, delimiter, header)
    except _READ_ERRORS:
        return FormatError(f"{str(path)!r} could not be read as CSV ({text})")


def _find_bad_csv_line(
    path: Path, text: str, names: list[str], ncols: int, delimiter: str, header: bool
) -> InputError:
    ragged = "Expected" in text and "columns" in text
    bad_column = re.search(r"column #(\d+)", text)
    with _open_text(path) as f:
        reader = csv.reader(f, delimiter=delimiter)
        for row in reader:
            lineno = reader.line_num  # physical line (quoted fields may span lines)
            if not row or (header and lineno == 1):
                continue
            if ragged and len(row) != ncols:
                return InputError(
                    f"{str(path)!r} line {lineno} has {len(row)} fields, but the first line has "
                    f"{ncols}; every row needs the same number of fields: fix or remove the line"
                )
            if bad_column and not ragged:
                i = int(bad_column.group(1))
                value = row[i] if i < len(row) else ""
                if value.strip() and not _is_number(value):
                    return InputError(
                        f"{str(path)!r} column {names[i]!r} holds the non-numeric value "
                        f"{value!r} on line {lineno}; features must be numbers: fix the value, "
                        "or name the column with --label-column if it holds the labels"
                    )
    return FormatError(f"{str(path)!r} could not be read as CSV ({text})")


def read_csv(
    path: str | os.PathLike,
    *,
    label_column: str | int | None = None,
    header: bool | None = None,
    delimiter: str = ",",
) -> InputData:
    """A numeric CSV file (``.gz`` allowed).

    Parameters
    ----------
    label_column : str or int, optional
        Name (with a header) or index (negative counts from the end) of the label column.
        Default: a column named ``label`` or ``y`` if the header has one, else no labels.
    header : bool, optional
        Whether the first line names the columns; default: guessed (see `_looks_like_header`).
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path = Path(path)
    source = str(path)
    try:
        with _open_text(path) as f:
            first = [
                row
                for _, row in zip(range(2), (r for r in csv.reader(f, delimiter=delimiter) if r))
            ]
    except _READ_ERRORS as exc:
        raise FormatError(
            f"{source!r} is not readable CSV text ({type(exc).__name__}: {exc}); "
            "is it really CSV? (pass --format)"
        ) from None
    if not first:
        raise InputError(f"{source!r} is empty; give a file with at least one row")
    ncols = len(first[0])
    if header is None:
        header = _looks_like_header(first)
    names = [c.strip() for c in first[0]] if header else [str(i) for i in range(ncols)]
    label = _label_index(label_column, names if header else None, ncols, source)
    internal = [f"c{i}" for i in range(ncols)]  # header names may repeat or be empty
    types = {c: (pa.string() if i == label else pa.float64()) for i, c in enumerate(internal)}
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == _GZIP_MAGIC
        table = pacsv.read_csv(
            pa.input_stream(str(path), compression="gzip" if gz else None),
            read_options=pacsv.ReadOptions(column_names=internal, skip_rows=1 if header else 0),
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
        )
    except pa.ArrowInvalid as exc:
        raise _csv_error(path, exc, names, ncols, delimiter, header) from None
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{source!r} could not be read as CSV ({exc})") from None
    return _table_to_data(table, names, label, source, "csv")


def read_parquet(path: str | os.PathLike, *, label_column: str | int | None = None) -> InputData:
    """A Parquet file: numeric feature columns and a label column (default ``label``/``y``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    source = str(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{source!r} is not a readable Parquet file ({exc})") from None
    names = list(table.column_names)
    label = _label_index(label_column, names, len(names), source)
    for i, name in enumerate(names):
        t = table.schema.field(i).type
        if i != label and not (
            pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
        ):
            raise InputError(
                f"{source!r} column {name!r} has type {t}, but features must be numeric; "
                "drop the column, or name it with --label-column if it holds the labels"
            )
    for i, name in enumerate(names):  # booleans with nulls would come out as objects
        if i != label and pa.types.is_boolean(table.schema.field(i).type):
            table = table.set_column(i, name, table.column(i).cast(pa.float64()))
    return _table_to_data(table, names, label, source, "parquet")


def read_letter(path: str | os.PathLike) -> InputData:
    """The UCI Letter Recognition file: a capital letter, then 16 integer features, no header."""
    data = read_csv(path, label_column=0, header=False)
    if data.d != 16:
        raise FormatError(
            f"{str(path)!r} has {data.d + 1} fields per line, but the UCI Letter format has 17 "
            "(a letter, then 16 integers); read it with --format csv instead"
        )
    data.format = "letter"
    return data


# -- IDX (MNIST, Fashion-MNIST) ---------------------------------------------------------------
def _read_idx_array(path: Path) -> np.ndarray:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except _READ_ERRORS as exc:
            raise FormatError(f"{str(path)!r} is a corrupted gzip file ({exc})") from None
    if not _is_idx(raw):
        raise FormatError(
            f"{str(path)!r} is not an IDX file (magic {raw[:4].hex()}, expected 0000 08 03 for "
            "images or 0000 08 01 for labels)"
        )
    dtype, ndim = np.dtype(_IDX_TYPES[raw[2]]), raw[3]
    dims = [int(v) for v in np.frombuffer(raw, ">i4", ndim, offset=4)]
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - offset != expected:
        raise FormatError(
            f"{str(path)!r} holds {len(raw) - offset} data bytes, but its header announces "
            f"{' x '.join(map(str, dims))} {dtype.name} values ({expected} bytes); the file is "
            "truncated or corrupted: download it again"
        )
    arr = np.frombuffer(raw, dtype, offset=offset).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def read_idx(images: str | os.PathLike, labels: str | os.PathLike | None = None) -> InputData:
    """An IDX images file (items of any shape, flattened) and optionally its labels file."""
    images = Path(images)
    source = str(images)
    X = _read_idx_array(images)
    if X.ndim < 2:
        raise FormatError(f"{source!r} is an IDX labels file (1-d); give the images file with it")
    X = _check_dense(X.reshape(X.shape[0], -1), source)
    data = InputData(X, None, None, None, int(X.shape[1]), [source], "idx")
    if labels is not None:
        y = _read_idx_array(Path(labels))
        if y.ndim != 1:
            raise FormatError(f"{str(labels)!r} is an IDX images file, expected labels (1-d)")
        if len(y) != data.n:
            raise InputError(
                f"IDX labels file {str(labels)!r} has {len(y)} labels, but images file {source!r} "
                f"has {data.n} images; pair every images file with its own labels file"
            )
        attach_labels(data, y, str(labels))
        data.sources.append(str(labels))
    return data


def idx_ndim(path: str | os.PathLike) -> int:
    """Number of dimensions an IDX file announces (1: labels, 3: images)."""
    path = Path(path)
    head = _head(path, 8)
    if not _is_idx(head):
        raise FormatError(f"{str(path)!r} is not an IDX file (magic {head[:4].hex()})")
    return head[3]


# -- text -------------------------------------------------------------------------------------
def read_newsgroups(path: str | os.PathLike) -> InputData:
    """Tab-separated documents (the 20 Newsgroups files): token counts and categories.

    The file has three header rows (column names, types, flags) and columns ``Category`` and
    ``Text``.  ``X`` holds raw counts over hashed token ids (``is_text``); weight them with
    `lshdist.store.text.weight_rows` (`lshdist.store.inputs.read_inputs` does).
    """
    path = Path(path)
    source = str(path)
    try:
        with _open_text(path) as f:
            lines = f.read().split("\n")
    except _READ_ERRORS as exc:
        raise FormatError(
            f"{source!r} is not readable text ({type(exc).__name__}: {exc})"
        ) from None
    names = lines[0].rstrip("\r").split("\t")
    if "Category" not in names or "Text" not in names or len(lines) < 3:
        raise FormatError(
            f"{source!r} is not in the newsgroups format: expected a tab-separated header row "
            f"with columns Category and Text, then two more header rows; got {names[:5]}"
        )
    ci, ti = names.index("Category"), names.index("Text")
    categories, docs = [], []
    for lineno, line in enumerate(lines[3:], start=4):
        line = line.rstrip("\r")
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != len(names):
            raise InputError(
                f"{source!r} line {lineno} has {len(fields)} tab-separated fields, but the header "
                f"has {len(names)}; every row needs the same number of fields: fix or remove the "
                "line"
            )
        categories.append(fields[ci])
        docs.append(fields[ti])
    if not docs:
        raise InputError(f"{source!r} has no documents; give a file with at least one row")
    data = InputData(
        bag_of_words(docs), None, None, None, 2**64, [source], "newsgroups", is_text=True
    )
    return attach_labels(data, np.array(categories, dtype=str), f"{source}:Category")


# -- lshdist datasets -------------------------------------------------------------------------
def read_dataset(path: str | os.PathLike) -> InputData:
    """All rows, labels, ids and extra attributes of an lshdist dataset (to re-shard it)."""
    ds = Dataset(path)
    X = ds.read_all()
    y = ds.labels()
    if y is not None and ds.classes is None:
        raise FormatError(
            f"{str(path)!r} has labels but no class names; the dataset is corrupted, re-ingest it"
        )
    extra = {k: v for k, v in ds.attrs.items() if k not in _CORE_ATTRS and k != "source"}
    return InputData(
        X,
        None if y is None else y.astype(np.int32),
        None if y is None else list(ds.classes),
        ds.ids(),
        ds.d,
        [str(path)],
        "zarr",
        attrs=extra,
    )


# -- one input of any format -----------------------------------------------------------------
def read_input(
    path: str | os.PathLike,
    *,
    format: str | None = None,
    label_column: str | int | None = None,
    header: bool | None = None,
    idx_labels: str | os.PathLike | None = None,
) -> InputData:
    """One input file or dataset directory.

    Parameters
    ----------
    format : str, optional
        One of `FORMATS`; default: `detect_format`.
    label_column, header
        For CSV (both) and Parquet (``label_column``) inputs; see `read_csv`.
    idx_labels : path, optional
        For an IDX images file: its labels file.
    """
    path = Path(path)
    fmt = format or detect_format(path)
    logger.info("reading %s (%s)", path, fmt)
    if fmt == "npy":
        return read_npy(path)
    if fmt == "npz":
        return read_npz(path)
    if fmt == "csv":
        return read_csv(path, label_column=label_column, header=header, delimiter=_delimiter(path))
    if fmt == "parquet":
        return read_parquet(path, label_column=label_column)
    if fmt == "idx":
        return read_idx(path, idx_labels)
    if fmt == "letter":
        return read_letter(path)
    if fmt == "newsgroups":
        return read_newsgroups(path)
    if fmt == "zarr":
        return read_dataset(path)
    raise InputError(f"unknown format {fmt!r}; expected one of: {', '.join(FORMATS)}")
