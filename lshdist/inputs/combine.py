"""Several inputs to one: IDX images/labels pairing, the union of classes, concatenation."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lshdist.blocks import SparseBlock, vstack_sparse
from lshdist.errors import InputError
from lshdist.inputs.data import InputData, first_duplicate
from lshdist.inputs.formats.idx import idx_ndim

logger = logging.getLogger(__name__)


def pair_idx(paths: Sequence[Path]) -> list[tuple[Path, Path | None]]:
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
    if len(free) == 1 and len(unpaired) == 1:
        pairs[unpaired[0]] = free.pop()
    if free:
        raise InputError(
            f"cannot tell which IDX images file the labels file(s) {[str(p) for p in free]} "
            "belong to; name each pair alike "
            "(train-images-idx3-ubyte.gz / train-labels-idx1-ubyte.gz)"
        )
    return [(img, pairs[img]) for img in images]


def _class_key(name: str) -> tuple[int, int, str]:
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
    ys = [p.y for p in parts if p.y is not None]
    names = [p.classes or [] for p in parts]
    if all(c == names[0] for c in names):
        return np.concatenate(ys).astype(np.int32), names[0]
    classes = sorted({c for cs in names for c in cs}, key=_class_key)
    code = {c: i for i, c in enumerate(classes)}
    y = [np.array([code[c] for c in cs], dtype=np.int32)[yp] for cs, yp in zip(names, ys)]
    return np.concatenate(y), classes


def _merge_ids(parts: Sequence[InputData]) -> np.ndarray | None:
    """Ids of the concatenated rows (None: number them 0..N-1); refuses an id used twice."""
    with_ids = [p for p in parts if p.ids is not None]
    if not with_ids:
        return None
    if len(with_ids) < len(parts):
        without = next(p for p in parts if p.ids is None)
        logger.warning(
            "%r carries row ids but %r does not; numbering all rows 0..N-1 instead",
            with_ids[0].sources[0],
            without.sources[0],
        )
        return None
    ids = np.concatenate([p.ids for p in parts if p.ids is not None])
    dup = first_duplicate(ids)
    if dup is not None:
        value, i, j = dup
        starts = np.cumsum([0] + [p.n for p in parts])
        a, b = (parts[int(np.searchsorted(starts, r, side="right")) - 1] for r in (i, j))
        raise InputError(
            f"row id {value} is in both {a.sources[0]!r} and {b.sources[0]!r}; ids must be "
            "unique within a dataset: ingest the inputs into separate datasets, or shift the "
            "ids of one input first (ingest it alone with --id-offset)"
        )
    return ids


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
    X: np.ndarray | SparseBlock
    if isinstance(a.X, SparseBlock):
        X = vstack_sparse([p.X for p in parts if isinstance(p.X, SparseBlock)])
    else:
        X = np.concatenate([p.X for p in parts if isinstance(p.X, np.ndarray)])
    attrs = a.attrs if all(p.attrs == a.attrs for p in parts) else {}
    formats = {p.format for p in parts}
    return InputData(
        X,
        y,
        classes,
        _merge_ids(parts),
        a.d,
        [s for p in parts for s in p.sources],
        a.format if len(formats) == 1 else "mixed",
        is_text=a.is_text,
        attrs=attrs,
    )
