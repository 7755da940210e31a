"""`lshdist._kernels.search` against plain numpy references.

Ids never rise with rows here (a shuffled, non-contiguous sample of 0..10**6), data are small
integers (float arithmetic is exact, so distances tie exactly and references are exact), and
duplicate rows make equal distances.  Each test names the plausible bug it catches; each was
checked once by planting that bug.
"""

import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from lshdist._kernels.search import (
    collect_candidates,
    collect_windows,
    quantize_rows,
    rerank_dense,
    rerank_dense_quantized,
    rerank_sparse,
    rows_within,
    scan_thresholds,
    window_candidates,
    window_positions_bsearch,
    window_positions_merge,
)


def shuffled_ids(rng, n: int) -> np.ndarray:
    """Distinct int64 ids that do not rise with rows."""
    return rng.permutation(10**6)[:n].astype(np.int64)


def random_csr_candidates(rng, Q: int, N: int, max_len: int):
    """Per-query distinct candidate rows (as `collect_candidates` gives them): some queries
    with none, some with fewer than k."""
    lens = rng.integers(0, min(max_len, N) + 1, size=Q)
    lens[0] = 0
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    rows = np.concatenate([rng.permutation(N)[:n] for n in lens]).astype(np.int64)
    return offsets, rows


def topk_reference(dist_rows, rows, ids, k):
    """Smallest k by (distance, id): ``np.lexsort((ids, dist))``; inf / -1 padded."""
    d = np.full(k, np.inf, np.float32)
    r = np.full(k, -1, np.int64)
    order = np.lexsort((ids[rows], dist_rows))[:k]
    d[: len(order)] = dist_rows[order]
    r[: len(order)] = rows[order]
    return d, r


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), W=st.integers(1, 4), N=st.integers(1, 40))
def test_window_candidates_match_numpy(seed, W, N):
    # Bugs caught: the window off by one (pos - W + 1 .. pos + W); side='right' in the merge
    # (queries equal to a list entry); windows running past either end not padded with -1.
    rng = np.random.default_rng(seed)
    M, Q = 3, 12
    sorted_prefix = np.sort(rng.integers(0, 8, size=(M, N)).astype(np.uint64), axis=1)  # dups
    sorted_rows = np.stack([rng.permutation(N) for _ in range(M)]).astype(np.int32)
    qprefix = rng.integers(0, 10, size=(M, Q)).astype(np.uint64)  # below, at and above the list
    expect = np.full((Q, M * 2 * W), -1, np.int64)
    for m in range(M):
        pos = np.searchsorted(sorted_prefix[m], qprefix[m], side="left")
        for q in range(Q):
            for t in range(2 * W):
                j = pos[q] - W + t
                if 0 <= j < N:
                    expect[q, m * 2 * W + t] = sorted_rows[m, j]
    by_search = window_positions_bsearch(sorted_prefix, qprefix)
    assert np.array_equal(window_candidates(by_search, sorted_rows, W), expect)
    qorder = np.argsort(qprefix, axis=1, kind="stable").astype(np.int64)
    by_merge = window_positions_merge(sorted_prefix, qprefix, qorder)
    assert np.array_equal(by_merge, by_search)
    assert np.array_equal(window_candidates(by_merge, sorted_rows, W), expect)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), W=st.integers(1, 5), N=st.integers(1, 50),
       keep=st.integers(0, 14), bits=st.sampled_from([3, 64, 130]))
def test_collect_windows_is_collect_candidates_of_the_windows(seed, W, N, keep, bits):
    # Bugs caught: a window bound off by one at either end of a list (pos - W < 0, pos + W > N);
    # the branch-free de-dup counting an entry seen earlier (the stamp written before the
    # comparison); the stamp of query 0 equal to the initial mark; lists walked in another
    # order (discovery order decides ties at the Hamming cut).
    rng = np.random.default_rng(seed)
    M, Q = 4, 9
    words = (bits + 63) // 64
    codes = rng.integers(0, 2**63, size=(N, words), dtype=np.int64).astype(np.uint64)
    codes[:, -1] &= np.uint64(~((1 << (words * 64 - bits)) - 1) & (2**64 - 1))
    codes[rng.integers(0, N, N // 3)] = codes[0]  # equal keys: ties at the cut
    qcodes = codes[rng.integers(0, N, Q)]
    sorted_rows = np.stack([rng.permutation(N) for _ in range(M)]).astype(np.int32)
    pos = rng.integers(0, N + 1, size=(Q, M)).astype(np.int64)  # at both ends too
    got = collect_windows(pos, sorted_rows, W, codes, qcodes, keep)
    expect = collect_candidates(window_candidates(pos, sorted_rows, W), codes, qcodes, keep)
    for g, e in zip(got, expect):
        assert np.array_equal(g, e)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), keep=st.integers(0, 12), bits=st.sampled_from([3, 64, 130]))
