"""Payload row selection and the order-independence of the bulk search."""

import numpy as np
import pytest
import scipy.sparse as sp

from lshdist._kernels.search import rerank_dense
from lshdist.index.hyperplane import MarginSparsePayload
from lshdist.index.payload import DensePayload, KernelPayload, csr_take
from lshdist.index.searcher import MetricIndex
from lshdist.metric.learned import ExplicitMetric


def _csr(n=30, d=50, seed=0):
    m = sp.random(n, d, density=0.1, format="lil", random_state=seed, dtype=np.float32)
    m[3, :] = 0  # an empty row
    m = sp.csr_matrix(m)
    m.eliminate_zeros()
    assert m.indptr[3] == m.indptr[4]
    return m.indptr.astype(np.int64), m.indices.astype(np.uint64), m.data.astype(np.float32)


def test_csr_take_index_array_equals_rows_one_by_one():
    indptr, indices, data = _csr()
    rows = np.array([7, 3, 3, 0, 29, 12])
    ptr, (ind, dat) = csr_take(indptr, (indices, data), rows)
    assert ptr[0] == 0 and len(ptr) == len(rows) + 1
    for j, r in enumerate(rows):
        lo, hi = indptr[r], indptr[r + 1]
        assert np.array_equal(ind[ptr[j]:ptr[j + 1]], indices[lo:hi])
        assert np.array_equal(dat[ptr[j]:ptr[j + 1]], data[lo:hi])
    # a slice gives the same as the equivalent array
    p1, (i1, d1) = csr_take(indptr, (indices, data), slice(5, 11))
    p2, (i2, d2) = csr_take(indptr, (indices, data), np.arange(5, 11))
    assert np.array_equal(p1, p2) and np.array_equal(i1, i2) and np.array_equal(d1, d2)


def test_payload_take_by_array():
    indptr, indices, data = _csr()
    n = len(indptr) - 1
    rng = np.random.default_rng(1)
    kp = KernelPayload(indptr, indices, data, rng.normal(size=(n, 4)), rng.random(n))
    rows = np.array([4, 1, 3])
    t = kp.take(rows)
    assert np.array_equal(t.cross, kp.cross[rows]) and np.array_equal(t.sx, kp.sx[rows])
    assert np.array_equal(np.diff(t.indptr), np.diff(indptr)[rows])
    ms = MarginSparsePayload(indptr, indices, data, rng.random(n))
    mt = ms.take(rows)
    assert np.array_equal(mt.inv_norm, ms.inv_norm[rows])
    assert np.array_equal(np.diff(mt.indptr), np.diff(indptr)[rows])
    dp = DensePayload(rng.normal(size=(n, 3)))
    assert np.array_equal(dp.take(rows).Z, dp.Z[rows])


def test_rerank_top_k_selection_equals_full_sort_with_ties():
    """The selection before the sort keeps the sorted prefix: many candidates with tied
    distances, the answer ordered by (distance, id) exactly as a full sort."""
    rng = np.random.default_rng(2)
    Z = rng.integers(0, 3, size=(400, 2)).astype(np.float32)  # many exact ties
    Zq = np.zeros((5, 2), np.float32)
    rows = np.concatenate([rng.permutation(400)[:200] for _ in range(5)]).astype(np.int64)
    offsets = np.arange(0, 1001, 200, dtype=np.int64)
    ids = rng.permutation(10_000)[:400].astype(np.int64)
    d, r = rerank_dense(offsets, rows, Z, Zq, 7, ids)
    for q in range(5):
        cand = rows[offsets[q]:offsets[q + 1]]
        dist = ((Z[cand] - Zq[q]) ** 2).sum(1).astype(np.float32)
        order = np.lexsort((ids[cand], dist))[:7]
        assert np.array_equal(r[q], cand[order])
        assert np.array_equal(d[q], dist[order])


def test_search_answers_do_not_depend_on_query_order_or_threads():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 16)).astype(np.float32)
    Q = rng.normal(size=(300, 16)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(16), n_permutations=8, window=4,
                     hamming_keep=40).fit(X)
    d1, i1 = ix.query(Q, 5, mode="hash")
    perm = rng.permutation(300)
    d2, i2 = ix.query(Q[perm], 5, mode="hash", n_threads=2)
    assert np.array_equal(i2, i1[perm]) and np.array_equal(d2, d1[perm])
    for j in (0, 17, 299):  # one at a time: no neighbouring queries
        dj, ij = ix.query(Q[j:j + 1], 5, mode="hash")
        assert np.array_equal(ij[0], i1[j]) and np.array_equal(dj[0], d1[j])


