"""`BoundedStore`: the read-only local Zarr store whose reads are bounded (see
`lshdist.store.files`: regular files only, symlinks inside the artefact, never more bytes than
a chunk of its array may hold)."""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.array_spec import ArrayConfigParams
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.storage import FsspecStore, LocalStore

from lshdist.errors import FormatError
from lshdist.store.files import MAX_JSON_BYTES, check_file, read_bounded
from lshdist.store.objects import ObjectPath

#: what a compressor may add to a chunk's raw bytes (blosc: 16-32 bytes, zstd: about 1/256 and
#: a frame header, gzip: 5 bytes per 16 KiB block): a generous bound
_CODEC_SLACK = 64 * 2**10

#: the array config of every array lshdist writes: each chunk is stored, all-zero ones
#: included.  Zarr's default (``write_empty_chunks`` off) compares every chunk with the fill
#: value before it writes it: 100 of the 150 ms a 30,000 x 784 uint8 payload took to write
#: (zarr 3.1, one core; 14 ms with this config, 9 ms for the bytes alone).  A chunk file
#: that is missing then only ever means a damaged artefact.
WRITE_CONFIG: ArrayConfigParams = {"write_empty_chunks": True}


def _chunk_limit(meta: Any) -> int | None:
    """The bytes one chunk of a Zarr v3 array may take on disk, from its metadata (None when it
    does not say)."""
    try:
        shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
        itemsize = int(np.dtype(meta["data_type"]).itemsize)
        raw = math.prod(int(s) for s in shape) * itemsize
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return raw + raw // 8 + _CODEC_SLACK


def _array_of(key: str) -> str | None:
    """The array a store key belongs to, for its read limit: ``"zarr.json"`` for a metadata
    key, the array's path (``""`` for a root array) for a chunk key, None for anything else."""
    if key == "zarr.json" or key.endswith("/zarr.json"):
        return "zarr.json"
    if key.startswith("c/"):
        return ""
    array, sep, _ = key.rpartition("/c/")
    return array if sep else None


class BoundedStore(LocalStore):
    """A read-only local Zarr store whose reads are bounded: metadata at `MAX_JSON_BYTES`, a
    chunk at what its array's metadata says one holds (`_chunk_limit`); special files and
    symlinks leaving ``root`` refused (`check_file`)."""

    def __init__(self, root: str | os.PathLike[str], *, read_only: bool = True) -> None:
        super().__init__(Path(root), read_only=True)
        self._real_root = Path(root).resolve()
        self._limits: dict[str, int | None] = {}

    def with_read_only(self, read_only: bool = False) -> BoundedStore:
        return BoundedStore(self.root)

    def _limit(self, key: str) -> int | None:
        array = _array_of(key)
        if array is None or array == "zarr.json":
            return MAX_JSON_BYTES if array else None
        if array not in self._limits:
            try:
                meta = json.loads(read_bounded(self.root / array / "zarr.json", MAX_JSON_BYTES,
                                               self._real_root))
            except (OSError, ValueError, RecursionError):
                meta = None
            self._limits[array] = _chunk_limit(meta)
        return self._limits[array]

    def _read(self, key: str, prototype: BufferPrototype,
              byte_range: ByteRequest | None) -> Buffer | None:
        path = self.root / key
        limit = self._limit(key)
        try:
            if limit is None:
                limit = check_file(path, self._real_root).st_size
            data = read_bounded(path, limit, self._real_root)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if isinstance(byte_range, RangeByteRequest):
            data = data[byte_range.start:byte_range.end]
        elif isinstance(byte_range, OffsetByteRequest):
            data = data[byte_range.offset:]
        elif isinstance(byte_range, SuffixByteRequest):
            data = data[max(0, len(data) - byte_range.suffix):]
        return prototype.buffer.from_bytes(data)

    def get_sync(self, key: str, *, prototype: BufferPrototype | None = None,
                 byte_range: ByteRequest | None = None) -> Buffer | None:
        self._ensure_open_sync()
        return self._read(key, prototype or default_buffer_prototype(), byte_range)

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        if not self._is_open:
            await self._open()
        return await asyncio.to_thread(self._read, key, prototype or default_buffer_prototype(),
                                       byte_range)

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]
                                 ) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]


class BoundedObjectStore(FsspecStore):
    """A read-only Zarr store over an object-store prefix whose reads are bounded as
    `BoundedStore`'s: a whole object (metadata, a chunk) is read as one ranged GET of at most
    its limit and one byte, and refused when it holds more -- a chunk replaced by a huge
    object is not downloaded (nor held in memory) to be found wrong by its checksum."""

    def __init__(self, path: ObjectPath) -> None:
        base = path.zarr_store()
        super().__init__(base.fs, path=base.path, read_only=True)
        self._where = path.url
        self._limits: dict[str, int | None] = {}

    def with_read_only(self, read_only: bool = False) -> BoundedObjectStore:
        return self

    async def _ranged(self, key: str, prototype: BufferPrototype, limit: int) -> Buffer | None:
        value = await super().get(key, prototype, RangeByteRequest(0, limit + 1))
        if value is not None and len(value) > limit:
            raise FormatError(f"'{self._where}/{key}' holds more than the {limit:,} bytes it "
                              "may: refused (damaged or replaced)")
        return value

    async def _limit(self, key: str) -> int | None:
        array = _array_of(key)
        if array is None or array == "zarr.json":
            return MAX_JSON_BYTES if array else None
        if array not in self._limits:
            meta_key = f"{array}/zarr.json" if array else "zarr.json"
            raw = await self._ranged(meta_key, default_buffer_prototype(), MAX_JSON_BYTES)
            try:
                meta = None if raw is None else json.loads(raw.to_bytes())
            except (ValueError, RecursionError):
                meta = None
            self._limits[array] = _chunk_limit(meta)
        return self._limits[array]

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        prototype = prototype or default_buffer_prototype()
        limit = None if byte_range is not None else await self._limit(key)
        if limit is None:
            return await super().get(key, prototype, byte_range)
        return await self._ranged(key, prototype, limit)


def open_store(path: Path | ObjectPath) -> Any:
    """The read-only Zarr store of the artefact directory or object-store prefix ``path``:
    its reads bounded (`BoundedStore`, `BoundedObjectStore`)."""
    if isinstance(path, ObjectPath):
        return BoundedObjectStore(path)
    return BoundedStore(path)


def write_store(path: Path | ObjectPath) -> Any:
    """What `zarr.open_group` writes a new group at ``path`` through."""
    if isinstance(path, ObjectPath):
        return path.zarr_store(read_only=False)
    return str(path)
