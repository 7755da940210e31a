import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lshdist.errors import InputError, NotFittedError
from lshdist.index import MetricIndex, PermutationIndex
from lshdist.index.params import permutations_for, resolve_permutations
from lshdist.metric.learned import ExplicitMetric


def test_permutations_from_epsilon():
    assert permutations_for(10_000, 1.0) == 200  # ceil(2 * 10000^(1/2))
    assert permutations_for(60_000, 2.0) == int(np.ceil(2 * 60_000 ** (1 / 3)))
    assert resolve_permutations(100, epsilon=None, permutations=7) == 7
    with pytest.raises(InputError, match="epsilon=0"):
        permutations_for(10, 0)
    with pytest.raises(InputError, match="not both"):
        resolve_permutations(10, epsilon=1.0, permutations=3)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    W=st.integers(1, 5),
    bits=st.sampled_from([8, 64, 100, 200]),
    keep=st.sampled_from([0, 5]),
)
def test_bulk_sort_merge_equals_per_query_search(seed, W, bits, keep):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 8)).astype(np.float32)
    Q = np.vstack([rng.normal(size=(40, 8)), X[:5]]).astype(np.float32)  # exact duplicates too
    ix = MetricIndex(
        ExplicitMetric.identity(8),
        bits=bits,
        n_permutations=6,
        window=W,
        hamming_keep=keep,
        seed=seed,
    ).fit(X)
    qcodes = ix.family_.hash(Q)
    assert np.array_equal(
        ix.index_.candidates(qcodes, bulk=True), ix.index_.candidates(qcodes, bulk=False)
    )
    d1, i1 = ix.query(Q, 5, bulk=True)
    d2, i2 = ix.query(Q, 5, bulk=False)
    d3, i3 = ix.query(Q, 5, bulk=True, n_threads=3)
    assert np.array_equal(i1, i2) and np.array_equal(d1, d2)
    assert np.array_equal(i1, i3) and np.array_equal(d1, d3)


def test_window_positions_are_binary_search_positions():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 6)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(6), bits=64, n_permutations=3, window=2).fit(X)
    p = ix.index_
    q = rng.normal(size=(20, 6)).astype(np.float32)
    cand = p.candidates(ix.family_.hash(q))
    from lshdist.index.permutation import permutation_prefixes

    qp = permutation_prefixes(ix.family_.hash(q), p.positions_)
    for m in range(3):
        pos = np.searchsorted(p.sorted_prefix_[m], qp[m], side="left")
        for j in range(20):
            lo, hi = max(0, pos[j] - 2), min(500, pos[j] + 2)
            expect = p.sorted_rows_[m, lo:hi]
            got = cand[j, m * 4 : m * 4 + 4]
            assert np.array_equal(got[got >= 0], expect)


def test_window_positions_across_list_groups_are_search_positions(monkeypatch):
    # the join makes the queries' prefixes LIST_GROUP lists at a time: every group's positions
    # must land in its own columns (20 lists: groups of 16 + 4, and of 3 with a short last)
    import lshdist.index.permutation as perm

    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, 6)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(6), bits=128, n_permutations=20, window=2).fit(X)
    p = ix.index_
    qc = ix.family_.hash(rng.normal(size=(300, 6)).astype(np.float32))
    qp = perm.permutation_prefixes(qc, p.positions_)
    expect = np.stack([np.searchsorted(p.sorted_prefix_[m], qp[m], side="left")
                       for m in range(20)], axis=1)
    for group in (16, 3):
        monkeypatch.setattr(perm, "LIST_GROUP", group)
        for bulk in (True, False):
            pos, M = p.window_positions(qc, bulk=bulk)
            assert M == 20 and np.array_equal(pos, expect)


