"""`read_inputs`: input files to one checked `InputData` (``lshdist ingest`` without the write).

Formats come from `lshdist.inputs.registry`; every option is checked against the formats that
honour it before any input is read, so a wrong flag fails at once, not after a long read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from lshdist.blocks import SparseBlock
from lshdist.errors import InputError
from lshdist.inputs.combine import concatenate, pair_idx
from lshdist.inputs.data import InputData, attach_labels
from lshdist.inputs.formats.arrays import read_labels_file
from lshdist.inputs.formats.idx import idx_ndim
from lshdist.inputs.registry import (
    ReadOptions,
    detect_format,
    formats_accepting,
    get_format,
    read_input,
)
from lshdist.inputs.text import WEIGHTINGS, Idf, text_attrs, weight_rows

logger = logging.getLogger(__name__)

#: the command-line spelling of each format option, for messages
_FLAGS = {
    "label_column": "--label-column",
    "header": "--header/--no-header",
    "id_column": "--id-column",
    "weighting": "--weighting/--idf-from",
}


def read_inputs(
    paths: Sequence[str | os.PathLike[str]],
    *,
    format: str | None = None,
    labels: Sequence[str | os.PathLike[str]] | None = None,
    label_column: str | int | None = None,
    header: bool | None = None,
    id_column: str | int | None = None,
    id_offset: int = 0,
    weighting: str | None = None,
    idf_from: str | os.PathLike[str] | None = None,
) -> InputData:
    """Read, check and concatenate input files; weight text rows; shift ids.

    Parameters
    ----------
    paths : sequence of paths
        Input files (or dataset directories), concatenated in this order; IDX images files
        are paired with their labels files among them.
    format : str, optional
        One of `FORMATS` for every input; default: detected for each input.
    labels : sequence of paths, optional
        One ``.npy`` labels file per input, in order, for inputs without labels of their own.
    label_column : str or int, optional
        Label column of CSV and Parquet inputs.
    header : bool, optional
        Whether CSV inputs have a header row (default: guessed).
    id_column : str or int, optional
        CSV and Parquet inputs: the column of row ids (unique int64); default: no id column.
    id_offset : int
        Added to every row id: to the default numbering ``0..N-1``, and to ids the inputs
        carry (an ``.npz`` ``ids`` array, an id column, a dataset's ids).  Default 0.
    weighting : {'tfidf', 'counts'}, optional
        Text inputs only; default ``'tfidf'``.
    idf_from : path, optional
        Text inputs only: weight with the IDF of this dataset (the training split's).

    Returns
    -------
    InputData
        With ``ids`` unique (None when they are ``0..N-1``).
    """
    if not paths:
        raise InputError("no input given; name at least one file")
    files = [Path(p) for p in paths]
    for p in files:
        if not p.exists():
            raise InputError(f"input {str(p)!r} does not exist")
    if format is not None:
        get_format(format)  # refuses an unknown name
    formats = [format or detect_format(p) for p in files]

    units: list[tuple[str, Path, Path | None]] = []  # (format, path, IDX labels) per input
    idx_files = [p for p, f in zip(files, formats) if f == "idx"]
    idx_pairs = iter(pair_idx(idx_files) if idx_files else [])
    for p, f in zip(files, formats):
        if f != "idx":
            units.append((f, p, None))
        elif idx_ndim(p) > 1:  # an IDX labels file comes with its images file
            units.append((f, *next(idx_pairs)))

    given = {
        "label_column": label_column is not None,
        "header": header is not None,
        "id_column": id_column is not None,
        "weighting": weighting is not None or idf_from is not None,
    }
    for option in (o for o, set_ in given.items() if set_):
        allowed = sorted(formats_accepting(option))
        other = next(((p, f) for f, p, _ in units if f not in allowed), None)
        if other is not None:
            raise InputError(
                f"{_FLAGS[option]} applies to {' and '.join(allowed)} inputs, but "
                f"{str(other[0])!r} is {other[1]}; drop {_FLAGS[option]}"
            )
    if weighting is not None and weighting not in WEIGHTINGS:
        raise InputError(f"weighting={weighting!r}: expected one of {', '.join(WEIGHTINGS)}")
    if labels and len(labels) != len(units):
        raise InputError(
            f"got {len(labels)} --labels files for {len(units)} inputs; give one labels file "
            "per input, in the same order"
        )
    for lab in labels or ():
        if not Path(lab).is_file():
            raise InputError(f"labels file {str(lab)!r} does not exist")
    if idf_from is not None and (weighting or "tfidf") != "tfidf":
        raise InputError(f"--idf-from needs --weighting tfidf, got --weighting {weighting}")
    if id_offset < 0:
        raise InputError(f"id offset {id_offset} is negative; give an offset >= 0")
    # the IDF source is checked before the (possibly long) reading of the inputs
    idf = Idf.from_dataset(idf_from) if idf_from is not None else None

    parts = []
    for i, (f, path, idx_labels) in enumerate(units):
        options = ReadOptions(label_column, header, id_column, idx_labels)
        data = read_input(path, format=f, options=options)
        if labels:
            if data.y is not None:
                raise InputError(
                    f"{data.sources[0]!r} has labels of its own; drop --labels {str(labels[i])!r}"
                )
            attach_labels(data, read_labels_file(labels[i]), str(labels[i]))
        parts.append(data)

    data = concatenate(parts)
    if data.is_text:
        data = _weight_text(data, weighting or "tfidf", idf, idf_from)
    data = data.shift_ids(id_offset)
    logger.info(
        "read %d rows x %s features (%s) from %d input(s)", data.n, data.d, data.kind, len(parts)
    )
    return data


def _weight_text(
    data: InputData, weighting: str, idf: Idf | None, idf_from: str | os.PathLike[str] | None
) -> InputData:
    if not isinstance(data.X, SparseBlock):  # text rows are sparse by construction
        raise TypeError(f"text rows of {data.sources[0]!r} are not sparse")
    if weighting == "tfidf" and idf is None:
        idf = Idf.from_counts(data.X)
    data.X = weight_rows(data.X, weighting, idf)
    idf_source = None
    if weighting == "tfidf":
        idf_source = str(idf_from) if idf_from is not None else "self"
    data.attrs = {
        **data.attrs,
        "text": text_attrs(weighting, idf_source, None if idf is None else idf.n_documents),
    }
    data.is_text = False
    return data
