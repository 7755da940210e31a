"""`SubspaceIndex`: the partition, the exact re-rank, recall against the exact scan, determinism.

Synthetic data with subspace structure: four mutually orthogonal 4-dimensional subspaces of R^64
holding 1/2, 1/4, 1/8, 1/8 of the points (Gaussian coefficients, scale 10), plus noise of norm
about α = 0.5.  Ids are a random permutation (they do not rise with rows).
"""

import numpy as np
import pytest

from lshdist.errors import InputError, NotFittedError
from lshdist.index.payload import DensePayload
from lshdist.index.scan import scan_topk
from lshdist.index.subspace import SubspaceIndex
from lshdist.metric.learned import ExplicitMetric

ALPHA = 0.5


def _synth(n, d=64, k=4, alpha=ALPHA, seed=0):
    rng = np.random.default_rng(seed)
    sizes = [n // 2, n // 4, n // 8, n - n // 2 - n // 4 - n // 8]
    bases = np.linalg.qr(rng.standard_normal((d, 4 * k)))[0]
    X, lab = [], []
    for i, s in enumerate(sizes):
        C = rng.standard_normal((s, k)) * 10
        noise = rng.standard_normal((s, d)) * alpha / np.sqrt(d)
        X.append(C @ bases[:, i * k : (i + 1) * k].T + noise)
        lab += [i] * s
    perm = rng.permutation(n)
    return np.vstack(X).astype(np.float32)[perm], np.array(lab)[perm]


@pytest.fixture(scope="module")
def data():
    X, lab = _synth(4400)
    ids = np.random.default_rng(7).permutation(10_000)[:4000].astype(np.int64)
    return X[:4000], lab[:4000], X[4000:], ids


def _recall(I, It):
    return float(np.mean([len(set(a) & set(b)) / It.shape[1] for a, b in zip(I, It)]))


def test_partition_finds_the_subspaces(data):
    X, lab, _, ids = data
    ix = SubspaceIndex(rank=4, bits=16, alpha=ALPHA, eta=0.1, seed=0).fit(X, ids)
    thr = np.sqrt(2) * 1.1 * ALPHA
    assert [r.threshold for r in ix.rounds_] == pytest.approx([thr] * len(ix.rounds_))
    # round 0 captures the half, round 1 the quarter (each whole and pure: noise ~0.48 < 0.78);
    # the two eighths are equal in energy: the third round's subspace mixes them, captures ~nobody
    assert [r.captured for r in ix.rounds_[:2]] == list(np.bincount(lab)[:2])
    for g, want in zip(ix.groups_[:2], [0, 1]):
        assert np.all(lab[g.rows] == want)
    assert ix.groups_[-1].final and sum(ix.group_sizes_) == 4000
    rows = np.concatenate([g.rows for g in ix.groups_])
    assert np.array_equal(np.sort(rows), np.arange(4000))  # a partition
    for g in ix.groups_:  # members sorted by id (Hamming ties by id)
        assert np.all(np.diff(ids[g.rows]) > 0)


def test_estimated_alpha_log_rounds(data):
    X, lab, _, _ = data
    ix = SubspaceIndex(rank=4, bits=16, alpha=None, eta=0.1, min_group=32, seed=0).fit(X)
    for r in ix.rounds_:  # threshold (1+eta) * median: at least half of what remains
        assert r.threshold == pytest.approx(np.sqrt(2) * 1.1 * r.alpha)
        assert r.captured >= r.remaining / 2
    assert len(ix.rounds_) <= int(np.ceil(np.log2(4000 / 32))) + 1
    # the first two groups are the two largest subspaces
    assert np.mean(lab[ix.groups_[0].rows] == 0) > 0.99
    assert np.mean(lab[ix.groups_[1].rows] == 1) > 0.99


def test_rerank_is_exact_when_everything_is_searched(data):
    """All groups probed, every member re-ranked: the exact scan, ids and distances (ties by id
    included: the queries hold duplicates of database rows, and the database duplicates)."""
    X, _, Xq, ids = data
    Xd = np.vstack([X, X[:50]])
    idd = np.concatenate([ids, 20_000 - np.arange(50)])
    Q = np.vstack([Xq[:60], X[:20]])
    for metric in [None, _metric(64)]:
        ix = SubspaceIndex(rank=4, bits=8, alpha=ALPHA, metric=metric, seed=1).fit(Xd, idd)
        D, I = ix.query(Q, 7, n_probe=len(ix.groups_), n_candidates=len(Xd))
        assert np.all(ix.stats_["reranked"] == len(Xd))
        m = metric or ExplicitMetric.identity(64)
        Dt, It = scan_topk(DensePayload(m.transform(Xd)), DensePayload(m.transform(Q)), 7,
                           ids=idd)
        assert np.array_equal(I, It)
        assert np.allclose(D, Dt, rtol=1e-5, atol=1e-4)


def _metric(d, seed=3):
    rng = np.random.default_rng(seed)
    L = np.eye(d) + 0.3 * rng.standard_normal((d, d)) / np.sqrt(d)
    return ExplicitMetric(L @ L.T)


def test_recall_against_exact_scan(data):
    X, _, Xq, ids = data
    _, It = scan_topk(DensePayload(X), DensePayload(Xq), 10, ids=ids)
    recalls = {}
    for bits in (8, 32):
        ix = SubspaceIndex(rank=4, bits=bits, alpha=ALPHA, n_candidates=40, seed=0).fit(X, ids)
        _, I = ix.query(Xq, 10)
        recalls[bits] = _recall(I, It)
        reranked = ix.stats_["reranked"].mean()
    # measured: 0.379 (8 bits), 0.693 (32 bits), 40 re-ranked per query (1% of the database);
    # the random baseline: 0.011
    assert recalls[8] >= 0.33 and recalls[32] >= 0.64, recalls
    assert recalls[32] > recalls[8]
    # baseline: the same number of random candidates, re-ranked exactly, fails the bar
    rng = np.random.default_rng(0)
    hits: list[float] = []
    for q in range(len(Xq)):
        rows = rng.choice(len(X), round(reranked), replace=False)
        d = ((X[rows] - Xq[q]) ** 2).sum(1)
        top = ids[rows[np.lexsort((ids[rows], d))[:10]]]
        hits.append(len(set(top) & set(It[q])) / 10)
    assert np.mean(hits) < 0.1, np.mean(hits)


def test_learned_metric_partitions_gx(data):
    """Under an explicit metric the index is the L2 index of G x: same groups, same answers."""
    X, _, Xq, ids = data
    m = _metric(64)
    a = SubspaceIndex(rank=4, bits=16, metric=m, seed=2, n_candidates=30).fit(X, ids)
    b = SubspaceIndex(rank=4, bits=16, seed=2, n_candidates=30).fit(m.transform(X), ids)
    assert a.group_sizes_ == b.group_sizes_
    for ga, gb in zip(a.groups_, b.groups_):
        assert np.array_equal(ga.rows, gb.rows) and np.array_equal(ga.codes, gb.codes)
    Da, Ia = a.query(Xq, 5)
    Db, Ib = b.query(m.transform(Xq), 5)
    assert np.array_equal(Ia, Ib) and np.array_equal(Da, Db)
    # and it is not the L2 index of x (the metric changes the answers)
    _, Ic = SubspaceIndex(rank=4, bits=16, seed=2, n_candidates=30).fit(X, ids).query(Xq, 5)
    assert not np.array_equal(Ia, Ic)


def test_same_seed_same_index(data):
    X, _, Xq, ids = data
    runs = [SubspaceIndex(rank=4, bits=16, seed=s).fit(X, ids) for s in (5, 5, 6)]
    for ga, gb in zip(runs[0].groups_, runs[1].groups_):
        assert np.array_equal(ga.rows, gb.rows) and np.array_equal(ga.codes, gb.codes)
    r0, r1, _ = (r.query(Xq, 5) for r in runs)
    assert np.array_equal(r0[1], r1[1]) and np.array_equal(r0[0], r1[0])
    assert not all(np.array_equal(a.codes, b.codes)
                   for a, b in zip(runs[0].groups_, runs[2].groups_))


def test_small_groups_probe_until_k_rows():
    X, _ = _synth(400)
    ix = SubspaceIndex(rank=4, bits=8, alpha=ALPHA, min_group=8, seed=0).fit(X)
    _, I = ix.query(X[:40], 300, n_candidates=1000)
    assert np.all(I >= 0)  # enough groups probed to hold k rows
    sizes = np.array(ix.group_sizes_)
    held = np.cumsum(sizes[np.argsort(ix.route(X[:40]), axis=1, kind="stable")], axis=1)
    probed = ix.stats_["probed"]
    assert probed.max() >= 2  # some queries needed more than their nearest group
    for q, p in enumerate(probed):  # the fewest nearest groups that hold k rows
        assert held[q, p - 1] >= 300 and (p == 1 or held[q, p - 2] < 300)


def test_errors(data):
    X, _, Xq, _ = data
    with pytest.raises(NotFittedError, match="not fitted"):
        SubspaceIndex().query(Xq, 1)
    with pytest.raises(InputError, match="rank=65: the subspaces cannot exceed the data's d=64"):
        SubspaceIndex(rank=65).fit(X)
    with pytest.raises(InputError, match="bits=0: must be an integer >= 1"):
        SubspaceIndex(bits=0).fit(X)
    with pytest.raises(InputError, match="alpha=-1"):
        SubspaceIndex(alpha=-1.0).fit(X)
    with pytest.raises(InputError, match="eta=nan"):
        SubspaceIndex(eta=float("nan")).fit(X)
    with pytest.raises(InputError, match="ids repeat"):
        SubspaceIndex().fit(X[:3], np.array([1, 1, 2]))
    ix = SubspaceIndex(rank=4, seed=0).fit(X)
    with pytest.raises(InputError, match="Xq has 63 features, but the index was built on 64"):
        ix.query(Xq[:, :63], 3)
    with pytest.raises(InputError, match="k=0"):
        ix.query(Xq, 0)
    with pytest.raises(InputError, match="n_probe=0"):
        ix.query(Xq, 1, n_probe=0)
