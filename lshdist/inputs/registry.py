"""The input formats: one table from format name to reader, sniffing predicate and options.

`REGISTRY` is the only list of formats.  ``--format`` choices (`FORMATS`), detection
(`detect_format`), dispatch (`read_input`) and which options a format honours
(`formats_accepting`) are all read from it; a new format is one new `InputFormat` entry.

Detection tries the formats in registry order and takes the first whose predicate accepts the
input, so formats recognised by magic bytes come first, and formats recognised by the first
line of a delimited text file (UCI Letter, 20 Newsgroups) come before plain CSV, which accepts
any delimited text file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lshdist.errors import FormatError, InputError
from lshdist.inputs.data import InputData
from lshdist.inputs.files import Probe, delimiter
from lshdist.inputs.formats.arrays import read_npy, read_npz, sniff_npy, sniff_npz
from lshdist.inputs.formats.dataset import read_dataset, sniff_dataset
from lshdist.inputs.formats.delimited import read_csv, read_letter, sniff_csv, sniff_letter
from lshdist.inputs.formats.idx import read_idx, sniff_idx
from lshdist.inputs.formats.newsgroups import read_newsgroups, sniff_newsgroups
from lshdist.inputs.formats.tables import read_parquet, sniff_parquet

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadOptions:
    """Per-format reading options (each honoured only by the formats that list it).

    Attributes
    ----------
    label_column : str or int, optional
        Label column of a table (name or index).
    header : bool, optional
        Whether a CSV file has a header row (None: guessed).
    id_column : str or int, optional
        Column of unique int64 row ids of a table.
    idx_labels : Path, optional
        The labels file paired with an IDX images file.
    """

    label_column: str | int | None = None
    header: bool | None = None
    id_column: str | int | None = None
    idx_labels: Path | None = None


Reader = Callable[[Path, ReadOptions], InputData]


@dataclass(frozen=True)
class InputFormat:
    """One input format.

    Attributes
    ----------
    name : str
        The ``--format`` value.
    title : str
        What the format is, for help texts.
    read : callable ``(path, ReadOptions) -> InputData``
    sniff : callable ``(Probe) -> bool``
        Whether an input looks like this format (see the module docstring for the order).
    options : frozenset of str
        The user options it honours: ``'label_column'``, ``'header'``, ``'id_column'`` (fields
        of `ReadOptions`) and ``'weighting'`` (text weighting, applied by `read_inputs`).
    """

    name: str
    title: str
    read: Reader
    sniff: Callable[[Probe], bool]
    options: frozenset[str] = frozenset()


def _csv(path: Path, o: ReadOptions) -> InputData:
    return read_csv(
        path,
        label_column=o.label_column,
        header=o.header,
        delimiter=delimiter(path),
        id_column=o.id_column,
    )


def _parquet(path: Path, o: ReadOptions) -> InputData:
    return read_parquet(path, label_column=o.label_column, id_column=o.id_column)


_TABLE_OPTIONS = frozenset({"label_column", "id_column"})

#: every input format, in detection order
REGISTRY: dict[str, InputFormat] = {
    f.name: f
    for f in (
        InputFormat("npy", "NumPy matrix", lambda p, o: read_npy(p), sniff_npy),
        InputFormat(
            "npz", "NumPy arrays X, y, ids or a scipy sparse matrix",
            lambda p, o: read_npz(p), sniff_npz,
        ),
        InputFormat("parquet", "Parquet table", _parquet, sniff_parquet, _TABLE_OPTIONS),
        InputFormat(
            "idx", "IDX images and labels files, as Fashion-MNIST",
            lambda p, o: read_idx(p, o.idx_labels), sniff_idx,
        ),
        InputFormat("letter", "UCI Letter", lambda p, o: read_letter(p), sniff_letter),
        InputFormat(
            "newsgroups", "20 Newsgroups tab-separated text",
            lambda p, o: read_newsgroups(p), sniff_newsgroups, frozenset({"weighting"}),
        ),
        InputFormat("csv", "CSV or TSV", _csv, sniff_csv, _TABLE_OPTIONS | {"header"}),
        InputFormat(
            "zarr", "an lshdist dataset, to re-shard", lambda p, o: read_dataset(p), sniff_dataset
        ),
    )
}  # fmt: skip

#: the ``--format`` choices
FORMATS: tuple[str, ...] = tuple(REGISTRY)


def formats_accepting(option: str) -> tuple[str, ...]:
    """Names of the formats that honour ``option`` (a key of `InputFormat.options`)."""
    return tuple(name for name, f in REGISTRY.items() if option in f.options)


def get_format(name: str) -> InputFormat:
    """The registry entry of ``name``, or an `InputError` listing the formats."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise InputError(
            f"unknown format {name!r}; expected one of: {', '.join(FORMATS)}"
        ) from None


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of ``path``: the first format of `REGISTRY` whose predicate accepts it."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"input {str(path)!r} does not exist")
    probe = Probe.of(path)
    if not probe.is_dir and not probe.head:
        raise InputError(f"input {str(path)!r} is empty; give a file with at least one row")
    for name, fmt in REGISTRY.items():
        if fmt.sniff(probe):
            return name
    if probe.is_dir:
        raise FormatError(
            f"{str(path)!r} is a directory but not a Zarr group (no zarr.json); "
            "give a data file or a dataset written by `lshdist ingest`"
        )
    raise FormatError(
        f"cannot tell the format of {str(path)!r} (extension {probe.extension or 'none'!r}, "
        f"first bytes {probe.head[:8].hex(' ')}); pass --format, one of: {', '.join(FORMATS)}"
    )


def read_input(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    options: ReadOptions = ReadOptions(),
) -> InputData:
    """One input file or dataset directory, in ``format`` (default: `detect_format`)."""
    path = Path(path)
    name = format or detect_format(path)
    fmt = get_format(name)
    logger.info("reading %s (%s)", path, name)
    return fmt.read(path, options)
