import numpy as np
import pytest

from lshdist._kernels.itml import itml_explicit
from lshdist.errors import InputError, NotFittedError
from lshdist.evaluation import knn_predict
from lshdist.metric.constraints import random_pairs
from lshdist.metric.itml import ITML, KernelITML
from lshdist.metric.learned import ExplicitMetric, sq_euclidean


def itml_reference(A, V, delta, xi, gamma, max_iter, tol):
    """The authors' / metric-learn loop in plain numpy, constraints in the given order."""
    A = A.copy()
    xi = xi.copy()
    lam = np.zeros(len(V))
    lam_old = np.zeros(len(V))
    gp = gamma / (gamma + 1)
    for it in range(1, max_iter + 1):
        for c, v in enumerate(V):
            p = v @ A @ v
            if p <= 1e-12:
                continue
            alpha = min(lam[c], delta[c] * gp * (1 / p - 1 / xi[c]))
            lam[c] -= alpha
            beta = delta[c] * alpha / (1 - delta[c] * alpha * p)
            xi[c] = 1 / (1 / xi[c] + delta[c] * alpha / gamma)
            Av = A @ v
            A += beta * np.outer(Av, Av)
        normsum = np.linalg.norm(lam) + np.linalg.norm(lam_old)
        if normsum == 0:
            break
        if np.abs(lam_old - lam).sum() / normsum < tol:
            break
        lam_old = lam.copy()
    return A, it


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 10))
    y = rng.integers(0, 3, 120)
    X[:, 0] += 3 * y
    return X, y


def test_kernel_matches_numpy_reference(toy):
    X, y = toy
    rng = np.random.default_rng(1)
    pairs, delta = random_pairs(y, 80, rng)
    V = X[pairs[:, 0]] - X[pairs[:, 1]]
    V[3] = 0.0  # a zero-length pair is skipped, never divided by
    xi = np.where(delta > 0, 5.0, 40.0)
    ref, it_ref = itml_reference(np.eye(10), V, delta, xi, 1.0, 200, 1e-3)
    A = np.eye(10)
    it, _ = itml_explicit(
        A, np.ascontiguousarray(V), delta, xi.copy(), np.zeros(len(V)), 1.0, 200, 1e-3
    )
    assert it == it_ref
    np.testing.assert_allclose(A, ref, rtol=1e-10, atol=1e-12)
    assert np.all(np.isfinite(A))


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
    """Issue 3: the explicit learner with its documented defaults reaches >= 96.5 % 1-NN."""
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
    with pytest.raises(InputError, match=r"1 NaN or infinite values \(first in row 5\)"):
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
