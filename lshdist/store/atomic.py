"""Write a directory under a temporary name, then rename it into place."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path

from lshdist.errors import OutputExistsError


def check_output(path: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse an existing output unless ``overwrite``."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise OutputExistsError(
            f"output {str(path)!r} already exists; choose another path or pass --overwrite"
        )
    return path


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, overwrite: bool = False):
    """Yield a temporary directory beside ``path``; on success rename it to ``path``.

    On any exception the temporary directory is removed, so nothing half-written is ever
    visible under ``path``.  An existing ``path`` is replaced only when ``overwrite``.
    """
    path = check_output(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        tmp.mkdir()
        yield tmp
        if path.exists():
            trash = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:12]}"
            os.rename(path, trash)
            os.rename(tmp, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a small text file by rename (a reader sees the old or the new file, whole)."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
