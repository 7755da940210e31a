"""Reading the first bytes of an input, gzip or not: what format detection looks at.

`Probe` is the one view of a file every format's sniffing predicate receives (see
`lshdist.inputs.registry`), so no predicate opens or decompresses a file itself.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from lshdist.errors import FormatError, InputError

GZIP_MAGIC = b"\x1f\x8b"
#: what reading a damaged (gzip) or non-text file may raise
READ_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    EOFError,
    zlib.error,
    UnicodeDecodeError,
    csv.Error,
)
#: extensions of delimited text (CSV, UCI Letter, 20 Newsgroups), before an optional ``.gz``
TEXT_EXTENSIONS = (".csv", ".data", ".txt", ".tab", ".tsv")
TAB_EXTENSIONS = (".tab", ".tsv")


def is_gzip(path: Path) -> bool:
    """Whether ``path`` starts with the gzip magic bytes."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def head(path: Path, n: int = 1024) -> bytes:
    """The first ``n`` bytes of ``path``, decompressed if it is gzip."""
    try:
        with open(path, "rb") as f:
            raw = f.read(n)
    except OSError as exc:
        raise InputError(
            f"cannot read input {str(path)!r} ({exc.strerror or exc}); check that the file is "
            "readable"
        ) from None
    if raw[:2] == GZIP_MAGIC:
        try:
            with gzip.open(path, "rb") as f:
                return f.read(n)
        except READ_ERRORS as exc:
            raise FormatError(f"{str(path)!r} is a corrupted gzip file ({exc})") from None
    return raw


def open_text(path: Path) -> TextIO:
    """``path`` as a UTF-8 text stream (gzip or plain)."""
    if is_gzip(path):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def extension(path: Path) -> str:
    """The last suffix of ``path`` other than ``.gz``, lower-cased ('' if none)."""
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    return suffixes[-1] if suffixes else ""


def delimiter(path: Path) -> str:
    """Tab for ``.tab``/``.tsv`` files, else comma."""
    return "\t" if extension(path) in TAB_EXTENSIONS else ","


@dataclass(frozen=True)
class Probe:
    """What format detection knows of an input before reading it.

    Attributes
    ----------
    path : Path
    is_dir : bool
    head : bytes
        The first 1024 bytes (decompressed if gzip); empty for a directory.
    """

    path: Path
    is_dir: bool
    head: bytes

    @classmethod
    def of(cls, path: Path) -> Probe:
        """Probe an existing file or directory."""
        if path.is_dir():
            return cls(path, True, b"")
        return cls(path, False, head(path))

    @property
    def extension(self) -> str:
        return extension(self.path)

    @property
    def first_line(self) -> str:
        """The first line of ``head`` as text (undecodable bytes replaced)."""
        return self.head.split(b"\n", 1)[0].decode("utf-8", errors="replace").rstrip("\r")

    @property
    def is_delimited_text(self) -> bool:
        """A file whose extension says delimited text (``.csv``, ``.data``, ``.tab``...)."""
        return not self.is_dir and self.extension in TEXT_EXTENSIONS
