"""Bounded reads of the files of an artefact: manifests and Zarr chunks.

A file read is a regular file (a device, FIFO or socket is refused: ``/dev/zero`` would be read
without end), a symlink only when it resolves inside the artefact's directory, and never more
bytes than it may hold: a manifest `MAX_JSON_BYTES`, a Zarr chunk what its array's metadata
says a chunk holds (its shape times its item size) plus what a compressor may add.
`lshdist.store.bounded.BoundedStore` is the Zarr store every reader of the store modules opens
its arrays through (in its own module: this one stays free of Zarr, which the command line's
parser imports).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from lshdist.errors import FormatError
from lshdist.store.objects import ObjectPath, is_url, local_path

__all__ = ["MAX_JSON_BYTES", "check_file", "dump_json", "load_json", "local_path", "read_bounded"]

#: a manifest (zarr.json, model.json, index.json, results.json) larger than this is refused
MAX_JSON_BYTES = 64 * 2**20


def dump_json(obj: Any, depth: int = 3) -> str:
    """JSON text of a manifest, for people and fast: the first ``depth`` levels of dicts and
    lists one entry per line, anything deeper on its line.  (``json.dumps(indent=...)`` runs
    Python's own encoder over every value: 0.1 s for an index manifest with its 900
    calibration points, on the driver while the workers waited.)"""
    return _dump(obj, depth, "")


def _dump(value: Any, depth: int, pad: str) -> str:
    inner = pad + "  "
    if depth > 0 and isinstance(value, dict) and value:
        rows = [f"{inner}{json.dumps(str(k))}: {_dump(v, depth - 1, inner)}"
                for k, v in value.items()]
        return "{\n" + ",\n".join(rows) + f"\n{pad}}}"
    if depth > 0 and isinstance(value, list) and value:
        rows = [inner + _dump(v, depth - 1, inner) for v in value]
        return "[\n" + ",\n".join(rows) + f"\n{pad}]"
    return json.dumps(value)


class _ObjectStat:
    """What `check_file` returns for an object: its size."""

    def __init__(self, size: int) -> None:
        self.st_size = size


def check_file(path: str | os.PathLike[str] | ObjectPath,
               root: str | os.PathLike[str] | ObjectPath | None = None) -> os.stat_result:
    """The `os.stat` of a regular file ``path``; a symlink must resolve inside ``root``.

    Raises
    ------
    FileNotFoundError
        If it does not exist (the caller decides what a missing file means).
    FormatError
        For a device, FIFO, socket or directory, or a symlink leaving ``root``.
    """
    if is_url(path):
        return _ObjectStat(ObjectPath(str(path)).size())  # type: ignore[return-value]
    p = Path(path)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        target = p.resolve()
        if root is not None and not target.is_relative_to(Path(root).resolve()):
            raise FormatError(f"{str(p)!r} is a symlink to {str(target)!r}, outside "
                              f"{str(root)!r}: an artefact's files stay inside it")
        st = os.stat(p)
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{str(p)!r} is not a regular file (a device, FIFO, socket or "
                          "directory): refused")
    return st


def read_bounded(path: str | os.PathLike[str] | ObjectPath, limit: int,
                 root: str | os.PathLike[str] | ObjectPath | None = None) -> bytes:
    """The bytes of the regular file ``path`` (`check_file`), at most ``limit`` of them.

    Raises
    ------
    FileNotFoundError
        If it does not exist.
    FormatError
        If `check_file` refuses it, or it holds more than ``limit`` bytes.
    """
    if is_url(path):
        return ObjectPath(str(path)).read_bytes(limit)
    st = check_file(path, root)
    too_big = FormatError(f"{str(path)!r} holds {st.st_size:,} bytes or more, more than the "
                          f"{limit:,} it may: refused (damaged or replaced)")
    if st.st_size > limit:
        raise too_big
    # O_NONBLOCK: a FIFO swapped in after the check must not block the open
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FormatError(f"{str(path)!r} is not a regular file: refused")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise too_big
    return data


def load_json(path: str | os.PathLike[str] | ObjectPath, what: str, fix: str,
              root: str | os.PathLike[str] | ObjectPath | None = None,
              limit: int | None = None) -> Any:
    """A small JSON file, bounded (`read_bounded`) and parsed.

    Raises
    ------
    FileNotFoundError
        If it does not exist.
    FormatError
        ``"{what} is corrupted (...); {fix}"`` for a file that is not a regular one, too large,
        not UTF-8, not JSON, or nested too deeply for the parser.
    """
    try:
        return json.loads(read_bounded(path, limit or MAX_JSON_BYTES, root).decode())
    except FormatError as exc:
        raise FormatError(f"{what} is corrupted ({exc}); {fix}") from None
    except RecursionError:
        raise FormatError(f"{what} is corrupted (JSON nested too deeply); {fix}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise FormatError(f"{what} is corrupted ({exc}); {fix}") from None
