"""Learned models on disk: ``model.json`` plus Zarr arrays (ARCHITECTURE.md section 3).

Explicit: arrays ``A`` (float64 d x d) and ``center`` (float32 d).  Implicit: ``S`` (float64
c x c) and the basis rows (``basis`` dense float32, or ``basis/indptr``, ``basis/indices``
(uint64), ``basis/data``).  ``model.json`` holds the kind, base kernel, d, learner parameters,
seed, format version and a sha256 of every array; loading checks them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from lshdist.blocks import SparseBlock
from lshdist.errors import FormatError, InputError
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric
from lshdist.store.atomic import atomic_dir
from lshdist.store.bounded import WRITE_CONFIG, open_store, write_store
from lshdist.store.files import load_json
from lshdist.store.objects import ObjectPath, as_path

FORMAT = "lshdist-model"
VERSION = 1


def array_checksum(a: np.ndarray) -> str:
    """sha256 over an array's dtype, shape and bytes (C order), read without a copy."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256()
    h.update(str(a.dtype).encode())
    h.update(str(a.shape).encode())
    h.update(a.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def checksums_digest(checksums: dict[str, str],
                     embedding: dict[str, Any] | None = None) -> str:
    """The model checksum: sha256 over the per-array checksums (canonical JSON), and over the
    set embedding's parameters when the model has one (they change every row it reads)."""
    what: dict[str, Any] = dict(checksums)
    if embedding is not None:
        what = {"arrays": checksums, "embedding": embedding}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _metric_arrays(metric: object) -> dict[str, np.ndarray]:
    if isinstance(metric, ExplicitMetric):
        out = {"A": metric.A}
        if metric.center is not None:
            out["center"] = metric.center
        return out
    if isinstance(metric, ImplicitMetric):
        out = {"S": metric.S}
        if isinstance(metric.basis, SparseBlock):
            indptr, indices, data = metric.basis.to_arrays()
            out.update({"basis/indptr": indptr, "basis/indices": indices, "basis/data": data})
        else:
            out["basis"] = np.asarray(metric.basis, np.float32)
        if metric.embedding is not None:
            out.update(metric.embedding.arrays())
        return out
    raise InputError(f"cannot save a {type(metric).__name__}")


def save_model(path: str | os.PathLike[str], metric: ExplicitMetric | ImplicitMetric, *,
               params: dict[str, Any] | None = None,
               seed: int = 0, overwrite: bool = False) -> str:
    """Write ``metric`` to the directory ``path`` atomically; return the model checksum."""
    arrays = _metric_arrays(metric)
    checksums = {name: array_checksum(a) for name, a in arrays.items()}
    embedding = None if metric.embedding is None else metric.embedding.to_json()
    model_sum = checksums_digest(checksums, embedding)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "kind": metric.kind,
        "kernel": getattr(metric, "kernel_name", None),
        "d": int(metric.d),
        "c": int(getattr(metric, "c", 0)) or None,
        "sparse": isinstance(getattr(metric, "basis", None), SparseBlock),
        "seed": int(seed),
        "params": params or {},
        "embedding": embedding,
        "checksums": checksums,
        "checksum": model_sum,
    }
    with atomic_dir(path, overwrite=overwrite, kind="lshdist-model") as tmp:
        g = zarr.open_group(write_store(tmp / "arrays"), mode="w", zarr_format=3)
        for name, a in arrays.items():
            g.create_array(name, data=np.ascontiguousarray(a), config=WRITE_CONFIG)
        (tmp / "model.json").write_text(json.dumps(meta, indent=2, default=_json_default))
    return model_sum


def _json_default(o: object) -> object:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


_SHA256 = re.compile(r"[0-9a-f]{64}")
_RELEARN = "learn it again with `lshdist learn`"
#: model.json fields: name -> (allowed JSON types, what is expected)
_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "kind": ((str,), "'explicit' or 'implicit'"),
    "kernel": ((str, type(None)), "a kernel name or null"),
    "d": ((int,), "an integer >= 1"),
    "c": ((int, type(None)), "an integer >= 1 or null"),
    "sparse": ((bool,), "true or false"),
    "seed": ((int,), "an integer"),
    "params": ((dict,), "an object"),
    "checksums": ((dict,), "an object of sha256 hex digests"),
    "checksum": ((str,), "a sha256 hex digest"),
}