def test_scan_is_exact_and_hash_reranks_exactly():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(2000, 10)).astype(np.float32)
    Q = rng.normal(size=(50, 10)).astype(np.float32)
    A = np.eye(10) + 0.3 * np.ones((10, 10))
    m = ExplicitMetric(A)
    ids = np.arange(2000) * 3 + 7
    ix = MetricIndex(m, bits=64, n_permutations=20, window=4).fit(X, ids=ids)
    D = ((Q[:, None, :] - X[None]) @ A * (Q[:, None, :] - X[None])).sum(-1)
    d, i = ix.query(Q, 5, mode="scan")
    np.testing.assert_array_equal(i, ids[np.argsort(D, axis=1, kind="stable")[:, :5]])
    np.testing.assert_allclose(d, np.sort(D, axis=1)[:, :5], rtol=1e-4)
    dh, ih = ix.query(Q, 5)
    rows = (ih - 7) // 3
    np.testing.assert_allclose(dh, np.take_along_axis(D, rows, 1), rtol=1e-4)  # exact distances
    assert np.all(np.diff(dh, axis=1) >= 0)
    assert 0 < ix.stats_["reranked"].mean() <= 20 * 2 * 4


def test_same_seed_same_results():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 5)).astype(np.float32)
    a = (
        MetricIndex(ExplicitMetric.identity(5), bits=32, n_permutations=8, seed=11)
        .fit(X)
        .query(X[:30], 3)
    )
    b = (
        MetricIndex(ExplicitMetric.identity(5), bits=32, n_permutations=8, seed=11)
        .fit(X)
        .query(X[:30], 3)
    )
    assert np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0])


def test_bad_input():
    X = np.zeros((10, 4), np.float32)
    with pytest.raises(NotFittedError, match="not fitted"):
        MetricIndex(ExplicitMetric.identity(4)).query(X, 1)
    ix = MetricIndex(ExplicitMetric.identity(4), bits=16, n_permutations=2).fit(X)
    with pytest.raises(InputError, match="k=0: k must be >= 1"):
        ix.query(X, 0)
    with pytest.raises(InputError, match="X has 3 features, but the model was learned on 4"):
        ix.query(X[:, :3], 1)
    with pytest.raises(InputError, match="mode='fast'"):
        ix.query(X, 1, mode="fast")
    with pytest.raises(InputError, match="window=0"):
        PermutationIndex(n_permutations=2, window=0).fit(ix.index_.codes_, 16, ix.index_.payload_)


def test_sparse_implicit_rerank_is_the_learned_distance():
    import scipy.sparse as sp

    from lshdist.blocks import SparseBlock
    from lshdist.metric.itml import KernelITML

    rng = np.random.default_rng(0)
    X = SparseBlock.from_csr(sp.random(400, 3000, density=0.02, format="csr", random_state=0))
    m = KernelITML(n_basis=20, n_constraints=200).fit(X, rng.integers(0, 3, 400)).metric(d=3000)
    ix = MetricIndex(m, bits=64, n_permutations=10, window=8).fit(X)
    Q = X.take(np.arange(30))
    d, i = ix.query(Q, 5)
    np.testing.assert_allclose(d, np.take_along_axis(m.pairwise(Q, X), i, 1), atol=1e-5)
    ds, iscan = ix.query(Q, 5, mode="scan")
    np.testing.assert_allclose(ds, np.sort(m.pairwise(Q, X), axis=1)[:, :5], atol=1e-5)
    assert np.all(iscan[:, 0] == np.arange(30))  # each query is its own nearest point