def test_dense_rerank_through_the_uint8_pass_and_a_pickle():
    """`DensePayload.rerank` with many candidates per query (the uint8 first pass) answers as
    `rerank_dense`; with few (the scan's k + 16) it makes no uint8 copy; a pickled payload
    arrives without its lock and copy and answers the same.  Bugs caught: the copy made for
    every re-rank (the scan paying for it), the lock pickled (a payload sent to a worker)."""
    import pickle

    rng = np.random.default_rng(4)
    Z = rng.normal(size=(2_000, 64)).astype(np.float32)
    q = DensePayload(rng.normal(size=(5, 64)))
    ids = rng.permutation(10**6)[:2_000].astype(np.int64)
    few = np.arange(0, 5 * 20 + 1, 20, dtype=np.int64)
    p = DensePayload(Z)
    rows = rng.integers(0, 2_000, size=100).astype(np.int64)
    p.rerank(few, rows, q, 10, ids)
    assert p._quantized is None
    many = np.arange(0, 5 * 300 + 1, 300, dtype=np.int64)
    rows = np.concatenate([rng.permutation(2_000)[:300] for _ in range(5)]).astype(np.int64)
    want = rerank_dense(many, rows, Z, q.Z, 10, ids)
    got = p.rerank(many, rows, q, 10, ids)
    assert p._quantized is not None
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    back = pickle.loads(pickle.dumps(p))
    assert back._quantized is None and np.array_equal(back.Z, Z)
    got = back.rerank(many, rows, q, 10, ids)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_uint8_copy_on_threads_equals_the_serial_kernel():
    """`quantize_parallel` (row ranges on threads; what `DensePayload.prepare` runs) gives
    `quantize_rows`' arrays and scale exactly, with uneven ranges and a column whose minimum
    and maximum fall in different ranges.  Bugs caught: bounds of one range only (rows of the
    other overflow the grid), the largest norm of one range in the scale, a range's rows left
    unfilled."""
    from lshdist._kernels.search import quantize_rows
    from lshdist.index.payload import quantize_parallel

    rng = np.random.default_rng(8)
    Z = (rng.normal(size=(12_301, 40)) * rng.uniform(0.1, 50, 40)).astype(np.float32)
    Z[5, 7], Z[12_300, 7] = -900.0, 900.0  # column 7's extremes at both ends
    Z[9_000] *= 30  # the largest row norm in the last range
    want = quantize_rows(Z)
    for threads in (1, 2, 3):
        got = quantize_parallel(Z, threads)
        for a, b in zip(got[:4], want[:4]):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        assert got[4] == want[4]
    p = DensePayload(Z)
    p.prepare(2)
    assert p._quantized is not None and np.array_equal(p._quantized[2], want[2])


@pytest.mark.parametrize("offset", [0.0, 1e3, 1e4, 1e5, 1e6, 1e7])
def test_exact_scan_far_from_the_origin(offset):
    """`scan_topk` gives the float64 neighbours (ties by row) of rows whose mean is large
    against their spread.  Bug caught: candidates from the float32 expansion |z|^2 - 2 q.z
    about the origin (20-d N(0, 1) + 1,000: 284 of 300 queries got other neighbours)."""
    from lshdist.index.scan import scan_topk

    rng = np.random.default_rng(3)
    X = (rng.normal(size=(5000, 20)) + offset).astype(np.float32)
    Q = (rng.normal(size=(300, 20)) + offset).astype(np.float32)
    _, ids = scan_topk(DensePayload(X), DensePayload(Q), 10)
    D = ((Q.astype(np.float64)[:, None] - X.astype(np.float64)[None]) ** 2).sum(-1)
    want = np.lexsort((np.broadcast_to(np.arange(len(X)), D.shape), D), axis=1)[:, :10]
    assert np.array_equal(ids, want)


@pytest.mark.parametrize("offset,spread", [(0.0, 1.0), (1e3, 1.0), (1e6, 1.0), (0.0, 1e4),
                                           (200.0, 60.0)])
