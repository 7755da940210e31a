"""Indexes on disk: ``index.json`` + one Zarr group per segment (ARCHITECTURE.md section 3).

A segment holds ``ids``, packed ``codes``, the permutations' bit ``positions``, per permutation
the ``sorted_rows``, and the re-rank ``payload/*`` arrays; the lists' 64-bit prefixes are
recomputed from the keys when a segment is read (segments written before that also hold them
as ``sorted_prefix``, still read and verified).
The manifest is written last by atomic rename: a reader never sees a half-built index, and an
interrupted build leaves the previous manifest (and so the previous index) as it was.

Everything is verified when read: the manifest carries a checksum over its parameters and
segment list and every field is checked for presence and type; segment names must be names
`new_segment_name` makes (so they resolve inside ``INDEX/segments``); a segment's checksum is
recomputed from the arrays loaded (a deleted Zarr chunk reads back as fill values and is caught
here); shapes and ranges are checked before any kernel sees the arrays
(`lshdist.index.permutation.check_state`).  Builds and appends serialise on `index_lock`.

The checked manifest is handed out typed (`read_index_manifest`: the frozen dataclasses of
`lshdist.store.manifest`) and written from its ``to_json()``; `read_manifest` gives the checked
JSON itself, for tools and tests that edit a manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec

from lshdist.errors import FormatError, InputError
from lshdist.index.calibrate import Calibration
from lshdist.index.hyperplane import MarginDensePayload, MarginSparsePayload
from lshdist.index.payload import DensePayload, KernelPayload
from lshdist.index.permutation import PackedSegment, PermutationIndex
from lshdist.store.atomic import atomic_write_text
from lshdist.store.bounded import WRITE_CONFIG, open_store, write_store
from lshdist.store.dataset import CHUNK_CRC_MISMATCH, repeated_id
from lshdist.store.files import dump_json, load_json
from lshdist.store.manifest import FORMAT as FORMAT
from lshdist.store.manifest import VERSION as VERSION
from lshdist.store.manifest import AnyManifest as AnyManifest
from lshdist.store.manifest import GroupEntry as GroupEntry
from lshdist.store.manifest import IndexManifest as IndexManifest
from lshdist.store.manifest import KindEntry as KindEntry
from lshdist.store.manifest import KindManifest as KindManifest
from lshdist.store.manifest import PermutationManifest as PermutationManifest
from lshdist.store.manifest import SegmentEntry as SegmentEntry
from lshdist.store.manifest import (
    SegmentPart,
    as_entry,
    known_methods,
    manifest_from_json,
    plugin_manifest,
)
from lshdist.store.manifest import SubspaceManifest as SubspaceManifest
from lshdist.store.model import array_checksum, zarr_array
from lshdist.store.objects import ObjectPath, as_path, is_url, local_path

log = logging.getLogger(__name__)

MANIFEST = "index.json"
SEGMENTS = "segments"
_PAYLOADS: dict[str, type[DensePayload] | type[KernelPayload] | type[MarginDensePayload]
                | type[MarginSparsePayload]] = {
    "dense": DensePayload, "kernel": KernelPayload,
    "margin-dense": MarginDensePayload, "margin-sparse": MarginSparsePayload}
_UNCOMPRESSED = {"codes", "sorted_rows", "sorted_prefix"}
#: the other arrays (payload, ids): byte-shuffled LZ4 in chunks of whole rows — on 200,000
#: shifted Fashion-MNIST rows (627 MB float32) it reads in about 0.35 s to 143 MB where
#: byte-shuffled zstd level 1 took 0.7 s for 106 MB and zarr's automatic chunks (a few dozen
#: columns each) 2.3 s: loading a 500,000-row segment for a query took 12 s, mostly this
#: (and a CRC32C checked before Blosc reads a chunk: see `store.dataset.ROWS_CODEC`)
_PAYLOAD_CODEC = (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"), Crc32cCodec())
#: bytes per chunk of a segment's arrays (whole rows; whole lists)
_CHUNK_BYTES = 4 << 20


def _chunks(a: np.ndarray) -> tuple[int, ...]:
    """Chunks of whole rows of about `_CHUNK_BYTES` (read whole and copied contiguously)."""
    if a.ndim == 0 or a.size == 0:
        return a.shape or (1,)
    row = max(1, a.itemsize * int(np.prod(a.shape[1:])))
    return (max(1, min(a.shape[0], _CHUNK_BYTES // row)), *a.shape[1:])
_STATE = ("ids", "codes", "positions", "sorted_rows")
#: stored by segments written before the prefixes were recomputed at load (still read)
_OLD_STATE = ("sorted_prefix",)
_SEGMENT_NAME = re.compile(r"seg-[0-9a-f]{16}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REBUILD = "rebuild the index (`lshdist index --overwrite`)"

#: manifest fields: name -> (allowed JSON types, description for messages)
_INT, _NUM, _STR, _BOOL = (int,), (int, float), (str,), (bool,)
_NONE = (type(None),)
_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "format": (_STR, "a string"),
    "version": (_INT, "an integer"),
    "model": (_STR, "a path"),
    "model_checksum": (_STR, "a sha256 hex digest"),
    "kind": (_STR, "'explicit' or 'implicit'"),
    "d": (_INT, "an integer >= 1"),
    "bits": (_INT, "an integer >= 1"),
    "epsilon": (_NUM + _NONE, "a number > 0 or null"),
    "permutations": (_INT + _NONE, "an integer >= 1 or null"),
    "window": (_INT, "an integer >= 1"),
    "hamming_keep": (_INT, "an integer >= 0"),
    "seed": (_INT, "an integer"),
    "learned": (_BOOL, "true or false"),
    "segments": ((list,), "a list of segment entries"),
    "rows": (_INT, "an integer >= 0"),
    "calibration": ((dict,), "the calibration record (curve and chosen operating point)"),
    "checksum": (_STR, "a sha256 hex digest"),
}
#: optional manifest fields
#: the EH-Hash definition an eh-hash index's keys were made with (2: the symmetric
#: counter-based U of `lshdist._kernels.ehhash`); an index of another is refused
EH_HASH_VERSION = 2

_OPTIONAL: dict[str, tuple[tuple[type, ...], str]] = {
    # labels of the appends that landed (`lshdist index --append --batch`, a day of
    # jobs/daily_append.py): an append whose label is here adds nothing
    "batches": ((list,), "a list of batch labels (strings)"),
    # an index for hyperplane queries (`lshdist index --family`): the hash family's name and
    # its EH-Hash query samples t; its segments hold margin payloads
    "family": ((dict,), "{'name': 'h-hash' or 'eh-hash', 'samples': an integer >= 1 or null}"),
}
_ENTRY_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "name": (_STR, "a segment name seg-<16 hex digits>"),
    "rows": (_INT, "an integer >= 1"),
    "permutations": (_INT, "an integer >= 1"),
    "checksum": (_STR, "a sha256 hex digest"),
}
_ENTRY_OPTIONAL: dict[str, tuple[tuple[type, ...], str]] = {
    # a packed (compacted) segment: its parts, each a segment as it was stored
    "parts": ((list,), "a list of parts {rows, permutations, checksum}"),
    "source": (_STR, "a path"),
    "start": (_INT, "an integer >= 0"),
    "stop": (_INT, "an integer >= 0"),
}


@contextlib.contextmanager
def unreadable(what: str) -> Iterator[None]:
    """An OS error while reading ``what`` (permission denied on ``segments/``, an I/O error)
    as a `FormatError` that says it cannot be read -- not, as the CLI would guess from a
    permission error alone, that something cannot be written."""
    try:
        yield
    except OSError as exc:
        raise FormatError(f"{what} is unreadable ({exc.strerror or exc}: "
                          f"{str(exc.filename)!r}); check its permissions and the file system"
                          ) from None


def new_segment_name() -> str:
    """A fresh segment directory name, ``seg-`` and 16 hex digits."""
    return f"seg-{uuid.uuid4().hex[:16]}"


def segment_path(index_dir: str | os.PathLike[str], name: Any) -> Path | ObjectPath:
    """``INDEX/segments/NAME``, refusing any name `new_segment_name` would not make.

    Raises
    ------
    FormatError
        For a name with a path separator, ``..``, an absolute path or anything else that is not
        ``seg-`` + 16 hex digits, or one that resolves outside ``INDEX/segments`` (a symlink).
    """
    if not isinstance(name, str) or not _SEGMENT_NAME.fullmatch(name):
        raise FormatError(f"index {str(index_dir)!r}: segment name {name!r} is not "
                          "seg-<16 hex digits>; the manifest was edited or damaged, "
                          f"{_REBUILD}")
    root = as_path(index_dir) / SEGMENTS
    path = root / name
    if isinstance(path, ObjectPath):  # no symlinks in an object store
        return path
    with unreadable(f"segment {name!r} of index {str(index_dir)!r}"):
        outside = path.exists() and path.resolve().parent != root.resolve()
    if outside:
        raise FormatError(f"index {str(index_dir)!r}: segment {name!r} resolves to "
                          f"{str(path.resolve())!r}, outside {str(root)!r}; {_REBUILD}")
    return path


def _segment_checksum(arrays: dict[str, np.ndarray]) -> str:
    return hashlib.sha256(
        json.dumps({k: array_checksum(v) for k, v in sorted(arrays.items())}).encode()
    ).hexdigest()


def write_segment(index_dir: str | os.PathLike[str], name: str,
                  index: PermutationIndex) -> SegmentEntry:
    """Write one fitted segment; returns its manifest entry (name, rows, M, checksum)."""
    arrays = {
        "ids": index.ids_, "codes": index.codes_, "positions": index.positions_,
        "sorted_rows": index.sorted_rows_,  # the lists' prefixes are recomputed at load
        **{f"payload/{k}": v for k, v in index.payload_.arrays().items()},
    }
    segment_zarr_arrays(segment_path(index_dir, name), arrays,
                        {"payload": index.payload_.kind, "bits": index.bits_})
    return SegmentEntry(name=name, rows=len(index.ids_),
                        permutations=int(index.n_permutations_),
                        checksum=_segment_checksum(arrays))


def segment_zarr_arrays(path: Path | ObjectPath, arrays: dict[str, np.ndarray],
                        attrs: dict[str, Any]
                        ) -> None:
    """Write ``arrays`` (names with ``/`` make subgroups) and ``attrs`` as a new Zarr group at
    ``path``, in the chunking and compression of every segment of an index."""
    key = "zarr.json"
    try:
        g = zarr.open_group(write_store(path), mode="w", zarr_format=3)
        for key, a in arrays.items():
            # the sorted lists and keys are near-random bits: compressing them costs more time
            # (half of a segment's build, measured) than the space it saves
            raw = key in _UNCOMPRESSED
            a = np.ascontiguousarray(a)
            if key in ("sorted_rows", "sorted_prefix") and (a.shape[1] * a.itemsize
                                                            > _CHUNK_BYTES):
                # (M, N): long lists in runs of one list (a chunk of several would be strided)
                chunks: tuple[int, ...] = (1, max(1, _CHUNK_BYTES // a.itemsize))
            else:  # whole rows: several short lists per chunk (zarr pays per chunk)
                chunks = _chunks(a)
            g.create_array(key, data=a, chunks=chunks,
                           compressors=None if raw else _PAYLOAD_CODEC, config=WRITE_CONFIG)
        key = "zarr.json"
        g.attrs.update(attrs)
    except OSError as exc:  # zarr's writes do not say which file: a full disk names it here
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path / key)) from None


def part_dir(i: int) -> str:
    """The directory of part ``i`` inside a packed segment."""
    return f"part-{i:04d}"


def packed_checksum(checksums: Sequence[str]) -> str:
    """A packed segment's checksum: over its parts' checksums, in order."""
    return hashlib.sha256(json.dumps(list(checksums)).encode()).hexdigest()


def contiguous_span(entries: Sequence[SegmentEntry]) -> dict[str, Any]:
    """``{source, start, stop}`` when ``entries`` are consecutive row ranges of one dataset
    (the fields a merged or packed segment keeps), else ``{}``."""
    sources = {e.source for e in entries}
    spans = [(e.start, e.stop) for e in entries]
    if (len(sources) == 1 and None not in sources
            and all(isinstance(a, int) and isinstance(b, int) for a, b in spans)
            and all(x[1] == y[0] for x, y in itertools.pairwise(spans))):
        return {"source": entries[0].source, "start": spans[0][0], "stop": spans[-1][1]}
    return {}


def pack_segments(index_dir: str | os.PathLike[str], entries: Sequence[SegmentEntry],
                  name: str) -> SegmentEntry:
    """Pack stored segments (plain or packed) into one new segment ``name``, each as a part
    copied file for file (the arrays, and so their checksums, unchanged); returns its manifest
    entry.  Nothing names the new segment until the caller swaps the manifest: a kill leaves an
    orphan for `remove_orphans`."""
    sources: list[Path | ObjectPath] = []
    parts: list[SegmentPart] = []
    for e in entries:
        src = segment_path(index_dir, e.name)
        subs = ([(src / part_dir(j), p) for j, p in enumerate(e.parts)] if e.parts is not None
                else [(src, SegmentPart(e.rows, e.permutations, e.checksum))])
        for path, p in subs:
            sources.append(path)
            parts.append(p)
    if len({p.permutations for p in parts}) != 1:
        raise InputError(f"segments with {sorted({p.permutations for p in parts})} lists "
                         "cannot be packed into one")
    dst = segment_path(index_dir, name)
    dst.mkdir(parents=True)
    for i, path in enumerate(sources):
        if isinstance(path, ObjectPath) and isinstance(dst, ObjectPath):
            path.copytree(dst / part_dir(i))
        else:
            shutil.copytree(path, dst / part_dir(i))
    return SegmentEntry(name=name, rows=sum(p.rows for p in parts),
                        permutations=parts[0].permutations,
                        checksum=packed_checksum([p.checksum for p in parts]),
                        parts=tuple(parts), **contiguous_span(entries))


def _search_params(manifest: PermutationManifest | Mapping[str, Any]) -> tuple[int, int, int, int]:
    """``(b, W, H, seed)`` of a manifest (as JSON: only these four keys are needed)."""
    if isinstance(manifest, PermutationManifest):
        return manifest.bits, manifest.window, manifest.hamming_keep, manifest.seed
    return (manifest["bits"], manifest["window"], manifest["hamming_keep"], manifest["seed"])


def read_segment(index_dir: str | os.PathLike[str], entry: SegmentEntry | Mapping[str, Any],
                 manifest: PermutationManifest | Mapping[str, Any]
                 ) -> PermutationIndex | PackedSegment:
    """Load and verify one segment named by a manifest entry (see `read_index_manifest`): a
    `PermutationIndex`, or a `PackedSegment` of such parts for an entry with ``parts`` (a
    compacted segment, `pack_segments`).  ``entry`` and ``manifest`` may also be given as
    JSON (`read_manifest`'s; of the manifest only b, W, H and the seed are read).

    Every part's checksum is recomputed from the arrays loaded, then shapes and ranges are
    checked (`lshdist.index.permutation.check_state`) before the index is returned.

    Raises
    ------
    FormatError
        Naming the segment, for a missing, unreadable, altered or inconsistent segment.
    """
    entry = as_entry(entry)
    params = _search_params(manifest)
    name = entry.name
    path = segment_path(index_dir, name)
    restore = f"{_REBUILD} or restore segment {name!r}"
    where = f"segment {name!r} of index {str(index_dir)!r}"
    with unreadable(where):  # on object storage a request: asked only after a failed read
        if not isinstance(path, ObjectPath) and not path.is_dir():
            raise FormatError(f"{where} is missing ({str(path)!r}); {restore}")
    if entry.parts is None:
        return _read_group(path, SegmentPart(entry.rows, entry.permutations, entry.checksum),
                           params, where, restore)
    return PackedSegment([_read_group(path / part_dir(i), p, params, f"{where} (part {i})",
                                      restore) for i, p in enumerate(entry.parts)])


def _read_group(path: Path | ObjectPath, entry: SegmentPart, params: tuple[int, int, int, int],
                where: str,
                restore: str) -> PermutationIndex:
    """One stored segment group at ``path`` checked against ``entry`` (rows, permutations,
    checksum)."""
    try:
        g = zarr.open_group(open_store(path), mode="r", zarr_format=3)
        kind, bits = g.attrs["payload"], g.attrs["bits"]
        pg = g["payload"]
        if not isinstance(pg, zarr.Group):
            raise TypeError("'payload' is an array, expected a group")
        payload_arrays = {f"payload/{k}": np.asarray(v[:]) for k, v in pg.arrays()}
        state = {k: zarr_array(g, k) for k in _STATE}
        state.update({k: zarr_array(g, k) for k in _OLD_STATE if k in g})
    except Exception as exc:  # zarr raises many types for missing or broken chunks and metadata
        failed = (f"{where} does not match its checksum: a chunk is damaged; {restore}"
                  if str(exc).startswith(CHUNK_CRC_MISMATCH) else
                  f"{where} is unreadable ({type(exc).__name__}: {exc}); {restore}")
    else:
        failed = ""
    if failed:  # raised outside the handler: no store exception chained to what a task returns
        if isinstance(path, ObjectPath) and not path.is_dir():
            failed = f"{where} is missing ({str(path)!r}); {restore}"
        raise FormatError(failed)
    digest = _segment_checksum({**state, **payload_arrays})
    if digest != entry.checksum:
        raise FormatError(f"{where} does not match its checksum (expected "
                          f"{entry.checksum[:12]}..., its arrays give {digest[:12]}...): "
                          f"a chunk is damaged or missing; {restore}")
    want_bits, window, hamming_keep, seed = params
    if not isinstance(kind, str) or kind not in _PAYLOADS or not isinstance(bits, int) or (
            bits != want_bits):
        raise FormatError(f"{where} declares payload {kind!r} and b={bits!r}; expected one of "
                          f"{sorted(_PAYLOADS)} and the manifest's b={want_bits}; {restore}")
    if len(state["ids"]) != entry.rows or len(state["positions"]) != entry.permutations:
        raise FormatError(f"{where} has {len(state['ids'])} rows and {len(state['positions'])} "
                          f"permutations, the manifest says {entry.rows} and "
                          f"{entry.permutations}; {restore}")
    try:
        payload = _PAYLOADS[kind].from_arrays(
            {k.removeprefix("payload/"): v for k, v in payload_arrays.items()})
        return PermutationIndex.from_state(
            window=window, hamming_keep=hamming_keep,
            seed=seed, bits=bits, payload=payload, **state)
    except InputError as exc:
        raise FormatError(f"{where} is inconsistent: {exc}; {restore}") from None


def manifest_checksum(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys), its ``checksum`` field left out."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


#: `write_manifest`'s ``expect`` for an index that must not exist yet
ABSENT = ""


def write_manifest(index_dir: str | os.PathLike[str],
                   manifest: IndexManifest | Mapping[str, Any], *,
                   expect: str | None = None) -> None:
    """Check ``manifest``, add its checksum and swap it into place: on a local disk by an
    atomic rename (under `index_lock`); on object storage by a conditional write -- with
    ``expect`` the version tag `read_manifest_tagged` gave (`ABSENT`: the index must not have
    a manifest yet), the write succeeds only if no other job committed meanwhile.

    ``manifest``: typed (its ``to_json()`` is written), or as JSON (tests and tools that edit
    a manifest); it is not modified.

    Raises
    ------
    InputError
        If ``manifest`` would not pass `read_manifest`.
    CommitConflict
        On object storage, when another job committed since ``expect`` was read.
    """
    raw = manifest.to_json() if isinstance(manifest, IndexManifest) else manifest
    canon = json.loads(json.dumps({k: v for k, v in raw.items() if k != "checksum"}))
    canon["checksum"] = manifest_checksum(canon)
    root = as_path(index_dir)
    _check_any(canon, root)
    text = dump_json(canon)
    if isinstance(root, ObjectPath):
        (root / MANIFEST).put(text.encode(), if_none_match=expect == ABSENT,
                              if_match=expect or None)
        return
    atomic_write_text(root / MANIFEST, text)


def manifest_tag(index_dir: str | os.PathLike[str]) -> str | None:
    """The version tag of an index's manifest on object storage (`ABSENT` when it has none);
    None on a local disk, where `index_lock` serialises writers instead."""
    root = as_path(index_dir)
    if not isinstance(root, ObjectPath):
        return None
    return (root / MANIFEST).etag() or ABSENT


def read_manifest_tagged(index_dir: str | os.PathLike[str]) -> tuple[AnyManifest, str | None]:
    """`read_index_manifest` and the version tag it was read at (`manifest_tag`), for a
    conditional `write_manifest`; the tag is taken first, so a commit in between makes the
    write fail."""
    for _ in range(5):
        tag = manifest_tag(index_dir)
        manifest = read_index_manifest(index_dir)
        if tag == manifest_tag(index_dir):
            return manifest, tag
    return manifest, tag


def read_index_manifest(index_dir: str | os.PathLike[str]) -> AnyManifest:
    """The verified manifest of an index, typed: a `PermutationManifest` (a
    `HyperplaneManifest` for an index built with ``--family``) or a `SubspaceManifest`.

    Raises
    ------
    InputError, FormatError
        As `read_manifest`.
    """
    return manifest_from_json(read_manifest(index_dir))


def read_permutation_manifest(index_dir: str | os.PathLike[str], what: str
                              ) -> PermutationManifest:
    """`read_index_manifest`, refusing a subspace index where only the permutation index is
    supported (``what``: the job or option, for the message)."""
    return require_permutation(read_index_manifest(index_dir), index_dir, what)


def read_manifest(index_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The verified manifest of an index as JSON (for tests and tools that edit one; lshdist
    itself reads `read_index_manifest`).

    Raises
    ------
    InputError
        If ``index_dir`` does not exist.
    FormatError
        If it has no manifest, or one that is corrupted, of another format or version, without
        its checksum or not matching it, with a missing or mistyped field, or with a segment
        name that is not one lshdist makes or that appears twice.
    """
    path = as_path(index_dir)
    if not path.is_dir():
        raise InputError(f"index {str(path)!r} does not exist; build it with `lshdist index`")
    f = path / MANIFEST
    if not f.is_file():
        raise FormatError(f"{str(path)!r} is not an lshdist index (no {MANIFEST}); "
                          "build one with `lshdist index`")
    meta = load_json(f, f"{str(path)!r}: {MANIFEST}", _REBUILD, path)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FormatError(f"{str(path)!r} is not an lshdist index (format="
                          f"{meta.get('format') if isinstance(meta, dict) else None!r}, "
                          f"expected {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise FormatError(f"{str(path)!r}: index format version {meta.get('version')!r}, "
                          f"this lshdist reads {VERSION}; {_REBUILD}")
    if "checksum" not in meta:
        raise FormatError(f"{str(path)!r}: {MANIFEST} has no checksum; it was not written by "
                          f"lshdist (or was edited by hand); {_REBUILD}")
    _check_fields({"checksum": meta["checksum"]}, {"checksum": _FIELDS["checksum"]},
                  f"{str(path)!r}: {MANIFEST}")
    try:
        digest = manifest_checksum(meta)
    except ValueError:  # NaN or infinity: JSON that lshdist never writes
        digest = "not computable (NaN or infinity in it)"
    if digest != meta["checksum"]:
        raise FormatError(f"{str(path)!r}: {MANIFEST} does not match its checksum (expected "
                          f"{meta['checksum'][:12]}..., its content gives {digest[:12]}...): it "
                          f"was edited or damaged; restore it or {_REBUILD}")
    _check_any(meta, path)  # a sealed manifest may still come from a buggy writer
    return meta


def require_permutation(manifest: IndexManifest, index_dir: str | os.PathLike[str],
                        what: str) -> PermutationManifest:
    """``manifest``, refusing a subspace index where only the permutation index is supported
    (``what``)."""
    if not isinstance(manifest, PermutationManifest):
        raise InputError(f"index {str(index_dir)!r} is a {manifest.method} index "
                         f"(--method {manifest.method}); {what} supports permutation "
                         "indexes only")
    return manifest


def _check_any(meta: dict[str, Any], path: Path | ObjectPath) -> None:
    from lshdist.store.subspace import METHOD, check_subspace_manifest

    method = meta.get("method", "permutation")
    plugin = plugin_manifest(method)
    if method == METHOD:
        check_subspace_manifest(meta, path)
    elif method == "permutation" and "method" not in meta:
        _check_manifest(meta, path)
    elif plugin is not None:
        _check_plugin(meta, path, plugin)
    else:
        kinds = [m for m in known_methods() if m != "permutation"]
        raise FormatError(f"{str(path)!r}: {MANIFEST}: method={method!r} is not one this "
                          f"lshdist reads ({', '.join(map(repr, kinds))}; a permutation index "
                          "records no method): an index of a plug-in kind needs that plug-in "
                          f"installed, else {_REBUILD}")


_PLUGIN_FIELDS = {k: _FIELDS[k] for k in ("format", "version", "model", "model_checksum",
                                          "kind", "d", "seed", "segments", "rows", "checksum")}


_PLUGIN_ENTRY = {k: _ENTRY_FIELDS[k] for k in ("name", "rows", "checksum")}


def _entries(meta: dict[str, Any], path: Path | ObjectPath, where: str,
             fields: dict[str, tuple[tuple[type, ...], str]],
             optional: dict[str, tuple[tuple[type, ...], str]] | None = None
             ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each segment entry of a manifest with where it is (for messages), once its fields are
    checked, its name is one lshdist makes (inside ``segments/``) and not listed before."""
    seen: set[str] = set()
    for i, entry in enumerate(meta["segments"]):
        w = f"{where}: segments[{i}]"
        if not isinstance(entry, dict):
            raise FormatError(f"{w} is {type(entry).__name__}, expected an object; {_REBUILD}")
        _check_fields(entry, fields, w)
        if optional:
            _check_fields(entry, optional, w, required=False)
        segment_path(path, entry["name"])
        if entry["name"] in seen:
            raise FormatError(f"{w}: segment {entry['name']!r} is listed twice; {_REBUILD}")
        seen.add(entry["name"])
        yield w, entry


def _check_plugin(meta: dict[str, Any], path: Path | ObjectPath,
                  cls: type[KindManifest]) -> None:
    """A plug-in kind's manifest: the common head, every segment entry (name, rows >= 1,
    checksum, each name once, rows summing to the index's) and the kind's own ``params``."""
    where = f"{str(path)!r}: {MANIFEST}"
    _check_fields(meta, _PLUGIN_FIELDS, where)
    _check_fields(meta, {"method": (_STR, "a string"), "params": ((dict,), "an object")}, where,
                  required=False)
    total = 0
    for w, entry in _entries(meta, path, where, _PLUGIN_ENTRY):
        if entry["rows"] < 1 or not _SHA256.fullmatch(entry["checksum"]):
            raise FormatError(f"{w}: rows={entry['rows']!r}, checksum={entry['checksum']!r}: "
                              f"expected an integer >= 1 and a sha256 hex digest; {_REBUILD}")
        total += entry["rows"]
    if total != meta["rows"] or meta["d"] < 1:
        raise FormatError(f"{where}: rows={meta['rows']}, d={meta['d']}, its segments hold "
                          f"{total} rows; {_REBUILD}")
    bad = [k for k in ("model_checksum", "checksum") if not _SHA256.fullmatch(meta[k])]
    if bad:
        raise FormatError(f"{where}: {', '.join(f'{k}={meta[k]!r}' for k in bad)}: expected "
                          f"a sha256 hex digest; {_REBUILD}")
    cls.check_params(meta.get("params") or {}, where)


def write_arrays_segment(index_dir: str | os.PathLike[str], name: str,
                         arrays: dict[str, np.ndarray], attrs: dict[str, Any] | None = None
                         ) -> KindEntry:
    """Write a plug-in kind's segment ``name`` (``arrays``: at least ``ids``, one per row);
    returns its manifest entry (name, rows, checksum over every array)."""
    if "ids" not in arrays:
        raise ValueError("a segment's arrays need 'ids' (one per row)")
    nested = sorted(k for k in arrays if "/" in k)
    if nested:  # `read_arrays_segment` reads the group's own arrays
        raise ValueError(f"segment array names {nested} hold '/'; use flat names")
    segment_zarr_arrays(segment_path(index_dir, name), arrays, dict(attrs or {}))
    return KindEntry(name=name, rows=len(arrays["ids"]), checksum=_segment_checksum(arrays))


def read_arrays_segment(index_dir: str | os.PathLike[str], entry: KindEntry
                        ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and attributes of a plug-in kind's segment, verified against its entry (the
    checksum of every array, the rows of ``ids``).

    Raises
    ------
    FormatError
        Naming the segment, when it is missing, unreadable or does not match its entry.
    """
    path = segment_path(index_dir, entry.name)
    where = f"segment {entry.name!r} of index {str(index_dir)!r}"
    restore = f"{_REBUILD} or restore segment {entry.name!r}"
    try:
        g = zarr.open_group(open_store(path), mode="r", zarr_format=3)
        arrays = {key: np.asarray(a[:]) for key, a in g.arrays()}
        attrs = dict(g.attrs)
    except Exception as exc:  # zarr raises many types for missing or broken chunks
        failed = f"{where} is unreadable or missing ({type(exc).__name__}: {exc}); {restore}"
    else:
        failed = ""
    if failed:
        raise FormatError(failed)
    digest = _segment_checksum(arrays)
    if digest != entry.checksum or len(arrays.get("ids", ())) != entry.rows:
        raise FormatError(f"{where} does not match its manifest entry (checksum "
                          f"{entry.checksum[:12]}..., {entry.rows} rows; its arrays give "
                          f"{digest[:12]}..., {len(arrays.get('ids', ()))} rows): a chunk is "
                          f"damaged or missing; {restore}")
    return arrays, attrs


def _check_fields(obj: dict[str, Any], fields: dict[str, tuple[tuple[type, ...], str]], where: str,
                  *, required: bool = True) -> None:
    for key, (types, what) in fields.items():
        if key not in obj:
            if required:
                raise FormatError(f"{where} has no {key!r} (expected {what}); {_REBUILD}")
            continue
        v = obj[key]
        # JSON true/false are Python bools, a subclass of int: never accept one for the other
        ok = isinstance(v, types) and (isinstance(v, bool) == (bool in types) or v is None)
        if not ok:
            raise FormatError(f"{where}: {key}={v!r} is not {what}; {_REBUILD}")


def _check_manifest(meta: dict[str, Any], path: Path | ObjectPath) -> None:
    """Presence, type and range of every manifest field and segment entry (not the checksum)."""
    where = f"{str(path)!r}: {MANIFEST}"
    _check_fields(meta, _FIELDS, where)
    _check_fields(meta, _OPTIONAL, where, required=False)
    batches = meta.get("batches", [])
    if not all(isinstance(b, str) and b for b in batches) or len(set(batches)) != len(batches):
        raise FormatError(f"{where}: batches={batches!r} is not {_OPTIONAL['batches'][1]}, "
                          f"each once; {_REBUILD}")
    fam = meta.get("family")
    if fam is not None and (not {"name", "samples"} <= set(fam) <= {"name", "samples", "version"}
                            or fam["name"] not in ("h-hash", "eh-hash")
                            or not (fam["samples"] is None or (type(fam["samples"]) is int
                                                               and fam["samples"] >= 1))):
        raise FormatError(f"{where}: family={fam!r} is not {_OPTIONAL['family'][1]}; "
                          f"{_REBUILD}")
    if fam is not None and fam["name"] == "eh-hash" and fam.get("version") != EH_HASH_VERSION:
        raise FormatError(f"{where}: an eh-hash index built by an earlier lshdist, whose EH-Hash "
                          "drew its Gaussian matrix differently: its keys do not match this "
                          "version's query hashing, so its answers would be wrong; rebuild it "
                          "with `lshdist index --family eh-hash`")
    bad = [k for k, lo in (("d", 1), ("bits", 1), ("window", 1), ("hamming_keep", 0),
                           ("rows", 0)) if meta[k] < lo]
    if meta["permutations"] is not None and meta["permutations"] < 1:
        bad.append("permutations")
    if meta["epsilon"] is not None and not meta["epsilon"] > 0:
        bad.append("epsilon")
    if meta["kind"] not in ("explicit", "implicit"):
        bad.append("kind")
    for key in ("model_checksum", "checksum"):
        if not _SHA256.fullmatch(meta[key]):
            bad.append(key)
    if bad:
        raise FormatError(f"{where}: {', '.join(f'{k}={meta[k]!r}' for k in bad)} out of range "
                          f"({'; '.join(_FIELDS[k][1] for k in bad)}); {_REBUILD}")
    try:
        Calibration.from_json(meta["calibration"], where="its calibration")
    except FormatError as exc:
        raise FormatError(f"{where}: calibration={str(meta['calibration'])[:40]!r}... is not a "
                          f"calibration record ({exc})") from None
    total = 0
    for w, entry in _entries(meta, path, where, _ENTRY_FIELDS, _ENTRY_OPTIONAL):
        if entry["rows"] < 1 or entry["permutations"] < 1 or not _SHA256.fullmatch(
                entry["checksum"]):
            raise FormatError(f"{w}: rows={entry['rows']!r}, permutations="
                              f"{entry['permutations']!r}, checksum={entry['checksum']!r}: "
                              f"expected integers >= 1 and a sha256 hex digest; {_REBUILD}")
        if "parts" in entry:
            _check_parts(entry, w)
        if meta["permutations"] is not None and entry["permutations"] != meta["permutations"]:
            raise FormatError(f"{w}: {entry['permutations']} permutations, the index has "
                              f"M={meta['permutations']}; {_REBUILD}")
        total += entry["rows"]
    if total != meta["rows"]:
        raise FormatError(f"{where}: rows={meta['rows']} but its segments hold {total}; "
                          f"{_REBUILD}")


def _check_parts(entry: dict[str, Any], where: str) -> None:
    parts = entry["parts"]
    ok = bool(parts) and all(
        isinstance(p, dict) and set(p) == {"rows", "permutations", "checksum"}
        and type(p["rows"]) is int and p["rows"] >= 1 and p["permutations"] == entry["permutations"]
        and isinstance(p["checksum"], str) and _SHA256.fullmatch(p["checksum"]) for p in parts)
    if not ok or sum(p["rows"] for p in parts) != entry["rows"]:
        raise FormatError(f"{where}: parts={str(parts)[:80]!r} is not a list of parts "
                          f"{{rows >= 1, permutations = {entry['permutations']}, checksum}} "
                          f"holding its {entry['rows']} rows; {_REBUILD}")
    if packed_checksum([p["checksum"] for p in parts]) != entry["checksum"]:
        raise FormatError(f"{where}: its checksum does not match its parts' checksums; "
                          f"{_REBUILD}")


# -- concurrent builds ---------------------------------------------------------------------

#: a lock older than this is taken over even if its owner seems alive (another host)
STALE_AFTER = 24 * 3600.0
_POLL = 0.05


def lock_path(index_dir: str | os.PathLike[str]) -> Path:
    """The lock file of an index: beside it (``.NAME.lock``), so that it outlives a rename or
    removal of the index directory itself."""
    p = Path(os.path.abspath(local_path(index_dir)))
    return p.parent / f".{p.name}.lock"


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of process ``pid`` (Linux), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def _pid_alive(pid: int, proc_start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except (OverflowError, ValueError):
        return False
    now = _proc_start(pid)
    return proc_start is None or now is None or now == proc_start


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _stale_reason(path: Path, owner: dict[str, Any] | None, stale_after: float) -> str | None:
    """Why the lock at ``path`` may be taken over, or None while its owner may be working."""
    now = time.time()
    if owner is None:  # unreadable: a holder between create and write, or a crash between
        age = now - path.stat().st_mtime
        return f"unreadable lock file {age:.0f}s old" if age > 10.0 else None
    started = owner.get("started")
    if isinstance(started, (int, float)) and now - started > stale_after:
        return f"held for {now - started:.0f}s, more than {stale_after:.0f}s"
    pid = owner.get("pid")
    if (owner.get("host") == socket.gethostname() and isinstance(pid, int)
            and not _pid_alive(pid, owner.get("proc_start"))):
        return f"its owner, pid {pid} on this host, is gone"
    return None


def _describe(owner: dict[str, Any] | None) -> str:
    if owner is None:
        return "an unknown owner"
    started = owner.get("started")
    when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
            if isinstance(started, (int, float)) else "?")
    return f"pid {owner.get('pid')} on host {owner.get('host')!r} since {when}"


def _break_stale(path: Path, owner: dict[str, Any] | None, reason: str) -> None:
    """Remove a stale lock, unless someone else took it over first (a short-lived guard file,
    itself created with O_EXCL, lets one process at a time check and remove)."""
    guard = path.with_name(path.name + ".break")
    try:
        fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:  # another process is breaking it
        with contextlib.suppress(FileNotFoundError):
            if time.time() - guard.stat().st_mtime > 60.0:  # a breaker that died
                guard.unlink()
        time.sleep(_POLL)
        return
    try:
        os.close(fd)
        try:
            again = _read_owner(path)
        except FileNotFoundError:
            return
        if again == owner:  # still the stale owner we judged
            log.warning("taking over the lock %s of %s: %s", path, _describe(owner), reason)
            path.unlink()
    finally:
        with contextlib.suppress(FileNotFoundError):
            guard.unlink()


@contextlib.contextmanager
def index_lock(index_dir: str | os.PathLike[str], *, timeout: float = 30.0,
               stale_after: float = STALE_AFTER) -> Iterator[dict[str, Any]]:
    """Hold the build lock of an index (a file created with O_CREAT | O_EXCL beside it).

    The file records the owner (host, pid, process start time, when taken).  A lock whose
    owner is a dead process of this host, or that is older than ``stale_after`` seconds, is
    taken over with a logged warning; otherwise this waits up to ``timeout`` seconds.

    Yields
    ------
    dict
        The owner record written to the lock file.

    Raises
    ------
    InputError
        If the lock is still held after ``timeout`` seconds, naming its owner and how to clear
        it.
    """
    if is_url(index_dir):  # object storage: conditional writes of the manifest instead
        yield {"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex}
        return
    path = lock_path(index_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "proc_start": _proc_start(os.getpid()),
          "started": time.time(), "token": uuid.uuid4().hex}
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = _read_owner(path)
                reason = _stale_reason(path, owner, stale_after)
            except FileNotFoundError:
                continue  # released meanwhile
            if reason is not None:
                _break_stale(path, owner, reason)
                continue
            if time.monotonic() >= deadline:
                raise InputError(
                    f"index {str(index_dir)!r} is locked by {_describe(owner)} (lock file "
                    f"{str(path)!r}): another build, append or gc is running. Wait for it and "
                    f"retry; if that process is gone, remove {str(path)!r}") from None
            time.sleep(_POLL)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me))
            f.flush()
            os.fsync(f.fileno())
        break
    try:
        yield me
    finally:
        try:
            current = _read_owner(path)
        except FileNotFoundError:
            current = None
        if current is not None and current.get("token") == me["token"]:
            path.unlink()
        else:
            log.warning("the lock %s was taken over while this process held it (held longer "
                        "than %.0fs?); another build may have run at the same time", path,
                        stale_after)


# -- leftovers -----------------------------------------------------------------------------

def list_orphans(index_dir: str | os.PathLike[str], *, min_age: float | None = None
                 ) -> list[Path | ObjectPath]:
    """Files and directories of an index that nothing refers to.

    Segment directories that the manifest does not name (a build that failed or is still
    running), temporary and replaced copies (``.*.tmp-*``, ``.*.old-*``) inside the index and
    beside it (of the index directory itself).  On object storage: the unnamed segments older
    than ``min_age`` seconds (`ORPHAN_AGE`; no lock tells a running append's from a dead one's).

    Raises
    ------
    InputError, FormatError
        As `read_manifest`: without a valid manifest nothing can be called an orphan.
    """
    if is_url(index_dir):
        return list(_object_orphans(ObjectPath(str(index_dir)), min_age))
    root = Path(index_dir)
    manifest = read_index_manifest(root)
    named = set(manifest.segment_names)
    out: list[Path | ObjectPath] = []
    seg_root = root / SEGMENTS
    with unreadable(f"index {str(root)!r}"):
        if seg_root.is_dir():
            out += sorted(p for p in seg_root.iterdir() if p.name not in named)
        out += _unnamed_router(root, manifest)
        leftover = re.compile(r"\..*\.(tmp|old)-[0-9a-f]+")
        out += sorted(p for p in root.iterdir() if leftover.fullmatch(p.name))
        mine = re.compile(re.escape(f".{Path(os.path.abspath(root)).name}.")
                          + r"(tmp|old)-[0-9a-f]+")
        parent = Path(os.path.abspath(root)).parent
        out += sorted(p for p in parent.iterdir() if mine.fullmatch(p.name))
    return out


def _unnamed_router(root: Path | ObjectPath, manifest: AnyManifest) -> list[Path | ObjectPath]:
    """``subspaces/`` (where subspace indexes stored their router before it was named by the
    manifest), when the manifest does not read it: left behind on object storage by a build
    that replaced such an index in place."""
    from lshdist.store.subspace import METHOD, SUBSPACES

    legacy = isinstance(manifest, SubspaceManifest) and manifest.subspace.router is None
    path = root / SUBSPACES
    if legacy or not path.is_dir():
        return []
    try:  # only a router lshdist wrote (a Zarr group of the subspace method), nothing else
        meta = load_json(path / "zarr.json", "subspaces/zarr.json", "", root=path)
    except (OSError, FormatError):
        return []
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    return [path] if isinstance(attrs, dict) and attrs.get("method") == METHOD else []


#: on object storage, an unnamed segment younger than this may be an append still running (no
#: lock tells): `gc` keeps it
ORPHAN_AGE = 6 * 3600.0


def _object_orphans(root: ObjectPath, min_age: float | None = None) -> list[ObjectPath]:
    """The segments under ``root/segments`` that its manifest does not name, and a stale
    ``subspaces/`` (`_unnamed_router`), whose newest object is older than ``min_age`` seconds
    (`ORPHAN_AGE`); one whose age the store does not say is kept (it could be a running
    append's)."""
    age = ORPHAN_AGE if min_age is None else min_age
    manifest = read_index_manifest(root)
    named = set(manifest.segment_names)
    stale = [p for p in _unnamed_router(root, manifest) if isinstance(p, ObjectPath)]
    out: list[ObjectPath] = []
    for p in [*stale, *(root / SEGMENTS).iterdir()]:  # the router's age kept as a segment's
        if p.name in named:
            continue
        written = p.age()
        if written is None:
            log.warning("gc: %s does not say when segment %s was written; kept", root, p.name)
        elif written >= age:
            out.append(p)
    return out


def remove_unnamed(index_dir: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Remove the segments ``names`` that the index's manifest does not name (what a replaced
    or failed write left): on object storage after a commit, where nothing was renamed."""
    root = as_path(index_dir)
    for name in names:
        p = root / SEGMENTS / name
        if isinstance(p, ObjectPath):
            p.rmtree()
        else:
            shutil.rmtree(p, ignore_errors=True)


def remove_orphans(index_dir: str | os.PathLike[str], *, timeout: float = 30.0,
                   dry_run: bool = False, min_age: float | None = None
                   ) -> list[Path | ObjectPath]:
    """Remove what `list_orphans` finds, holding `index_lock` (no build is running meanwhile);
    returns what was (or, with ``dry_run``, would be) removed."""
    with index_lock(index_dir, timeout=timeout):
        found = list_orphans(index_dir, min_age=min_age)
        if not dry_run:
            for p in found:
                if isinstance(p, ObjectPath):
                    p.rmtree()
                elif p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
    return found


def verify_index(index_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """`verify_index_manifest`, the manifest returned as JSON (as `read_manifest`)."""
    return verify_index_manifest(index_dir).to_json()


def verify_index_manifest(index_dir: str | os.PathLike[str]) -> AnyManifest:
    """Load and check every segment of an index; returns its manifest.

    Raises
    ------
    FormatError
        For the first problem found (see `read_manifest`, `read_segment`).
    """
    manifest = read_index_manifest(index_dir)
    if isinstance(manifest, SubspaceManifest):
        from lshdist.store.subspace import read_group, read_subspaces

        read_subspaces(index_dir, manifest)
        for group in manifest.segments:
            read_group(index_dir, group, manifest)
        return manifest
    if isinstance(manifest, KindManifest):  # a plug-in kind's: each segment's checksum
        seen = [read_arrays_segment(index_dir, e)[0]["ids"] for e in manifest.segments]
        dup = repeated_id(np.concatenate(seen) if seen else np.zeros(0, np.int64))
        if dup is not None:
            raise FormatError(f"index {str(index_dir)!r} holds id {dup[0]} twice; {_REBUILD}")
        return manifest
    ids: list[np.ndarray] = []
    for entry in manifest.segments:
        seg = read_segment(index_dir, entry, manifest)
        ids += [p.ids_ for p in (seg.parts if isinstance(seg, PackedSegment) else [seg])]
    _check_unique_ids(index_dir, manifest, ids)
    return manifest


def _check_unique_ids(index_dir: str | os.PathLike[str], manifest: PermutationManifest,
                      ids: list[np.ndarray]) -> None:
    """Refuse an id that two rows of the index hold (``ids``: every segment's, in manifest
    order; a packed segment's parts one after the other): an id names one row."""
    everything = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    dup = repeated_id(everything)
    if dup is None:
        return
    ends = np.cumsum([e.rows for e in manifest.segments])
    names = [manifest.segments[int(np.searchsorted(ends, r, side="right"))].name
             for r in dup[1:]]
    where = (f"twice in segment {names[0]!r}" if names[0] == names[1]
             else f"in segments {names[0]!r} and {names[1]!r}")
    raise FormatError(f"index {str(index_dir)!r}: id {dup[0]} is {where}: an id names one row; "
                      f"{_REBUILD}")


def segment_ids(index_dir: str | os.PathLike[str],
                entry: SegmentEntry | Mapping[str, Any]) -> np.ndarray:
    """The ids of one segment (int64; every part's, for a packed one), read alone (for the
    id-collision check of an append); ``entry`` typed or as JSON."""
    entry = as_entry(entry)
    name = entry.name
    path = segment_path(index_dir, name)
    paths = [path / part_dir(i) for i in range(entry.n_parts)] if entry.parts else [path]
    try:
        ids = np.concatenate([
            np.asarray(zarr_array(zarr.open_group(open_store(p), mode="r", zarr_format=3),
                                  "ids"),
                       dtype=np.int64) for p in paths])
    except Exception as exc:  # zarr raises many types for missing or broken chunks
        raise FormatError(f"segment {name!r} of index {str(index_dir)!r} is unreadable "
                          f"({type(exc).__name__}: {exc}); {_REBUILD}") from None
    if len(ids) != entry.rows:
        raise FormatError(f"segment {name!r} of index {str(index_dir)!r} has {len(ids)} ids, "
                          f"the manifest says {entry.rows}; {_REBUILD}")
    return ids
