"""Datasets as Zarr v3 groups (ARCHITECTURE.md section 3).

Layout of a dataset directory::

    zarr.json                group attributes: format, version, N, d, kind, nnz, shard_rows,
                             classes (label names or null)
    X                        dense: float32 (N, d), or uint8 for byte values (format 3),
                             chunked (shard_rows, d): a chunk is a shard
    X/indptr, X/indices,     sparse CSR: int64 (N+1,), uint64 (nnz,), float32 (nnz,)
    X/data, X/shard_bounds   int64 (n_shards+1,): the first row of every shard, then N
    P/values, P/offsets,     point sets (kind "pointsets"): float32 (T, d) local features of
    P/coords                 all sets, set after set; int64 (N+1,) where each set starts;
                             optional float32 (T, 2) image coordinates.  ``d`` is the feature
                             dimension of a point, ``nnz`` the number of points T
    y                        optional int32 label codes (index into ``classes``)
    ids                      int64 row ids (default 0..N-1), unique

Format version 2 seals every shard: the attributes hold ``checksums`` -- for each of ``X``
(dense rows; sparse: the shard's slice of ``indptr`` and its ``indices`` and ``data``), ``P``
(a shard's ``offsets``, ``values`` and ``coords``), ``ids`` and ``y``, one sha256 a shard
(`shard_digest`) -- and ``checksum``, a sha256 over all the other attributes.  Every read
recomputes the checksums of the shards it touches (a deleted Zarr chunk reads back as fill
values and is caught there), so workers never compute on a damaged shard.  A version 1 dataset
(no checksums) is refused unless opened with ``legacy=True``, which `lshdist ingest` does to
convert one.

A shard is read alone: only the Zarr chunks that overlap its rows are fetched.  A point-set
dataset's rows are sets (`lshdist.embed.pointsets.PointSets`, read by `Dataset.read_sets`); the
vector readers refuse them: a model with a set kernel maps them to rows
(`lshdist.store.embedded.open_data`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import scipy.sparse as sp
import zarr
from numpy.typing import ArrayLike
from zarr.codecs import BloscCodec, Crc32cCodec

from lshdist.blocks import Block, RowsLike, SparseBlock, take_rows, vstack_sparse
from lshdist.embed.pointsets import PointSets
from lshdist.errors import FormatError, InputError
from lshdist.store.atomic import atomic_dir
from lshdist.store.bounded import WRITE_CONFIG, open_store, write_store
from lshdist.store.files import load_json
from lshdist.store.model import array_checksum
from lshdist.store.objects import ObjectPath, as_path
from lshdist.validation import check_finite, check_labels, check_numeric_matrix

log = logging.getLogger(__name__)

#: the codec of a dataset's rows (dense X, sparse indices and values, point-set values):
#: byte-shuffled LZ4.  Measured on Fashion-MNIST (10,000 x 784 float32, one chunk, one core):
#: read 0.057 s against zarr's default zstd's 0.234 s, written in 0.25 s against 0.62, 7.6 MB
#: against 6.3 (the read of the rows was 13 of the index stage's 71 core-s at 480k rows).
#: Datasets written with another codec are read as they are (the codec is in their metadata).
#: Each compressed chunk carries a CRC32C checked before Blosc sees it: Blosc trusts the
#: sizes in a chunk's header, so a truncated chunk could be decoded from whatever memory
#: lay past its end (seen: a chunk cut to 9 bytes read back as the intact rows, once).
ROWS_CODEC = (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"), Crc32cCodec())
#: how zarr's CRC32C codec's refusal begins
CHUNK_CRC_MISMATCH = "Stored and computed checksum do not match"

FORMAT = "lshdist-dataset"
#: 2: shard checksums and an attributes checksum
VERSION = 2
#: 3: as 2, a dense ``X`` of byte values (every value an integer in 0..255, e.g. pixels) is
#: stored as uint8 and read as float32 -- the same rows from a quarter of the bytes to
#: decompress and checksum (Fashion-MNIST, 30,000 rows: `read_rows` 0.131 -> 0.051 s, median
#: of 9 alternated reads); datasets of
#: other values are still written as version 2
BYTES_VERSION = 3
#: a dataset written before the checksums (read only with ``legacy=True``)
LEGACY_VERSION = 1
#: attributes the writers set themselves (a caller's ``attrs`` cannot replace the seals)
_SEALS = ("checksums", "checksum")
DEFAULT_SHARD_ROWS = 10_000
_SPARSE_CHUNK = 1 << 20
HASHED_D = 2**64  # feature space of hashed (uint64) feature ids


def _shard_bounds(n: int, shard_rows: int) -> np.ndarray:
    return np.append(np.arange(0, n, shard_rows, dtype=np.int64), np.int64(n))


def shard_digest(*parts: np.ndarray) -> str:
    """The checksum of one shard of one array: sha256 over the `array_checksum` (dtype, shape,
    bytes) of each of its parts, in order."""
    return hashlib.sha256("".join(array_checksum(p) for p in parts).encode()).hexdigest()


def _row_sums(a: np.ndarray, bounds: np.ndarray) -> list[str]:
    """One `shard_digest` a shard of an array of rows."""
    return [shard_digest(a[lo:hi]) for lo, hi in itertools.pairwise(bounds)]


def _csr_sums(offsets: np.ndarray, bounds: np.ndarray, *arrays: np.ndarray) -> list[str]:
    """One `shard_digest` a shard of CSR-like arrays: the shard's slice of ``offsets`` (its
    rows' starts and the end, absolute) and of each of ``arrays`` between them."""
    out = []
    for lo, hi in itertools.pairwise(bounds):
        off = offsets[lo:hi + 1]
        out.append(shard_digest(off, *(a[off[0]:off[-1]] for a in arrays)))
    return out