def test_dense_scan_slack_bounds_the_scores(offset, spread):
    """`DensePayload.scan_slack`: every score plus the query's offset is within the slack of
    the float64 squared distance, and the re-rank's float32 distance within ``rel`` of it
    (relative).  Catches: the offset's sign or its 2 (q - c).c term, a bound over |q| instead
    of |q - c| that is too small for rows far from the origin, gamma_d taken for d = 1."""
    rng = np.random.default_rng(5)
    d = 48
    X = (rng.normal(size=(3000, d)) * spread + offset).astype(np.float32)
    Q = (rng.normal(size=(40, d)) * spread + offset).astype(np.float32)
    X[7] *= 3.0  # one long row: the bound takes the largest
    p, qp = DensePayload(X), DensePayload(Q)
    S = p.distances(qp).astype(np.float64)
    offset_q, slack, rel = p.scan_slack(qp)
    exact = ((Q.astype(np.float64)[:, None] - X.astype(np.float64)[None]) ** 2).sum(-1)
    err = np.abs(S + offset_q[:, None] - exact)
    assert np.all(err <= slack[:, None])
    assert err.max() > 1e-3 * slack.min()  # the bound is not vacuous: within 1000x of errors
    rows = np.tile(np.arange(3000), 40)
    offs = np.arange(0, 40 * 3000 + 1, 3000, dtype=np.int64)
    got, ids = rerank_dense(offs, rows, X, Q, 3000, np.arange(3000, dtype=np.int64))
    want = np.take_along_axis(exact, ids, axis=1)
    assert np.all(np.abs(got - want) <= rel * want + 1e-30)


def test_float64_payloads_scan_slack_covers_their_rerank():
    """The kernel and margin payloads' slack covers the difference between their float64
    `distances` and their re-rank, so the exact scan re-ranks every row it must."""
    from lshdist.index.hyperplane import MarginDensePayload

    rng = np.random.default_rng(9)
    X = rng.normal(size=(500, 30)).astype(np.float32)
    W = rng.normal(size=(8, 30))
    W[0] = X[3] @ np.eye(30)  # a normal whose margin to some row is far from 0
    pts = MarginDensePayload(X)
    qs = MarginDensePayload(W, 1.0 / np.linalg.norm(W, axis=1))
    D = pts.distances(qs)
    offset, slack, rel = pts.scan_slack(qs)
    assert np.all(offset == 0) and np.all(slack > 0) and rel > 0
    rows = np.tile(np.arange(500), 8)
    offs = np.arange(0, 8 * 500 + 1, 500, dtype=np.int64)
    got, ids = pts.rerank(offs, rows, qs, 500, np.arange(500, dtype=np.int64))
    want = np.take_along_axis(D, ids, axis=1)
    assert np.all(np.abs(got - want) <= slack[:, None] + rel * np.abs(want))


