"""``lshdist verify PATH``: read a dataset, model or index in full and check everything."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lshdist.errors import FormatError, InputError
from lshdist.jobs.info import directory_format
from lshdist.store.objects import ObjectPath, as_path

if TYPE_CHECKING:
    from lshdist.store.manifest import IndexManifest


def verify_dataset(path: Path | ObjectPath) -> str:
    from lshdist.store.dataset import Dataset

    ds = Dataset(path)
    ds.verify()
    return (f"dataset {str(path)!r}: {ds.n} rows x {ds.d} features, {ds.kind}, "
            f"{ds.n_shards} shards")


def verify_model(path: Path | ObjectPath) -> str:
    from lshdist.store.model import load_model

    _, meta = load_model(path)
    return f"model {str(path)!r}: {meta['kind']}, d={meta['d']}, checksum {meta['checksum'][:12]}"


def verify_index_dir(path: Path | ObjectPath) -> str:
    from lshdist.store.index import list_orphans, verify_index_manifest
    from lshdist.store.model import load_model

    manifest = verify_index_manifest(path)
    try:
        _, model_meta = load_model(manifest.model)  # every array against its checksum
    except InputError as exc:
        raise InputError(f"index {str(path)!r} is intact, but its model cannot be read: "
                         f"{exc}") from None
    if model_meta["checksum"] != manifest.model_checksum:
        raise InputError(f"index {str(path)!r} is intact, but the model at "
                         f"{manifest.model!r} is not the one it was built with (checksums "
                         "differ); restore that model or rebuild the index")
    sources = _source_datasets(path, manifest)
    orphans = list_orphans(path)
    extra = f"; {len(orphans)} orphans (`lshdist gc` removes them)" if orphans else ""
    return (f"index {str(path)!r}: {len(manifest.segments)} segments, {manifest.rows} "
            f"rows, every segment and the model checked{sources}{extra}")


def _source_datasets(path: Path | ObjectPath, manifest: IndexManifest) -> str:
    """The datasets the index's segments were built from, each opened (its attributes against
    their checksum, its arrays' shapes): what `verify` says of them.  A dataset that is gone is
    said so, not an error: queries read only the index."""
    from lshdist.store.dataset import Dataset
    from lshdist.store.manifest import SegmentEntry

    names = list(dict.fromkeys(e.source for e in manifest.segments
                               if isinstance(e, SegmentEntry) and e.source is not None))
    gone = []
    for name in names:
        if not as_path(name).exists():
            gone.append(name)
            continue
        try:
            Dataset(name)
        except InputError as exc:
            raise InputError(f"index {str(path)!r} is intact, but the dataset it was built from "
                             f"is damaged: {exc}") from None
    if not names:
        return ""
    checked = len(names) - len(gone)
    said = f", {checked} source dataset{'s' if checked != 1 else ''} checked"
    if gone:
        said += f" ({len(gone)} no longer there: {', '.join(repr(g) for g in gone[:3])})"
    return said


def verifiers() -> dict[str, Callable[[Path | ObjectPath], str]]:
    """Checks by the ``format`` a directory declares (the store modules, imported here rather
    than with the module, keep `lshdist --help` light)."""
    from lshdist.store.dataset import FORMAT as DATASET_FORMAT
    from lshdist.store.index import FORMAT as INDEX_FORMAT
    from lshdist.store.model import FORMAT as MODEL_FORMAT

    return {DATASET_FORMAT: verify_dataset, MODEL_FORMAT: verify_model,
            INDEX_FORMAT: verify_index_dir}


def verify(path: str | Path | ObjectPath) -> str:
    """Check the artefact at ``path`` in full; the one-line summary of what was checked.

    Raises
    ------
    InputError, FormatError
        Describing the first problem found.
    """
    from lshdist.store.dataset import Dataset

    path = as_path(path)
    fmt = directory_format(path)
    known = verifiers()
    if fmt not in known:
        if (path / "zarr.json").is_file():
            Dataset(path)  # the dataset reader's own message for a foreign Zarr group
        raise FormatError(f"{str(path)!r} declares format {fmt!r}; lshdist verify knows "
                          f"{', '.join(sorted(known))}")
    return known[fmt](path)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "verify", help="check a dataset, model or index in full",
        description="Read every array of PATH and check it (checksums, shapes, ranges, "
                    "finiteness); an index is checked segment by segment, with its model. "
                    "Exit code 0 with one line OK, 2 with the problem.")
    p.add_argument("path", metavar="PATH", help="a dataset, model or index directory")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(f"OK {verify(args.path)}\n")
    return 0