def attrs_checksum(attrs: dict[str, Any]) -> str:
    """sha256 of the attributes' canonical JSON (sorted keys), ``checksum`` left out."""
    body = {k: v for k, v in attrs.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def _sealed(attrs: dict[str, Any], sums: dict[str, list[str]],
            extra: dict[str, Any] | None) -> dict[str, Any]:
    """``attrs``, a caller's ``extra`` attributes (their own seals dropped: a converted
    dataset's), the shard ``checksums`` and the attributes' ``checksum``."""
    out = {**attrs, **{k: v for k, v in (extra or {}).items() if k not in _SEALS},
           "checksums": sums}
    out = json.loads(json.dumps(out))  # as a reader will load them
    out["checksum"] = attrs_checksum(out)
    return cast(dict[str, Any], out)


def write_dataset(
    path: str | os.PathLike[str],
    X: RowsLike,
    y: ArrayLike | None = None,
    *,
    ids: ArrayLike | None = None,
    classes: list[str] | None = None,
    d: int | None = None,
    shard_rows: int = DEFAULT_SHARD_ROWS,
    overwrite: bool = False,
    attrs: dict[str, Any] | None = None,
) -> Dataset:
    """Write a dense or sparse dataset, atomically.

    Parameters
    ----------
    X : ndarray (N, d), scipy sparse matrix (N, d) or `SparseBlock` (N, features)
        Rows.  Dense data is stored as float32 (as uint8 when every value is an integer in
        0..255: read back as the same float32 rows); sparse data as CSR with uint64 feature
        ids.
    y : array (N,), optional
        Integer label codes when ``classes`` is given, otherwise any labels (their sorted unique
        values, as strings, become ``classes``).
    ids : int64 array (N,), optional
        Row ids; default ``0..N-1``.
    d : int, optional
        Dimension of a sparse feature space (default: the scipy shape, or 2**64 for hashed ids).
    shard_rows : int
        Rows per shard (a dense Zarr chunk; a sparse row range).
    """
    if not isinstance(shard_rows, (int, np.integer)) or shard_rows < 1:
        raise InputError(f"shard_rows={shard_rows!r}: the shard size must be an integer >= 1")
    if isinstance(X, SparseBlock) or sp.issparse(X):
        if not isinstance(X, SparseBlock):  # a scipy sparse matrix
            check_finite(sp.csr_matrix(X))
            if d is None:
                d = int(np.shape(X)[1])
            X = SparseBlock.from_csr(X)
        check_finite(X.matrix)
        if not X.matrix.has_canonical_format:  # the format promises sorted, unique ids per row
            m = X.matrix.copy()
            m.sum_duplicates()
            X = SparseBlock(m, X.features)
        kind, n = "sparse", X.n_rows
        if n == 0:
            raise InputError("X is empty (0 rows); give at least one row")
        if d is None:
            d = HASHED_D
    else:
        raw = X
        X = check_numeric_matrix(X)
        kind, (n, d) = "dense", X.shape
        X = _stored_rows(raw, X)
    y, classes = _label_codes(y, n, classes)
    ids = _row_ids(ids, n)

    bounds = _shard_bounds(n, int(shard_rows))
    sums = {"ids": _row_sums(ids, bounds)}
    if y is not None:
        sums["y"] = _row_sums(y, bounds)
    with atomic_dir(path, overwrite=overwrite, kind="lshdist-dataset") as tmp:
        g = zarr.open_group(write_store(tmp), mode="w", zarr_format=3)
        nnz = None
        if not isinstance(X, SparseBlock):  # kind == "dense"
            sums["X"] = _row_sums(X, bounds)
            g.create_array("X", data=X, chunks=(int(min(shard_rows, n)), int(d)),
                           compressors=ROWS_CODEC, config=WRITE_CONFIG)
        else:
            indptr, indices, data = X.to_arrays()
            sums["X"] = _csr_sums(indptr, bounds, indices, data)
            nnz = len(data)
            gx = g.create_group("X")
            gx.create_array("indptr", data=indptr, chunks=(int(min(shard_rows, n)) + 1,),
                            config=WRITE_CONFIG)
            ck = (int(max(1, min(_SPARSE_CHUNK, nnz))),)
            gx.create_array("indices", data=indices, chunks=ck, compressors=ROWS_CODEC,
                            config=WRITE_CONFIG)
            gx.create_array("data", data=data, chunks=ck, compressors=ROWS_CODEC,
                            config=WRITE_CONFIG)
            gx.create_array("shard_bounds", data=bounds, config=WRITE_CONFIG)
        if y is not None:
            g.create_array("y", data=y, chunks=(int(min(shard_rows, n)),), config=WRITE_CONFIG)
        g.create_array("ids", data=ids, chunks=(int(min(shard_rows, n)),), config=WRITE_CONFIG)
        g.attrs.update(_sealed(
            {
                "format": FORMAT,
                "version": VERSION if isinstance(X, SparseBlock) else _version_of(X.dtype),
                "N": int(n),
                "d": int(d),
                "kind": kind,
                "nnz": nnz,
                "shard_rows": int(shard_rows),
                "n_shards": int(len(bounds) - 1),
                "classes": classes,
            }, sums, attrs))
    return Dataset(path)


def write_pointsets(
    path: str | os.PathLike[str],
    sets: PointSets,
    y: ArrayLike | None = None,
    *,
    ids: ArrayLike | None = None,
    classes: list[str] | None = None,
    shard_rows: int = DEFAULT_SHARD_ROWS,
    overwrite: bool = False,
    attrs: dict[str, Any] | None = None,
) -> Dataset:
    """Write a point-set dataset (one row a set of local features), atomically.

    Parameters
    ----------
    sets : PointSets
        The sets (point weights are not stored: every point of an ingested set weighs 1).
    y, ids, classes, shard_rows, overwrite, attrs
        As in `write_dataset`: a shard is ``shard_rows`` sets.
    """
    if not isinstance(shard_rows, (int, np.integer)) or shard_rows < 1:
        raise InputError(f"shard_rows={shard_rows!r}: the shard size must be an integer >= 1")
    if not isinstance(sets, PointSets):
        raise InputError(f"sets must be PointSets, got {type(sets).__name__}")
    if sets.weights is not None:
        raise InputError("point weights are not stored in a dataset; give sets without weights")
    n = len(sets)
    if n == 0:
        raise InputError("no sets given (0 rows); give at least one set")
    if len(sets.values) == 0:
        raise InputError("every set is empty (0 points in all); nothing to store")
    codes, classes = _label_codes(y, n, classes)
    ids_arr = _row_ids(ids, n)
    bounds = _shard_bounds(n, int(shard_rows))
    d = sets.d
    point_chunk = int(max(1, min(len(sets.values), (1 << 22) // (4 * d))))
    coords = None if sets.coords is None else np.ascontiguousarray(sets.coords[:, :2],
                                                                    dtype=np.float32)
    sums = {"P": _csr_sums(np.asarray(sets.offsets, np.int64), bounds,
                           np.asarray(sets.values, np.float32),
                           *([] if coords is None else [coords])),
            "ids": _row_sums(ids_arr, bounds)}
    if codes is not None:
        sums["y"] = _row_sums(codes, bounds)
    with atomic_dir(path, overwrite=overwrite, kind="lshdist-dataset") as tmp:
        g = zarr.open_group(write_store(tmp), mode="w", zarr_format=3)
        gp = g.create_group("P")
        gp.create_array("values", data=np.asarray(sets.values, np.float32),
                        chunks=(point_chunk, d), compressors=ROWS_CODEC, config=WRITE_CONFIG)
        gp.create_array("offsets", data=np.asarray(sets.offsets, np.int64),
                        chunks=(int(min(shard_rows, n)) + 1,), config=WRITE_CONFIG)
        if coords is not None:
            gp.create_array("coords", data=coords, chunks=(point_chunk, 2), config=WRITE_CONFIG)
        if codes is not None:
            g.create_array("y", data=codes, chunks=(int(min(shard_rows, n)),), config=WRITE_CONFIG)
        g.create_array("ids", data=ids_arr, chunks=(int(min(shard_rows, n)),), config=WRITE_CONFIG)
        g.attrs.update(_sealed({"format": FORMAT, "version": VERSION, "N": int(n),
                                "d": int(d), "kind": "pointsets", "nnz": len(sets.values),
                                "shard_rows": int(shard_rows),
                                "n_shards": int(len(bounds) - 1), "classes": classes},
                               sums, attrs))
    return Dataset(path)


def _label_codes(y: ArrayLike | None, n: int, classes: list[str] | None
                 ) -> tuple[np.ndarray | None, list[str] | None]:
    """Labels as int32 codes into ``classes`` (made from the sorted labels when not given)."""
    if y is None:
        return None, classes
    y = check_labels(y, n)
    if classes is None:
        classes_arr, codes = np.unique(y, return_inverse=True)
        classes = [str(c) for c in classes_arr.tolist()]
        y = codes
    y = np.asarray(y)
    if y.dtype.kind not in "iu" or (len(y) and (y.min() < 0 or y.max() >= len(classes))):
        raise InputError(f"label codes must be integers in [0, {len(classes)}), got {y[:5]}...")
    return y.astype(np.int32), classes


def _row_ids(ids: ArrayLike | None, n: int) -> np.ndarray:
    if ids is None:
        return np.arange(n, dtype=np.int64)
    out = np.asarray(ids, dtype=np.int64)
    if out.shape != (n,):
        raise InputError(f"ids has shape {out.shape}, but there are {n} rows; give one id per "
                         "row")
    dup = repeated_id(out)
    if dup is not None:
        raise InputError(f"ids has duplicates: id {dup[0]} is on rows {dup[1]} and {dup[2]}; "
                         "give each row its own id")
    return out


def repeated_id(ids: np.ndarray) -> tuple[int, int, int] | None:
    """``(id, first row, second row)`` of an id that two rows share, or None when all are
    unique (the first repeat in id order)."""
    order = np.argsort(ids, kind="stable")
    ranked = ids[order]
    same = np.flatnonzero(ranked[1:] == ranked[:-1])
    if len(same) == 0:
        return None
    i = int(same[0])
    return int(ranked[i]), int(order[i]), int(order[i + 1])


def _byte_valued(X: np.ndarray, block: int = 8192) -> bool:
    """Whether every value of float rows ``X`` is an integer in 0..255 stored as uint8 and
    read back bit for bit (so not -0.0), read in blocks of rows: no copy of the whole array."""
    for lo in range(0, X.shape[0], block):
        B = X[lo:lo + block]
        if B.size and (B.min() < 0 or B.max() > 255 or np.signbit(B).any()
                       or not np.array_equal(B, np.rint(B))):
            return False
    return True


def _stored_rows(raw: Any, X: np.ndarray) -> np.ndarray:
    """The dense rows ``X`` (float32, checked) as stored: uint8 when every value is a byte
    value (a uint8 input ``raw``, taken as it is, or values that all are; read back as the
    same float32 rows), else ``X``."""
    if isinstance(raw, np.ndarray) and raw.dtype == np.uint8:
        return np.ascontiguousarray(raw)
    return X.astype(np.uint8) if _byte_valued(X) else X


def _version_of(dtype: Any) -> int:
    """The format version of a dataset whose rows are stored as ``dtype``."""
    return BYTES_VERSION if np.dtype(dtype) == np.uint8 else VERSION


def write_dense_shards(
    path: str | os.PathLike[str],
    shards: Iterable[tuple[np.ndarray, np.ndarray | None]],
    *,
    n: int,
    d: int,
    shard_rows: int,
    classes: list[str] | None = None,
    overwrite: bool = False,
    attrs: dict[str, Any] | None = None,
    dtype: Any = np.float32,
) -> Dataset:
    """Write a dense dataset of ``n`` rows shard by shard, atomically, never holding more than
    one shard: ``shards`` yields ``(X (rows, d), y (rows,) or None)`` of exactly ``shard_rows``
    rows each (the last one the remainder); ids are ``0..n-1``, labels integer codes into
    ``classes``.  The same layout `write_dataset` writes.  ``dtype``: how the rows are stored,
    float32 or uint8 (every value must then be an integer in 0..255; read back as float32).

    Raises
    ------
    InputError
        If a shard has the wrong shape, non-finite values, labels outside ``classes``, or the
        shards do not add up to ``n`` rows.
    """
    if not isinstance(shard_rows, (int, np.integer)) or shard_rows < 1 or n < 1 or d < 1:
        raise InputError(f"n={n}, d={d}, shard_rows={shard_rows}: all must be integers >= 1")
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.uint8)):
        raise InputError(f"dtype={dtype}: dense rows are stored as float32 or uint8")
    bounds = _shard_bounds(int(n), int(shard_rows))
    with atomic_dir(path, overwrite=overwrite, kind="lshdist-dataset") as tmp:
        g = zarr.open_group(write_store(tmp), mode="w", zarr_format=3)
        chunk = int(min(shard_rows, n))
        xa = g.create_array("X", shape=(n, d), dtype=dtype, chunks=(chunk, int(d)),
                            compressors=ROWS_CODEC, config=WRITE_CONFIG)
        ya = None
        if classes is not None:
            ya = g.create_array("y", shape=(n,), dtype=np.int32, chunks=(chunk,),
                                config=WRITE_CONFIG)
        ids = np.arange(n, dtype=np.int64)
        g.create_array("ids", data=ids, chunks=(chunk,), config=WRITE_CONFIG)
        sums: dict[str, list[str]] = {"X": [], "ids": _row_sums(ids, bounds)}
        if ya is not None:
            sums["y"] = []
        i = 0
        for X, y in shards:
            if i >= len(bounds) - 1:
                raise InputError(f"the shards hold more than n={n} rows")
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            X = check_numeric_matrix(X)
            if X.shape != (hi - lo, d):
                raise InputError(f"shard {i} has shape {X.shape}, expected ({hi - lo}, {d})")
            if dtype == np.uint8:
                if not _byte_valued(X):
                    raise InputError(f"shard {i} holds values that are not integers in 0..255 "
                                     "(or -0.0); they cannot be stored as uint8 (store them as "
                                     "float32)")
                X = X.astype(np.uint8)
            xa[lo:hi] = X
            sums["X"].append(shard_digest(X))
            if ya is not None:
                codes = np.asarray(y)
                if codes.shape != (hi - lo,) or codes.dtype.kind not in "iu" or (
                        len(codes) and (codes.min() < 0 or codes.max() >= len(classes or []))):
                    raise InputError(f"shard {i}: labels must be {hi - lo} integer codes in "
                                     f"[0, {len(classes or [])})")
                ya[lo:hi] = codes.astype(np.int32)
                sums["y"].append(shard_digest(codes.astype(np.int32)))
            i += 1
        if i != len(bounds) - 1:
            raise InputError(f"the shards hold {int(bounds[i])} rows, expected n={n}")
        g.attrs.update(_sealed({"format": FORMAT,
                                "version": _version_of(dtype),
                                "N": int(n), "d": int(d), "kind": "dense", "nnz": None,
                                "shard_rows": int(shard_rows),
                                "n_shards": int(len(bounds) - 1), "classes": classes},
                               sums, attrs))
    return Dataset(path)


def _check_attrs(attrs: dict[str, Any], path: Path | ObjectPath) -> None:
    """Presence, type and range of the group attributes (no array read)."""
    where = f"{str(path)!r}: dataset attributes"
    ints = {"N": 1, "d": 1, "shard_rows": 1, "n_shards": 1}
    for key, lo in ints.items():
        v = attrs.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise FormatError(f"{where}: {key}={v!r}, expected an integer >= {lo}; the dataset "
                              "is corrupted, re-ingest it")
    kind = attrs.get("kind")
    if kind not in ("dense", "sparse", "pointsets"):
        raise FormatError(f"{where}: kind={kind!r}, expected 'dense', 'sparse' or 'pointsets'; "
                          "the dataset is corrupted, re-ingest it")
    nnz = attrs.get("nnz")
    if kind != "dense" and (not isinstance(nnz, int) or isinstance(nnz, bool) or nnz < 0):
        raise FormatError(f"{where}: nnz={nnz!r}, expected an integer >= 0 for sparse data; "
                          "the dataset is corrupted, re-ingest it")
    if kind != "sparse" and attrs["n_shards"] != -(-attrs["N"] // attrs["shard_rows"]):
        raise FormatError(f"{where}: n_shards={attrs['n_shards']} but N={attrs['N']} rows in "
                          f"shards of {attrs['shard_rows']}; the dataset is corrupted, "
                          "re-ingest it")
    classes = attrs.get("classes")
    if classes is not None and (not isinstance(classes, list)
                                or not all(isinstance(c, str) for c in classes)):
        raise FormatError(f"{where}: classes must be a list of names or null; the dataset is "
                          "corrupted, re-ingest it")
    if attrs.get("version") == LEGACY_VERSION:
        return
    sums = attrs.get("checksums")
    rows = "P" if kind == "pointsets" else "X"
    n_shards = attrs["n_shards"]
    if (not isinstance(sums, dict) or not {rows, "ids"} <= set(sums) <= {rows, "ids", "y"}
            or not all(isinstance(v, list) and len(v) == n_shards
                       and all(isinstance(h, str) and _SHA256.fullmatch(h) for h in v)
                       for v in sums.values())):
        raise FormatError(f"{where}: checksums={str(sums)[:60]!r} is not {{{rows!r}, 'ids' "
                          f"and, when labelled, 'y': {n_shards} sha256 digests each}}; the "
                          "dataset is corrupted, re-ingest it")


_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ShardInfo:
    index: int
    start: int
    stop: int


class Dataset:
    """Read side of a dataset directory; nothing is loaded until asked for.

    Every read checks the shards it touches against their checksums; ``legacy=True`` also
    opens a dataset of format version 1, which has none (read unchecked, with a warning).

    Raises `FormatError` for a directory that is not an lshdist dataset or is corrupted.
    """

    def __init__(self, path: str | os.PathLike[str], *, legacy: bool = False):
        self.path = as_path(path)
        self.legacy = legacy
        meta = self.path / "zarr.json"
        # on object storage, where every check is a request (and workers open the dataset
        # once per shard), the marker is read straight away and a missing one explained after
        remote = isinstance(self.path, ObjectPath)
        if not remote and not self.path.exists():
            raise InputError(f"dataset {str(self.path)!r} does not exist")
        if not remote and not meta.is_file():
            raise self._no_group()
        where = f"{str(self.path)!r}: zarr.json"
        try:
            try:
                attrs = load_json(meta, where, "re-ingest the dataset", self.path)
            except FileNotFoundError:
                if not self.path.exists():
                    raise InputError(f"dataset {str(self.path)!r} does not exist") from None
                raise self._no_group() from None
            attrs = attrs.get("attributes", {})
            if not isinstance(attrs, dict):
                raise TypeError("its attributes are not a JSON object")
        except (OSError, AttributeError, TypeError) as exc:
            raise FormatError(f"{where} is corrupted ({exc}); re-ingest the dataset") from None
        if attrs.get("format") != FORMAT:
            raise FormatError(
                f"{str(self.path)!r} is a Zarr group but not an lshdist dataset "
                f"(format={attrs.get('format')!r}, expected {FORMAT!r}); "
                "re-ingest it with `lshdist ingest`"
            )
        version = attrs.get("version")
        if version == LEGACY_VERSION and not legacy:
            raise FormatError(
                f"{str(self.path)!r} was written by an earlier lshdist (dataset format version "
                f"{LEGACY_VERSION}, without checksums): its shards cannot be verified; convert it "
                f"with `lshdist ingest {self.path!s} --out NEW` (read once, unchecked) or "
                "ingest its source files again")
        if version not in (VERSION, BYTES_VERSION, LEGACY_VERSION):
            raise FormatError(
                f"{str(self.path)!r} has dataset format version {version!r}; "
                f"this lshdist reads versions {LEGACY_VERSION} to {BYTES_VERSION}"
            )
        if version != LEGACY_VERSION:
            digest = attrs_checksum(attrs)
            if attrs.get("checksum") != digest:
                raise FormatError(
                    f"{str(self.path)!r}: the attributes in zarr.json do not match their "
                    f"checksum (expected {str(attrs.get('checksum'))[:12]}..., they give "
                    f"{digest[:12]}...): edited or damaged; re-ingest the dataset")
        else:
            log.warning("dataset %s has format version %d (no checksums): read unchecked",
                        self.path, LEGACY_VERSION)
        _check_attrs(attrs, self.path)
        self.attrs = attrs
        self._sums: dict[str, list[str]] | None = attrs.get("checksums")
        try:
            self._group = zarr.open_group(open_store(self.path), mode="r", zarr_format=3)
            self._check_arrays()
        except FormatError:
            raise
        except Exception as exc:  # zarr raises many types for missing or broken arrays
            raise FormatError(
                f"{str(self.path)!r} is corrupted ({type(exc).__name__}: {exc}); re-ingest it"
            ) from None

    def _no_group(self) -> FormatError:
        return FormatError(f"{str(self.path)!r} is not a Zarr v3 group (no zarr.json); "
                           "create datasets with `lshdist ingest`")

    def _damaged(self, what: str) -> FormatError:
        return FormatError(f"{str(self.path)!r}: {what}; the dataset is corrupted, re-ingest it")

    def _array(self, name: str) -> zarr.Array[Any]:
        a = self._group[name]
        if not isinstance(a, zarr.Array):
            raise self._damaged(f"{name!r} is a group, expected an array")
        return a

    def _check_arrays(self) -> None:
        """Shapes and dtypes from the arrays' metadata (and the shard bounds): cheap."""
        g, n, d = self._group, self.n, int(self.attrs["d"])
        if self.stored_kind == "dense":
            xa = self._array("X")
            want = np.uint8 if self.attrs.get("version") == BYTES_VERSION else np.float32
            if tuple(xa.shape) != (n, d) or xa.dtype != want:
                raise self._damaged(f"X is {xa.dtype} {tuple(xa.shape)}, the attributes say "
                                    f"{np.dtype(want)} ({n}, {d})")
        elif self.stored_kind == "pointsets":
            specs = {"P/values": (np.float32, (self.nnz, d)), "P/offsets": (np.int64, (n + 1,))}
            if "P/coords" in g:
                specs["P/coords"] = (np.float32, (self.nnz, 2))
            for name, (dtype, shape) in specs.items():
                a = self._array(name)
                if tuple(a.shape) != shape or a.dtype != dtype:
                    raise self._damaged(f"{name} is {a.dtype} {tuple(a.shape)}, expected "
                                        f"{np.dtype(dtype)} {shape}")
        else:
            specs = {"X/indptr": (np.int64, (n + 1,)), "X/indices": (np.uint64, (self.nnz,)),
                     "X/data": (np.float32, (self.nnz,))}
            for name, (dtype, shape) in specs.items():
                a = self._array(name)
                if tuple(a.shape) != shape or a.dtype != dtype:
                    raise self._damaged(f"{name} is {a.dtype} {tuple(a.shape)}, expected "
                                        f"{np.dtype(dtype)} {shape}")
            b = np.asarray(self._array("X/shard_bounds")[:])
            if (b.dtype.kind not in "iu" or b.ndim != 1 or len(b) != self.attrs["n_shards"] + 1
                    or b[0] != 0 or b[-1] != n or np.any(np.diff(b) <= 0)):
                shown = f"{b[:8].tolist()}{'...' if len(b) > 8 else ''}"
                raise self._damaged(f"X/shard_bounds is {shown}, expected "
                                    f"{self.attrs['n_shards'] + 1} row numbers rising from 0 "
                                    f"to N={n}")
            self._bounds = b.astype(np.int64)
        ids = self._array("ids")
        if tuple(ids.shape) != (n,) or ids.dtype != np.int64:
            raise self._damaged(f"ids is {ids.dtype} {tuple(ids.shape)}, expected int64 ({n},)")
        if "y" in g:
            y = self._array("y")
            if tuple(y.shape) != (n,) or y.dtype.kind not in "iu":
                raise self._damaged(f"y is {y.dtype} {tuple(y.shape)}, expected integer ({n},)")
            if self.classes is None:
                raise self._damaged("y is present but the attributes have no classes")
        if self._sums is not None and ("y" in g) != ("y" in self._sums):
            raise self._damaged("the labels y and their checksums do not go together (one is "
                                "missing)")

    def _check_shard(self, name: str, i: int, *parts: np.ndarray) -> None:
        """Shard ``i`` of ``name`` (``X``, ``P``, ``ids``, ``y``) against its checksum."""
        if self._sums is None:  # a legacy dataset
            return
        if shard_digest(*parts) != self._sums[name][i]:
            raise self._damaged(f"{self._shard_name(i, name)} does not match its checksum: a "
                                "chunk is damaged or missing")

    def _covering(self, start: int, stop: int) -> tuple[int, int]:
        """The shards ``i0 .. i1-1`` that hold rows ``start:stop`` (checked: in range)."""
        if not (isinstance(start, (int, np.integer)) and isinstance(stop, (int, np.integer))
                and 0 <= start <= stop <= self.n):
            raise InputError(f"rows {start}:{stop} out of range 0..{self.n}")
        b = self.shard_bounds
        if start == stop:
            i = int(np.searchsorted(b, start, side="right")) - 1
            return i, i
        return (int(np.searchsorted(b, start, side="right")) - 1,
                int(np.searchsorted(b, stop, side="left")))

    def _offsets(self, name: str, lo: int, hi: int, total: int) -> np.ndarray:
        """``name[lo:hi + 1]`` (CSR row starts), checked to rise within ``[0, total]``: the
        entries read after them are bounded by what the attributes record."""
        off = np.asarray(self._array(name)[lo:hi + 1], dtype=np.int64)
        if len(off) != hi - lo + 1 or off[0] < 0 or off[-1] > total or np.any(np.diff(off) < 0):
            raise self._damaged(f"{name} of rows {lo}:{hi} does not rise within [0, {total}]")
        return off

    def _csr_rows(self, start: int, stop: int, offsets: str, names: tuple[str, ...],
                  check: str) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(offsets, arrays)`` of rows ``start:stop`` of a CSR-like layout (the array
        ``offsets`` of row starts, the entries in the arrays ``names``), read shard by shard,
        each checked against ``check``'s checksums; offsets rebased to 0."""
        i0, i1 = self._covering(start, stop)
        b = self.shard_bounds
        lo, hi = (int(b[i0]), int(b[i1])) if i1 > i0 else (start, stop)
        off = self._offsets(offsets, lo, hi, int(self.nnz or 0))
        base = int(off[0])
        sources = [self._array(a) for a in names]
        arrays = self._read_spans(sources, base, int(off[-1]), [
            (i, int(off[int(b[i]) - lo]), int(off[int(b[i + 1]) - lo]))
            for i in range(i0, i1)], check)
        for i in range(i0, i1):
            s = off[int(b[i]) - lo:int(b[i + 1]) - lo + 1]
            a, z = int(s[0]) - base, int(s[-1]) - base
            self._check_shard(check, i, s, *(dst[a:z] for dst in arrays))
        s = off[start - lo:stop - lo + 1]
        return s - s[0], [a[s[0] - base:s[-1] - base] for a in arrays]

    def _dense_rows(self, start: int, stop: int, take: np.ndarray | None = None, *,
                    dtype: Any = np.float32) -> np.ndarray:
        """Rows ``start:stop`` of a dense X (float32, whatever it is stored as; ``dtype``
        uint8: as stored, for `read_byte_rows`), read shard by shard, each checked;
        ``take``: only these of them (numbered from ``start``)."""
        i0, i1 = self._covering(start, stop)
        b = self.shard_bounds
        if i1 == i0:
            return np.zeros((0 if take is None else len(take), self.d), dtype)
        lo = int(b[i0])
        (X,) = self._read_spans([self._array("X")], lo, int(b[i1]), [
            (i, int(b[i]), int(b[i + 1])) for i in range(i0, i1)], "X")
        for i in range(i0, i1):
            self._check_shard("X", i, X[int(b[i]) - lo:int(b[i + 1]) - lo])
        rows = X[start - lo:stop - lo]
        return np.ascontiguousarray(rows if take is None else rows[take], dtype=dtype)

    def _read_spans(self, sources: list[zarr.Array[Any]], lo: int, hi: int,
                    shards: list[tuple[int, int, int]], name: str) -> list[np.ndarray]:
        """``source[lo:hi]`` of each source in one read (zarr decodes the chunks of one call
        concurrently); when that fails, the shards ``(i, start, stop)`` are read one by one
        to name the one that cannot be read."""
        try:
            return [np.asarray(src[lo:hi]) for src in sources]
        except Exception:
            for i, a, z in shards:
                with self._reading(self._shard_name(i, name)):
                    for src in sources:
                        src[a:z]
            raise

    def _shard_name(self, i: int, name: str) -> str:
        b = self.shard_bounds
        return f"shard {i} (rows {int(b[i])}:{int(b[i + 1])}) of {name}"

    def _whole(self, name: str) -> np.ndarray:
        """All of a per-row array (``ids``, ``y``), every shard checked."""
        src = self._array(name)
        b = self.shard_bounds
        try:
            a = np.asarray(src[:])  # one read (zarr pays per call: thousands of shards)
        except Exception:  # find the shard that cannot be read, to name it
            for i in range(self.n_shards):
                with self._reading(self._shard_name(i, name)):
                    src[int(b[i]):int(b[i + 1])]
            raise
        for i in range(self.n_shards):
            self._check_shard(name, i, a[int(b[i]):int(b[i + 1])])
        return a

    def verify(self) -> None:
        """Read everything, shard by shard, and check what the format promises.

        Every shard against its checksums; finite values; sparse: ``indptr`` rising from 0 to
        nnz, feature ids sorted and unique within each row; labels within ``classes``; ids
        unique.

        Raises
        ------
        FormatError
            For the first problem found.
        """
        for shard in self.shards():
            where = f"rows {shard.start}:{shard.stop}"
            with self._reading(f"{where} of X"):
                if self.stored_kind == "pointsets":
                    self.read_sets(shard.start, shard.stop)  # checks offsets and values
                    continue
                if self.stored_kind == "dense":
                    block = self._dense_rows(shard.start, shard.stop)
                    if not np.isfinite(block).all():
                        raise self._damaged(f"{where} of X hold NaN or infinite values")
                    continue
                indptr, (indices, data) = self._csr_rows(
                    shard.start, shard.stop, "X/indptr", ("X/indices", "X/data"), "X")
                if not np.isfinite(data).all():
                    raise self._damaged(f"{where} of X hold NaN or infinite values")
                # strictly rising ids within a row: compare neighbours that share a row
                rising = indices[1:] > indices[:-1]
                starts = indptr[1:-1]
                same_row = np.ones(len(rising), dtype=bool)
                inner = starts[(starts > 0) & (starts < len(indices))]
                same_row[inner - 1] = False
                if np.any(same_row & ~rising):
                    raise self._damaged(f"feature ids of {where} are not sorted and unique "
                                        "within each row")
        if self.stored_kind == "sparse":
            with self._reading("X/indptr"):
                ends = self._array("X/indptr")
                first = int(np.asarray(ends[0:1])[0])
                last = int(np.asarray(ends[self.n:self.n + 1])[0])
                if first != 0 or last != self.nnz:
                    raise self._damaged(f"X/indptr runs from {first} to {last}, expected 0 to "
                                        f"nnz={self.nnz}")
        self.labels()
        dup = repeated_id(self.ids())
        if dup is not None:
            raise self._damaged(f"id {dup[0]} is on rows {dup[1]} and {dup[2]}: ids must be "
                                "unique")

    # -- metadata ---------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return int(self.attrs["N"])

    @property
    def d(self) -> int:
        return int(self.attrs["d"])

    @property
    def kind(self) -> str:
        """What the rows read are: ``dense``, ``sparse`` or ``pointsets`` (sets of local
        features; a model's set embedding reads them as sparse rows)."""
        return str(self.attrs["kind"])

    @property
    def byte_valued(self) -> bool:
        """Whether the rows are dense and stored as uint8 (format 3: every value an integer
        in 0..255), which `read_byte_rows` reads without their float32 copy."""
        return self.kind == "dense" and self.attrs.get("version") == BYTES_VERSION

    @property
    def stored_kind(self) -> str:
        """The kind on disk (`kind` may differ for a view of the dataset)."""
        return str(self.attrs["kind"])

    @property
    def nnz(self) -> int | None:
        return self.attrs.get("nnz")

    @property
    def classes(self) -> list[str] | None:
        return self.attrs.get("classes")

    @property
    def has_coords(self) -> bool:
        """Point sets with image coordinates (the PDK needs them)."""
        return self.stored_kind == "pointsets" and "P/coords" in self._group

    @property
    def shard_bounds(self) -> np.ndarray:
        if self.stored_kind == "sparse":
            return self._bounds
        return _shard_bounds(self.n, int(self.attrs["shard_rows"]))

    @property
    def n_shards(self) -> int:
        return len(self.shard_bounds) - 1

    def shards(self) -> list[ShardInfo]:
        b = self.shard_bounds
        return [ShardInfo(i, int(b[i]), int(b[i + 1])) for i in range(len(b) - 1)]

    def summary(self) -> dict[str, Any]:
        """What `lshdist info` prints."""
        y = self.labels()
        return {
            "path": str(self.path),
            "N": self.n,
            "d": self.d,
            "kind": self.kind,
            "nnz": self.nnz if self.kind == "sparse" else self.n * self.d,
            **({"points": self.nnz, "coords": self.has_coords,
                "nnz": int(self.nnz or 0) * int(self.attrs["d"])}
               if self.stored_kind == "pointsets" else {}),
            "shards": self.n_shards,
            "shard_rows": int(self.attrs["shard_rows"]),
            "classes": None if self.classes is None else len(self.classes),
            "labelled": y is not None,
        }

    # -- data -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        # a damaged chunk surfaces as a codec error (RuntimeError, ValueError...): say so
        try:
            yield
        except InputError:
            raise
        except Exception as exc:
            if str(exc).startswith(CHUNK_CRC_MISMATCH):  # zarr's CRC32C codec
                raise FormatError(
                    f"{str(self.path)!r}: {what} does not match its checksum: a chunk is "
                    "damaged; the dataset is corrupted, re-ingest it") from None
            raise FormatError(
                f"{str(self.path)!r}: cannot read {what} ({type(exc).__name__}: {exc}); "
                "the dataset is corrupted, re-ingest it"
            ) from None

    def labels(self) -> np.ndarray | None:
        """Label codes, int (N,), each an index into `classes`; None when unlabelled."""
        with self._reading("y"):
            if "y" not in self._group:
                return None
            y = self._whole("y")
        n_classes = len(self.classes or [])
        if len(y) and (y.min() < 0 or y.max() >= n_classes):
            raise self._damaged(f"label codes run from {y.min()} to {y.max()}, outside the "
                                f"{n_classes} classes")
        return y

    def ids(self) -> np.ndarray:
        with self._reading("ids"):
            return np.asarray(self._whole("ids"), dtype=np.int64)

    def _refuse_sets(self) -> InputError:
        return InputError(
            f"dataset {str(self.path)!r} holds sets of local features (kind pointsets), not "
            "vectors: learn a model with a set kernel (`lshdist learn --kernel pmk|pdk`) and "
            "index or query the sets with that model")

    def read_sets(self, start: int, stop: int) -> PointSets:
        """Sets ``start:stop`` of a point-set dataset, validated (offsets, finite values)."""
        if self.stored_kind != "pointsets":
            raise InputError(f"dataset {str(self.path)!r} holds {self.stored_kind} vectors, "
                             "not sets of local features; ingest images with --features")
        with self._reading(f"sets {start}:{stop}"):
            names = ("P/values", "P/coords") if self.has_coords else ("P/values",)
            off, arrays = self._csr_rows(start, stop, "P/offsets", names, "P")
            values = np.asarray(arrays[0], dtype=np.float32)
            coords = np.asarray(arrays[1], dtype=np.float32) if self.has_coords else None
        try:
            return PointSets.from_arrays(values, off, coords=coords)
        except InputError as exc:
            raise self._damaged(f"sets {start}:{stop}: {exc}") from None

    def read_set_rows(self, rows: np.ndarray) -> PointSets:
        """The sets numbered ``rows`` (sorted, unique), read shard by shard."""
        parts = [self.read_sets(a, b).take(r) for a, b, r in self._rows_by_shard(rows)]
        return concat_sets(parts, int(self.attrs["d"]))

    def _rows_by_shard(self, rows: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(shard start, shard stop, the rows in it relative to its start)`` for every
        shard holding some of ``rows`` (checked: sorted, unique, in range)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows[0] < 0 or rows[-1] >= self.n or np.any(np.diff(rows) <= 0)):
            raise InputError(f"row numbers must be sorted, unique and in 0..{self.n - 1}")
        b = self.shard_bounds
        for i in range(self.n_shards):
            lo, hi = np.searchsorted(rows, [b[i], b[i + 1]])
            if hi > lo:
                yield int(b[i]), int(b[i + 1]), rows[lo:hi] - b[i]

    def read_rows(self, start: int, stop: int) -> Block:
        """Rows ``start:stop``: a float32 array, or a `SparseBlock`."""
        if self.kind == "pointsets":
            raise self._refuse_sets()
        with self._reading(f"rows {start}:{stop} of X"):
            if self.kind == "dense":
                return self._dense_rows(start, stop)
            indptr, (indices, data) = self._csr_rows(start, stop, "X/indptr",
                                                     ("X/indices", "X/data"), "X")
            return SparseBlock.from_arrays(indptr, indices, data)

    def read_byte_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a `byte_valued` dataset as stored: uint8 (n, d), each
        shard checked as `read_rows` checks it (whose float32 rows are these numbers)."""
        if not self.byte_valued:
            raise InputError(f"dataset {str(self.path)!r} is not stored as bytes; read its "
                             "rows with read_rows")
        with self._reading(f"rows {start}:{stop} of X"):
            return self._dense_rows(start, stop, dtype=np.uint8)

    def read_row_set(self, rows: np.ndarray, *, threads: int = 1) -> Block:
        """The rows numbered ``rows`` (sorted, unique), read shard by shard: memory holds
        ``threads`` shards (read at once: decompression releases the GIL) and the selected
        rows, never the whole dataset."""
        if self.kind == "pointsets":
            raise self._refuse_sets()

        def take(part: tuple[int, int, np.ndarray]) -> Block:
            if self.kind == "dense":  # taken before they become float32
                with self._reading(f"rows {part[0]}:{part[1]} of X"):
                    return self._dense_rows(part[0], part[1], part[2])
            return take_rows(self.read_rows(part[0], part[1]), part[2])

        spans = list(self._rows_by_shard(rows))
        if threads > 1 and len(spans) > 1:
            with ThreadPoolExecutor(min(threads, len(spans))) as pool:
                parts: list[Block] = list(pool.map(take, spans))
        else:
            parts = [take(p) for p in spans]
        if self.kind == "dense":
            return (np.concatenate(parts) if parts  # type: ignore[arg-type]
                    else np.zeros((0, self.d), np.float32))
        return vstack_sparse(parts)  # type: ignore[arg-type]

    def read_shard(self, i: int) -> Block:
        """Shard ``i`` alone (dense array or `SparseBlock`)."""
        if not 0 <= i < self.n_shards:
            raise InputError(f"shard {i} out of range: the dataset has {self.n_shards} shards")
        b = self.shard_bounds
        return self.read_rows(int(b[i]), int(b[i + 1]))

    def iter_shards(self) -> Iterator[Block]:
        for i in range(self.n_shards):
            yield self.read_shard(i)

    def read_all(self) -> Block:
        """The whole dataset in memory (driver-side use on small data only)."""
        return self.read_rows(0, self.n)

    def to_dask(self) -> Any:
        """Dense: a lazy ``dask.array`` (one chunk a shard).  Sparse: one delayed per shard."""
        import dask.array as da
        from dask.delayed import delayed

        if self.kind == "pointsets":
            raise self._refuse_sets()
        shards = [delayed(_read_shard)(str(self.path), i, self.legacy)
                  for i in range(self.n_shards)]
        if self.kind == "dense":  # one chunk a shard, each read (and checked) alone
            # dask.array is not annotated (untyped calls into a dependency)
            return da.concatenate([  # type: ignore[no-untyped-call]
                da.from_delayed(part, shape=(s.stop - s.start, self.d),  # type: ignore[no-untyped-call]
                                dtype=np.float32)
                for part, s in zip(shards, self.shards())])
        return shards


def _read_shard(path: str, i: int, legacy: bool = False) -> Block:
    return Dataset(path, legacy=legacy).read_shard(i)


def concat_sets(parts: list[PointSets], d: int) -> PointSets:
    """Sets of several `PointSets` (one feature dimension ``d``), in order."""
    if not parts:
        return PointSets(np.zeros((0, d), np.float32), np.zeros(1, np.int64))
    coords = None
    if all(p.coords is not None for p in parts):
        coords = np.concatenate([cast(np.ndarray, p.coords) for p in parts])
    sizes = np.concatenate([p.sizes for p in parts])
    return PointSets(np.concatenate([p.values for p in parts]),
                     np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), None, coords)
