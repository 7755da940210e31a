"""Partial answers of query chunks and their merge, for every index kind: a segment's partial
answer is ``(dist (Q, k), ids (Q, k), candidates (Q,))``; merged by (distance, id) to the top
k (`lshdist.index.permutation.merge_topk`), whichever way they are grouped.  The last element
of a chunk's encoding (`Encoded`-like tuples of every kind) is its query ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lshdist.index.permutation import merge_topk
from lshdist.store.results import PartWriter, queries_per_group

#: one segment's partial answer to a chunk: (dist (Q, k), ids (Q, k), candidates (Q,))
Partial = tuple[np.ndarray, np.ndarray, np.ndarray]


def merged_ids(encoded: tuple[Any, ...], parts: Sequence[Partial], k: int) -> np.ndarray:
    """The merged top-``k`` ids (Q, k) of a chunk's partial answers (`merge_and_write`'s
    answer, returned instead of written: the recall check's)."""
    return merge_topk([p[0] for p in parts], [p[1] for p in parts], k)[1]


def merge_partials(parts: Sequence[Partial], k: int) -> Partial:
    """One partial answer from several segments' (a worker's, before its answers travel to
    the chunk's merge): the top-k by (distance, id), candidates summed — what
    `merge_and_write` makes of them, whichever way they are grouped (`merge_topk`)."""
    dist, ids = merge_topk([p[0] for p in parts], [p[1] for p in parts], k)
    return dist, ids, np.sum([p[2] for p in parts], axis=0)


def merge_and_write(encoded: tuple[Any, ...], parts: Sequence[Partial], k: int, out_dir: str,
                    chunk: int) -> int:
    """Merge the partial lists of one query chunk and write its Parquet parts, a row group
    of queries at a time (`queries_per_group`: the merged table of a 10,000-query chunk at
    k = 100 is never whole in memory); returns Q."""
    qids = encoded[2]
    step = queries_per_group(k)
    with PartWriter(out_dir, chunk) as out:
        for lo in range(0, len(qids), step):
            sl = slice(lo, lo + step)
            dist, ids = merge_topk([p[0][sl] for p in parts], [p[1][sl] for p in parts], k)
            out.write(qids[sl], dist, ids, np.sum([p[2][sl] for p in parts], axis=0))
    return out.queries
