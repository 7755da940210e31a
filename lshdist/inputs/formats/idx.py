"""IDX files (MNIST, Fashion-MNIST): an images file of any item shape and its labels file.

Header: two zero bytes, a type byte, the number of dimensions, then one big-endian int32 per
dimension (http://yann.lecun.com/exdb/mnist/).  Gzip is allowed.
"""

from __future__ import annotations

import gzip
import math
import os
from pathlib import Path

import numpy as np

from lshdist.errors import FormatError, InputError
from lshdist.inputs.data import InputData, attach_labels, check_dense
from lshdist.inputs.files import GZIP_MAGIC, READ_ERRORS, Probe, head

# IDX type byte -> big-endian dtype
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _is_idx(raw: bytes) -> bool:
    return (
        len(raw) >= 8 and raw[0] == 0 and raw[1] == 0 and raw[2] in _IDX_TYPES and 1 <= raw[3] <= 8
    )


def sniff_idx(probe: Probe) -> bool:
    return _is_idx(probe.head)


def idx_ndim(path: str | os.PathLike[str]) -> int:
    """Number of dimensions an IDX file announces (1: labels, 3: images)."""
    path = Path(path)
    raw = head(path, 8)
    if not _is_idx(raw):
        raise FormatError(
            f"{str(path)!r} is not an IDX file (magic {raw[:4].hex()}, expected 0000 08 03 for "
            "images or 0000 08 01 for labels); pass the right --format"
        )
    return raw[3]


def _read_idx_array(path: Path) -> np.ndarray:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except READ_ERRORS as exc:
            raise FormatError(f"{str(path)!r} is a corrupted gzip file ({exc})") from None
    if not _is_idx(raw):
        raise FormatError(
            f"{str(path)!r} is not an IDX file (magic {raw[:4].hex()}, expected 0000 08 03 for "
            "images or 0000 08 01 for labels)"
        )
    dtype, ndim = np.dtype(_IDX_TYPES[raw[2]]), raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise FormatError(
            f"{str(path)!r} ends inside its header (it announces {ndim} dimensions, "
            f"{4 + 4 * ndim} header bytes, but has {len(raw)} bytes); the file is truncated: "
            "download it again"
        )
    dims = [int(v) for v in np.frombuffer(raw, ">i4", ndim, offset=4)]
    shape = " x ".join(map(str, dims))
    if min(dims) <= 0:
        what = "items" if dims[0] <= 0 else "values per item"
        raise InputError(
            f"{str(path)!r} holds no data: its header announces {shape} {dtype.name} values "
            f"(0 {what}), expected at least one item of at least one value; the file was "
            "written empty or is damaged: give an IDX file with at least one item"
        )
    offset = 4 + 4 * ndim
    expected = math.prod(dims) * dtype.itemsize
    if len(raw) - offset != expected:
        raise FormatError(
            f"{str(path)!r} holds {len(raw) - offset} data bytes, but its header announces "
            f"{shape} {dtype.name} values ({expected} bytes); the file is "
            "truncated or corrupted: download it again"
        )
    arr = np.frombuffer(raw, dtype, offset=offset).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def read_idx(
    images: str | os.PathLike[str], labels: str | os.PathLike[str] | None = None
) -> InputData:
    """An IDX images file (items of any shape, flattened) and optionally its labels file."""
    images = Path(images)
    source = str(images)
    X = _read_idx_array(images)
    if X.ndim < 2:
        raise FormatError(f"{source!r} is an IDX labels file (1-d); give the images file with it")
    X = check_dense(X.reshape(X.shape[0], -1), source)
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