def test_collect_candidates_matches_numpy(seed, keep, bits):
    # Bugs caught: a candidate repeated across lists kept twice (the stamp not per query);
    # the Hamming cut off by one (keeping keep+1 or keep-1 rows, or the wrong rows at the cut
    # distance); the last word of a 130-bit key ignored.
    rng = np.random.default_rng(seed)
    words = (bits + 63) // 64
    codes = rng.integers(0, 2**63, size=(40, words), dtype=np.int64).astype(np.uint64)
    codes[:, -1] &= np.uint64(~((1 << (words * 64 - bits)) - 1) & (2**64 - 1))  # b bits only
    qcodes = codes[rng.integers(0, 40, 3)]
    cand = rng.integers(-1, 40, size=(3, 25))
    off, rows, distinct = collect_candidates(cand, codes, qcodes, keep)
    for q in range(3):
        seen = list(dict.fromkeys(v for v in cand[q].tolist() if v >= 0))  # discovery order
        assert distinct[q] == len(seen)
        if keep and len(seen) > keep:
            ham = [sum(bin(int(a) ^ int(b)).count("1") for a, b in zip(codes[v], qcodes[q]))
                   for v in seen]
            order = np.argsort(ham, kind="stable")[:keep]
            expect = sorted([seen[i] for i in order], key=seen.index)
        else:
            expect = seen
        assert rows[off[q] : off[q + 1]].tolist() == expect


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), k=st.integers(1, 12), kk=st.integers(0, 30),
       n=st.integers(1, 60), dtype=st.sampled_from([np.float32, np.float64]))
def test_scan_thresholds_and_rows_within_match_numpy(seed, k, kk, n, dtype):
    # Bugs caught: the k-th score taken as the (k+1)-th; the kk-th smallest score not a floor
    # (fewer than k + 16 rows kept); the relative term on the score instead of the distance
    # (score + offset); rows at exactly the threshold dropped (ties with the k-th row).
    rng = np.random.default_rng(seed)
    D = rng.integers(-3, 5, size=(5, n)).astype(dtype)  # many ties
    offset = rng.uniform(0, 10, 5)
    slack = rng.choice([0.0, 0.25, 1.0], 5)
    rel = float(rng.choice([0.0, 0.01, 0.1]))
    cap = int(rng.integers(1, 20))
    thr, counts, buf = scan_thresholds(D, k, k + kk, offset, slack, rel, cap)
    S = np.sort(D.astype(np.float64), axis=1)
    kq = min(k, n)
    vk = S[:, kq - 1]
    floor = S[:, max(kq, min(k + kk, n)) - 1]
    scale = np.maximum(vk + offset, 0) + slack
    want = np.maximum(floor, vk + 2 * slack + 2 * rel * scale / (1 - rel))
    assert np.array_equal(thr, want)
    assert np.array_equal(counts, (D.astype(np.float64) <= want[:, None]).sum(1))
    off, rows = rows_within(D, thr, int(counts.sum()))
    for q in range(5):
        assert rows[off[q]:off[q + 1]].tolist() == np.flatnonzero(D[q] <= want[q]).tolist()
        first = np.flatnonzero(D[q] <= want[q])[:cap]
        assert buf[q, :len(first)].tolist() == first.tolist() and np.all(buf[q, len(first):] == -1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), k=st.integers(1, 12))
