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
from pathlib import Path

import numpy as np
import zarr

from lshdist.blocks import SparseBlock
from lshdist.errors import FormatError, InputError
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric
from lshdist.store.atomic import atomic_dir

FORMAT = "lshdist-model"
VERSION = 1


def array_checksum(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    h = hashlib.sha256()
    h.update(str(a.dtype).encode())
    h.update(str(a.shape).encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _metric_arrays(metric) -> dict[str, np.ndarray]:
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
        return out
    raise InputError(f"cannot save a {type(metric).__name__}")


def save_model(path: str | os.PathLike, metric, *, params: dict | None = None,
               seed: int = 0, overwrite: bool = False) -> str:
    """Write ``metric`` to the directory ``path`` atomically; return the model checksum."""
    arrays = _metric_arrays(metric)
    checksums = {name: array_checksum(a) for name, a in arrays.items()}
    model_sum = hashlib.sha256(json.dumps(checksums, sort_keys=True).encode()).hexdigest()
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
        "checksums": checksums,
        "checksum": model_sum,
    }
    with atomic_dir(path, overwrite=overwrite) as tmp:
        g = zarr.open_group(str(tmp / "arrays"), mode="w", zarr_format=3)
        for name, a in arrays.items():
            g.create_array(name, data=np.ascontiguousarray(a))
        (tmp / "model.json").write_text(json.dumps(meta, indent=2, default=_json_default))
    return model_sum


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


def read_model_meta(path: str | os.PathLike) -> dict:
    path = Path(path)
    f = path / "model.json"
    if not path.is_dir():
        raise InputError(f"model {str(path)!r} does not exist; create it with `lshdist learn`")
    if not f.is_file():
        raise FormatError(f"{str(path)!r} is not an lshdist model (no model.json)")
    try:
        meta = json.loads(f.read_text())
    except json.JSONDecodeError as exc:
        raise FormatError(f"{str(path)!r}: model.json is corrupted ({exc})") from None
    if meta.get("format") != FORMAT:
        raise FormatError(f"{str(path)!r} is not an lshdist model (format={meta.get('format')!r})")
    if meta.get("version") != VERSION:
        raise FormatError(f"{str(path)!r}: model format version {meta.get('version')!r}, "
                          f"this lshdist reads {VERSION}")
    return meta


def load_model(path: str | os.PathLike):
    """``(metric, meta)`` from a model directory; checksums are verified."""
    path = Path(path)
    meta = read_model_meta(path)
    try:
        g = zarr.open_group(str(path / "arrays"), mode="r", zarr_format=3)
        arrays = {name: np.asarray(g[name][:]) for name in meta["checksums"]}
    except Exception as exc:
        raise FormatError(f"{str(path)!r}: model arrays unreadable ({type(exc).__name__}: {exc})") from None
    for name, a in arrays.items():
        if array_checksum(a) != meta["checksums"][name]:
            raise FormatError(f"{str(path)!r}: array {name!r} does not match its checksum; "
                              "the model is corrupted, learn it again")
    if meta["kind"] == "explicit":
        metric = ExplicitMetric(arrays["A"], center=arrays.get("center"))
    elif meta["kind"] == "implicit":
        if "basis" in arrays:
            basis = arrays["basis"]
        else:
            basis = SparseBlock.from_arrays(arrays["basis/indptr"], arrays["basis/indices"],
                                            arrays["basis/data"])
        metric = ImplicitMetric(basis, arrays["S"], kernel=meta["kernel"], d=meta["d"])
    else:
        raise FormatError(f"{str(path)!r}: unknown model kind {meta['kind']!r}")
    return metric, meta
