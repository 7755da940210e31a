"""Indexes on disk: ``index.json`` + one Zarr group per segment (ARCHITECTURE.md section 3).

A segment holds ``ids``, packed ``codes``, the permutations' bit ``positions``, per permutation
the ``sorted_rows`` and their 64-bit ``sorted_prefix``, and the re-rank ``payload/*`` arrays.
The manifest is written last by atomic rename: a reader never sees a half-built index, and an
interrupted build leaves the previous manifest (and so the previous index) as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import numpy as np
import zarr

from lshdist.errors import FormatError, InputError
from lshdist.index.payload import DensePayload, KernelPayload
from lshdist.index.permutation import PermutationIndex
from lshdist.store.atomic import atomic_write_text
from lshdist.store.model import array_checksum

FORMAT = "lshdist-index"
VERSION = 1
MANIFEST = "index.json"
_PAYLOADS = {"dense": DensePayload, "kernel": KernelPayload}
_UNCOMPRESSED = {"codes", "sorted_rows", "sorted_prefix"}


def new_segment_name() -> str:
    return f"seg-{uuid.uuid4().hex[:16]}"


def write_segment(index_dir: str | os.PathLike, name: str, index: PermutationIndex) -> dict:
    """Write one fitted segment; returns its manifest entry (name, rows, M, checksum)."""
    arrays = {
        "ids": index.ids_, "codes": index.codes_, "positions": index.positions_,
        "sorted_rows": index.sorted_rows_, "sorted_prefix": index.sorted_prefix_,
        **{f"payload/{k}": v for k, v in index.payload_.arrays().items()},
    }
    path = Path(index_dir) / "segments" / name
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    for key, a in arrays.items():
        # the sorted lists and keys are near-random bits: compressing them costs more time
        # (half of a segment's build, measured) than the space it saves
        raw = key in _UNCOMPRESSED
        g.create_array(key, data=np.ascontiguousarray(a), compressors=None if raw else "auto")
    g.attrs.update({"payload": index.payload_.kind, "bits": index.bits_})
    digest = hashlib.sha256(
        json.dumps({k: array_checksum(v) for k, v in sorted(arrays.items())}).encode()
    ).hexdigest()
    return {"name": name, "rows": int(len(index.ids_)), "permutations": int(index.n_permutations_),
            "checksum": digest}


def read_segment(index_dir: str | os.PathLike, entry: dict, manifest: dict) -> PermutationIndex:
    path = Path(index_dir) / "segments" / entry["name"]
    try:
        g = zarr.open_group(str(path), mode="r", zarr_format=3)
        kind = g.attrs["payload"]
        payload = _PAYLOADS[kind].from_arrays(
            {k: np.asarray(v[:]) for k, v in g["payload"].arrays()})
        state = {k: np.asarray(g[k][:]) for k in
                 ("ids", "codes", "positions", "sorted_rows", "sorted_prefix")}
    except Exception as exc:
        raise FormatError(f"segment {entry['name']!r} of {str(index_dir)!r} is unreadable "
                          f"({type(exc).__name__}: {exc}); rebuild the index") from None
    if len(state["ids"]) != entry["rows"]:
        raise FormatError(f"segment {entry['name']!r} has {len(state['ids'])} rows, the manifest "
                          f"says {entry['rows']}; rebuild the index")
    return PermutationIndex.from_state(
        window=manifest["window"], hamming_keep=manifest["hamming_keep"], seed=manifest["seed"],
        bits=manifest["bits"], payload=payload, **state)


def write_manifest(index_dir: str | os.PathLike, manifest: dict) -> None:
    atomic_write_text(Path(index_dir) / MANIFEST, json.dumps(manifest, indent=2))


def read_manifest(index_dir: str | os.PathLike) -> dict:
    path = Path(index_dir)
    if not path.is_dir():
        raise InputError(f"index {str(path)!r} does not exist; build it with `lshdist index`")
    f = path / MANIFEST
    if not f.is_file():
        raise FormatError(f"{str(path)!r} is not an lshdist index (no {MANIFEST}); "
                          "build one with `lshdist index`")
    try:
        meta = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(f"{str(path)!r}: {MANIFEST} is corrupted ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FormatError(f"{str(path)!r} is not an lshdist index (format="
                          f"{meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != VERSION:
        raise FormatError(f"{str(path)!r}: index format version {meta.get('version')!r}, "
                          f"this lshdist reads {VERSION}")
    return meta
