import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lshdist._kernels.hashing import pack_signs
from lshdist.blocks import SparseBlock
from lshdist.errors import InputError
from lshdist.hashing import LearnedExplicit, LearnedImplicit, RandomHyperplanes
from lshdist.hashing.families import gaussian_matrix
from lshdist.metric.itml import ITML, KernelITML


def test_learned_implicit_equals_explicit_hash_value():
    """r^T G phi(x) through gamma^r = S^T (Phi^T r) equals the explicit value (dense, low d)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(150, 12)).astype(np.float32)
    y = rng.integers(0, 3, 150)
    X[:, 0] += 3 * y
    m = KernelITML(n_basis=9, n_constraints=300, seed=1).fit(X, y).metric()
    fam = LearnedImplicit(m, bits=70, seed=5)
    R = gaussian_matrix(5, 12, 70)
    explicit = X.astype(np.float64) @ (R @ m.explicit_G()).T
    np.testing.assert_allclose(fam.project(X), explicit, rtol=1e-8, atol=1e-8)


def _asymmetric_basis_model(seed: int = 0):
    """A basis-route kernel ITML model on small dense data (linear kernel, so phi(x) = x) whose
    S is far from symmetric (Lemma 2 updates S by a a^T (I + K0 S): not symmetric)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(40, 6)).astype(np.float32)
    basis = rng.permutation(40)[:6]
    pairs = np.array([[0, 1], [2, 3], [4, 5], [0, 2], [1, 4], [3, 5]])
    delta = np.array([1, 1, 1, -1, -1, -1.0])
    fit = KernelITML(route="basis", basis=basis, bounds=(1.0, 30.0), max_iter=50, tol=1e-6)
    fit.fit(X, pairs=pairs, delta=delta)
    S = fit.S_
    assert np.abs(S - S.T).max() > 0.1 * np.abs(S).max()  # else S vs S^T cannot be told apart
    return X, fit.metric()


def test_learned_implicit_basis_route_asymmetric_S_equals_explicit_G():
    """The implicit family over the basis equals the explicit G.  Bug caught: gamma^r =
    S (Phi^T r) instead of S^T (Phi^T r) (the papers' index typo) -- invisible with the span
    route, whose S is symmetric."""
    X, m = _asymmetric_basis_model()
    bits, seed = 48, 7
    fam = LearnedImplicit(m, bits=bits, seed=seed)
    Phi = np.asarray(m.basis, np.float64).T  # d x c
    G = np.eye(6) + Phi @ m.S @ Phi.T  # built here, not by the library
    R = gaussian_matrix(seed, 6, bits)  # b x d, the family's r vectors (tested in _kernels)
    X64 = X.astype(np.float64)
    expect = X64 @ (R @ G).T  # r^T G x
    np.testing.assert_allclose(fam.project(X), expect, rtol=1e-9, atol=1e-9)
    # the same through eq. 11 written out: r^T x + sum_j gamma_j k(x_j, x), gamma = S^T Phi^T r
    gamma = m.S.T @ (Phi.T @ R.T)  # c x b
    np.testing.assert_allclose(fam.project(X), X64 @ R.T + (X64 @ Phi) @ gamma, rtol=1e-9,
                               atol=1e-9)
    # the bits, where the projection is clearly away from 0
    clear = np.abs(expect) > 1e-6
    got_bits = np.unpackbits(fam.hash(X).astype(">u8").view(np.uint8), axis=1)[:, :bits]
    assert np.array_equal(got_bits[clear].astype(bool), (expect >= 0)[clear])
    # and the projections are not the same under the transposed S (the test can fail)
    wrong = X64 @ (R @ (np.eye(6) + Phi @ m.S.T @ Phi.T)).T
    assert np.abs(wrong - expect).max() > 1e-3


