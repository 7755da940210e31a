"""Safe outputs: write a directory aside, then rename it into place; never replace what is not
an lshdist artefact of the same kind, never an input of the same job.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from lshdist.errors import InputError, OutputExistsError
from lshdist.store.files import local_path
from lshdist.store.objects import ObjectPath, as_path, check_bucket, is_url

#: artefact kind -> the file that marks a directory as one (and holds ``format``)
MARKERS = {
    "lshdist-dataset": "zarr.json",
    "lshdist-model": "model.json",
    "lshdist-index": "index.json",
    "lshdist-results": "results.json",
    "lshdist-evaluation": ".lshdist.json",
    "lshdist-workdir": ".lshdist.json",
    "lshdist-active": "summary.json",
}

#: a marker file is small JSON; a larger file of that name is not read (nor is it a marker)
MAX_MARKER_BYTES = 16 * 2**20


def artefact_kind(path: str | os.PathLike[str] | ObjectPath) -> str | None:
    """The lshdist artefact kind of directory ``path`` (from its marker file), or None."""
    p = as_path(path)
    for marker in dict.fromkeys(MARKERS.values()):
        f = p / marker
        try:
            if isinstance(f, ObjectPath):
                if not f.is_file():
                    continue
                meta = json.loads(f.read_bytes(MAX_MARKER_BYTES))
            else:
                if not f.is_file() or f.stat().st_size > MAX_MARKER_BYTES:
                    continue
                meta = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if marker == "zarr.json" and isinstance(meta, dict):
            meta = meta.get("attributes", {})
        # a kind counts only from its own marker file: a user's summary.json that says
        # "lshdist-workdir" does not make their directory a workdir (which `run --fresh` clears)
        fmt = meta.get("format") if isinstance(meta, dict) else None
        if isinstance(fmt, str) and MARKERS.get(fmt) == marker:
            return fmt
    return None


def check_not_input(path: str | os.PathLike[str],
                    inputs: Iterable[str | os.PathLike[str] | None]) -> None:
    """Refuse an output that is, contains or lies inside an input of the same job (or that is
    one of its object-store prefixes)."""
    out = as_path(path).resolve()
    for i in inputs:
        if i is None:
            continue
        src = as_path(i).resolve()
        if type(src) is not type(out):
            continue
        if out == src or out in src.parents or src in out.parents:
            raise InputError(f"output {str(path)!r} would overwrite the input {str(i)!r} "
                             "(it is, contains or lies inside it); write the output elsewhere")


def check_output(path: str | os.PathLike[str] | ObjectPath, overwrite: bool, *,
                 kind: str | None = None,
                 inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Path | ObjectPath:
    """Refuse an existing output unless ``overwrite``, and even then unless it is an lshdist
    artefact of kind ``kind`` (any lshdist kind when None); refuse an output that is an input.
    An object-store output is checked the same way, after its bucket (`check_bucket`: it
    exists, the credentials reach it)."""
    if is_url(path):
        p: Path | ObjectPath = ObjectPath(str(path))
        check_bucket(str(p))
    else:
        p = local_path(path)
    check_not_input(p, inputs)
    if isinstance(p, Path) and not p.exists() and not p.is_symlink():
        return p
    if isinstance(p, ObjectPath) and not p.exists():
        return p
    if not overwrite:
        raise OutputExistsError(
            f"output {str(p)!r} already exists; choose another path or pass --overwrite")
    local = isinstance(p, Path)
    found = artefact_kind(p) if not local or (p.is_dir() and not p.is_symlink()) else None
    if found is None or (kind is not None and found != kind):
        what = (f"an lshdist {found.removeprefix('lshdist-')}" if found
                else "not an lshdist artefact")
        want = f"an lshdist {kind.removeprefix('lshdist-')}" if kind else "an lshdist artefact"
        raise OutputExistsError(
            f"refusing to overwrite {str(p)!r}: it is {what}, and this job writes {want}; "
            "remove it yourself or choose another path")
    if isinstance(p, Path):
        try:
            here: Path | None = Path.cwd()
        except OSError:  # the current directory was removed: nothing to protect
            here = None
        if here is not None and (here == p.resolve() or p.resolve() in here.parents):
            raise OutputExistsError(
                f"refusing to overwrite {str(p)!r}: it is (or holds) the current directory; "
                "run the job from another directory or choose another path")
    foreign = foreign_files(p, found)
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise OutputExistsError(
            f"refusing to overwrite {str(p)!r}: it holds {foreign[0]!r}{more}, which lshdist "
            "did not write; move what you keep there elsewhere (or remove it yourself), then "
            "run the job again")
    return p


#: what lshdist writes inside an artefact of each kind (paths relative to it, regexes): Zarr
#: metadata and chunks, manifests, Parquet parts, temporaries of an interrupted write
_ZARR = r"(?:[^/]+/)*(?:zarr\.json|c(?:/\d+)+)"
_TEMP = r"(?:[^/]+/)*\.[^/]+\.(?:tmp|old)-[0-9a-f]+(?:/.*)?"
_OWN_FILES = {
    "lshdist-dataset": re.compile(f"{_ZARR}|{_TEMP}"),
    "lshdist-model": re.compile(f"model\\.json|arrays/{_ZARR}|{_TEMP}"),
    "lshdist-index": re.compile(f"index\\.json|{_ZARR}|{_TEMP}"),
    "lshdist-results": re.compile(r"results\.json|(?:neighbors|stats)/part-\d+\.parquet|"
                                  + _TEMP),
}


def foreign_files(path: str | os.PathLike[str] | ObjectPath, kind: str) -> list[str]:
    """The files inside the artefact directory ``path`` (of kind ``kind``) that lshdist does
    not write there -- a user's own notes in a results directory -- which replacing it would
    delete (sorted, relative paths).  Kinds whose content is open (an evaluation, a
    workdir) are not checked."""
    own = _OWN_FILES.get(kind)
    if own is None:
        return []
    if is_url(path):
        return [r for r in ObjectPath(str(path)).files() if not own.fullmatch(r)]
    root = Path(path)
    out = []
    for top, dirs, files in os.walk(root):
        rel = Path(top).relative_to(root)
        for name in files + [d for d in dirs if (Path(top) / d).is_symlink()]:
            r = (rel / name).as_posix()
            if not own.fullmatch(r):
                out.append(r)
    return sorted(out)


_WRITE_ERRORS = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only",
                 errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                 errno.EDQUOT: "the disk quota is exceeded",
                 errno.EFBIG: "a file would exceed the file size limit (ulimit -f) or the "
                              "largest file the file system holds"}
_FIXES = {errno.EFBIG: "raise the limit (ulimit -f) or write smaller shards, then run the job "
                       "again"}


def is_write_error(exc: BaseException) -> bool:
    """An OS error a user fixes on their side: disk full, read-only, permission, quota, file
    size limit."""
    return isinstance(exc, OSError) and exc.errno in _WRITE_ERRORS


def os_error(exc: OSError, path: str | os.PathLike[str] | None) -> InputError:
    """An OS error while writing (disk full, read-only, permission) as an exit-2 message
    (``path`` None: the system did not say which file)."""
    reason = _WRITE_ERRORS.get(exc.errno or 0, exc.strerror)
    fix = _FIXES.get(exc.errno or 0, "free space or choose a writable path, then run the job "
                                     "again")
    what = repr(str(path)) if path is not None else "a file (the system did not say which)"
    return InputError(f"cannot write {what}: {reason}; {fix}")


def describe_os_error(exc: OSError) -> InputError:
    """Any OS error that ends a job, as one exit-2 line: a write error (`is_write_error`) as
    `os_error`, naming the file when the error does; another one (an I/O error, too many open
    files, a name too long...) with its file, its errno name and the system's words."""
    if exc.errno in (errno.EACCES, errno.EPERM):  # a read or a write: not known here
        what = repr(str(exc.filename)) if exc.filename is not None else "a file"
        return InputError(f"permission denied on {what}: lshdist cannot read or write it; "
                          "check its permissions and those of the directories above it")
    if is_write_error(exc):
        return os_error(exc, exc.filename)
    if exc.errno is None:  # raised by a library, not the system (a connection timed out...)
        return InputError(f"{type(exc).__name__}: {exc}")
    code = errno.errorcode.get(exc.errno or 0, "")
    where = f" on {str(exc.filename)!r}" if exc.filename is not None else ""
    return InputError(f"the operating system refused an operation{where}: "
                      f"{exc.strerror or exc}{f' ({code})' if code else ''}; check the file "
                      "system and the job's limits, then run the job again")