def test_rerank_dense_matches_numpy(seed, k):
    # Bugs caught: ties by row (or by discovery order) instead of by id; a query's CSR slice off
    # by one (offsets[q] .. offsets[q+1]); padding of queries with fewer than k candidates.
    rng = np.random.default_rng(seed)
    N, d, Q = 50, 3, 7
    Z = rng.integers(-2, 3, size=(N, d)).astype(np.float32)
    Z[rng.integers(0, N, 20)] = Z[0]  # duplicate rows: exact ties
    Zq = np.vstack([Z[:3], rng.integers(-2, 3, size=(Q - 3, d))]).astype(np.float32)
    ids = shuffled_ids(rng, N)
    offsets, rows = random_csr_candidates(rng, Q, N, 30)
    got_d, got_r = rerank_dense(offsets, rows, Z, Zq, k, ids)
    for q in range(Q):
        r = rows[offsets[q] : offsets[q + 1]]
        dist = ((Z[r].astype(np.float64) - Zq[q]) ** 2).sum(1)
        ed, er = topk_reference(dist, r, ids, k)
        assert np.array_equal(got_d[q], ed) and np.array_equal(got_r[q], er)


def test_quantize_rows_grid_and_errors():
    """``lo + step u`` is within ``err`` of each row (float64 reference), ``err <= |step|/2``,
    a constant column has step 0 and is exact, u spans 0..255.  Bugs caught: step from the
    range / 256 (u overflows at the maximum), truncation instead of rounding (err up to a
    whole step), err of the float32 grid point instead of the exact one."""
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(300, 40)).astype(np.float32) * np.linspace(0.01, 100, 40)
    Z[:, 3] = 7.25  # constant column
    lo, step, U, err, scale = quantize_rows(Z)
    grid = lo.astype(np.float64) + step.astype(np.float64) * U
    ref = np.sqrt(((Z.astype(np.float64) - grid) ** 2).sum(1))
    np.testing.assert_allclose(err, ref, rtol=1e-12, atol=1e-12)
    assert np.all(err <= 0.5 * np.linalg.norm(step.astype(np.float64)) * (1 + 1e-9))
    assert step[3] == 0 and np.all(U[:, 3] == 0) and lo[3] == np.float32(7.25)
    assert U.min() == 0 and U.max() == 255 and U.dtype == np.uint8
    assert scale >= np.linalg.norm(Z.astype(np.float64), axis=1).max()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), k=st.integers(1, 12), kind=st.sampled_from(
    ["ties", "real", "offset", "near"]))
def test_rerank_dense_quantized_is_rerank_dense_bit_for_bit(seed, k, kind):
    """The pruned re-rank returns `rerank_dense`'s distances and rows exactly: integer rows
    with duplicate rows (exact ties), real-valued rows, rows far from 0 (rounding of large
    magnitudes), and many candidates at nearly the same distance (near-ties within the grid's
    error), with queries of more and fewer than 4k candidates.  Bugs caught: the bound
    without the row's grid error (a near neighbour pruned), the k-th smallest *lower* bound as
    the cut (pruning rows that can still be in the top k), ties broken among survivors only
    when a tied row was pruned.  (The kernel's float32 rounding slack ``tau`` is a margin no
    case here needs: rows at 1e4 from 0 pass without it.)"""
    rng = np.random.default_rng(seed)
    N, d, Q = 400, 48, 9
    if kind == "ties":
        Z = rng.integers(-3, 4, size=(N, d)).astype(np.float32)
        Z[rng.integers(0, N, 80)] = Z[0]
    elif kind == "real":
        Z = (rng.normal(size=(N, d)) * rng.uniform(0.1, 5, d)).astype(np.float32)
    elif kind == "offset":
        Z = (rng.normal(size=(N, d)) + 1e4).astype(np.float32)
    else:  # every row on a sphere around the first query, radius 10 +- 1e-4
        dirs = rng.normal(size=(N, d))
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        Z = (10.0 + 1e-4 * rng.normal(size=(N, 1))) * dirs
        Z = Z.astype(np.float32)
    Zq = np.vstack([np.zeros((1, d)), Z[1:3], rng.normal(size=(Q - 3, d)) * Z.std()
                    + Z.mean(0)]).astype(np.float32)
    ids = shuffled_ids(rng, N)
    offsets, rows = random_csr_candidates(rng, Q, N, 300)
    want_d, want_r = rerank_dense(offsets, rows, Z, Zq, k, ids)
    got_d, got_r, exact = rerank_dense_quantized(offsets, rows, Z, Zq, k, ids,
                                                 *quantize_rows(Z))
    assert np.array_equal(got_d, want_d) and np.array_equal(got_r, want_r)
    n = np.diff(offsets)
    assert np.all(exact <= n) and np.all(exact >= np.minimum(n, k))


