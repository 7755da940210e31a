"""Reading query results (Parquet parts) back, part by part."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow.parquet as pq

from lshdist.errors import FormatError


def iter_parts(results: str | os.PathLike, k: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per Parquet part: ``(query_ids (Q,), neighbor_ids (Q, k), distances (Q, k), candidates (Q,))``
    with -1 / inf where a query has fewer than k neighbours."""
    root = Path(results)
    parts = sorted((root / "neighbors").glob("part-*.parquet"))
    if not parts:
        raise FormatError(f"{str(root)!r} holds no result parts; run `lshdist query` first")
    for p in parts:
        t = pq.read_table(p)
        s = pq.read_table(root / "stats" / p.name)
        qids = s.column("query_id").to_numpy()
        cand = s.column("candidates").to_numpy()
        nb = np.full((len(qids), k), -1, np.int64)
        dist = np.full((len(qids), k), np.inf, np.float32)
        row = np.searchsorted(qids, t.column("query_id").to_numpy())
        rank = t.column("rank").to_numpy()
        nb[row, rank] = t.column("neighbor_id").to_numpy()
        dist[row, rank] = t.column("distance").to_numpy()
        yield qids, nb, dist, cand
