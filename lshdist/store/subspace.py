"""Subspace-partition indexes on disk (``lshdist index --method subspace``).

The index directory is an lshdist index (`lshdist.store.index` owns ``index.json``, its
checksum, format and version, the segment names and the lock); this module owns what a
subspace index adds, and `lshdist.store.index.read_manifest` calls `check_subspace_manifest`
for a manifest with ``method: "subspace"``:

* the manifest's ``subspace`` record: the build parameters (rank, bits r, η, α, rounds, Krylov
  iterations, probe and candidates), every round (`lshdist.index.subspace.Round`), the group
  sizes, the record's own format version and the checksum of the subspaces;
* ``subspaces/``: a Zarr group with ``bases`` float64 (G, d, k), every group's subspace in
  group order, and ``center`` float64 (d,), the database mean (what the queries are routed
  with, read on its own: the driver never loads a segment);
* one segment per group, ``segments/seg-*/``: ``ids`` int64 (n_g,) ascending, ``codes`` uint64
  (n_g, ceil(r/64)), ``coords`` float32 (n_g, k), ``basis`` float64 (d, k), ``mean`` float64 (k,),
  ``R`` float64 (r, k) and the re-rank rows ``payload/Z`` float32 (n_g, d); its manifest entry
  holds ``name``, ``rows``, ``group`` (its number), ``final`` and ``checksum``.

Everything is verified when read: checksums recomputed from the arrays loaded, then shapes,
dtypes and ranges checked against the manifest before a search touches them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from lshdist.errors import FormatError
from lshdist.index.payload import DensePayload
from lshdist.index.subspace import Group, Round
from lshdist.store.bounded import open_store
from lshdist.store.manifest import GroupEntry, SubspaceManifest, as_group_entry, manifest_from_json
from lshdist.store.model import array_checksum, zarr_array
from lshdist.store.objects import ObjectPath, as_path

METHOD = "subspace"
#: version of the ``subspace`` record and of the group segments
SUBSPACE_VERSION = 1
SUBSPACES = "subspaces"
_REBUILD = "rebuild the index (`lshdist index --method subspace --overwrite`)"
_GROUP_ARRAYS = ("ids", "codes", "coords", "basis", "mean", "R", "payload/Z")
_RECORD: dict[str, Any] = {"version": int, "rank": int, "bits": int, "eta": (int, float),
           "alpha": (int, float, type(None)), "max_rounds": int, "min_group": int,
           "krylov_iters": int, "n_probe": int, "n_candidates": int, "rounds": list,
           "group_sizes": list, "subspaces_checksum": str}
_ENTRY: dict[str, Any] = {"name": str, "rows": int, "group": int, "final": bool, "checksum": str}


@dataclass(frozen=True)
class GroupSegment:
    """One stored group, loaded: the `Group` (its ``rows`` are positions 0..n_g-1 into
    ``payload`` and ``ids``), the members' ids (ascending) and re-rank rows."""

    number: int
    group: Group
    ids: np.ndarray
    payload: DensePayload

    def __len__(self) -> int:
        return len(self.ids)


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    return hashlib.sha256(
        json.dumps({k: array_checksum(v) for k, v in sorted(arrays.items())}).encode()
    ).hexdigest()


def write_group(index_dir: str | os.PathLike[str], name: str, number: int, group: Group,
                ids: np.ndarray, Z: np.ndarray) -> GroupEntry:
    """Write group ``number`` (members' ``ids`` ascending, their re-rank rows ``Z``) as
    segment ``name``; returns its manifest entry."""
    from lshdist.store.index import segment_path, segment_zarr_arrays

    arrays = {"ids": np.asarray(ids, np.int64), "codes": group.codes, "coords": group.coords,
              "basis": group.basis, "mean": group.mean, "R": group.R,
              "payload/Z": np.asarray(Z, np.float32)}
    segment_zarr_arrays(segment_path(index_dir, name), arrays,
                        {"method": METHOD, "version": SUBSPACE_VERSION, "group": number})
    return GroupEntry(name=name, rows=len(ids), group=number, final=bool(group.final),
                      checksum=_checksum(arrays))


def _typed(manifest: SubspaceManifest | Mapping[str, Any]) -> SubspaceManifest:
    if isinstance(manifest, SubspaceManifest):
        return manifest
    typed = manifest_from_json(manifest)
    if not isinstance(typed, SubspaceManifest):
        raise FormatError("the manifest is not a subspace index's")
    return typed


