"""`merge_topk`: partial top-k lists of several segments merge into the global top-k.

Segments are real `PermutationIndex` segments (windows as long as a segment, so each partial
list is exact) over rows whose ids do not rise with rows; duplicate rows tie exactly; the
reference is ``np.lexsort((ids, dist))`` over all rows.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lshdist.index import MetricIndex
from lshdist.index.permutation import merge_topk
from lshdist.metric.learned import ExplicitMetric


def lexsort_topk(X, Q, ids, k):
    D = ((Q[:, None, :].astype(np.float64) - X[None]) ** 2).sum(-1)
    order = np.stack([np.lexsort((ids, row)) for row in D])[:, :k]
    d = np.full((len(Q), k), np.inf, np.float32)
    i = np.full((len(Q), k), -1, np.int64)
    d[:, : order.shape[1]] = np.take_along_axis(D, order, 1)
    i[:, : order.shape[1]] = ids[order]
    return d, i


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 40), n_segments=st.integers(1, 4),
       k=st.integers(1, 8))
def test_merge_of_segment_topk_equals_global_topk(seed, n, n_segments, k):
    # Bugs caught: ties between segments resolved by segment order (concatenation order)
    # instead of by id; padding (-1, inf) of a segment with fewer than k rows ranked before
    # real neighbours; a merge that keeps k per segment but not k overall.
    rng = np.random.default_rng(seed)
    X = rng.integers(-1, 2, size=(n, 2)).astype(np.float32)  # 9 distinct rows: many ties
    Q = np.vstack([X[:1], rng.integers(-1, 2, size=(4, 2))]).astype(np.float32)
    ids = rng.permutation(10**6)[:n].astype(np.int64)
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(n_segments - 1, n - 1), replace=False))
    parts = []
    for rows in np.split(rng.permutation(n), cuts):  # segments of shuffled rows
        ix = MetricIndex(ExplicitMetric.identity(2), bits=8, n_permutations=2,
                         window=len(rows), seed=seed).fit(X[rows], ids=ids[rows])
        d, i = ix.query(Q, k)
        parts.append((d, i, ix.stats_["reranked"]))
    dist, got = merge_topk([p[0] for p in parts], [p[1] for p in parts], k)
    ed, ei = lexsort_topk(X, Q, ids, k)
    assert np.array_equal(got, ei) and np.array_equal(dist, ed)
    assert dist.dtype == np.float32 and got.dtype == np.int64


def test_query_chunks_split_shards_never_straddle_them():
    """Each shard in the fewest nearly equal pieces of at most ``chunk`` rows; the pieces
    tile the rows in order, and no piece crosses a shard boundary."""
    from lshdist.cluster.driver import query_chunks

    bounds = [0, 20_000, 24_000, 24_001]
    got = query_chunks(bounds, 10_000)
    assert got == [(0, 10_000), (10_000, 20_000), (20_000, 24_000), (24_000, 24_001)]
    got = query_chunks(bounds, 7_000)
    assert got[:3] == [(0, 6667), (6667, 13333), (13333, 20_000)]
    for chunk in (1, 3, 999, 50_000):
        got = query_chunks(bounds, chunk)
        assert [a for a, _ in got] == [0, *[b for _, b in got[:-1]]] and got[-1][1] == 24_001
        assert all(0 < b - a <= chunk for a, b in got)
        assert not any(a < edge < b for a, b in got for edge in bounds)


def test_partials_merged_per_worker_then_together_equal_one_merge():
    """`merge_partials` (a worker's segments) then the chunk's merge give what merging every
    segment's partial at once gives, ties by id and missing entries included."""
    import numpy as np

    from lshdist.cluster.answers import merge_partials
    from lshdist.index.permutation import merge_topk

    rng = np.random.default_rng(3)
    Q, k = 50, 7
    parts = []
    for s in range(5):
        d = np.sort(rng.integers(0, 6, (Q, k)).astype(np.float32), axis=1)  # many ties
        ids = rng.permutation(1000)[:Q * k].reshape(Q, k) + 1000 * s
        ids[d > 4] = -1
        d[ids < 0] = np.inf
        parts.append((d, ids, rng.integers(0, 100, Q)))
    whole = merge_topk([p[0] for p in parts], [p[1] for p in parts], k)
    for trial in range(20):  # random groupings of the segments over 1-4 workers
        owner = rng.integers(0, rng.integers(1, 5), len(parts))
        groups = [merge_partials([p for p, o in zip(parts, owner) if o == g], k)
                  for g in np.unique(owner)]
        got = merge_topk([g[0] for g in groups], [g[1] for g in groups], k)
        assert np.array_equal(whole[0], got[0]) and np.array_equal(whole[1], got[1]), trial
        assert np.array_equal(np.sum([g[2] for g in groups], axis=0),
                              np.sum([p[2] for p in parts], axis=0))


def test_query_chunks_shrink_with_k():
    """A segment's partial answer to a chunk (12 bytes a neighbour) stays under PARTIAL_BYTES:
    k = 10 and 100 keep the default 10,000-query chunk, k = 1,000 takes 1,398, k = 10^6 one
    query; the chunk asked for is never exceeded."""
    from lshdist.cluster.driver import PARTIAL_BYTES, chunk_rows

    assert chunk_rows(10_000, 10) == chunk_rows(10_000, 100) == 10_000
    assert chunk_rows(10_000, 1_000) == PARTIAL_BYTES // 12_000 == 1_398
    assert chunk_rows(10_000, 10**6) == 1
    assert chunk_rows(500, 1_000) == 500
    for k in (1, 7, 140, 1_000, 5_000):
        assert chunk_rows(10**6, k) * k * 12 <= PARTIAL_BYTES


def test_query_chunk_encodings_are_grouped_by_host():
    # a chunk is encoded once per host (`chunk_tasks`): workers grouped by Dask's host of
    # their address, in order; catches grouping by the whole address (one encoding per
    # worker, as before) or by the port, and a lost None (a segment whose worker is unknown)
    from lshdist.cluster.driver import hosts_of

    ws = ["tcp://10.0.0.1:4001", "tcp://10.0.0.2:4001", "tcp://10.0.0.1:4002",
          "tls://10.0.0.2:5000", None, "tcp://[::1]:4003"]
    assert hosts_of(ws) == {"10.0.0.1": [ws[0], ws[2]], "10.0.0.2": [ws[1], ws[3]],
                            None: [None], "::1": [ws[5]]}
    assert hosts_of([]) == {}


def _worker_address(*_args):
    from distributed import get_worker

    return get_worker().address


def _no_answer(_segment, encoded):
    return encoded


def _encoded_where(encoded, _local):
    return encoded


def test_query_chunk_encodings_take_turns_on_a_hosts_workers():
    # two workers on one host, each holding a segment: chunk c is encoded on the (c mod 2)-th,
    # so both encode at once (the scheduler, left to choose, put every chunk in flight on one
    # worker while the other waited for it); each chunk's encoding reaches every segment
    from distributed import Client, LocalCluster

    from lshdist.cluster.driver import Chunk, Loaded, chunk_tasks, workers_of

    with LocalCluster(processes=False, n_workers=2, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        ws = workers_of(client)
        segs = [client.scatter(j, workers=[w]) for j, w in enumerate(ws)]
        loaded = Loaded(shared={}, segments=segs, homes=list(ws))
        chunk = Chunk(encode=(_worker_address,), search=(_no_answer,), encode_once=True)
        where = []
        for c in range(4):
            ((merged, rest),) = chunk_tasks(client, c, loaded, 10, chunk,
                                            (_encoded_where,)).items()
            where.append(merged.result())
            assert [p.result() for p in rest[1:3]] == [where[-1]] * 2  # each segment's search
            client.cancel([merged, *rest])
    assert where == [ws[0], ws[1], ws[0], ws[1]]
