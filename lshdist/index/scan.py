"""Exact linear scan under the learned metric (the reference, and a search mode)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from lshdist._kernels.search import count_within, rows_within, scan_thresholds
from lshdist.errors import InputError
from lshdist.index.payload import DensePayload, Projection
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
#: directions of the pruned scan's lower bound (`_pruned`): dense rows of at least
#: ``4 * PRUNE_RANK`` columns, in batches whose product it cuts at least 4-fold
#: (`prunes`).  Shifted Fashion-MNIST (100,000 rows, 1,000 test queries, k = 11): rows whose
#: bound in 64 principal directions is within the 11th distance, 1.4 % on average (3.4 % at
#: the 90th percentile); with 32 directions 3.6 %, with 96 0.75 % (measured on the 1 M-row
#: benchmark's truth)
PRUNE_RANK = 64
#: queries of one pruned block (their bounds, float32 (block, N), are one array)
_PRUNE_BLOCK = 256
#: a block whose bounds leave more than this share of its (query, row) pairs is scanned in
#: full instead (data the bound cannot prune: the scan costs little more than without it)
_PRUNE_MAX_SHARE = 0.2


def scan_topk(payload: _P, qpayload: _P, k: int, *, ids: np.ndarray | None = None,
              block: int = 1024, n_threads: int = 1, prune: bool = False
              ) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of every query against every database row.

    The payload's scores (`RerankPayload.distances`, a float32 product for dense rows) pick
    the candidates; every row whose score could, within the payload's rounding bound
    (`RerankPayload.scan_slack`), belong to the top k is re-ranked exactly (at least the
    k + 16 best scores) — so the answer is the re-rank's top k over all rows, whatever the
    data's offset or spread.

    ``prune``: rule most rows out first by a lower bound where that pays (`will_prune`,
    `_pruned`) — the same answer.  The calibration's truth prunes; the "scan" search mode
    does not (its speed is what the calibration times against the hashed search, on a sample
    too small for the bound to pay: `lshdist.index.calibrate.exact_truth`).

    Returns ``(distances float32 (Q, k), ids int64 (Q, k))``, ascending, ties by id (by row
    when ``ids`` is None).
    """
    k = check_k(k)
    N, Q = len(payload), len(qpayload)
    tiebreak = np.arange(N, dtype=np.int64) if ids is None else np.asarray(ids, np.int64)
    proj = (payload.projection(PRUNE_RANK)
            if prune and isinstance(payload, DensePayload) and will_prune(payload, Q, k)
            else None)
    if proj is not None:
        block = min(block, _PRUNE_BLOCK)
    starts = list(range(0, Q, block))
    work = threading.local()  # each thread's bounds buffer, reused from block to block

    def one(start: int) -> tuple[np.ndarray, np.ndarray]:
        stop = min(Q, start + block)
        qp = qpayload.take(slice(start, stop))
        if proj is not None:
            if not hasattr(work, "bounds"):
                work.bounds = np.empty((min(block, Q), N), np.float32)
            got = _pruned(payload, proj, qp, k, tiebreak, work.bounds)  # type: ignore[arg-type]
            if got is not None:
                return got
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


def will_prune(payload: RerankPayload, n_queries: int, k: int) -> bool:
    """Whether `scan_topk` with ``prune`` rules rows out by the lower bound for ``n_queries``
    queries against ``payload`` (dense rows that `prunes`)."""
    return isinstance(payload, DensePayload) and prunes(len(payload), n_queries,
                                                        int(payload.shape[1]), k)


def prunes(n_rows: int, n_queries: int, d: int, k: int) -> bool:
    """Whether the exact scan of ``n_queries`` against ``n_rows`` dense rows of ``d`` columns
    goes through the pruned path (`_pruned`): rows wide enough (d >= 4 `PRUNE_RANK`), more
    rows than a few times the re-ranked ones, and a product cut at least 4-fold — the full
    scan's ``Q N d`` against the projection's ``N d r`` (the rows, once per call) and the
    bounds' ``Q N r``."""
    r = PRUNE_RANK
    return (d >= 4 * r and n_rows >= 64 * (k + _GUARD)
            and n_queries * d >= 4 * r * (n_queries + d))


def _pruned(payload: DensePayload, proj: Projection, qp: DensePayload, k: int,
            tiebreak: np.ndarray, work: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray] | None:
    """The exact top-k of the queries ``qp`` with most rows ruled out by a lower bound
    (`DensePayload.lower_bounds`: their distance in the top principal directions of the rows,
    less its rounding).  Per query, the k + 16 rows of smallest bound are re-ranked; the k-th
    of their distances, tau, bounds the k-th nearest's; every row whose bound is within
    ``s^2 tau / (1 - rel)`` (the basis's stretch, the re-rank's rounding) is re-ranked — the
    re-rank's top k over all rows, the answer of the full scan, ties included.  None when the
    bound keeps more than `_PRUNE_MAX_SHARE` of the pairs (the caller scans in full).
    ``work``: a float32 buffer of at least (len(qp), N) for the bounds."""
    bounds, offset, slack, rel = payload.lower_bounds(qp, proj, work)
    Q, N = bounds.shape
    kk = min(N, k + _GUARD)
    zero = np.zeros(Q)
    _, _, buf = scan_thresholds(bounds, kk, kk, zero, zero, 0.0, kk)  # the kk smallest bounds
    first = np.arange(Q + 1, dtype=np.int64) * kk
    try:
        d0, _ = payload.rerank(first, np.ascontiguousarray(buf[:, :kk]).ravel(), qp, k,
                               tiebreak)
    except InputError:  # a distance among these rows overflowed: the full scan decides
        return None
    tau = d0[:, min(k, N) - 1].astype(np.float64)
    if not np.all(np.isfinite(tau)):
        return None
    thr = proj.s2 * tau / (1.0 - rel) + slack - offset
    total = int(count_within(bounds, thr).sum())
    if total > _PRUNE_MAX_SHARE * Q * N:
        return None
    offsets, rows = rows_within(bounds, thr, total)
    return payload.rerank(offsets, rows, qp, k, tiebreak)


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