def test_lsh_parameter_functions():
    from lshdist.index.params import collision_probability, max_candidates

    assert collision_probability(0.0) == 1.0
    assert collision_probability(np.pi / 2) == pytest.approx(0.5)
    assert max_candidates(160, 8) == 2560
    with pytest.raises(InputError, match="angle=4"):
        collision_probability(4)
    # the empirical bit agreement of Charikar's hash matches 1 - angle/pi
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 32)).astype(np.float32)
    angle = np.arccos(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    from lshdist.hashing import RandomHyperplanes

    P = RandomHyperplanes(d=32, bits=4096, seed=1).project(np.stack([a, b]))
    agree = np.mean((P[0] >= 0) == (P[1] >= 0))
    assert agree == pytest.approx(collision_probability(angle), abs=0.03)


def test_answers_do_not_depend_on_the_query_block(monkeypatch):
    # Bug caught: a block's answers written to the rows of another block (the queries are
    # searched in the order of their first permuted key, block by block).  Join blocks and
    # the candidate sub-blocks inside them, each short at the end, give the same answers.
    import lshdist.index.permutation as perm

    rng = np.random.default_rng(3)
    X = rng.normal(size=(800, 10)).astype(np.float32)
    Q = rng.normal(size=(700, 10)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(10), bits=128, n_permutations=8, window=4,
                     hamming_keep=12, seed=1).fit(X)
    whole = (*ix.query(Q, 5, mode="hash"), ix.stats_)
    monkeypatch.setattr(perm, "QUERY_BLOCK", 256)  # three blocks, the last one short
    assert perm.query_block(8) == 256
    blocked = (*ix.query(Q, 5, mode="hash"), ix.stats_)
    monkeypatch.setattr(perm, "SUB_BLOCK", 100)  # sub-blocks of 100, 100, 56 in a block
    assert perm.sub_block(8, 4, 12, 800) == 100
    sub = (*ix.query(Q, 5, mode="hash"), ix.stats_)
    for got in (blocked, sub):
        assert np.array_equal(whole[1], got[1]) and np.array_equal(whole[0], got[0])
        assert all(np.array_equal(whole[2][s], got[2][s]) for s in ("distinct", "reranked"))


def test_query_block_bounds_positions_and_sub_block_the_candidate_rows():
    from lshdist.index.permutation import (
        BLOCK_BYTES,
        QUERY_BLOCK,
        SUB_BLOCK,
        SUB_BYTES,
        query_block,
        sub_block,
    )

    assert query_block(96) == QUERY_BLOCK  # 96 positions a query: a full block
    many = query_block(4096)  # M = 4,096 lists: 32 KB of positions a query
    assert many * 4096 * 8 <= BLOCK_BYTES and many >= 256
    assert sub_block(96, 16, 120, 100_000) == SUB_BLOCK  # H rows a query: a full sub-block
    wide = sub_block(128, 64, 0, 10**6)  # every window entry kept: 16,384 rows a query
    assert wide * 16_384 * 8 <= SUB_BYTES and wide >= 16
    assert sub_block(128, 64, 0, 50) == SUB_BLOCK  # at most N distinct rows a query


def test_lists_that_would_not_fit_in_memory_are_refused(monkeypatch):
    """M lists of N rows take 12 M N bytes, and each build thread 40 N more; more than the
    memory available is refused with the size and the number of lists that fits, before
    anything is allocated (the default M = 2 sqrt(N) at 1,020,000 rows asked for 24.7 GB and
    the process was killed).  Bugs caught: the threads' temporaries not counted, a count of
    lists that does not fit suggested, nothing said when not even one list fits."""
    import lshdist.index.permutation as perm
    from lshdist.index.hyperplane import HyperplaneIndex

    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 6)).astype(np.float32)
    room = 12 * 64 * 1000 + 40 * 1000
    monkeypatch.setattr(perm, "available_memory", lambda: room - 1)
    with pytest.raises(InputError, match=r"the 64 permutation lists of 1,000 rows need 0\.0 GiB "
                                         r"with the build's temporaries, more than the 0\.0 GiB "
                                         r"of memory available: give fewer lists .*; 63 fit\)"):
        HyperplaneIndex(bits=64, n_permutations=64).fit(X)
    HyperplaneIndex(bits=64, n_permutations=63).fit(X)  # fits
    with pytest.raises(InputError, match="need"):  # two build threads: 40 bytes a row more
        HyperplaneIndex(bits=64, n_permutations=63).fit(X, n_threads=2)
    monkeypatch.setattr(perm, "available_memory", lambda: 40 * 1000 + 11 * 1000)
    with pytest.raises(InputError, match="give fewer rows per segment: not one list fits"):
        HyperplaneIndex(bits=64, n_permutations=1).fit(X)
    monkeypatch.setattr(perm, "available_memory", lambda: None)  # unknown: not refused
    HyperplaneIndex(bits=64, n_permutations=64).fit(X)
