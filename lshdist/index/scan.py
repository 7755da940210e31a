"""Exact linear scan under the learned metric (the reference, and a search mode)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from lshdist._kernels.search import smallest_per_row
from lshdist.validation import check_k

if TYPE_CHECKING:
    from lshdist.protocols import RerankPayload

_P = TypeVar("_P", bound="RerankPayload")

#: extra rows re-checked with the exact difference form after the BLAS expansion, so rounding
#: in ``|x|^2 + |q|^2 - 2 x.q`` cannot reorder the true top-k
_GUARD = 16


def scan_topk(payload: _P, qpayload: _P, k: int, *, ids: np.ndarray | None = None,
              block: int = 1024, n_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of every query against every database row.

    Returns ``(distances float32 (Q, k), ids int64 (Q, k))``, ascending, ties by id (by row
    when ``ids`` is None).
    """
    k = check_k(k)
    N, Q = len(payload), len(qpayload)
    tiebreak = np.arange(N, dtype=np.int64) if ids is None else np.asarray(ids, np.int64)
    kk = min(N, k + _GUARD)
    starts = list(range(0, Q, block))

    def one(start: int) -> tuple[np.ndarray, np.ndarray]:
        stop = min(Q, start + block)
        qp = qpayload.take(slice(start, stop))
        cand = smallest_per_row(payload.distances(qp), kk, tiebreak)
        offsets = np.arange(0, cand.size + 1, kk, dtype=np.int64)
        return payload.rerank(offsets, np.ascontiguousarray(cand).ravel(), qp, k, tiebreak)

    if n_threads > 1 and len(starts) > 1:
        with ThreadPoolExecutor(n_threads) as pool:
            parts = list(pool.map(one, starts))
    else:
        parts = [one(s) for s in starts]
    dist = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts])
    if ids is not None:
        rows = np.where(rows >= 0, np.asarray(ids)[np.maximum(rows, 0)], -1)
    return dist, rows