def expected_arrays(meta: dict[str, Any]) -> list[set[str]]:
    """The sets of array names a model of this kind may hold (explicit: ``center`` optional)."""
    if meta["kind"] == "explicit":
        return [{"A"}, {"A", "center"}]
    if meta["sparse"]:
        names = {"S", "basis/indptr", "basis/indices", "basis/data"}
        emb = meta.get("embedding")
        if isinstance(emb, dict) and emb.get("kernel") == "pmk":
            names.add("embedding/shift")
            if emb.get("pca"):
                names |= {"embedding/pca_mean", "embedding/pca_components"}
        elif isinstance(emb, dict):
            names.add("embedding/codebook")
        return [names]
    return [{"S", "basis"}]


def _check_meta(meta: dict[str, Any], path: Path | ObjectPath) -> None:
    where = f"{str(path)!r}: model.json"
    for key, (types, what) in _FIELDS.items():
        if key not in meta:
            raise FormatError(f"{where} has no {key!r} (expected {what}); {_RELEARN}")
        v = meta[key]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise FormatError(f"{where}: {key}={v!r} is not {what}; {_RELEARN}")
    emb = meta.get("embedding")
    if emb is not None and (not isinstance(emb, dict) or meta["kind"] != "implicit"
                            or not meta["sparse"]):
        raise FormatError(f"{where}: embedding={emb!r}: a set embedding belongs to an implicit "
                          f"model over sparse rows; {_RELEARN}")
    if meta["kind"] not in ("explicit", "implicit") or meta["d"] < 1 or (
            meta["c"] is not None and meta["c"] < 1):
        raise FormatError(f"{where}: kind={meta['kind']!r}, d={meta['d']!r}, c={meta['c']!r}: "
                          f"expected 'explicit' or 'implicit', d >= 1 and c >= 1 or null; "
                          f"{_RELEARN}")
    sums = meta["checksums"]
    if not all(isinstance(v, str) and _SHA256.fullmatch(v) for v in sums.values()):
        raise FormatError(f"{where}: checksums must be sha256 hex digests; {_RELEARN}")
    if set(sums) not in expected_arrays(meta):
        want = " or ".join(str(sorted(e)) for e in expected_arrays(meta))
        raise FormatError(f"{where}: checksums name arrays {sorted(sums)}, a {meta['kind']} "
                          f"model has {want}; the model is damaged, {_RELEARN}")
    digest = checksums_digest(sums, meta.get("embedding"))
    if digest != meta["checksum"]:
        raise FormatError(f"{where}: checksum {meta['checksum'][:12]}... does not match its "
                          f"checksums ({digest[:12]}...); the model is damaged, {_RELEARN}")