def read_group(index_dir: str | os.PathLike[str], entry: GroupEntry | Mapping[str, Any],
               manifest: SubspaceManifest | Mapping[str, Any]) -> GroupSegment:
    """Load and verify one group segment named by a (checked) manifest entry (``entry`` and
    ``manifest`` typed, or as JSON: `lshdist.store.index.read_manifest`'s).

    Raises
    ------
    FormatError
        Naming the segment, for a missing, unreadable, altered or inconsistent one.
    """
    from lshdist.store.index import segment_path

    entry, manifest = as_group_entry(entry), _typed(manifest)
    name = entry.name
    path = segment_path(index_dir, name)
    where = f"segment {name!r} (group {entry.group}) of index {str(index_dir)!r}"
    fix = f"{_REBUILD} or restore the segment"
    if not path.is_dir():
        raise FormatError(f"{where} is missing ({str(path)!r}); {fix}")
    try:
        g = zarr.open_group(open_store(path), mode="r", zarr_format=3)
        arrays = {k: zarr_array(g, k) for k in _GROUP_ARRAYS}
    except Exception as exc:  # zarr raises many types for missing or broken chunks
        raise FormatError(f"{where} is unreadable ({type(exc).__name__}: {exc}); {fix}") from None
    digest = _checksum(arrays)
    if digest != entry.checksum:
        raise FormatError(f"{where} does not match its checksum (expected "
                          f"{entry.checksum[:12]}..., its arrays give {digest[:12]}...): a "
                          f"chunk is damaged or missing; {fix}")
    rec = manifest.subspace
    n, d, k, r = entry.rows, manifest.d, rec.rank, rec.bits
    want = {"ids": (np.int64, (n,)), "codes": (np.uint64, (n, (r + 63) // 64)),
            "coords": (np.float32, (n, k)), "basis": (np.float64, (d, k)),
            "mean": (np.float64, (k,)), "R": (np.float64, (r, k)),
            "payload/Z": (np.float32, (n, d))}
    for key, (dtype, shape) in want.items():
        a = arrays[key]
        if a.dtype != dtype or a.shape != shape:
            raise FormatError(f"{where}: {key} is {a.dtype} {a.shape}, expected "
                              f"{np.dtype(dtype)} {shape}; {fix}")
    ids = arrays["ids"]
    if n > 1 and not np.all(ids[1:] > ids[:-1]):
        raise FormatError(f"{where}: ids are not strictly ascending; {fix}")
    for key in ("coords", "basis", "mean", "R", "payload/Z"):
        if not np.all(np.isfinite(arrays[key])):
            raise FormatError(f"{where}: {key} holds NaN or infinite values; {fix}")
    group = Group(rows=np.arange(n, dtype=np.int64), basis=arrays["basis"],
                  mean=arrays["mean"], coords=arrays["coords"], codes=arrays["codes"],
                  R=arrays["R"], final=entry.final)
    return GroupSegment(entry.group, group, ids, DensePayload(arrays["payload/Z"]))


def router_path(index_dir: str | os.PathLike[str], manifest: SubspaceManifest
                ) -> Path | ObjectPath:
    """Where an index's router is: the segment directory its record names, or, for an index
    written before routers were named, ``subspaces/``."""
    from lshdist.store.index import segment_path

    name = manifest.subspace.router
    return as_path(index_dir) / SUBSPACES if name is None else segment_path(index_dir, name)


def write_subspaces(index_dir: str | os.PathLike[str], bases: np.ndarray,
                    center: np.ndarray, name: str) -> str:
    """Write the router (``bases`` (G, d, k), ``center`` (d,)) as the segment directory
    ``name`` (`lshdist.store.index.new_segment_name`: nothing the index's current manifest
    names is written over); returns its checksum."""
    from lshdist.store.index import segment_path, segment_zarr_arrays

    arrays = {"bases": np.asarray(bases, np.float64), "center": np.asarray(center, np.float64)}
    segment_zarr_arrays(segment_path(index_dir, name), arrays,
                        {"method": METHOD, "version": SUBSPACE_VERSION})
    return _checksum(arrays)


def read_subspaces(index_dir: str | os.PathLike[str], manifest: SubspaceManifest
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The verified router of a subspace index: ``bases`` float64 (G, d, k), ``center`` (d,).

    Raises
    ------
    FormatError
        For a missing, unreadable, altered or inconsistent ``subspaces/`` group.
    """
    path = router_path(index_dir, manifest)
    where = f"the subspaces of index {str(index_dir)!r} ({str(path)!r})"
    try:
        g = zarr.open_group(open_store(path), mode="r", zarr_format=3)
        arrays = {k: zarr_array(g, k) for k in ("bases", "center")}
    except Exception as exc:  # zarr raises many types for missing or broken chunks
        raise FormatError(f"{where} are unreadable ({type(exc).__name__}: {exc}); "
                          f"{_REBUILD}") from None
    rec = manifest.subspace
    if _checksum(arrays) != rec.subspaces_checksum:
        raise FormatError(f"{where} do not match their checksum: a chunk is damaged or "
                          f"missing; {_REBUILD}")
    G, d, k = len(manifest.segments), manifest.d, rec.rank
    bases, center = arrays["bases"], arrays["center"]
    if (bases.dtype != np.float64 or bases.shape != (G, d, k) or center.dtype != np.float64
            or center.shape != (d,) or not np.all(np.isfinite(bases))
            or not np.all(np.isfinite(center))):
        raise FormatError(f"{where}: bases {bases.dtype} {bases.shape} and center "
                          f"{center.dtype} {center.shape}, expected finite float64 "
                          f"({G}, {d}, {k}) and ({d},); {_REBUILD}")
    return bases, center


def _is(v: Any, types: Any) -> bool:
    # JSON true/false are Python bools, a subclass of int: never accept one for the other
    if isinstance(v, bool):
        return types is bool or (isinstance(types, tuple) and bool in types)
    return isinstance(v, types)


def check_subspace_manifest(meta: dict[str, Any], path: Path | ObjectPath) -> None:
    """Presence, type and range of a subspace index's manifest fields (its checksum, format
    and version are checked by `lshdist.store.index.read_manifest`)."""
    where = f"{str(path)!r}: index.json"
    top: dict[str, Any] = {"model": str, "model_checksum": str, "kind": str, "d": int,
                           "seed": int, "rows": int, "segments": list, "subspace": dict}
    for key, types in top.items():
        if key not in meta or not _is(meta[key], types):
            raise FormatError(f"{where}: {key}={meta.get(key)!r} is missing or of the wrong "
                              f"type; {_REBUILD}")
    rec = meta["subspace"]
    for key, types in _RECORD.items():
        if key not in rec or not _is(rec[key], types):
            raise FormatError(f"{where}: subspace.{key}={rec.get(key)!r} is missing or of the "
                              f"wrong type; {_REBUILD}")
    from lshdist.store.index import segment_path

    router = rec.get("router")  # absent in indexes written before: ``subspaces/``
    if router is not None:
        if not isinstance(router, str):
            raise FormatError(f"{where}: subspace.router={router!r} is not a segment name; "
                              f"{_REBUILD}")
        segment_path(path, router)
    target = rec.get("target_recall")  # absent in indexes written before it was recorded
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not 0.0 < target <= 1.0):
        raise FormatError(f"{where}: subspace.target_recall={target!r} is not a recall in "
                          f"(0, 1]; {_REBUILD}")
    if rec["version"] != SUBSPACE_VERSION:
        raise FormatError(f"{where}: subspace index version {rec['version']}, this lshdist "
                          f"reads {SUBSPACE_VERSION}; {_REBUILD}")
    if meta["kind"] != "explicit" or meta["d"] < 1 or not 1 <= rec["rank"] <= meta["d"] or (
            rec["bits"] < 1 or rec["n_probe"] < 1 or rec["n_candidates"] < 1):
        raise FormatError(f"{where}: kind={meta['kind']!r}, d={meta['d']}, rank={rec['rank']}, "
                          f"bits={rec['bits']}, n_probe={rec['n_probe']}, n_candidates="
                          f"{rec['n_candidates']} out of range; {_REBUILD}")
    try:
        rounds = [Round(**r) for r in rec["rounds"]]
    except TypeError:
        raise FormatError(f"{where}: subspace.rounds is not a list of rounds "
                          f"{{round, remaining, alpha, threshold, captured}}; {_REBUILD}") from None
    segs = meta["segments"]
    seen: set[str] = set()
    for i, e in enumerate(segs):
        if not isinstance(e, dict) or set(e) != set(_ENTRY) or not all(
                _is(e[key], t) for key, t in _ENTRY.items()):
            raise FormatError(f"{where}: segments[{i}]={str(e)[:80]!r} is not "
                              f"{{name, rows, group, final, checksum}}; {_REBUILD}")
        segment_path(path, e["name"])
        if e["name"] in seen or e["group"] != i or e["rows"] < 1:
            raise FormatError(f"{where}: segments[{i}] (group {e['group']}, {e['rows']} rows) "
                              f"is listed twice, out of order or empty; {_REBUILD}")
        seen.add(e["name"])
    if router in seen:
        raise FormatError(f"{where}: subspace.router={router!r} is also a group's segment; "
                          f"{_REBUILD}")
    sizes = [e["rows"] for e in segs]
    if rec["group_sizes"] != sizes or sum(sizes) != meta["rows"] or (
            len(rounds) > len(segs)
            or [r.captured for r in rounds if r.captured] != sizes[: len(
                [r for r in rounds if r.captured])]):
        raise FormatError(f"{where}: group sizes {rec['group_sizes']}, segments {sizes}, rows "
                          f"{meta['rows']} and the rounds' captures disagree; {_REBUILD}")
