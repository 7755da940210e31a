"""Artefacts in object storage (``s3://``, ``gs://``, ``abfs://``) through fsspec.

`ObjectPath` is the small part of `pathlib.Path` the store modules use (``/``, ``name``,
``parent``, ``exists``, ``is_file``, ``is_dir``, ``read_bytes``, ``write_text``, ``glob``...),
over one object-store prefix; `as_path` gives a `Path` for a local path or ``file://`` URL and
an `ObjectPath` for an object-store URL.  Its ``__fspath__`` raises: an `os` call on it fails
loudly instead of writing a local directory named ``s3:``.

What object storage lacks -- rename, locks -- is replaced by conditional writes (`put` with
``if_none_match`` / ``if_match``: S3's ``If-None-Match: *`` and ``If-Match: ETag``), which the
index store commits its manifest with (`lshdist.store.index.write_manifest`).

Credentials and endpoints come the standard way (the ``AWS_*`` environment including
``AWS_ENDPOINT_URL``, fsspec's configuration); anything else as a JSON object in the
``LSHDIST_STORAGE_OPTIONS`` environment variable (``--storage-options``), handed to the
file system's constructor -- workers started by lshdist inherit it.

Every failure of the store (no back end installed, an unknown scheme, a missing bucket, denied
credentials, an unreachable endpoint) becomes an `InputError` of one line.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lshdist.errors import FormatError, InputError

#: URL scheme -> (fsspec protocol, the module that implements it, the lshdist extra)
SCHEMES = {
    "s3": ("s3", "s3fs", "s3"), "s3a": ("s3", "s3fs", "s3"),
    "gs": ("gcs", "gcsfs", "gcs"), "gcs": ("gcs", "gcsfs", "gcs"),
    "abfs": ("abfs", "adlfs", "azure"), "az": ("abfs", "adlfs", "azure"),
    "memory": ("memory", "fsspec", ""),  # fsspec's in-process store: tests and notebooks
}

#: the environment variable holding extra file-system options (a JSON object)
OPTIONS_ENV = "LSHDIST_STORAGE_OPTIONS"

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.S)


#: ``scheme:/`` at the start: a URL (``s3://b/k``; a `Path` made of one keeps ``s3:/b/k``)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):/")


def local_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a local path: a ``file://`` URL becomes its path; any other URL (``s3://``,
    ``gs://``, ``abfs://``, ``https://``...) is refused before anything is read or written --
    it would otherwise be a local directory named ``s3:``.  Where object storage is supported,
    `lshdist.store.objects.as_path` is used instead.

    Raises
    ------
    InputError
        For a URL other than ``file://`` (or a ``file://`` URL naming another host).
    """
    from urllib.parse import unquote, urlsplit

    text = os.fspath(path)
    m = _SCHEME.match(text)
    if m is None:
        return Path(text)
    parts = urlsplit(text)
    if m[1].lower() == "file" and parts.netloc in ("", "localhost"):
        return Path(unquote(parts.path))
    if m[1].lower() == "file":
        raise InputError(f"{text!r} names another host; a file:// URL must name a local path "
                         "(file:///PATH)")
    raise InputError(f"{text!r} is not a local path (it starts like a URL): give a local path, "
                     "file:///PATH, or an object-store URL such as s3://BUCKET/PATH")


class CommitConflict(InputError):
    """A conditional write lost: the object was created or changed since it was read."""


def is_url(path: object) -> bool:
    """Whether ``path`` is an object-store URL (``scheme://``, not ``file://``)."""
    if isinstance(path, ObjectPath):
        return True
    if not isinstance(path, str):
        return False
    m = _URL.match(path)
    return m is not None and m[1].lower() != "file"


