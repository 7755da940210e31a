"""Exact linear scan under the learned metric (the reference, and a search mode)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from lshdist._kernels.search import rows_within, scan_thresholds
from lshdist.limits import one_blas_thread
from lshdist.validation import check_k

if TYPE_CHECKING:
    from lshdist.protocols import RerankPayload

_P = TypeVar("_P", bound="RerankPayload")

#: rows always re-checked exactly beyond the k best scores (the candidate set is at least
#: this; the payload's rounding bound, `RerankPayload.scan_slack`, may ask for more)
_GUARD = 16
#: candidate rows re-ranked at once (a query whose rounding bound admits many rows -- data
#: far from the origin against its spread -- is re-ranked in batches this size, not all
#: queries' candidates at once)
_BATCH_ROWS = 1 << 24
#: candidates per query collected in the counting pass, as a multiple of k + 16 (more are
#: read back from the scores in a second pass)
_CAP_FACTOR = 4


def scan_topk(payload: _P, qpayload: _P, k: int, *, ids: np.ndarray | None = None,
              block: int = 1024, n_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of every query against every database row.

    The payload's scores (`RerankPayload.distances`, a float32 product for dense rows) pick
    the candidates; every row whose score could, within the payload's rounding bound
    (`RerankPayload.scan_slack`), belong to the top k is re-ranked exactly (at least the
    k + 16 best scores) — so the answer is the re-rank's top k over all rows, whatever the
    data's offset or spread.

    Returns ``(distances float32 (Q, k), ids int64 (Q, k))``, ascending, ties by id (by row
    when ``ids`` is None).
    """
    k = check_k(k)
    N, Q = len(payload), len(qpayload)
    tiebreak = np.arange(N, dtype=np.int64) if ids is None else np.asarray(ids, np.int64)
    starts = list(range(0, Q, block))

    def one(start: int) -> tuple[np.ndarray, np.ndarray]:
        stop = min(Q, start + block)
        qp = qpayload.take(slice(start, stop))
        D = payload.distances(qp)
        offset, slack, rel = payload.scan_slack(qp)
        thr, counts, buf = scan_thresholds(D, k, k + _GUARD, offset, slack, float(rel),
                                           min(_CAP_FACTOR * (k + _GUARD), max(N, 1)))
        parts = []
        for a, b in _batches(counts, _BATCH_ROWS):
            c = counts[a:b]
            if c.size and int(c.max()) <= buf.shape[1]:  # collected in the counting pass
                rows = buf[a:b][np.arange(buf.shape[1])[None, :] < c[:, None]]
                offsets = np.concatenate([[0], np.cumsum(c)]).astype(np.int64)
            else:
                offsets, rows = rows_within(D[a:b], thr[a:b], int(c.sum()))
            parts.append(payload.rerank(offsets, rows, qp.take(slice(a, b)), k, tiebreak))
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))

    if n_threads > 1 and len(starts) > 1:
        # each thread's product on one BLAS thread: two 2-thread products at once on 2 cores
        # ran 1.7x slower (Fashion-MNIST, 4,096 queries: 4.83 s, held to one each 2.86 s; one
        # query block at a time with 2 BLAS threads 3.71 s)
        with one_blas_thread(), ThreadPoolExecutor(n_threads) as pool:
            parts = list(pool.map(one, starts))
    else:
        parts = [one(s) for s in starts]
    dist = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts])
    if ids is not None:
        rows = np.where(rows >= 0, np.asarray(ids)[np.maximum(rows, 0)], -1)
    return dist, rows


def _batches(counts: np.ndarray, budget: int) -> Iterator[tuple[int, int]]:
    """Consecutive query ranges whose candidate rows total at most ``budget`` (a query with
    more is a range of its own); at least one range, even for no queries."""
    a, acc = 0, 0
    for q, c in enumerate(counts.tolist()):
        if q > a and acc + c > budget:
            yield a, q
            a, acc = q, 0
        acc += c
    yield a, len(counts)
