"""Pair constraints for ITML, given or drawn from labels (ARCHITECTURE.md section 2).

A constraint set is ``(pairs, delta)``: int64 ``(n, 2)`` row indices and float64 ``(n,)`` with
+1 for similar and -1 for dissimilar pairs.  Similar pairs come first, then dissimilar ones
(the order of metric-learn's ITML, so both learners see the same sequence).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
from numpy.typing import ArrayLike

from lshdist.errors import InputError

if TYPE_CHECKING:
    from lshdist.blocks import BlockT

STRATEGIES = ("random", "neighbors")

#: a constraint set: int64 (n, 2) row pairs and float64 (n,) +1/-1 labels
Constraints: TypeAlias = tuple[np.ndarray, np.ndarray]
#: squared base distances between two blocks of rows: float64 (n_a, n_b)
SqDist: TypeAlias = "Callable[[BlockT, BlockT], np.ndarray]"


def check_labels_for_constraints(y: np.ndarray) -> np.ndarray:
    y = np.asarray(y)
    if len(np.unique(y)) < 2:
        raise InputError(
            f"the labels hold one class only ({np.unique(y)[:1].tolist()}); constraints need "
            "at least two classes (similar and dissimilar pairs)"
        )
    return y


def random_pairs(y: np.ndarray, n_constraints: int, rng: np.random.Generator) -> Constraints:
    """``n_constraints // 2`` random same-label pairs and as many different-label pairs.

    The strategy of the ITML authors' code and of metric-learn.
    """
    y = check_labels_for_constraints(y)
    n = len(y)
    half = max(1, n_constraints // 2)
    pos: list[tuple[int, int]] = []
    neg: list[tuple[int, int]] = []
    # draw in rounds until both halves are full; distinct points within a pair
    while len(pos) < half or len(neg) < half:
        a = rng.integers(0, n, size=4 * half)
        b = rng.integers(0, n, size=4 * half)
        ok = a != b
        a, b = a[ok], b[ok]
        same = y[a] == y[b]
        pos.extend(zip(a[same].tolist(), b[same].tolist()))
        neg.extend(zip(a[~same].tolist(), b[~same].tolist()))
    pairs = np.array(pos[:half] + neg[:half], dtype=np.int64)
    delta = np.concatenate([np.ones(half), -np.ones(half)])
    return pairs, delta


class NeighborTable:
    """The base metric's nearest neighbours of the first anchors `neighbor_pairs` will draw —
    computed once and shared by fits that differ only in what they do with the pairs (metric
    selection's grid: gamma, bounds and neighbours per anchor leave the anchors and their
    neighbour order unchanged).  ``anchors``: the first rows of the permutation the fit's
    generator draws; ``nn`` int64 (len(anchors), k): each anchor's k nearest other rows,
    ascending by (distance, row); ``n``: the rows of Z; ``digest``: of the anchors' rows of Z.
    A fit uses it only where its own anchors and their rows are these (checked: another X or
    prior of the same shape is refused), so a table never changes the pairs, only their cost.
    Read-only: concurrent fits share it."""

    def __init__(self, anchors: np.ndarray, nn: np.ndarray, n: int, digest: str):
        self.anchors = np.array(anchors, np.int64)
        self.nn = np.array(nn, np.int64)
        self.anchors.setflags(write=False)
        self.nn.setflags(write=False)
        self.n = int(n)
        self.digest = digest

    @classmethod
    def build(cls, Z: BlockT, order: np.ndarray, n_anchors: int, k: int, sq_dist: SqDist[BlockT],
              *, n_threads: int = 1) -> NeighborTable:
        from lshdist.blocks import n_rows

        anchors = np.asarray(order[:n_anchors], np.int64)
        return cls(anchors, anchor_neighbors(Z, anchors, k, sq_dist, n_threads=n_threads),
                   n_rows(Z), _rows_digest(Z, anchors))

    def lookup(self, Z: BlockT, start: int, anchors: np.ndarray, k: int) -> np.ndarray | None:
        """The k nearest of ``anchors`` (rows ``start:`` of the fit's anchor order over the rows
        ``Z``), or None when the table was not made for them."""
        from lshdist.blocks import n_rows

        stop = start + len(anchors)
        if (n_rows(Z) != self.n or k > self.nn.shape[1] or stop > len(self.anchors)
                or not np.array_equal(self.anchors[start:stop], anchors)
                or _rows_digest(Z, self.anchors) != self.digest):
            return None
        return self.nn[start:stop, :k]


def _rows_digest(Z: BlockT, rows: np.ndarray) -> str:
    """A digest of rows of a dense Z (a `SparseBlock`'s: of its arrays' bytes)."""
    import hashlib

    from lshdist.blocks import take_rows

    h = hashlib.blake2b(digest_size=16)
    part: Any = take_rows(Z, rows)
    for a in ((part,) if isinstance(part, np.ndarray) else
              (part.indptr, part.indices, part.data)):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def anchor_neighbors(Z: BlockT, anchors: np.ndarray, k: int, sq_dist: SqDist[BlockT], *,
                     n_threads: int = 1) -> np.ndarray:
    """int64 (len(anchors), k): each anchor's k nearest other rows of Z under ``sq_dist``,
    ascending by (distance, row).

    float32 dense rows under L2 (`sq_euclidean`, what explicit ITML passes): the exact scan
    (`lshdist.index.scan.scan_topk`: float32 products pick candidates, the exact distance
    orders them) — half the cost of the float64 distance matrix at 784-d.  Other rows: the
    ``sq_dist`` matrix, its k smallest ordered by (distance, row)."""
    from lshdist.blocks import n_rows, take_rows
    from lshdist.metric.learned import sq_euclidean

    N = n_rows(Z)
    anchors = np.asarray(anchors, np.int64)
    if isinstance(Z, np.ndarray) and Z.dtype == np.float32 and sq_dist is sq_euclidean:
        from lshdist.index.payload import DensePayload
        from lshdist.index.scan import scan_topk

        kk = min(k + 1, N)
        _, nn = scan_topk(DensePayload(Z), DensePayload(Z[anchors]), kk, n_threads=n_threads)
        # the anchor itself (distance 0) is dropped; when k + 1 rows tie it at 0 with smaller
        # row numbers it is not among them, and the last is dropped instead
        own = nn == anchors[:, None]
        drop = np.where(own.any(axis=1), own.argmax(axis=1), kk - 1)
        keep = np.ones(nn.shape, bool)
        keep[np.arange(len(nn)), drop] = False
        return nn[keep].reshape(len(nn), kk - 1)[:, :k]
    D = sq_dist(take_rows(Z, anchors), Z)
    D[np.arange(len(anchors)), anchors] = np.inf  # a point is not its own neighbour
    kth = np.partition(D, k - 1, axis=1)[:, k - 1]
    out = np.empty((len(anchors), k), np.int64)
    for i in range(len(anchors)):  # the rows at most the k-th distance, by (distance, row)
        c = np.flatnonzero(D[i] <= kth[i])
        out[i] = c[np.lexsort((c, D[i, c]))][:k]
    return out


def anchors_needed(n_constraints: int, n_neighbors: int, n: int) -> int:
    """How many anchors `neighbor_pairs` takes at its first step (``n`` rows)."""
    k = int(min(n_neighbors, n - 1))
    return min(n, max(16, int(np.ceil(n_constraints / max(k, 1)))))


def neighbor_pairs(
    Z: BlockT, y: np.ndarray, n_constraints: int, n_neighbors: int, rng: np.random.Generator,
    sq_dist: SqDist[BlockT], table: NeighborTable | None = None,
) -> Constraints:
    """Constraints among nearest neighbours under the base metric.

    For sampled anchors, the same-label points among the anchor's ``n_neighbors`` nearest
    neighbours (ascending by distance, ties by row) become similar pairs and the
    different-label ones (impostors) dissimilar pairs, until ``n_constraints`` pairs are
    gathered.

    Parameters
    ----------
    Z : rows (dense array or `SparseBlock`) under the base metric
    sq_dist : callable ``(Z_rows_a, Z_all) -> (n_a, N)`` squared base distances
    table : the neighbours of the anchors, computed before (`NeighborTable`); used where it
        holds this draw's anchors, the same pairs either way
    """
    from lshdist.blocks import n_rows

    y = check_labels_for_constraints(y)
    N = n_rows(Z)
    k = int(min(n_neighbors, N - 1))
    if k < 1:
        raise InputError("neighbour constraints need at least two points")
    order = rng.permutation(N)
    pos: list[tuple[int, int]] = []
    neg: list[tuple[int, int]] = []
    step = anchors_needed(n_constraints, n_neighbors, N)
    done = 0
    while len(pos) + len(neg) < n_constraints and done < N:
        anchors = order[done : done + step]
        nn = table.lookup(Z, done, anchors, k) if table is not None else None
        if nn is None:
            nn = anchor_neighbors(Z, anchors, k, sq_dist)
        done += len(anchors)
        for a, row in zip(anchors.tolist(), nn.tolist()):
            for b in row:
                (pos if y[a] == y[b] else neg).append((a, b))
            if len(pos) + len(neg) >= n_constraints:
                break
    if not neg:
        raise InputError(
            "no dissimilar pairs among the nearest neighbours; increase n_neighbors or use "
            "constraints='random'"
        )
    pairs = np.array(pos + neg, dtype=np.int64)
    delta = np.concatenate([np.ones(len(pos)), -np.ones(len(neg))])
    return pairs, delta


def check_pairs(pairs: ArrayLike, delta: ArrayLike | None, n_points: int) -> Constraints:
    """Validate user-given constraints."""
    pairs = np.asarray(pairs)
    delta = np.asarray(delta, dtype=np.float64)
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise InputError(f"pairs must have shape (n, 2), got {pairs.shape}")
    if pairs.dtype.kind not in "iu":
        raise InputError(f"pairs must hold integer row indices, got dtype {pairs.dtype}")
    if delta.shape != (len(pairs),):
        raise InputError(
            f"got {len(delta)} pair labels for {len(pairs)} pairs; give one +1/-1 label per pair"
        )
    if not np.isin(delta, (-1.0, 1.0)).all():
        raise InputError("pair labels must be +1 (similar) or -1 (dissimilar)")
    if len(pairs) and (pairs.min() < 0 or pairs.max() >= n_points):
        bad = pairs[(pairs < 0) | (pairs >= n_points)][0]
        raise InputError(
            f"constraint id {int(bad)} is out of range: the data has {n_points} points "
            f"(valid ids 0..{n_points - 1})"
        )
    if len(pairs) == 0:
        raise InputError("no constraints given; give at least one pair")
    return pairs.astype(np.int64), delta
