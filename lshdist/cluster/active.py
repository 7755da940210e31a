"""Active learning on the cluster (``lshdist active --distributed``): the pool indexed once,
its segments held in worker memory, every selection a round of tasks.

The driver keeps what is small: the labels (the oracle), the labelled rows fetched so far for
the SVMs, the test rows, a labelled mask per class.  The workers hold the pool: per segment
(a run of whole dataset shards, one or two per worker thread) the H-Hash or EH-Hash keys of
its rows (bias as a constant feature) and the rows themselves (the margin payload).  A hashed
selection hashes the class's hyperplane on the driver (the family's coefficients are the
driver's, the same seed as the workers'), sends the key and the normal to one task per
worker (`rank_segments`: in each segment it holds, the segment's share of the ``candidates``
smallest angle scores re-ranked, or its permutation lists), and merges the partial top lists
by (margin, id); the exhaustive baseline is the same round of tasks computing every row's
margin.  Nothing is written but the summary.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import numpy as np

from lshdist.cluster.driver import spread
from lshdist.errors import InputError
from lshdist.hashing.hyperplane import HHash, HyperplaneFamily, hyperplane_family
from lshdist.index.hyperplane import (
    MarginDensePayload,
    candidate_shares,
    encode_hyperplanes,
    encode_points,
    rms_from_sums,
    row_sums,
    search_hyperplanes,
)
from lshdist.index.permutation import PermutationIndex, merge_topk
from lshdist.index.searcher import permutation_seed
from lshdist.store.dataset import Dataset

log = logging.getLogger(__name__)

#: rows per pool segment at most (a segment is a run of whole shards)
SEGMENT_ROWS = 250_000


# ------------------------------------------------------------------------------ worker tasks


def read_pool_rows(data_path: str, start: int, stop: int) -> np.ndarray:
    """Dataset rows ``start:stop`` (dense)."""
    out: np.ndarray = np.asarray(Dataset(data_path).read_rows(start, stop))
    return out


def fit_pool_segment(X: np.ndarray, start: int, family: HyperplaneFamily,
                     center: np.ndarray | None, bias_scale: float, lists: int, window: int,
                     seed: int) -> PermutationIndex:
    """Keys and margin payload of the pool rows ``X`` (ids ``start, start + 1, ...``: the
    dataset's row numbers), the keys hashing ``((x - center) / bias_scale, 1)``."""
    codes, payload = encode_points(family, X, center, bias_scale)
    index = PermutationIndex(n_permutations=lists, window=window, seed=permutation_seed(seed))
    index.fit(codes, family.bits, payload, np.arange(start, start + len(X), dtype=np.int64))
    return index


def rank_segment(segment: PermutationIndex, codes: np.ndarray, payload: Any, k: int, mode: str,
                 candidates: int, paired: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """Partial top-k margins of one hyperplane in one segment: ``(dist, ids, reranked)``."""
    dist, ids, stats = search_hyperplanes(segment, codes, payload, k, mode=mode,
                                          candidates=candidates, paired=paired)
    return dist, ids, int(stats["reranked"].sum())


def exhaustive_segment(segment: PermutationIndex, w: np.ndarray, b: float, k: int
                       ) -> tuple[np.ndarray, np.ndarray, int]:
    """The exhaustive baseline on one segment, as a user would write it: every row's margin by
    one float32 product with the rows (their bias column times b), the ``k + 64`` smallest
    recomputed in float64 and the top k kept (ties by id).  ``(dist, ids, rows scanned)``."""
    payload = segment.payload_
    if not isinstance(payload, MarginDensePayload):
        raise InputError("exhaustive_segment reads dense margin payloads only")
    X = payload.X
    coef = np.append(w, b).astype(X.dtype)
    m = np.abs(X @ coef)
    n = len(m)
    take = min(n, k + 64)
    cand = np.argpartition(m, take - 1)[:take] if take < n else np.arange(n)
    exact = np.abs(np.asarray(X[cand], np.float64) @ np.append(w, b)) / np.linalg.norm(w)
    ids = segment.ids_[cand]
    order = np.lexsort((ids, exact))[:k]
    return exact[order][None, :].astype(np.float32), ids[order][None, :], n


def rank_segments(segments: list[PermutationIndex], codes: np.ndarray, payload: Any, k: int,
                  mode: str, shares: list[int], paired: bool
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """`rank_segment` over the segments one worker holds, their top lists merged: one task per
    worker and round (a task costs the scheduler ~3 ms, a 170,000-row segment's search ~1 ms)."""
    res = [rank_segment(s, codes, payload, k, mode, c, paired) for s, c in zip(segments, shares)]
    dist, ids = merge_topk([r[0] for r in res], [r[1] for r in res], k)
    return dist, ids, sum(r[2] for r in res)


def exhaustive_segments(segments: list[PermutationIndex], w: np.ndarray, b: float, k: int
                        ) -> tuple[np.ndarray, np.ndarray, int]:
    """`exhaustive_segment` over the segments one worker holds, merged (one task per worker)."""
    res = [exhaustive_segment(s, w, b, k) for s in segments]
    dist, ids = merge_topk([r[0] for r in res], [r[1] for r in res], k)
    return dist, ids, sum(r[2] for r in res)


def segment_rows(segment: PermutationIndex, rows: np.ndarray) -> np.ndarray:
    """Rows of a segment's payload (dense, the bias column dropped), float32."""
    payload = segment.payload_.take(np.asarray(rows, np.int64))
    if not isinstance(payload, MarginDensePayload):
        raise InputError("segment_rows reads dense margin payloads only")
    out: np.ndarray = np.ascontiguousarray(np.asarray(payload.X)[:, :-1])
    return out


# ------------------------------------------------------------------------------------ driver


def check_pool(path: str) -> np.ndarray:
    """A pool the cluster path takes, checked on the driver before any cluster starts: dense,
    ids its row numbers, labelled.  Returns its labels."""
    ds = Dataset(path)
    if ds.kind != "dense":
        raise InputError(f"pool {path!r} holds sparse rows; --distributed active learning takes "
                         "dense pools (run sparse pools in one process: drop --distributed)")
    if not np.array_equal(ds.ids(), np.arange(ds.n)):
        raise InputError(f"pool {path!r} has ids that are not its row numbers 0..n-1; "
                         "re-ingest it without --id-column / --id-offset")
    y = ds.labels()
    if y is None:
        raise InputError(f"pool dataset {path!r} has no labels; active learning needs them (the "
                         "pool's act as the oracle)")
    out: np.ndarray = np.asarray(y)
    return out


class ClusterPool:
    """A dense pool dataset hashed once on the cluster (`lshdist.active.run_active`'s pool
    backend on Dask).  ``ids`` of the dataset must be its row numbers (what `lshdist ingest`
    writes), so that a selected id is a row."""

    def __init__(self, client: Any, data_path: str, *, family: str, bits: int, seed: int,
                 samples: int | None = None, terms: int | None = None, lists: int = 1,
                 window: int = 1, segment_rows: int | None = None, center: bool = False) -> None:
        check_pool(data_path)
        ds = Dataset(data_path)
        self.client = client
        self.n = ds.n
        self.d = ds.d
        self.family = hyperplane_family(family, d=ds.d, bits=bits, seed=seed, bias=True,
                                        samples=samples, terms=terms)
        self.paired = isinstance(self.family, HHash)
        bounds = [int(b) for b in ds.shard_bounds]
        workers = sorted(client.scheduler_info().get("workers", {}))
        most = SEGMENT_ROWS if segment_rows is None else int(segment_rows)
        n_shards = len(bounds) - 1
        # segments of whole shards, at most `most` rows where shards allow, as many as a
        # multiple of the workers (a round's tasks then end together)
        n_seg = -(-self.n // most) if self.n else 1
        if workers:
            n_seg = -(-n_seg // len(workers)) * len(workers)
        n_seg = min(max(n_seg, 1), max(n_shards, 1))
        # cut at the shard boundaries nearest to equal shares of the rows
        cuts = sorted({0, n_shards, *(int(np.abs(np.asarray(bounds) - i * self.n / n_seg)
                                             .argmin()) for i in range(1, n_seg))})
        self.bounds: list[tuple[int, int]] = [(bounds[a], bounds[b])
                                              for a, b in itertools.pairwise(cuts)]
        where = spread([b - a for a, b in self.bounds], workers)
        t0 = time.perf_counter()
        fam_f = client.scatter(self.family, broadcast=True)
        # the rows read once into the workers, their sums gathered: the centre (the pool mean,
        # with ``center``) and the bias constant (the RMS norm of the rows as hashed), as
        # `HyperplaneIndex.fit` computes them in one process; then the segments' keys
        rows = [client.submit(read_pool_rows, str(ds.path), a, b, pure=False,
                              workers=None if w is None else [w], allow_other_workers=w is not None)
                for (a, b), w in zip(self.bounds, where)]
        stats = client.gather([client.submit(row_sums, r, pure=False) for r in rows])
        total = np.sum([st[0] for st in stats], axis=0)
        sq = float(sum(st[1] for st in stats))
        n = max(int(sum(st[2] for st in stats)), 1)
        self.center: np.ndarray | None = total / n if center else None
        # `default_bias_scale`: the centred rows' RMS norm, 1 for rows as given
        self.bias_scale = 1.0 if self.center is None else rms_from_sums(sq, n, self.center)
        self.segments = [client.submit(fit_pool_segment, r, a, fam_f, self.center,
                                       self.bias_scale, lists, window, seed, pure=False,
                                       workers=None if w is None else [w],
                                       allow_other_workers=w is not None)
                         for r, (a, _), w in zip(rows, self.bounds, where)]
        client.gather(self.segments)
        del rows  # released by the scheduler (not cancelled: that would cancel the segments)
        self.build_seconds = time.perf_counter() - t0
        # a round is one task per worker over the segments it holds (`rank_segments`)
        # (a segment held by several workers -- replicated, or moved and still cached -- goes
        # to the holder with the fewest rows so far: the round's tasks stay balanced)
        holders = client.who_has(self.segments)
        groups: dict[str | None, list[int]] = {}
        load: dict[str | None, int] = {}
        for i, f in enumerate(self.segments):
            held = sorted(holders.get(f.key, ()))
            w = min(held, key=lambda h: (load.get(h, 0), h)) if held else None
            groups.setdefault(w, []).append(i)
            load[w] = load.get(w, 0) + self.bounds[i][1] - self.bounds[i][0]
        self.groups: list[tuple[str | None, list[int]]] = sorted(
            groups.items(), key=lambda g: g[1][0])
        log.info("pool of %d rows hashed on the cluster (%s, %d bits, %d segments): %.1fs",
                 self.n, family, bits, len(self.segments), self.build_seconds)

    def nbytes_per_row(self) -> float:
        """Keys + payload + lists held by the workers, bytes per pool row."""
        def size(seg: PermutationIndex) -> int:
            payload = seg.payload_
            assert isinstance(payload, MarginDensePayload)
            return int(seg.codes_.nbytes + payload.X.nbytes + seg.positions_.nbytes
                       + seg.sorted_rows_.nbytes + seg.ids_.nbytes)

        total = sum(self.client.gather([self.client.submit(size, s, pure=False)
                                        for s in self.segments]))
        return float(total) / self.n

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """Pool rows (dense float32) fetched from the segments that hold them."""
        rows = np.asarray(rows, np.int64)
        starts = np.array([a for a, _ in self.bounds])
        seg = np.searchsorted(starts, rows, side="right") - 1
        out = np.empty((len(rows), self.d), np.float32)
        futs = []
        for s in np.unique(seg):
            sel = np.flatnonzero(seg == s)
            futs.append((sel, self.client.submit(segment_rows, self.segments[s],
                                                 rows[sel] - starts[s], pure=False)))
        for sel, f in futs:
            out[sel] = f.result()
        return out

    def top(self, w: np.ndarray, b: float, k: int, mode: str, candidates: int
            ) -> tuple[np.ndarray, np.ndarray, int]:
        """Merged top-k (margins, ids) of hyperplane ``(w, b)`` over the segments and the rows
        whose margin was computed; ``mode`` "rank", "hash" or "scan" (exhaustive)."""
        def place(where: str | None) -> dict[str, Any]:
            return {"pure": False, "workers": None if where is None else [where],
                    "allow_other_workers": True}

        if mode == "scan":
            parts = [self.client.submit(exhaustive_segments, [self.segments[i] for i in group],
                                        w, b, k, **place(where))
                     for where, group in self.groups]
        else:
            codes, payload = encode_hyperplanes(self.family, w[None, :], np.array([b]),
                                                self.center, self.bias_scale)
            shares = candidate_shares(candidates, [hi - lo for lo, hi in self.bounds])
            parts = [self.client.submit(rank_segments, [self.segments[i] for i in group], codes,
                                        payload, k, mode, [shares[i] for i in group],
                                        self.paired, **place(where))
                     for where, group in self.groups]
        res = self.client.gather(parts)
        dist, ids = merge_topk([r[0] for r in res], [r[1] for r in res], k)
        return dist[0], ids[0], sum(r[2] for r in res)

    def close(self) -> None:
        self.client.cancel(self.segments)