def test_rerank_dense_quantized_prunes_on_fashion(fashion):
    """On Fashion-MNIST rows (784 pixels, centred), 200 candidates per query: the answer is
    `rerank_dense`'s and the exact distance is computed for few of them (measured: a median
    of 10 of 200 for k = 10, the 90th percentile 11) -- the point of the uint8 pass."""
    X = fashion.X_train[:20_000].astype(np.float32)
    Z = X - X.mean(0)
    Zq = fashion.X_test[:200].astype(np.float32) - X.mean(0)
    # candidates like a search's: the 200 nearest by a noisy distance
    D = ((Zq[:, None, :64] - Z[None, :, :64]) ** 2).sum(-1)
    rows = np.argsort(D, axis=1)[:, :200].ravel().astype(np.int64)
    offsets = np.arange(0, rows.size + 1, 200, dtype=np.int64)
    ids = np.arange(len(Z), dtype=np.int64)
    want_d, want_r = rerank_dense(offsets, rows, Z, Zq, 10, ids)
    got_d, got_r, exact = rerank_dense_quantized(offsets, rows, Z, Zq, 10, ids,
                                                 *quantize_rows(Z))
    assert np.array_equal(got_d, want_d) and np.array_equal(got_r, want_r)
    assert np.median(exact) < 25, np.median(exact)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), k=st.integers(1, 10))
def test_rerank_sparse_matches_numpy(seed, k):
    # Bugs caught: the query's dense buffer not cleared between queries (stale features of the
    # previous query); the cross term's sign or factor 2; a query feature that no database row
    # has (qlocal = -1) read as feature 0; ties by row instead of by id.
    rng = np.random.default_rng(seed)
    N, F, extra, c, Q = 40, 12, 3, 4, 6
    Xd = rng.integers(-2, 3, size=(N, F)) * (rng.random((N, F)) < 0.4)
    Xd[rng.integers(0, N, 12)] = Xd[1]  # duplicate rows: exact ties
    Kx = rng.integers(-2, 3, size=(N, c))
    Kx[(Xd == Xd[1]).all(1)] = Kx[1]
    B = rng.integers(-1, 2, size=(c, c))
    Qm = (B @ B.T).astype(np.float64)  # PSD: learned distances are >= 0
    # queries over F + extra features; the extra ones are in no database row
    Qd = rng.integers(-2, 3, size=(Q, F + extra)) * (rng.random((Q, F + extra)) < 0.5)
    Qd[0, :F], Qd[0, F:] = Xd[1], 0  # a query equal to a duplicated row
    Kq = rng.integers(-2, 3, size=(Q, c))
    Kq[0] = Kx[1]
    X = sp.csr_matrix(Xd.astype(np.float32))
    Xq = sp.csr_matrix(Qd.astype(np.float32))
    sx = (Xd**2).sum(1) + np.einsum("ij,jk,ik->i", Kx, Qm, Kx)
    sq = (Qd**2).sum(1) + np.einsum("ij,jk,ik->i", Kq, Qm, Kq)
    zq = Kq @ Qm
    qlocal = np.where(Xq.indices < F, Xq.indices, -1).astype(np.int32)
    ids = shuffled_ids(rng, N)
    offsets, rows = random_csr_candidates(rng, Q, N, 25)
    got_d, got_r = rerank_sparse(
        offsets, rows, X.indptr.astype(np.int64), X.indices.astype(np.int32), X.data, F,
        Kx.astype(np.float32), sx.astype(np.float64), Xq.indptr.astype(np.int64), qlocal,
        Xq.data, zq.astype(np.float64), sq.astype(np.float64), k, ids,
    )
    Xfull = np.hstack([Xd, np.zeros((N, extra))])
    for q in range(Q):
        r = rows[offsets[q] : offsets[q + 1]]
        diff, kd = Xfull[r] - Qd[q], Kx[r] - Kq[q]
        dist = (diff**2).sum(1) + np.einsum("ij,jk,ik->i", kd, Qm, kd)
        ed, er = topk_reference(dist, r, ids, k)
        assert np.array_equal(got_d[q], ed) and np.array_equal(got_r[q], er), q