def test_implicit_learned_distance_with_asymmetric_S_is_d_A_of_GtG():
    """The learned distance of an implicit model is d_A with A = G^T G (not ``||Gx - Gq||^2`` of
    some other G).  Bug caught: Q = S + S^T + S K0 S^T (transpose) in the distance expansion."""
    X, m = _asymmetric_basis_model(1)
    Phi = np.asarray(m.basis, np.float64).T
    G = np.eye(6) + Phi @ m.S @ Phi.T
    A = G.T @ G
    X64 = X.astype(np.float64)
    diff = X64[:9, None, :] - X64[None, 9:, :]
    expect = np.einsum("qnd,de,qne->qn", diff, A, diff)
    np.testing.assert_allclose(m.pairwise(X[:9], X[9:]), expect, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(expect, (((X64[:9] @ G.T)[:, None] - (X64[9:] @ G.T)[None]) ** 2)
                               .sum(-1), rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(m.similarity(X[:5], X[5:9]), X64[:5] @ A @ X64[5:9].T,
                               rtol=1e-8, atol=1e-8)


def test_sparse_hash_needs_no_dense_r_and_equals_dense():
    rng = np.random.default_rng(1)
    D = rng.normal(size=(40, 300)) * (rng.random((40, 300)) < 0.05)
    import scipy.sparse as sp

    block = SparseBlock.from_csr(sp.csr_matrix(D))
    assert block.shape[1] < 300  # only the features present
    fam = RandomHyperplanes(d=300, bits=100, seed=9)
    np.testing.assert_allclose(
        fam.project(block), fam.project(D.astype(np.float32)), rtol=1e-5, atol=1e-5
    )
    assert np.array_equal(fam.hash(block), fam.hash(D.astype(np.float32)))


@settings(max_examples=15, deadline=None)
@given(split=st.integers(1, 59), seed=st.integers(0, 2**32))
def test_keys_do_not_depend_on_chunking(split, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(60, 16)).astype(np.float32)
    m = ITML(n_constraints=40, max_iter=5).fit(X, rng.integers(0, 2, 60)).metric()
    fam = LearnedExplicit(m, bits=130, seed=seed)
    whole = fam.hash(X)
    assert np.array_equal(np.vstack([fam.hash(X[:split]), fam.hash(X[split:])]), whole)
    assert np.array_equal(np.vstack([fam.hash(X[i : i + 1]) for i in range(60)]), whole)
    assert np.array_equal(LearnedExplicit(m, bits=130, seed=seed).hash(X), whole)  # same seed


def test_bad_bits():
    """Every family checks its key length in one place (HashFamily's constructor)."""
    from lshdist.hashing.unary import UnaryHyperplanes
    from lshdist.limits import MAX_BITS
    from lshdist.metric.learned import ExplicitMetric, ImplicitMetric

    explicit = ExplicitMetric.identity(3)
    implicit = ImplicitMetric.identity(np.eye(3, dtype=np.float32), d=3)
    for make in (lambda b: RandomHyperplanes(d=3, bits=b),
                 lambda b: LearnedExplicit(explicit, bits=b),
                 lambda b: LearnedImplicit(implicit, bits=b),
                 lambda b: UnaryHyperplanes(np.ones(3), bits=b)):
        for bad in (0, MAX_BITS + 1, 8.0, True):
            with pytest.raises(InputError, match=rf"bits={bad!r}: the number of hash bits "
                                                 rf"must be an integer in 1\.\.{MAX_BITS}"):
                make(bad)
        assert make(np.int64(7)).bits == 7 and make(np.int64(7)).seed == 0
    with pytest.raises(InputError, match="X has 4 features, but the hash family has d=3"):
        RandomHyperplanes(d=3, bits=8).hash(np.zeros((2, 4), np.float32))


def test_explicit_float32_projection_matches_float64_reference_and_blocks(monkeypatch):
    """The float32, row-blocked hashing: the projection agrees with a float64 numpy reference
    of ``R G (x - mu)`` to float32 rounding, the bits agree wherever the value is clearly away
    from 0, and hashing in blocks gives the same keys as one block."""
    import lshdist.hashing.families as fams

    rng = np.random.default_rng(3)
    X = (rng.random((700, 20)) * 255).astype(np.float32)
    y = rng.integers(0, 3, 700)
    X[:, 0] += 40 * y
    m = ITML(n_constraints=200, seed=0).fit(X, y).metric()
    fam = LearnedExplicit(m, bits=100, seed=4)
    R = gaussian_matrix(4, 20, 100)
    center = np.zeros(20) if m.center is None else np.asarray(m.center, np.float64)
    ref = (X.astype(np.float64) - center) @ (R @ m.G).T
    got = fam.project(X)
    assert got.dtype == np.float32
    scale = np.abs(ref).max()
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * scale)
    clear = np.abs(ref) > 1e-4 * scale
    bits = np.unpackbits(fam.hash(X).astype(">u8").view(np.uint8), axis=1)[:, :100]
    assert clear.mean() > 0.99
    assert np.array_equal(bits[clear].astype(bool), (ref >= 0)[clear])
    whole = fam.hash(X)
    monkeypatch.setattr(fams, "HASH_BLOCK_ROWS", 64)
    assert np.array_equal(fam.hash(X), whole)


@pytest.mark.parametrize("family", ["explicit", "charikar"])
def test_float32_keys_do_not_depend_on_the_chunking(family, monkeypatch):
    """Keys of the same rows hashed whole, in uneven chunks and one row at a time are equal bit
    for bit (every BLAS call has the same shape), on rows built to have projections near 0."""
    rng = np.random.default_rng(5)
    d, bits = 40, 256
    X = rng.normal(size=(3000, d)).astype(np.float32)
    R = gaussian_matrix(9, d, bits)
    # rows nearly orthogonal to some hash vectors: projections within float32 rounding of 0
    for i in range(0, 3000, 3):
        r = R[i % bits]
        X[i] -= (X[i] @ r / (r @ r) * r).astype(np.float32)
    if family == "explicit":
        from lshdist.metric.learned import ExplicitMetric

        fam = LearnedExplicit(ExplicitMetric.identity(d), bits=bits, seed=9)
    else:
        fam = RandomHyperplanes(d=d, bits=bits, seed=9)
    whole = fam.hash(X)
    cuts = np.sort(rng.choice(np.arange(1, 3000), size=17, replace=False))
    parts = np.vstack([fam.hash(p) for p in np.split(X, cuts)])
    assert np.array_equal(parts, whole)
    for i in rng.choice(3000, size=60, replace=False):
        assert np.array_equal(fam.hash(X[i:i + 1]), whole[i:i + 1])
    # on several threads (each a share of the rows on single-threaded BLAS): the same keys,
    # the last part's uneven end included
    import lshdist.hashing.families as fams

    monkeypatch.setattr(fams, "HASH_BLOCK_ROWS", 100)  # 2999 rows: up to 7 parts
    for threads in (2, 3):
        assert np.array_equal(fam.hash(X[:2999], n_threads=threads), whole[:2999])
    # and they are the signs of the float64 product (the BLAS build and CPU do not matter)
    X32, W, off = fam._f32_terms(X)
    T = X32.astype(np.float64) @ W.astype(np.float64) - off.astype(np.float64)
    assert np.array_equal(whole, pack_signs(T))
    assert (np.abs(T) < 1e-5 * np.abs(T).max()).sum() >= 500  # the rows near 0 are there


def test_exact_signs_kernel_overrides_any_float32_error_within_the_bound():
    """`pack_signs_exact` returns the signs of ``X Wt^T - off`` whatever error the float32
    ``P`` carries within the bound (here: P = T + the largest allowed error, signs flipped)."""
    from lshdist._kernels.hashing import pack_signs_exact

    rng = np.random.default_rng(0)
    n, d, b = 500, 30, 130
    X = rng.normal(size=(n, d)).astype(np.float32)
    Wt = rng.normal(size=(b, d)).astype(np.float32)
    off = rng.normal(size=b).astype(np.float32)
    off[::3] = 0.0
    for r in range(n):  # row r nearly orthogonal to hash vector r % b: T within rounding of 0
        w = Wt[r % b]
        X[r] -= (X[r] @ w / (w @ w) * w).astype(np.float32)
    T = X.astype(np.float64) @ Wt.T.astype(np.float64) - off.astype(np.float64)
    tol = 2.0 * (d + 2) * 2.0 ** -24
    xn = np.linalg.norm(X.astype(np.float64), axis=1).astype(np.float32)
    wtol = (tol * np.linalg.norm(Wt.astype(np.float64), axis=1)).astype(np.float32)
    otol = (tol * np.abs(off.astype(np.float64))).astype(np.float32)
    bound = xn[:, None].astype(np.float64) * wtol[None, :] + otol[None, :]
    near = np.abs(T) <= 0.5 * bound
    assert near.sum() >= n // 3
    # the worst float32 answer: every value within half the bound pushed across 0
    P = np.where(near, -np.where(T >= 0, 1.0, -1.0) * 0.5 * bound, T).astype(np.float32)
    assert ((P >= 0) != (T >= 0)).sum() >= n // 3
    got = pack_signs_exact(P, X, xn, Wt, off, wtol, otol)
    assert np.array_equal(got, pack_signs(T))
    assert np.array_equal(pack_signs_exact(T.astype(np.float32), X, xn, Wt, off, wtol, otol),
                          pack_signs(T))


def test_identity_metric_factor_hash_and_transfer_are_the_general_ones():
    """The prior (A = I) skips the Cholesky factorisation and the R G product: its G is
    cholesky(I)^T and its RG is R @ I, bit for bit, so its keys are the general path's; sent
    between processes it is its size, and comes back the same metric."""
    import pickle

    from lshdist.metric.learned import ExplicitMetric

    d, bits = 37, 70
    rng = np.random.default_rng(3)
    centre = rng.normal(size=d).astype(np.float32)
    m = ExplicitMetric.identity(d, center=centre)
    assert m.is_identity
    np.testing.assert_array_equal(m.G, np.linalg.cholesky(np.eye(d)).T)
    fam = LearnedExplicit(m, bits=bits, seed=4)
    R = gaussian_matrix(4, d, bits)
    RG = R @ np.linalg.cholesky(np.eye(d)).T
    np.testing.assert_array_equal(fam._RGt32, RG.T.astype(np.float32))
    np.testing.assert_array_equal(fam.offset, RG @ centre.astype(np.float64))

    blob = pickle.dumps(m)
    assert len(blob) < 8 * d * d  # neither A nor G is in it
    back = pickle.loads(blob)
    assert back.is_identity and back.d == d
    np.testing.assert_array_equal(back.A, np.eye(d))
    np.testing.assert_array_equal(back.G, np.eye(d))
    np.testing.assert_array_equal(back.center, centre)
    X = rng.normal(size=(50, d)).astype(np.float32)
    np.testing.assert_array_equal(LearnedExplicit(back, bits=bits, seed=4).hash(X), fam.hash(X))

    # a learned metric travels whole, and is unchanged
    A = np.eye(d) + 0.1 * np.outer(centre, centre) / float(centre @ centre)
    learned = ExplicitMetric(A)
    assert not learned.is_identity
    again = pickle.loads(pickle.dumps(learned))
    np.testing.assert_array_equal(again.A, learned.A)
    np.testing.assert_array_equal(again.G, learned.G)
    np.testing.assert_array_equal(again.A, 0.5 * (A + A.T))
