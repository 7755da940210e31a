"""Input checks shared by every layer: finite, numeric, non-empty, matching lengths."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike

from lshdist.errors import InputError

if TYPE_CHECKING:
    from lshdist.blocks import RowsLike


def check_numeric_matrix(X: RowsLike, *, name: str = "X") -> np.ndarray:
    """Return ``X`` as a 2-d float32 C-contiguous array, or raise a clear `InputError`.

    Checks: numeric dtype, two dimensions, at least one row and one column, no NaN or infinity
    (the message gives how many and the first row holding one).
    """
    X = np.asarray(X)
    if X.dtype.kind not in "biuf":
        raise InputError(
            f"{name} has dtype {X.dtype}, but features must be numeric; "
            "convert or drop the non-numeric columns"
        )
    if X.ndim != 2:
        raise InputError(f"{name} must be 2-d (rows x features), got shape {X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise InputError(
            f"{name} is empty (shape {X.shape}); give at least one row and one feature"
        )
    X = np.ascontiguousarray(X, dtype=np.float32)
    check_finite(X, name=name)
    return X


def check_finite(X: ArrayLike | sp.spmatrix, *, name: str = "X") -> None:
    """Raise if ``X`` (dense or scipy sparse) holds NaN or infinite values."""
    if sp.issparse(X):
        m: sp.spmatrix = X
        values = m.data
        bad = ~np.isfinite(values)
        if bad.any():
            indptr = m.indptr
            first = int(np.searchsorted(indptr, np.flatnonzero(bad)[0], side="right") - 1)
            raise InputError(
                f"{name} holds {int(bad.sum())} NaN or infinite values (first in row {first}); "
                "remove or impute them before ingesting"
            )
        return
    bad = ~np.isfinite(X)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        raise InputError(
            f"{name} holds {int(bad.sum())} NaN or infinite values (first in row {int(rows[0])}); "
            "remove or impute them before ingesting"
        )


def check_labels(y: ArrayLike, n_rows: int, *, name: str = "y") -> np.ndarray:
    """Return labels as a 1-d array of length ``n_rows`` or raise."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise InputError(f"{name} must be 1-d, got shape {y.shape}")
    if len(y) != n_rows:
        raise InputError(
            f"{name} has {len(y)} labels, but X has {n_rows} rows; give one label per row"
        )
    return y


def check_k(k: int) -> int:
    """Validate a neighbour count."""
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise InputError(f"k={k!r}: k must be an integer >= 1")
    if k < 1:
        raise InputError(f"k={k}: k must be >= 1")
    return int(k)