def _aside(path: Path, what: str) -> Path:
    """``.NAME.tmp-*`` / ``.NAME.old-*`` beside ``path``: 8 hex digits of this host, 8 of this
    pid, 12 random (all hex, so `lshdist.store.index.list_orphans` matches them too)."""
    owner = f"{_host_tag()}{os.getpid():08x}"
    return path.parent / f".{path.name}.{what}-{owner}{uuid.uuid4().hex[:12]}"


def _host_tag() -> str:
    return hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()


def remove_stale_temps(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the ``.NAME.tmp-*`` / ``.NAME.old-*`` siblings of ``path`` that `atomic_dir` of a
    process of this host left when it died (killed mid-write); returns what was removed.

    Only names `_aside` makes for this very ``NAME`` are touched, and only when their owner pid
    is gone: a live process (or a reused pid), another host's or an older-style name is kept.
    """
    p = Path(path)
    pattern = re.compile(re.escape(f".{p.name}.") + r"(?:tmp|old)-([0-9a-f]{8})([0-9a-f]{8})"
                         r"[0-9a-f]{12}")
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for q in p.parent.iterdir():
            m = pattern.fullmatch(q.name)
            if not m or m[1] != _host_tag() or int(m[2], 16) in (0, os.getpid()):
                continue
            try:
                os.kill(int(m[2], 16), 0)
                continue  # alive (or a reused pid): keep
            except ProcessLookupError:
                pass
            except (PermissionError, OverflowError, ValueError):
                continue
            if q.is_dir() and not q.is_symlink():
                shutil.rmtree(q, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    q.unlink()
            removed.append(q)
    return removed


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
    if is_url(path):
        with _object_dir(ObjectPath(str(path)), overwrite, kind, inputs) as written:
            yield written  # type: ignore[misc]
        return
    check_output(path, overwrite, kind=kind, inputs=inputs)
    path = local_path(path)
    remove_stale_temps(path)  # what a killed earlier run of this job left beside it
    tmp = _aside(path, "tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:
        raise os_error(exc, path) from None
    try:
        yield tmp
        if path.exists():
            check_output(path, overwrite, kind=kind, inputs=inputs)  # still ours to replace
            trash = _aside(path, "old")
            os.rename(path, trash)
            os.rename(tmp, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException as exc:
        _remove_aside(tmp)
        if is_write_error(exc) and not isinstance(exc, InputError):
            raise os_error(exc, path) from None  # type: ignore[arg-type]
        raise


@contextlib.contextmanager
def _object_dir(path: ObjectPath, overwrite: bool, kind: str | None,
                inputs: tuple[str | os.PathLike[str] | None, ...]) -> Iterator[ObjectPath]:
    """`atomic_dir` on object storage, which has no rename: the artefact is written in place,
    its marker file (``zarr.json``'s attributes, ``model.json``, ``results.json``...) last,
    so a reader refuses it ("not an lshdist ...") until it is whole; a failed write removes
    what it wrote.  An index keeps its old objects until its new manifest is committed
    (`lshdist.store.index.write_manifest`: a conditional write), then drops the segments no
    manifest names; any other kind being replaced is removed first (its marker first)."""
    check_output(path, overwrite, kind=kind, inputs=inputs)
    existed = path.exists()
    if existed and kind != "lshdist-index":
        marker = MARKERS.get(kind or "", "")
        if marker:
            (path / marker).unlink(missing_ok=True)
        path.rmtree()
    try:
        yield path
    except BaseException:
        # an index's segments carry unique names and another job may have committed one
        # here meanwhile: what a failed build wrote is left to `lshdist gc`
        if not existed and kind != "lshdist-index":
            path.rmtree()
        raise


def _remove_aside(tmp: Path, settle: float = 0.1, limit: float = 2.0) -> None:
    """Remove a failed write's temporary directory, and again while writes still in flight
    recreate it: zarr writes chunks concurrently, and when one fails (a full disk, a file size
    limit) the others go on and make their directories anew after a first removal (seen: a
    ``.NAME.tmp-*`` left by an ingest that hit ``ulimit -f``).  Gone for ``settle`` seconds
    in a row, or ``limit`` seconds in all, ends it."""
    deadline = time.monotonic() + limit
    while True:
        shutil.rmtree(tmp, ignore_errors=True)
        time.sleep(settle)
        if not tmp.exists() or time.monotonic() > deadline:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            return


def atomic_write_text(path: str | os.PathLike[str] | ObjectPath, text: str) -> None:
    """Write a small text file by rename (a reader sees the old or the new file, whole; an
    object is written whole by one request)."""
    if is_url(path):
        ObjectPath(str(path)).write_text(text)
        return
    path = Path(path)
    tmp = _aside(path, "tmp")
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
