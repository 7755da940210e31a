"""The duck-typed roles of lshdist, written down as `typing.Protocol`s for the type checker.

Nothing here runs: the classes that play these roles do not inherit from them.

- `Metric`: a learned (or identity) metric, `ExplicitMetric` or `ImplicitMetric`.
- `Kernel`: a base kernel of the kernelized learner (`lshdist.metric.kernels`).
- `RerankPayload`: what each indexed row carries for the exact re-rank
  (`lshdist.index.payload`), and the arrays a segment stores it as.

The hash family role is the base class `lshdist.hashing.families.HashFamily`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from typing_extensions import Self

    from lshdist.blocks import Block, RowsLike
    from lshdist.embed.model import SetEmbedding


class Metric(Protocol):
    """A metric over rows of ``d`` features: checks rows, gives distances and similarities."""

    #: ``"explicit"`` (a d x d matrix) or ``"implicit"`` (kernelized, over basis points)
    kind: str
    d: int
    is_identity: bool
    #: how sets of local features become rows (`lshdist.embed.model.SetEmbedding`), or None
    embedding: SetEmbedding | None

    def check(self, X: RowsLike) -> Block:
        """``X`` as rows this metric takes, or raise `lshdist.errors.InputError`."""
        ...

    def pairwise(self, X: RowsLike, Y: RowsLike) -> np.ndarray:
        """Learned squared distances, float64 (n_X, n_Y)."""
        ...

    def similarity(self, X: RowsLike, Y: RowsLike) -> np.ndarray:
        """Learned inner products, float64 (n_X, n_Y)."""
        ...


class Kernel(Protocol):
    """A base kernel ``k(x, y)`` on dense rows or `SparseBlock` rows."""

    name: str

    def __call__(self, A: Block, B: Block) -> np.ndarray:
        """``k(a_i, b_j)``: float64 (n_A, n_B)."""
        ...

    def paired(self, A: Block, B: Block) -> np.ndarray:
        """``k(a_i, b_i)`` row by row: float64 (n,)."""
        ...

    def diag(self, A: Block) -> np.ndarray:
        """``k(a_i, a_i)``: float64 (n,)."""
        ...


class RerankPayload(Protocol):
    """Re-rank payload of database rows or of queries (one kind on both sides)."""

    kind: str

    def __len__(self) -> int: ...

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a segment stores, by name (read back by the class's ``from_arrays``)."""
        ...

    def take(self, rows: slice | np.ndarray) -> Self:
        """The payload of rows ``rows`` (a contiguous slice, or an integer array)."""
        ...

    def distances(self, query: Self) -> np.ndarray:
        """Approximate distances from every query to every row: (Q, N)."""
        ...

    def rerank(self, offsets: np.ndarray, rows: np.ndarray, query: Self, k: int,
               tiebreak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k of each query's candidates: ``(float32 (Q, k), int64 rows (Q, k))``."""
        ...

    def scan_slack(self, query: Self) -> tuple[np.ndarray, np.ndarray, float]:
        """How far `distances` may be from the re-rank: ``(offset (Q,), slack (Q,), rel)``,
        float64 — for every row, ``distances[q, j] + offset[q]`` is within ``slack[q]`` of the
        row's distance, and `rerank`'s distance within a factor ``1 +- rel`` of it (the exact
        scan re-ranks every row that could be in the top k by these bounds)."""
        ...

    def prepare(self, n_threads: int = 1) -> None:
        """Make, on ``n_threads`` threads, what the re-rank of many candidates keeps in memory
        (a no-op for payloads that keep nothing)."""
        ...