def test_threaded_scan_holds_blas_to_one_thread_per_thread(monkeypatch):
    """A scan on several threads runs each block's product on one BLAS thread (two 2-thread
    products on 2 cores ran 1.7x slower), the same answers as one thread, and the limit is
    lifted after.  Bug caught: the limit dropped, or left on after the scan."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from lshdist.index.scan import scan_topk

    def blas_threads():
        return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    seen: list[int] = []
    distances = DensePayload.distances

    def recording(self, query):
        seen.append(blas_threads())
        return distances(self, query)

    rng = np.random.default_rng(2)
    X = rng.normal(size=(3000, 24)).astype(np.float32)
    Q = rng.normal(size=(300, 24)).astype(np.float32)
    want = scan_topk(DensePayload(X), DensePayload(Q), 5)
    monkeypatch.setattr(DensePayload, "distances", recording)
    with threadpool_limits(2, user_api="blas"):
        got = scan_topk(DensePayload(X), DensePayload(Q), 5, block=64, n_threads=2)
        assert len(seen) == 5 and set(seen) == {1}
        assert blas_threads() == 2
        seen.clear()
        scan_topk(DensePayload(X), DensePayload(Q), 5, block=64)
        assert set(seen) == {2}
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])


def test_rows_beyond_float32_distances_are_refused():
    """Rows whose squared distances overflow float32 cannot be ranked by the re-rank (every
    distance inf, ties by id): refused with what to do.  Rows near that range but within it
    are scanned exactly (the bound grows, the answer stays the re-rank's)."""
    from lshdist.errors import InputError
    from lshdist.index.scan import scan_topk

    rng = np.random.default_rng(4)
    big = (rng.normal(size=(200, 8)) * 1e19).astype(np.float32)
    with pytest.raises(InputError, match=r"exceeds float32's range.*scale the data down"):
        DensePayload(big).prepare()
    X = (rng.normal(size=(200, 8)) * 1e17).astype(np.float32)
    Q = (rng.normal(size=(5, 8)) * 1e17).astype(np.float32)
    _, ids = scan_topk(DensePayload(X), DensePayload(Q), 3)
    D = ((Q.astype(np.float64)[:, None] - X.astype(np.float64)[None]) ** 2).sum(-1)
    assert np.array_equal(ids, np.argsort(D, axis=1, kind="stable")[:, :3])


def test_exact_scan_of_rows_near_float32_underflow():
    """Rows whose differences underflow float32 (spread ~1e-23): the scan's slack carries an
    absolute term for subnormal results, so the answer is a re-rank of every row's.  Bug
    caught: a purely relative bound (13-27 of 40 queries other rows)."""
    from lshdist.index.scan import scan_topk

    rng = np.random.default_rng(5)
    for m, s, d in [(0.0, 3e-23, 1), (0.0, 3e-23, 4), (1e-18, 1e-24, 20)]:
        X = (m + rng.normal(size=(500, d)) * s).astype(np.float32)
        Q = (m + rng.normal(size=(40, d)) * s).astype(np.float32)
        offs = np.arange(0, 40 * 500 + 1, 500, dtype=np.int64)
        rows = np.tile(np.arange(500, dtype=np.int64), 40)
        want = rerank_dense(offs, rows, X, Q, 3, np.arange(500, dtype=np.int64))
        got = scan_topk(DensePayload(X), DensePayload(Q), 3)
        assert np.array_equal(got[1], want[1])


def test_rows_far_from_the_origin_keep_few_candidates():
    """Rows far from the origin against their spread are multiplied centred, so the scan's
    rounding bound stays below the gaps between neighbours and few rows are re-ranked, with the
    float64 neighbours as the answer.  Bug caught: the product over uncentred rows, whose bound
    (~u |q - c| |z|) re-ranked every row at 10^6."""
    from lshdist._kernels.search import scan_thresholds
    from lshdist.index.scan import scan_topk

    rng = np.random.default_rng(6)
    for offset in (0.0, 1e6):
        X = (rng.normal(size=(5000, 20)) + offset).astype(np.float32)
        Q = (rng.normal(size=(100, 20)) + offset).astype(np.float32)
        p, qp = DensePayload(X), DensePayload(Q)
        assert (p._centred()[2] is None) == (offset == 0.0)  # a copy for far rows only
        o, slack, rel = p.scan_slack(qp)
        _, counts, _ = scan_thresholds(p.distances(qp), 10, 26, o, slack, rel, 104)
        assert counts.max() < 100, counts.max()
        _, ids = scan_topk(p, qp, 10)
        D = ((Q.astype(np.float64)[:, None] - X.astype(np.float64)[None]) ** 2).sum(-1)
        assert np.array_equal(ids, np.argsort(D, axis=1, kind="stable")[:, :10])


@pytest.mark.parametrize("mode", ["scan", "hash"])
def test_queries_beyond_float32_distances_are_refused(mode):
    """A query whose learned distance to its neighbours overflows float32 (every one inf,
    ranked by id — what both searches returned before) is refused with what to do, by the
    scan and the hashed search alike; the other queries of a batch are not answered
    silently around it (the whole call refuses).  A query far from the rows but within the
    range is answered exactly."""
    from lshdist.errors import InputError

    rng = np.random.default_rng(5)
    X = rng.normal(size=(2000, 16)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(16), seed=0).fit(X)
    Q = rng.normal(size=(5, 16)).astype(np.float32)
    Q[2] *= 1e19
    with pytest.raises(InputError, match=r"float32's range.*cannot be ranked.*scale"):
        ix.query(Q, 3, mode=mode)
    Q[2] = rng.normal(size=16) * 1e3  # far from the rows, within range: exact neighbours
    d, ids = ix.query(Q, 3, mode="scan")
    D = ((Q.astype(np.float64)[:, None] - X.astype(np.float64)[None]) ** 2).sum(-1)
    assert np.isfinite(d).all()
    assert np.array_equal(ids[2], np.argsort(D[2], kind="stable")[:3])


def test_kernel_distances_beyond_float32_are_refused():
    """The kernel payload's float64 distances, returned as float32, are refused past its range
    too (here a query's self-similarity of 1e40), not answered as inf ranked by id."""
    from lshdist.errors import InputError
    from lshdist.index.scan import scan_topk

    indptr, indices, data = _csr()
    n = len(indptr) - 1
    pool = KernelPayload(indptr, indices, data, np.zeros((n, 4)), np.ones(n))
    q = KernelPayload(indptr[:2], indices[: indptr[1]], data[: indptr[1]], np.zeros((1, 4)),
                      np.array([1e40]))
    with pytest.raises(InputError, match=r"float32's range.*cannot be ranked"):
        scan_topk(pool, q, 2)
    q.sx[0] = 1.0  # the same query within range
    d, _ = scan_topk(pool, q, 2)
    assert np.isfinite(d).all()
