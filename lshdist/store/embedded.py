"""The rows a model sees: a dataset as stored, or a point-set dataset through the model's
set embedding (`lshdist.embed.model.SetEmbedding`), shard by shard where it is read."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

import numpy as np

from lshdist.blocks import Block, SparseBlock
from lshdist.errors import InputError
from lshdist.store.dataset import HASHED_D, Dataset

if TYPE_CHECKING:
    from lshdist.embed.model import SetEmbedding


class EmbeddedDataset(Dataset):
    """A point-set dataset read as sparse rows: each set mapped by ``embedding``.

    Everything that reads rows (`read_rows`, `read_row_set`, `read_shard`, `read_all`) gets
    the embedded rows; ids, labels and shard bounds are the dataset's own.
    """

    def __init__(self, path: str | os.PathLike[str], embedding: SetEmbedding):
        super().__init__(path)
        if self.stored_kind != "pointsets":
            raise InputError(f"dataset {str(path)!r} holds {self.stored_kind} vectors, but the "
                             f"model embeds sets of local features ({embedding.kernel}); give a "
                             "point-set dataset (`lshdist ingest --features`)")
        if self.d_points != embedding.d_:
            raise InputError(f"dataset {str(path)!r} has points of {self.d_points} features, but "
                             f"the model's {embedding.kernel} embedding was fitted on "
                             f"{embedding.d_}; ingest with the same --features")
        if embedding.kernel == "pdk" and not self.has_coords:
            raise InputError(f"dataset {str(path)!r} has no image coordinates, which the PDK "
                             "needs; ingest the images with --features (coordinates are kept)")
        self.embedding = embedding

    @property
    def kind(self) -> str:
        return "sparse"

    @property
    def d(self) -> int:
        return HASHED_D

    @property
    def d_points(self) -> int:
        """Feature dimension of a point."""
        return int(self.attrs["d"])

    def read_rows(self, start: int, stop: int) -> Block:
        return self.embedding.transform(self.read_sets(start, stop))

    def read_row_set(self, rows: np.ndarray, *, threads: int = 1) -> Block:
        """The embedded rows numbered ``rows`` (read serially: ``threads`` is accepted for the
        interface's sake)."""
        return self.embedding.transform(self.read_set_rows(rows))

    def to_dask(self) -> list[object]:
        from dask.delayed import delayed

        return [delayed(_embedded_shard)(str(self.path), self.embedding, i)
                for i in range(self.n_shards)]


def _embedded_shard(path: str, embedding: SetEmbedding, i: int) -> SparseBlock:
    rows = EmbeddedDataset(path, embedding).read_shard(i)
    return cast(SparseBlock, rows)  # an embedding gives sparse rows


def open_data(path: str | os.PathLike[str], embedding: SetEmbedding | None) -> Dataset:
    """The dataset at ``path`` as rows of a model whose set embedding is ``embedding``
    (None: a vector model, which refuses a point-set dataset)."""
    if embedding is not None:
        return EmbeddedDataset(path, embedding)
    ds = Dataset(path)
    if ds.kind == "pointsets":
        raise InputError(f"dataset {str(path)!r} holds sets of local features, but the model "
                         "was learned on vectors: learn one on point sets with "
                         "`lshdist learn --kernel pmk|pdk`")
    return ds

