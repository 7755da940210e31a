"""NumPy inputs: ``.npy`` matrices and labels, ``.npz`` archives (dense or scipy sparse)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from lshdist.blocks import SparseBlock
from lshdist.errors import FormatError, InputError
from lshdist.inputs.data import InputData, attach_labels, check_dense, check_ids
from lshdist.inputs.files import Probe
from lshdist.validation import check_finite

_NPY_MAGIC = b"\x93NUMPY"
_NPZ_MAGIC = b"PK\x03\x04"  # a zip archive
_SCIPY_CSR_KEYS = {"indptr", "indices", "data", "shape", "format"}  # scipy.sparse.save_npz
_SCIPY_COO_KEYS = {"row", "col", "data", "shape", "format"}


def sniff_npy(probe: Probe) -> bool:
    return probe.head.startswith(_NPY_MAGIC)


def sniff_npz(probe: Probe) -> bool:
    return probe.head.startswith(_NPZ_MAGIC)


def _np_load(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise FormatError(
            f"{str(path)!r} is not a readable NumPy file ({exc.strerror or exc}); give a file "
            "written by np.save or np.savez"
        ) from None
    if not magic.startswith((_NPY_MAGIC, _NPZ_MAGIC)):
        raise FormatError(
            f"{str(path)!r} is not a NumPy file (first bytes {magic.hex(' ') or 'none'}; "
            f"expected {_NPY_MAGIC.hex(' ')} for .npy or {_NPZ_MAGIC.hex(' ')} for .npz); "
            "pass the right --format, or none to detect it"
        )
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


def read_labels_file(path: str | os.PathLike[str]) -> np.ndarray:
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


def read_npy(
    path: str | os.PathLike[str], *, labels: str | os.PathLike[str] | None = None
) -> InputData:
    """A dense ``.npy`` matrix, labels optionally from a 1-d ``.npy`` file."""
    path = Path(path)
    X = _np_load(path)
    if not isinstance(X, np.ndarray):
        raise FormatError(f"{str(path)!r} is a .npz archive, not .npy; read it with --format npz")
    X = check_dense(X, str(path))
    data = InputData(X, None, None, None, int(X.shape[1]), [str(path)], "npy")
    if labels is not None:
        attach_labels(data, read_labels_file(labels), str(labels))
    return data


def read_npz(path: str | os.PathLike[str]) -> InputData:
    """An ``.npz`` with arrays ``X`` (and optional ``y``, ``ids``), or a scipy sparse matrix."""
    path = Path(path)
    source = str(path)
    z = _np_load(path)
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise FormatError(f"{source!r} is a .npy file, not .npz; read it with --format npy")
    with z:
        keys = set(z.files)
        if keys >= _SCIPY_CSR_KEYS or keys >= _SCIPY_COO_KEYS:
            return _read_scipy_npz(path)
        if "X" not in keys:
            raise FormatError(
                f"{source!r} holds arrays {sorted(keys)}; expected 'X' (and optionally 'y', "
                "'ids'), or a matrix saved with scipy.sparse.save_npz"
            )
        members = {k: _npz_member(z, k, source) for k in ("X", "y", "ids") if k in keys}
    X = check_dense(members["X"], source)
    data = InputData(X, None, None, None, int(X.shape[1]), [source], "npz")
    if "y" in members:
        attach_labels(data, members["y"], f"{source}:y")
    if "ids" in members:
        data.ids = check_ids(
            members["ids"], data.n, f"{source}:ids",
            "fix the 'ids' array, or drop it to number the rows 0..N-1",
        )  # fmt: skip
    return data


def _read_scipy_npz(path: Path) -> InputData:
    source = str(path)
    try:
        X = sp.csr_matrix(sp.load_npz(path))
    except Exception as exc:  # scipy raises ValueError/KeyError for broken members
        raise FormatError(f"{source!r} is not a readable scipy sparse matrix ({exc})") from None
    if X.dtype.kind not in "biuf":
        raise InputError(f"{source!r} holds {X.dtype} values, but features must be numeric")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise InputError(
            f"{source!r} is empty (shape {X.shape}); give at least one row and one feature"
        )
    check_finite(X, name=repr(source))
    return InputData(SparseBlock.from_csr(X), None, None, None, int(X.shape[1]), [source], "npz")


def _npz_member(z: Any, key: str, source: str) -> np.ndarray:
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
