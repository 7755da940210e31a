"""Safe outputs: write a directory aside, then rename it into place; never replace what is not
an lshdist artefact of the same kind, never an input of the same job.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from lshdist.errors import InputError, OutputExistsError

#: artefact kind -> the file that marks a directory as one (and holds ``format``)
MARKERS = {
    "lshdist-dataset": "zarr.json",
    "lshdist-model": "model.json",
    "lshdist-index": "index.json",
    "lshdist-results": "results.json",
    "lshdist-evaluation": ".lshdist.json",
    "lshdist-workdir": ".lshdist.json",
}


def artefact_kind(path: str | os.PathLike[str]) -> str | None:
    """The lshdist artefact kind of directory ``path`` (from its marker file), or None."""
    p = Path(path)
    for marker in dict.fromkeys(MARKERS.values()):
        f = p / marker
        if not f.is_file():
            continue
        try:
            meta = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if marker == "zarr.json" and isinstance(meta, dict):
            meta = meta.get("attributes", {})
        if isinstance(meta, dict) and meta.get("format") in MARKERS:
            return str(meta["format"])
    return None


def check_not_input(path: str | os.PathLike[str],
                    inputs: Iterable[str | os.PathLike[str] | None]) -> None:
    """Refuse an output that is, contains or lies inside an input of the same job."""
    out = Path(path).resolve()
    for i in inputs:
        if i is None:
            continue
        src = Path(i).resolve()
        if out == src or out in src.parents or src in out.parents:
            raise InputError(f"output {str(path)!r} would overwrite the input {str(i)!r} "
                             "(it is, contains or lies inside it); write the output elsewhere")


def check_output(path: str | os.PathLike[str], overwrite: bool, *, kind: str | None = None,
                 inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Path:
    """Refuse an existing output unless ``overwrite``, and even then unless it is an lshdist
    artefact of kind ``kind`` (any lshdist kind when None); refuse an output that is an input."""
    p = Path(path)
    check_not_input(p, inputs)
    if not p.exists() and not p.is_symlink():
        return p
    if not overwrite:
        raise OutputExistsError(
            f"output {str(p)!r} already exists; choose another path or pass --overwrite")
    found = artefact_kind(p) if p.is_dir() and not p.is_symlink() else None
    if found is None or (kind is not None and found != kind):
        what = f"an lshdist {found.removeprefix('lshdist-')}" if found else "not an lshdist artefact"
        want = f"an lshdist {kind.removeprefix('lshdist-')}" if kind else "an lshdist artefact"
        raise OutputExistsError(
            f"refusing to overwrite {str(p)!r}: it is {what}, and this job writes {want}; "
            "remove it yourself or choose another path")
    return p


_WRITE_ERRORS = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only",
                 errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                 errno.EDQUOT: "the disk quota is exceeded"}


def is_write_error(exc: BaseException) -> bool:
    """An OS error a user fixes on their side: disk full, read-only, permission, quota."""
    return isinstance(exc, OSError) and exc.errno in _WRITE_ERRORS


def os_error(exc: OSError, path: str | os.PathLike[str]) -> InputError:
    """An OS error while writing (disk full, read-only, permission) as an exit-2 message."""
    reason = _WRITE_ERRORS.get(exc.errno or 0, exc.strerror)
    return InputError(f"cannot write {str(path)!r}: {reason}; free space or choose a writable "
                      "path, then run the job again")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], *, overwrite: bool = False,
               kind: str | None = None,
               inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success rename it to ``path``.

    On any exception the temporary directory is removed, so nothing half-written is ever
    visible under ``path``.  An existing ``path`` is replaced only with ``overwrite`` and only
    if it is an lshdist artefact of kind ``kind`` (`check_output`); the old one is moved aside
    first and removed after the swap.
    """
    inputs = tuple(inputs)
    path = check_output(path, overwrite, kind=kind, inputs=inputs)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:
        raise os_error(exc, path) from None
    try:
        yield tmp
        if path.exists():
            check_output(path, overwrite, kind=kind, inputs=inputs)  # still ours to replace
            trash = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:12]}"
            os.rename(path, trash)
            os.rename(tmp, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_write_error(exc) and not isinstance(exc, InputError):
            raise os_error(exc, path) from None  # type: ignore[arg-type]
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a small text file by rename (a reader sees the old or the new file, whole)."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise os_error(exc, path) from None