def storage_options() -> dict[str, Any]:
    """The options of ``LSHDIST_STORAGE_OPTIONS`` (a JSON object), ``{}`` when unset.

    Raises
    ------
    InputError
        When it is not a JSON object.
    """
    text = os.environ.get(OPTIONS_ENV, "").strip()
    if not text:
        return {}
    try:
        opts = json.loads(text)
    except ValueError as exc:
        raise InputError(f"--storage-options / {OPTIONS_ENV} is not JSON ({exc}); give an "
                         'object such as \'{"anon": false}\'') from None
    if not isinstance(opts, dict):
        raise InputError(f"--storage-options / {OPTIONS_ENV} is {type(opts).__name__}, "
                         'expected a JSON object such as \'{"anon": false}\'')
    return opts


def _protocol(scheme: str, url: str) -> tuple[str, str, str]:
    found = SCHEMES.get(scheme.lower())
    if found is None:
        known = ", ".join(f"{s}://" for s in SCHEMES if s not in ("s3a", "gcs", "az"))
        raise InputError(f"{url!r}: unknown storage scheme {scheme + '://'!r}; lshdist reads "
                         f"and writes local paths, file:// and {known}")
    return found


def backend(url: str) -> str:
    """The fsspec protocol of ``url``, after checking its back end is installed.

    Raises
    ------
    InputError
        For an unknown scheme, or one whose back end is not installed (naming the extra).
    """
    m = _URL.match(url)
    if m is None:
        raise InputError(f"{url!r} is not a URL")
    protocol, module, extra = _protocol(m[1], url)
    try:
        __import__(module)
    except ImportError:
        raise InputError(f"{url!r}: {m[1]}:// needs the {module} package, which is not "
                         f"installed; pip install 'lshdist[{extra}]'") from None
    return protocol


@functools.lru_cache(maxsize=16)
def _filesystem(protocol: str, options: str, environment: tuple[tuple[str, str], ...]) -> Any:
    import fsspec  # type: ignore[import-untyped]

    # no listings cache: another process's commit (an append, a compaction) must be seen
    opts: dict[str, Any] = {"use_listings_cache": False, "skip_instance_cache": True}
    if protocol == "s3":
        # s3fs's default splits a large GET into concurrent ranges and sends a HEAD first to
        # learn the size -- for every Zarr chunk, doubling the requests; a worker already
        # reads many chunks at once
        opts["max_concurrency"] = 1
    opts.update(json.loads(options))
    return fsspec.filesystem(protocol, **opts)


def filesystem(protocol: str) -> Any:
    """The fsspec file system of ``protocol`` with `storage_options` (one per process and
    options)."""
    opts = json.dumps(storage_options(), sort_keys=True)
    if os.getpid() != _owner[0]:  # a forked worker: file systems hold sockets of the parent
        _filesystem.cache_clear()
        _owner[0] = os.getpid()
    # the credentials and endpoint the back end reads from the environment: a change (a test,
    # a notebook) makes a new file system, not one still signed with the old key
    env = tuple(sorted((k, v) for k, v in os.environ.items()
                       if k.startswith(("AWS_", "GOOGLE_", "AZURE_", "FSSPEC_"))))
    return _filesystem(protocol, opts, env)


_owner = [os.getpid()]


def _describe(exc: BaseException, url: str) -> str:
    """One line for an error of the store."""
    name = type(exc).__name__
    text = str(exc).splitlines()[0] if str(exc) else name
    low = f"{name} {text}".lower()
    if isinstance(exc, PermissionError) or any(
            s in low for s in ("accessdenied", "access denied", "forbidden", "invalidaccesskeyid",
                               "signaturedoesnotmatch", "nocredentials", "unable to locate "
                               "credentials", "expiredtoken")):
        return (f"access to {url!r} was denied ({text}); check the credentials (AWS_ACCESS_KEY_ID"
                " / AWS_SECRET_ACCESS_KEY / AWS_PROFILE, or --storage-options)")
    if "nosuchbucket" in low or "bucket does not exist" in low or "no such bucket" in low:
        return f"{url!r}: the bucket does not exist; create it first or fix the URL"
    if any(s in low for s in ("could not connect", "connect timeout", "connection refused",
                              "endpointconnectionerror", "cannot connect", "name or service")):
        return (f"cannot reach the object store for {url!r} ({text}); check AWS_ENDPOINT_URL / "
                "the network")
    return f"{url!r}: the object store failed ({name}: {text})"


