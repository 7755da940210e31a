"""Columnar inputs: the columns shared by CSV and Parquet (features, labels, ids) and Parquet.

A table has numeric feature columns, optionally one label column (by default a column named
``label`` or ``y``) and optionally one id column (only when named: ``--id-column``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from lshdist.errors import FormatError, InputError
from lshdist.inputs.data import InputData, attach_labels, check_dense, check_ids
from lshdist.inputs.files import Probe

DEFAULT_LABEL_COLUMNS = ("label", "y")
_ID_FIX = "fix the id column, or drop --id-column to number the rows 0..N-1"


def sniff_parquet(probe: Probe) -> bool:
    return probe.head.startswith(b"PAR1")


def column_index(
    spec: str | int | None,
    names: list[str] | None,
    ncols: int,
    source: str,
    role: str,
) -> int | None:
    """Position of the ``role`` ('label' or 'id') column given by name or index.

    ``names`` is None for a file without a header row.  With ``spec`` None the label column is
    the first of `DEFAULT_LABEL_COLUMNS` present, and there is no id column.
    """
    if spec is None:
        if role == "label" and names is not None:
            for default in DEFAULT_LABEL_COLUMNS:
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
            f"{role} column {spec!r} not found in {source!r} ({have}); give a column name or "
            f"an index in [-{ncols}, {ncols})"
        ) from None
    if not -ncols <= i < ncols:
        raise InputError(
            f"{role} column index {i} is out of range for {source!r}, which has {ncols} "
            f"columns; give an index in [-{ncols}, {ncols})"
        )
    return i % ncols


def label_and_id_columns(
    label_column: str | int | None,
    id_column: str | int | None,
    names: list[str] | None,
    ncols: int,
    source: str,
) -> tuple[int | None, int | None]:
    """Positions of the label and id columns; refuses one column in both roles."""
    label = column_index(label_column, names, ncols, source, "label")
    ids = column_index(id_column, names, ncols, source, "id")
    if ids is not None and ids == label:
        name = names[ids] if names is not None else str(ids)
        raise InputError(
            f"column {name!r} of {source!r} is both the label column and the id column "
            f"(--id-column {id_column}); give the ids and the labels in different columns"
        )
    return label, ids


def table_to_data(
    table: Any,
    names: list[str],
    label: int | None,
    id_col: int | None,
    source: str,
    fmt: str,
) -> InputData:
    """Numeric feature columns, optional label and id columns of a pyarrow table."""
    if table.num_rows == 0:
        raise InputError(f"{source!r} has no data rows; give a file with at least one row")
    roles = {label: "label", id_col: "id"}
    features = [i for i in range(table.num_columns) if i not in roles]
    if not features:
        others = [f"the {roles[i]} column {names[i]!r}" for i in (label, id_col) if i is not None]
        besides = f" besides {' and '.join(others)}" if others else ""
        raise InputError(
            f"{source!r} has no feature column{besides}; give at least one numeric column"
        )
    X = np.empty((table.num_rows, len(features)), dtype=np.float64)
    for j, i in enumerate(features):
        X[:, j] = table.column(i).to_numpy()  # nulls become NaN
    data = InputData(check_dense(X, source), None, None, None, len(features), [source], fmt)
    if label is not None:
        attach_labels(data, table.column(label).to_numpy(), f"{source}:{names[label]}")
    if id_col is not None:
        data.ids = _ids_from_column(table.column(id_col), names[id_col], source)
    return data


def _ids_from_column(column: Any, name: str, source: str) -> np.ndarray:
    import pyarrow as pa

    if not pa.types.is_integer(column.type):
        raise InputError(
            f"id column {name!r} of {source!r} has type {column.type}, but ids must be "
            f"integers: {_ID_FIX}"
        )
    if column.null_count:
        first = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(
            f"id column {name!r} of {source!r} misses {column.null_count} values (first in "
            f"row {first}); give every row an id: {_ID_FIX}"
        )
    values = np.asarray(column.to_numpy())
    return check_ids(values, len(values), f"{source}:{name}", _ID_FIX)


def read_parquet(
    path: str | os.PathLike[str],
    *,
    label_column: str | int | None = None,
    id_column: str | int | None = None,
) -> InputData:
    """A Parquet file: numeric feature columns, a label column (default ``label``/``y``) and
    optionally an integer id column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    source = str(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{source!r} is not a readable Parquet file ({exc})") from None
    names = list(table.column_names)
    if not names:
        raise InputError(f"{source!r} has no columns; give a file with numeric feature columns")
    label, id_col = label_and_id_columns(label_column, id_column, names, len(names), source)
    for i, name in enumerate(names):
        t = table.schema.field(i).type
        if i not in (label, id_col) and not (
            pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
        ):
            raise InputError(
                f"{source!r} column {name!r} has type {t}, but features must be numeric; "
                "drop the column, or name it with --label-column if it holds the labels"
            )
    if label is not None:
        t = table.schema.field(label).type
        if pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            raise InputError(
                f"{source!r} label column {names[label]!r} has type {t}, but labels must be "
                "integers or names, one per row; give a column of class names or codes"
            )
    for i, name in enumerate(names):  # booleans with nulls would come out as objects
        if i not in (label, id_col) and pa.types.is_boolean(table.schema.field(i).type):
            table = table.set_column(i, name, table.column(i).cast(pa.float64()))
    return table_to_data(table, names, label, id_col, source, "parquet")