def read_model_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``model.json`` of a model directory, checked: fields, array names, model checksum.

    No array is read (see `load_model`).

    Raises
    ------
    InputError
        If ``path`` does not exist.
    FormatError
        If ``model.json`` is missing, corrupted, of another format or version, lacks a field or
        has one of the wrong type, names other arrays than its kind needs, or its checksum does
        not match its array checksums.
    """
    path = as_path(path)
    f = path / "model.json"
    if not path.is_dir():
        raise InputError(f"model {str(path)!r} does not exist; create it with `lshdist learn`")
    if not f.is_file():
        raise FormatError(f"{str(path)!r} is not an lshdist model (no model.json)")
    meta = load_json(f, f"{str(path)!r}: model.json", _RELEARN, path)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        fmt = meta.get("format") if isinstance(meta, dict) else None
        raise FormatError(f"{str(path)!r} is not an lshdist model (format={fmt!r})")
    if meta.get("version") != VERSION:
        raise FormatError(f"{str(path)!r}: model format version {meta.get('version')!r}, "
                          f"this lshdist reads {VERSION}")
    _check_meta(meta, path)
    return meta


def zarr_array(g: zarr.Group, name: str) -> np.ndarray:
    """All of array ``name`` of group ``g`` (a KeyError or TypeError when it is not an array)."""
    a = g[name]
    if not isinstance(a, zarr.Array):
        raise TypeError(f"{name!r} is a group, expected an array")
    return np.asarray(a[:])


def _stored_arrays(g: zarr.Group) -> set[str]:
    return {name for name, obj in g.members(max_depth=None) if isinstance(obj, zarr.Array)}


def load_model(path: str | os.PathLike[str]
               ) -> tuple[ExplicitMetric | ImplicitMetric, dict[str, Any]]:
    """``(metric, meta)`` from a model directory, verified.

    ``model.json`` is checked (`read_model_meta`); the arrays on disk must be exactly those its
    ``checksums`` name, each matching its checksum, with shapes consistent with ``d`` and ``c``.

    Raises
    ------
    FormatError
        For any damage, naming the array.
    """
    path = as_path(path)
    meta = read_model_meta(path)
    try:
        g = zarr.open_group(open_store(path / "arrays"), mode="r", zarr_format=3)
        stored = _stored_arrays(g)
        arrays = {name: zarr_array(g, name) for name in meta["checksums"] if name in stored}
    except Exception as exc:
        raise FormatError(f"{str(path)!r}: model arrays unreadable ({type(exc).__name__}: {exc}); "
                          f"{_RELEARN}") from None
    if stored != set(meta["checksums"]):
        raise FormatError(f"{str(path)!r}: the model holds arrays {sorted(stored)}, model.json "
                          f"names {sorted(meta['checksums'])}; the model is damaged, {_RELEARN}")
    for name, a in arrays.items():
        if array_checksum(a) != meta["checksums"][name]:
            raise FormatError(f"{str(path)!r}: array {name!r} does not match its checksum; "
                              f"the model is corrupted, {_RELEARN}")
    try:
        metric = _metric_from_arrays(arrays, meta)
    except (InputError, ValueError, TypeError, KeyError) as exc:
        raise FormatError(f"{str(path)!r}: the model arrays are inconsistent ({exc}); "
                          f"{_RELEARN}") from None
    return metric, meta


def _metric_from_arrays(arrays: dict[str, np.ndarray],
                        meta: dict[str, Any]) -> ExplicitMetric | ImplicitMetric:
    d = meta["d"]
    if meta["kind"] == "explicit":
        if arrays["A"].shape != (d, d):
            raise InputError(f"A has shape {arrays['A'].shape}, expected ({d}, {d})")
        return ExplicitMetric(arrays["A"], center=arrays.get("center"))
    c = meta["c"]
    if arrays["S"].shape != (c, c):
        raise InputError(f"S has shape {arrays['S'].shape}, expected (c, c) = ({c}, {c})")
    if "basis" in arrays:
        dense = arrays["basis"]
        if dense.ndim != 2 or dense.shape != (c, d):
            raise InputError(f"basis has shape {dense.shape}, expected ({c}, {d})")
        return ImplicitMetric(dense, arrays["S"], kernel=meta["kernel"], d=d)
    else:
        indptr = arrays["basis/indptr"]
        nnz = len(arrays["basis/indices"])
        if (indptr.shape != (c + 1,) or len(arrays["basis/data"]) != nnz or indptr[0] != 0
                or indptr[-1] != nnz or np.any(np.diff(indptr) < 0)):
            raise InputError(f"basis/indptr does not delimit {c} rows of {nnz} entries")
        basis = SparseBlock.from_arrays(indptr, arrays["basis/indices"], arrays["basis/data"])
    embedding = None
    if meta.get("embedding") is not None:
        from lshdist.embed.model import SetEmbedding

        embedding = SetEmbedding.from_json(meta["embedding"], arrays)
    return ImplicitMetric(basis, arrays["S"], kernel=meta["kernel"], d=d, embedding=embedding)
