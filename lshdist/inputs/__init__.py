"""Input adapters: data files to the rows, labels and ids `lshdist ingest` stores.

Formats (`REGISTRY` in `lshdist.inputs.registry` is the one list; how each is recognised when
``--format`` is not given):

- ``npy`` (magic): a dense 2-d numeric array; labels from ``--labels FILE.npy``.
- ``npz`` (magic): arrays ``X`` (and ``y``, ``ids``), or a ``scipy.sparse.save_npz`` matrix.
- ``parquet`` (magic): numeric feature columns, a label column (default ``label`` or ``y``),
  optionally an id column (``--id-column``).
- ``idx`` (magic 0x00000803 images, 0x00000801 labels, gzip allowed): Fashion-MNIST style
  images files, each paired with its labels file.
- ``letter`` (first line): UCI Letter, a capital letter then 16 integers, no header.
- ``newsgroups`` (first line of a ``.tab``/``.tsv``/``.txt``): tab-separated, 3 header rows,
  columns ``Category`` and ``Text``; text becomes hashed token counts (`lshdist.inputs.text`).
- ``csv`` (extension ``.csv``/``.data``/``.txt``; ``.tab``/``.tsv`` are tab-separated; ``.gz``
  allowed): numbers, an optional header, labels in ``--label-column`` (default: a header
  column ``label`` or ``y``), ids in ``--id-column``.
- ``zarr`` (a directory with ``zarr.json``): an lshdist dataset, to re-shard.

Every problem with the input is raised as `InputError` or `FormatError` before anything is
written, naming the file, what was expected, what came, and the fix.  This package sits beside
`lshdist.store` (it writes through `lshdist.store.dataset`), never below it.
"""

from lshdist.inputs.data import InputData
from lshdist.inputs.read import read_inputs
from lshdist.inputs.registry import (
    FORMATS,
    REGISTRY,
    InputFormat,
    ReadOptions,
    detect_format,
    read_input,
)
from lshdist.inputs.text import WEIGHTINGS

__all__ = [
    "FORMATS",
    "REGISTRY",
    "WEIGHTINGS",
    "InputData",
    "InputFormat",
    "ReadOptions",
    "detect_format",
    "read_input",
    "read_inputs",
]
