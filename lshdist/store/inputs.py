"""Several inputs to one `InputData`: formats, IDX pairing, option checks, concatenation and
the weighting of text rows.  ``lshdist ingest`` is `read_inputs` followed by `InputData.write`.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from lshdist.blocks import vstack_sparse
from lshdist.errors import InputError
from lshdist.store.readers import (
    FORMATS,
    InputData,
    attach_labels,
    detect_format,
    idx_ndim,
    read_input,
    read_labels_file,
)
from lshdist.store.text import WEIGHTINGS, Idf, text_attrs, weight_rows

logger = logging.getLogger(__name__)


def _pair_idx(paths: list[Path]) -> list[tuple[Path, Path | None]]:
    """Pair IDX images files with labels files: by name (images->labels, idx3->idx1), else 1:1."""
    images = [p for p in paths if idx_ndim(p) > 1]
    labels = [p for p in paths if idx_ndim(p) == 1]
    if not images:
        raise InputError(
            f"IDX inputs {[str(p) for p in labels]} are all labels files; give the images files too"
        )
    free = list(labels)
    pairs: dict[Path, Path | None] = {}

    def stem(p: Path) -> str:
        return p.name[:-3] if p.name.endswith(".gz") else p.name

    for img in images:
        want = stem(img).replace("images", "labels").replace("idx3", "idx1")
        match = next((lab for lab in free if stem(lab) == want), None)
        pairs[img] = match
        if match is not None:
            free.remove(match)
    unpaired = [img for img in images if pairs[img] is None]
    if free and len(free) == 1 and len(unpaired) == 1:
        pairs[unpaired[0]] = free.pop()
    if free:
        raise InputError(
            f"cannot tell which IDX images file the labels file(s) {[str(p) for p in free]} "
            "belong to; name each pair alike "
            "(train-images-idx3-ubyte.gz / train-labels-idx1-ubyte.gz)"
        )
    return [(img, pairs[img]) for img in images]


def _class_key(name: str):
    return (0, int(name), "") if re.fullmatch(r"-?\d+", name) else (1, 0, name)


def merge_labels(parts: Sequence[InputData]) -> tuple[np.ndarray | None, list[str] | None]:
    """Label codes of the concatenated ``parts`` over the union of their classes.

    Classes are kept as they are when every part has the same list, else sorted (numerically
    when every name is an integer).  Returns ``(None, None)`` when no part is labelled.
    """
    labelled = [p.y is not None for p in parts]
    if not any(labelled):
        return None, None
    if not all(labelled):
        missing = parts[labelled.index(False)].sources[0]
        having = parts[labelled.index(True)].sources[0]
        raise InputError(
            f"{missing!r} has no labels but {having!r} has; give labels for every input or none"
        )
    first = parts[0].classes
    if all(p.classes == first for p in parts):
        return np.concatenate([p.y for p in parts]).astype(np.int32), first
    classes = sorted({c for p in parts for c in p.classes}, key=_class_key)
    code = {c: i for i, c in enumerate(classes)}
    y = [np.array([code[c] for c in p.classes], dtype=np.int32)[p.y] for p in parts]
    return np.concatenate(y), classes


def concatenate(parts: Sequence[InputData]) -> InputData:
    """Rows of several inputs one after the other (same kind and number of features)."""
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    a = parts[0]
    for p in parts[1:]:
        if p.kind != a.kind:
            raise InputError(
                f"inputs mix dense and sparse rows ({a.sources[0]!r} is {a.kind}, {p.sources[0]!r} "
                f"is {p.kind}); ingest them into separate datasets"
            )
        if p.d != a.d:
            raise InputError(
                f"{p.sources[0]!r} has {p.d} features, but {a.sources[0]!r} has {a.d}; "
                "all inputs must have the same features"
            )
        if p.is_text != a.is_text:
            raise InputError(
                f"text input {(p if p.is_text else a).sources[0]!r} cannot be mixed with "
                f"{(a if p.is_text else p).format} input; ingest them separately"
            )
    y, classes = merge_labels(parts)
    if a.kind == "dense":
        X = np.concatenate([p.X for p in parts])
    else:
        X = vstack_sparse([p.X for p in parts])
    ids = None
    if all(p.ids is not None for p in parts):
        ids = np.concatenate([p.ids for p in parts])
        if len(np.unique(ids)) != len(ids):
            logger.warning("row ids repeat across the inputs; numbering the rows 0..N-1 instead")
            ids = None
    attrs = a.attrs if all(p.attrs == a.attrs for p in parts) else {}
    formats = {p.format for p in parts}
    return InputData(
        X,
        y,
        classes,
        ids,
        a.d,
        [s for p in parts for s in p.sources],
        a.format if len(formats) == 1 else "mixed",
        is_text=a.is_text,
        attrs=attrs,
    )


def read_inputs(
    paths: Sequence[str | os.PathLike],
    *,
    format: str | None = None,
    labels: Sequence[str | os.PathLike] | None = None,
    label_column: str | int | None = None,
    header: bool | None = None,
    weighting: str | None = None,
    idf_from: str | os.PathLike | None = None,
) -> InputData:
    """Read, check and concatenate input files; weight text rows.

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
    weighting : {'tfidf', 'counts'}, optional
        Text inputs only; default ``'tfidf'``.
    idf_from : path, optional
        Text inputs only: weight with the IDF of this dataset (the training split's).

    Returns
    -------
    InputData
    """
    if not paths:
        raise InputError("no input given; name at least one file")
    paths = [Path(p) for p in paths]
    for p in paths:
        if not p.exists():
            raise InputError(f"input {str(p)!r} does not exist")
    if format is not None and format not in FORMATS:
        raise InputError(f"unknown format {format!r}; expected one of: {', '.join(FORMATS)}")
    formats = [format or detect_format(p) for p in paths]

    units: list[tuple[str, tuple]] = []  # (format, reader arguments) per logical input
    idx_paths = [p for p, f in zip(paths, formats) if f == "idx"]
    idx_pairs = iter(_pair_idx(idx_paths)) if idx_paths else iter(())
    for p, f in zip(paths, formats):
        if f != "idx":
            units.append((f, (p, None)))
        elif idx_ndim(p) > 1:  # an IDX labels file comes with its images file
            units.append((f, next(idx_pairs)))

    def refuse(option: str, allowed: tuple[str, ...]):
        other = [(a[0], f) for f, a in units if f not in allowed]
        if other:
            raise InputError(
                f"{option} applies to {' and '.join(allowed)} inputs, but {str(other[0][0])!r} "
                f"is {other[0][1]}; drop {option}"
            )

    if label_column is not None:
        refuse("--label-column", ("csv", "parquet"))
    if header is not None:
        refuse("--header/--no-header", ("csv",))
    if weighting is not None or idf_from is not None:
        refuse("--weighting/--idf-from", ("newsgroups",))
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
    # the IDF source is checked before the (possibly long) reading of the inputs
    idf = Idf.from_dataset(idf_from) if idf_from is not None else None

    parts = []
    for i, (f, args) in enumerate(units):
        data = read_input(
            args[0], format=f, label_column=label_column, header=header, idx_labels=args[1]
        )
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
    logger.info(
        "read %d rows x %s features (%s) from %d input(s)", data.n, data.d, data.kind, len(parts)
    )
    return data


def _weight_text(
    data: InputData, weighting: str, idf: Idf | None, idf_from: str | os.PathLike | None
) -> InputData:
    if weighting == "tfidf" and idf is None:
        idf = Idf.from_counts(data.X)
    data.X = weight_rows(data.X, weighting, idf)
    data.attrs = {
        **data.attrs,
        "text": text_attrs(
            weighting,
            None if weighting != "tfidf" else (str(idf_from) if idf_from is not None else "self"),
            None if idf is None else idf.n_documents,
        ),
    }
    data.is_text = False
    return data
