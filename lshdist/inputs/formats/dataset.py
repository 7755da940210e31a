"""An lshdist dataset as input, to re-shard it or to concatenate it with other inputs."""

from __future__ import annotations

import os

import numpy as np

from lshdist.errors import FormatError
from lshdist.inputs.data import InputData, check_ids
from lshdist.inputs.files import Probe
from lshdist.store.dataset import Dataset

# attributes write_dataset sets itself; the rest of a source dataset's attributes are kept
_CORE_ATTRS = {"format", "version", "N", "d", "kind", "nnz", "shard_rows", "n_shards", "classes"}


def sniff_dataset(probe: Probe) -> bool:
    """A directory with a ``zarr.json`` (`Dataset` checks that it is an lshdist dataset)."""
    return probe.is_dir and (probe.path / "zarr.json").is_file()


def read_dataset(path: str | os.PathLike[str]) -> InputData:
    """All rows, labels, ids and extra attributes of an lshdist dataset (one of an earlier
    format without checksums too: ingesting it is how it is converted)."""
    ds = Dataset(path, legacy=True)
    X = ds.read_all()
    y = ds.labels()
    if y is not None and ds.classes is None:
        raise FormatError(
            f"{str(path)!r} has labels but no class names; the dataset is corrupted, re-ingest it"
        )
    ids = check_ids(ds.ids(), ds.n, f"{path!s}:ids", "re-ingest the dataset with unique ids")
    extra = {k: v for k, v in ds.attrs.items() if k not in _CORE_ATTRS and k != "source"}
    return InputData(
        X,
        None if y is None else y.astype(np.int32),
        None if ds.classes is None or y is None else list(ds.classes),
        ids,
        ds.d,
        [str(path)],
        "zarr",
        attrs=extra,
    )