@contextlib.contextmanager
def store_errors(url: str) -> Iterator[None]:
    """Turn what a file-system call raises into an `InputError` of one line (a missing object
    stays a `FileNotFoundError`, which callers decide about)."""
    try:
        yield
    except (InputError, FormatError, FileNotFoundError):
        raise
    except Exception as exc:
        raise InputError(_describe(exc, url)) from None


def _written(info: dict[str, Any]) -> float | None:
    """When an object was written (POSIX seconds), from what its back end's ``info`` says: S3
    ``LastModified``, GCS ``updated``, Azure ``last_modified``, local/memory ``mtime`` or
    ``created``."""
    import datetime

    for key in ("LastModified", "updated", "last_modified", "mtime", "created"):
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.timezone.utc)
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


class ObjectPath:
    """An object-store URL, used like a `pathlib.Path` by the store modules."""

    __slots__ = ("key", "protocol", "url")

    def __init__(self, url: str) -> None:
        m = _URL.match(url)
        if m is None:
            raise InputError(f"{url!r} is not a URL")
        self.protocol = backend(url)
        self.key = m[2].strip("/")
        if not self.key:
            raise InputError(f"{url!r} names no bucket; give s3://BUCKET/PATH")
        self.url = f"{m[1]}://{self.key}"

    # --- names -------------------------------------------------------------------------
    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"ObjectPath({self.url!r})"

    def __fspath__(self) -> str:
        """Refused: code that needs a local file (an `os` call, `Path(...)`) fails here, loudly,
        instead of writing a local directory named after the URL."""
        raise InputError(f"{self.url!r}: this operation needs a local path; it does not work "
                         "on object storage yet")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, name: str) -> ObjectPath:
        return ObjectPath(f"{self.url}/{str(name).strip('/')}")

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]

    @property
    def bucket(self) -> str:
        return self.key.partition("/")[0]

    @property
    def parent(self) -> ObjectPath:
        head = self.key.rpartition("/")[0]
        return ObjectPath(f"{self.url.partition('://')[0]}://{head or self.key}")

    @property
    def parents(self) -> list[ObjectPath]:
        out, p = [], self
        while "/" in p.key:
            p = p.parent
            out.append(p)
        return out

    def resolve(self) -> ObjectPath:
        return self

    def is_relative_to(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and (other == self or other in self.parents)

    @property
    def fs(self) -> Any:
        return filesystem(self.protocol)

    # --- queries -----------------------------------------------------------------------
    def exists(self) -> bool:
        """An object, or a prefix with objects under it."""
        with store_errors(self.url):
            return bool(self.fs.exists(self.key))

    def is_file(self) -> bool:
        with store_errors(self.url):
            return bool(self.fs.isfile(self.key))

    def is_dir(self) -> bool:
        with store_errors(self.url):
            return bool(self.fs.isdir(self.key))

    def is_symlink(self) -> bool:
        return False

    def size(self) -> int:
        with store_errors(self.url):
            return int(self.fs.size(self.key))

    def etag(self) -> str | None:
        """The object's version tag (S3's ETag), None when it does not exist."""
        with store_errors(self.url):
            try:
                info = self.fs.info(self.key)
            except FileNotFoundError:
                return None
        tag = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("created")
        return None if tag is None else str(tag)

    def age(self) -> float | None:
        """Seconds since the newest object under this prefix was written; None when the store
        does not say (or holds nothing there)."""
        with store_errors(self.url):
            try:
                found = self.fs.find(self.key, detail=True)
            except FileNotFoundError:
                return None
        stamps = [t for t in (_written(i) for i in found.values()) if t is not None]
        return time.time() - max(stamps) if stamps else None

    def iterdir(self) -> Iterator[ObjectPath]:
        with store_errors(self.url):
            names = self.fs.ls(self.key, detail=False)
        scheme = self.url.partition("://")[0]
        for n in sorted(names):
            n = str(n).strip("/")
            if n != self.key:
                yield ObjectPath(f"{scheme}://{n}")

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        for p in self.iterdir():
            if fnmatch.fnmatchcase(p.name, pattern):
                yield p

    def files(self) -> list[str]:
        """Every object under this prefix, as paths relative to it (sorted)."""
        with store_errors(self.url):
            try:
                found = self.fs.find(self.key)
            except FileNotFoundError:
                return []
        return sorted(str(f).strip("/")[len(self.key) + 1:] for f in found
                      if str(f).strip("/") != self.key)

    # --- reads -------------------------------------------------------------------------
    def read_bytes(self, limit: int | None = None) -> bytes:
        """The object's bytes, refusing one larger than ``limit``."""
        with store_errors(self.url):
            if limit is None:
                return bytes(self.fs.cat_file(self.key))
            data = bytes(self.fs.cat_file(self.key, start=0, end=limit + 1))  # one ranged GET
        if len(data) > limit:
            raise FormatError(f"{self.url!r} holds more than the {limit:,} bytes it may: "
                              "refused (damaged or replaced)")
        return data

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def open(self, mode: str = "rb") -> Any:
        with store_errors(self.url):
            return self.fs.open(self.key, mode)

    # --- writes ------------------------------------------------------------------------
    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing: an object store has no directories."""

    def write_bytes(self, data: bytes) -> None:
        with store_errors(self.url):
            self.fs.pipe_file(self.key, data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def put(self, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> None:
        """Write the object only if it does not exist (``if_none_match``) or still has the tag
        ``if_match``; a lost race raises `CommitConflict`."""
        lost = CommitConflict(f"{self.url!r} was written by another job meanwhile")
        with store_errors(self.url):
            if self.protocol == "s3":
                args: dict[str, Any] = {}
                if if_none_match:
                    args["IfNoneMatch"] = "*"
                elif if_match is not None:
                    args["IfMatch"] = if_match
                bucket, _, key = self.key.partition("/")
                try:
                    self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **args)
                except FileExistsError:
                    raise lost from None
                except OSError as exc:
                    if "pre-condition" in str(exc).lower() or "precondition" in str(exc).lower():
                        raise lost from None
                    raise
                self.fs.invalidate_cache(self.key)
                return
            # other back ends: their own create-only mode; If-Match checked just before (a
            # window in which a concurrent writer can still slip in: documented)
            if if_match is not None and self.etag() != if_match:
                raise lost
            if if_none_match:
                try:
                    self.fs.pipe_file(self.key, data, mode="create")
                except FileExistsError:
                    raise lost from None
                except TypeError:  # a back end without mode=
                    if self.fs.exists(self.key):
                        raise lost from None
                    self.fs.pipe_file(self.key, data)
                return
            self.fs.pipe_file(self.key, data)

    def unlink(self, missing_ok: bool = False) -> None:
        with store_errors(self.url):
            try:
                self.fs.rm_file(self.key)
            except FileNotFoundError:
                if not missing_ok:
                    raise

    def rmtree(self) -> None:
        """Remove every object under this prefix (and the object itself, if any)."""
        with store_errors(self.url), contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.key, recursive=True)

    def copytree(self, dst: ObjectPath) -> None:
        """Copy every object under this prefix to ``dst`` (server-side where the store can)."""
        with store_errors(self.url):
            for rel in self.files():
                self.fs.copy(f"{self.key}/{rel}", f"{dst.key}/{rel}")

    def zarr_store(self, *, read_only: bool = True) -> Any:
        """A Zarr store over this prefix: the process's (synchronous) file system, wrapped
        for Zarr's event loop -- one session per process, closed at exit by fsspec."""
        from fsspec.implementations.asyn_wrapper import (  # type: ignore[import-untyped]
            AsyncFileSystemWrapper,
        )
        from zarr.storage import FsspecStore

        wrapped = AsyncFileSystemWrapper(self.fs, asynchronous=True)
        return FsspecStore(wrapped, path=self.key, read_only=read_only)


def as_path(path: str | os.PathLike[str] | ObjectPath) -> Path | ObjectPath:
    """``path`` as a `Path` (a local path or ``file://`` URL) or an `ObjectPath` (an
    object-store URL whose back end is installed).

    Raises
    ------
    InputError
        For an unknown scheme or a back end not installed.
    """
    if isinstance(path, ObjectPath):
        return path
    if is_url(path):
        return ObjectPath(str(path))
    return local_path(path)


@contextlib.contextmanager
def local_copies(paths: list[str]) -> Iterator[list[str]]:
    """``paths`` with every object-store URL among them (an input file, or a dataset to
    re-shard) copied into a temporary local directory, names kept, for the input readers that
    open files (numpy, gzip, CSV, IDX); local paths pass through.  The copies go when the
    block ends.  The driver reads every input whole either way: a copy costs local disk, not a
    second read.

    Raises
    ------
    InputError
        For a URL naming nothing (``input ... does not exist``) or a failing store.
    """
    import tempfile

    urls = [p for p in paths if is_url(p)]
    if not urls:
        yield list(paths)
        return
    with tempfile.TemporaryDirectory(prefix="lshdist-inputs-") as tmp:
        out = []
        for i, p in enumerate(paths):
            if not is_url(p):
                out.append(p)
                continue
            src = ObjectPath(p)
            if not src.exists():
                raise InputError(f"input {src.url!r} does not exist")
            dst = Path(tmp) / str(i) / src.name
            dst.parent.mkdir()
            with store_errors(src.url):
                src.fs.get(src.key, str(dst), recursive=src.is_dir())
            out.append(str(dst))
        yield out


def tree_bytes(path: Path | ObjectPath) -> int:
    """The bytes of every file (object) under ``path``."""
    if isinstance(path, ObjectPath):
        with store_errors(path.url):
            return int(path.fs.du(path.key))
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def resolved(path: str | os.PathLike[str] | ObjectPath) -> str:
    """``path`` as recorded in a manifest: an absolute local path, or the URL."""
    p = as_path(path)
    return str(p.resolve())


def require_local(path: str | os.PathLike[str] | ObjectPath, what: str) -> None:
    """Refuse an object-store URL where a job writes local files only (``what``: the option
    and why), before any work.

    Raises
    ------
    InputError
        For an object-store URL.
    """
    if is_url(path):
        raise InputError(f"{what}: {str(path)!r} is an object-storage URL; give a local or "
                         "shared directory (object storage serves datasets, models, indexes "
                         "and results)")


def check_bucket(url: str) -> None:
    """Refuse an object-store URL whose bucket does not exist or cannot be reached with the
    credentials given -- before anything is written.

    Raises
    ------
    InputError
        One line: the bucket missing, access denied, the store unreachable.
    """
    p = ObjectPath(url)
    if p.protocol == "memory":
        return
    bucket = p.url.partition("://")[0] + "://" + p.bucket
    with store_errors(bucket):
        try:
            if p.protocol == "s3":  # one HEAD, whatever the bucket holds
                p.fs.call_s3("head_bucket", Bucket=p.bucket)
            else:
                p.fs.ls(p.bucket, detail=False)
        except FileNotFoundError:
            raise InputError(f"{url!r}: the bucket {p.bucket!r} does not exist; create it "
                             "first or fix the URL") from None
