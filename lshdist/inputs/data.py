"""`InputData`, the rows an input becomes, and the checks every reader applies to what it read.

A reader validates at this boundary (numeric, finite, non-empty features; labels one per row;
ids unique int64), so that `InputData.write` and everything after it can trust the arrays.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from lshdist.blocks import SparseBlock
from lshdist.errors import InputError
from lshdist.store.dataset import Dataset, write_dataset
from lshdist.validation import check_finite

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_INT64 = np.iinfo(np.int64)


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
        Unique row ids when the input carried them (an ``.npz`` ``ids`` array, an id column,
        a re-sharded dataset) or they were shifted; else ``0..N-1`` is written.
    d : int
        Number of features (for sparse rows: the feature space, ``2**64`` for hashed ids).
    sources : list of str
        The files read, in row order.
    format : str
        The input format (a name of `lshdist.inputs.FORMATS`, or ``'mixed'``).
    is_text : bool
        ``X`` holds raw token counts still to be weighted (`read_inputs` does).
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
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "sparse" if isinstance(self.X, SparseBlock) else "dense"

    @property
    def n(self) -> int:
        return self.X.n_rows if isinstance(self.X, SparseBlock) else int(self.X.shape[0])

    def rows(self, start: int, stop: int) -> InputData:
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
        return InputData(
            X, y, self.classes, ids, self.d, self.sources, self.format, self.is_text, attrs
        )

    def shift_ids(self, offset: int) -> InputData:
        """Add ``offset`` to every row's id (to ``0..N-1`` when the rows carry none).

        Raises
        ------
        InputError
            If ``offset`` is negative or a shifted id would not fit in int64.
        """
        if offset < 0:
            raise InputError(f"id offset {offset} is negative; give an offset >= 0")
        if offset == 0:
            return self
        ids = np.arange(self.n, dtype=np.int64) if self.ids is None else self.ids
        top = int(ids.max())
        if top > _INT64.max - offset:
            raise InputError(
                f"id offset {offset} moves id {top} beyond the int64 maximum {_INT64.max}; "
                f"give an offset <= {_INT64.max - top}"
            )
        attrs = {**self.attrs, "id_offset": offset}
        return InputData(
            self.X, self.y, self.classes, ids + np.int64(offset), self.d, self.sources,
            self.format, self.is_text, attrs,
        )  # fmt: skip

    def write(
        self, path: str | os.PathLike[str], *, shard_rows: int, overwrite: bool = False
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


def check_dense(X: np.ndarray, source: str) -> np.ndarray:
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
        with contextlib.suppress(ValueError):  # integer labels sort as integers (2 before 10)
            values = values.astype(np.int64)
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


def attach_labels(data: InputData, values: npt.ArrayLike, source: str) -> InputData:
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


def first_duplicate(ids: np.ndarray) -> tuple[int, int, int] | None:
    """``(id, first row, second row)`` of the earliest row whose id an earlier row has."""
    order = np.argsort(ids, kind="stable")
    ranked = ids[order]
    repeats = np.flatnonzero(ranked[1:] == ranked[:-1])
    if len(repeats) == 0:
        return None
    second = int(order[repeats + 1].min())
    value = ids[second]
    first = int(np.flatnonzero(ids == value)[0])
    return int(value), first, second


def check_ids(ids: np.ndarray, n: int, source: str, fix: str) -> np.ndarray:
    """``ids`` as unique int64, one per row, or an `InputError` ending with ``fix``."""
    if ids.dtype.kind not in "iu" or ids.shape != (n,):
        raise InputError(
            f"{source!r} has {ids.dtype} ids of shape {ids.shape}; expected {n} integers, "
            f"one per row; {fix}"
        )
    if ids.dtype.kind == "u" and n and int(ids.max()) > _INT64.max:
        raise InputError(
            f"{source!r} has id {int(ids.max())}, beyond the int64 maximum {_INT64.max}; "
            f"ids must be int64: {fix}"
        )
    ids = ids.astype(np.int64)
    dup = first_duplicate(ids)
    if dup is not None:
        value, i, j = dup
        raise InputError(
            f"{source!r} has duplicate ids: id {value} is on rows {i} and {j}; ids must be "
            f"unique within a dataset: {fix}"
        )
    return ids
