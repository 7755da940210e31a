import numpy as np
import pytest

from lshdist.errors import InputError, NotFittedError
from lshdist.metric.constraints import random_pairs
from lshdist.metric.itml import ITML, KernelITML
from lshdist.metric.knn import knn_predict
from lshdist.metric.learned import ExplicitMetric, sq_euclidean


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 10))
    y = rng.integers(0, 3, 120)
    X[:, 0] += 3 * y
    return X, y


def test_matches_metric_learn_on_letter(letter):
    metric_learn = pytest.importorskip("metric_learn")
    Xtr, ytr = letter.X_train[:4000].astype(np.float64), letter.y_train[:4000]
    pairs, delta = random_pairs(ytr, 400, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    S = Xtr[rng.choice(len(Xtr), 200, replace=False)]
    D = sq_euclidean(S, S)[np.triu_indices(200, 1)]
    u, l = np.percentile(D, (5, 95))
    ours = ITML(bounds=(u, l), gamma=1.0, tol=1e-3, max_iter=1000).fit(
        Xtr, pairs=pairs, delta=delta
    )
    ml = metric_learn.ITML(gamma=1.0, tol=1e-3, max_iter=1000, prior="identity", preprocessor=Xtr)
    ml.fit(pairs, delta, bounds=[u, l])
    A_ml = ml.get_mahalanobis_matrix()
    err = np.linalg.norm(ours.A_ - A_ml) / np.linalg.norm(A_ml)
    assert err <= 1e-3
    assert not np.allclose(A_ml, np.eye(16), atol=1e-2)  # it really learned something


def test_both_kernel_routes_give_GtG_equal_A(toy):
    X, _ = toy
    pairs = np.array([[0, 1], [2, 3], [4, 5], [0, 6], [1, 7], [3, 5], [2, 7]])
    delta = np.array([1, 1, -1, -1, 1, -1, 1.0])
    basis = np.arange(8)
    kw = dict(bounds=(2.0, 30.0), max_iter=100, tol=1e-6)
    A = ITML(**kw).fit(X, pairs=pairs, delta=delta).A_
    for route in ("basis", "span"):
        m = KernelITML(route=route, basis=basis, **kw).fit(X, pairs=pairs, delta=delta)
        G = m.metric().explicit_G()
        assert np.linalg.norm(G.T @ G - A) / np.linalg.norm(A) <= 1e-6, route
    basis_route = KernelITML(route="basis", basis=basis, **kw).fit(X, pairs=pairs, delta=delta)
    # eq. 5 keeps K_t = Phi^T A_t Phi
    Phi = X[basis].astype(np.float32).astype(np.float64).T
    np.testing.assert_allclose(basis_route.K_, Phi.T @ A @ Phi, rtol=1e-8, atol=1e-8)


def test_span_route_offsets_make_the_true_distances_meet_the_constraints():
    """Pairs outside the basis, d > c: the span route learns W on psi with
    ``||(I-P)(a-b)||^2`` added to every length.  With hard constraints, the learned metric's
    *true* distances (through the explicit G, and through d_A) must meet the bound.  Bug caught:
    the offset dropped (then psi's part alone reaches u and the true distance is u + offset)."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 10))
    basis = rng.permutation(40)[:3]
    Phi = X[basis].astype(np.float32).astype(np.float64).T  # 10 x 3: the span is 3-d of 10
    P = Phi @ np.linalg.solve(Phi.T @ Phi, Phi.T)
    others = np.setdiff1d(np.arange(40), basis)
    cand = np.array(np.triu_indices(len(others), 1)).T
    cand = others[cand[rng.permutation(len(cand))]]
    X32 = X.astype(np.float32).astype(np.float64)
    V = X32[cand[:, 0]] - X32[cand[:, 1]]
    full = (V**2).sum(1)
    offset = ((V @ (np.eye(10) - P)) ** 2).sum(1)
    u = float(np.median(full))
    # feasible (the offset alone is below u) and active (the prior distance is above u)
    pairs = cand[(offset < 0.8 * u) & (full > 1.2 * u)][:4]
    assert len(pairs) == 4
    delta = np.ones(4)
    fit = KernelITML(route="span", basis=basis, bounds=(u, 10 * u), gamma=np.inf,
                     max_iter=2000, tol=1e-9).fit(X, pairs=pairs, delta=delta)
    m = fit.metric()
    G = m.explicit_G()
    Vp = X32[pairs[:, 0]] - X32[pairs[:, 1]]
    true = ((Vp @ G.T) ** 2).sum(1)
    np.testing.assert_allclose(m.pairwise(X[pairs[:, 0]], X[pairs[:, 1]]).diagonal(), true,
                               rtol=1e-6)
    assert np.all(true <= u * (1 + 1e-3)), (true, u)
    assert np.isclose(true, u, rtol=1e-3).any()  # some constraint binds (no trivial shrinkage)
    # G keeps the orthogonal complement fixed: the offset is part of every learned distance
    np.testing.assert_allclose(((Vp @ (np.eye(10) - P) @ G.T @ G @ (np.eye(10) - P)) * Vp)
                               .sum(1), ((Vp @ (np.eye(10) - P)) ** 2).sum(1), rtol=1e-6)


def test_implicit_distance_equals_explicit(toy):
    X, y = toy
    m = KernelITML(n_basis=8, n_constraints=200, seed=3).fit(X, y).metric()
    G = m.explicit_G()
    exp = ExplicitMetric(G.T @ G)
    np.testing.assert_allclose(
        m.pairwise(X[:7], X[7:20]), exp.pairwise(X[:7], X[7:20]), rtol=1e-4, atol=1e-4
    )
    X32 = X.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(
        m.similarity(X[:5], X[5:9]), X32[:5] @ G.T @ G @ X32[5:9].T, rtol=1e-6, atol=1e-6
    )


def test_singular_basis_is_handled(toy, caplog):
    X, y = toy
    Xd = X.copy()
    Xd[1] = Xd[0]  # duplicate basis points: K0 singular
    m = KernelITML(basis=np.arange(12), n_constraints=100).fit(Xd, y)
    assert np.all(np.isfinite(m.S_))
    assert "singular" in caplog.text


def test_letter_learned_metric_beats_l2(letter):
    """The explicit learner with its documented defaults reaches >= 96.5 % 1-NN on Letter."""
    Xtr, ytr, Xte, yte = letter
    G = ITML().fit(Xtr, ytr).metric()
    acc = {}
    for name, (A, B) in {"L2": (Xtr, Xte), "ML": (G.transform(Xtr), G.transform(Xte))}.items():
        nn = np.argsort(sq_euclidean(B, A), axis=1)[:, :4]
        acc[name] = [float((knn_predict(ytr[nn], k, 26) == yte).mean()) for k in (1, 4)]
    assert acc["L2"][0] == pytest.approx(0.9565, abs=0.002)
    assert acc["ML"][0] >= 0.965
    assert acc["ML"][1] > acc["L2"][1]


def test_bad_input(toy):
    X, y = toy
    with pytest.raises(InputError, match="one class only"):
        ITML().fit(X, np.zeros(len(X), int))
    with pytest.raises(InputError, match="c=500 basis points requested, but the data has only 120"):
        KernelITML(n_basis=500).fit(X, y)
    Xn = X.copy()
    Xn[5, 2] = np.nan
    with pytest.raises(InputError,
                       match=r"1 NaN or infinite values \(first in row 5, column 2\)"):
        ITML().fit(Xn, y)
    with pytest.raises(
        InputError, match="constraint id 120 is out of range: the data has 120 points"
    ):
        ITML().fit(X, pairs=np.array([[0, 120]]), delta=np.array([1.0]))
    m = ITML(n_constraints=100).fit(X, y).metric()
    with pytest.raises(InputError, match="X has 9 features, but the model was learned on 10"):
        m.transform(X[:, :9])
    with pytest.raises(NotFittedError, match="not fitted"):
        ITML().metric()
    with pytest.raises(InputError, match="constraints='nope'"):
        ITML(constraints="nope").fit(X, y)


def test_fit_at_high_dimension_blocks_and_matches_one_at_a_time(monkeypatch):
    """At d >= 64 `ITML.fit` takes its projections in blocks (`explicit_block`); the learned
    matrix is the constraint-at-a-time one up to rounding.  Bug caught: the blocked path wired
    to the wrong block size or skipped for the explicit learner."""
    from lshdist._kernels import itml as kernels
    from lshdist.metric import itml as itml_mod

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 80)).astype(np.float32)
    y = rng.integers(0, 4, size=400)
    X[:, 0] += 2 * y
    assert kernels.explicit_block(80) > 1
    blocked = itml_mod.ITML(n_constraints=600, max_iter=3).fit(X, y)
    monkeypatch.setattr(itml_mod, "explicit_block", lambda d: 1)
    one = itml_mod.ITML(n_constraints=600, max_iter=3).fit(X, y)
    np.testing.assert_allclose(blocked.A_, one.A_, rtol=1e-9, atol=1e-12)
    assert np.abs(one.A_ - np.eye(80)).max() > 1e-2  # it learned something


def test_transform_in_row_blocks_is_g_x_of_every_row(monkeypatch):
    # the float64 product G x is made a block of rows at a time (bounded memory); every row
    # must be its own G x, whatever block it falls in (blocks of 7: 5 blocks, the last short)
    import lshdist.metric.learned as learned

    rng = np.random.default_rng(5)
    d = 12
    L = rng.normal(size=(d, d))
    m = ExplicitMetric(L @ L.T + np.eye(d))
    X = rng.normal(size=(31, d)).astype(np.float32)
    whole = m.transform(X)
    monkeypatch.setattr(learned, "TRANSFORM_ROWS", 7)
    blocked = m.transform(X)
    ref = np.array([m.G @ x for x in X.astype(np.float64)])
    assert blocked.dtype == np.float32 and blocked.shape == (31, d)
    np.testing.assert_allclose(blocked, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(blocked, whole, rtol=1e-6, atol=1e-6)
    # and L2 on them is d_A
    diff = (X[3] - X[17]).astype(np.float64)
    assert np.sum((blocked[3].astype(np.float64) - blocked[17]) ** 2) == pytest.approx(
        diff @ m.A @ diff, rel=1e-5)
