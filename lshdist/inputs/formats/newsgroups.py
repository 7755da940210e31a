"""Tab-separated documents (the 20 Newsgroups files): categories and raw token counts.

The file has three header rows (column names, types, flags) and columns ``Category`` and
``Text``; the text becomes counts over hashed token ids (`lshdist.inputs.text`), still to be
weighted (`lshdist.inputs.read_inputs` does).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lshdist.errors import FormatError, InputError
from lshdist.inputs.data import InputData, attach_labels
from lshdist.inputs.files import READ_ERRORS, Probe, open_text
from lshdist.inputs.text import bag_of_words
from lshdist.store.dataset import HASHED_D

_EXTENSIONS = (".tab", ".tsv", ".txt")
_COLUMNS = {"Category", "Text"}


def sniff_newsgroups(probe: Probe) -> bool:
    """A ``.tab``/``.tsv``/``.txt`` file whose first row names the columns Category and Text."""
    return (
        not probe.is_dir
        and probe.extension in _EXTENSIONS
        and set(probe.first_line.split("\t")) >= _COLUMNS
    )


def read_newsgroups(path: str | os.PathLike[str]) -> InputData:
    """Token counts (``is_text``) and categories of a tab-separated documents file."""
    path = Path(path)
    source = str(path)
    try:
        with open_text(path) as f:
            lines = f.read().split("\n")
    except READ_ERRORS as exc:
        raise FormatError(
            f"{source!r} is not readable text ({type(exc).__name__}: {exc}); pass the right "
            "--format, or none to detect it"
        ) from None
    names = lines[0].rstrip("\r").split("\t")
    if not set(names) >= _COLUMNS or len(lines) < 3:
        raise FormatError(
            f"{source!r} is not in the newsgroups format: expected a tab-separated header row "
            f"with columns Category and Text, then two more header rows; got {names[:5]}"
        )
    ci, ti = names.index("Category"), names.index("Text")
    categories, docs = [], []
    for lineno, line in enumerate(lines[3:], start=4):
        line = line.rstrip("\r")
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != len(names):
            raise InputError(
                f"{source!r} line {lineno} has {len(fields)} tab-separated fields, but the header "
                f"has {len(names)}; every row needs the same number of fields: fix or remove the "
                "line"
            )
        categories.append(fields[ci])
        docs.append(fields[ti])
    if not docs:
        raise InputError(f"{source!r} has no documents; give a file with at least one row")
    data = InputData(
        bag_of_words(docs), None, None, None, HASHED_D, [source], "newsgroups",
        is_text=True,
    )  # fmt: skip
    return attach_labels(data, np.array(categories, dtype=str), f"{source}:Category")
