"""H-Hash and EH-Hash (NIPS 2010): collision probabilities over many random functions against
the paper's formulas, the sampled EH query embedding, dense vs sparse, bias.

Each test names the bug it catches; each was checked once by planting that bug.
"""

import itertools

import numpy as np
import pytest

from lshdist.blocks import SparseBlock
from lshdist.errors import InputError
from lshdist.hashing.hyperplane import (
    BIAS_FEATURE,
    EHHash,
    HHash,
    ehhash_collision,
    hhash_collision,
    hyperplane_family,
    samples_for,
)

THETAS = np.pi * np.array([0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95])


def _pair(theta: float, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """x and w at angle theta in a random plane of R^d, different norms."""
    Q, _ = np.linalg.qr(rng.normal(size=(d, 2)))
    w = 2.5 * Q[:, 0]
    x = 0.7 * (np.cos(theta) * Q[:, 0] + np.sin(theta) * Q[:, 1])
    return x[None, :], w[None, :]


def _bits(P: np.ndarray) -> np.ndarray:
    return P >= 0


def test_hhash_collision_probability_matches_paper():
    """Pr[h(x) = h(w)] = 1/4 - (theta - pi/2)^2/pi^2, measured over 16,384 functions (8 seeds x
    2,048) at 7 angles, within 4 standard errors.  Bugs caught: the query's second bit not
    negated (Pr = (1 - theta/pi)^2, largest at theta = 0), both bits negated.  (u and v swapped
    between the sides is *not* caught here: planted, it gives the same probability --
    ``test_hhash_definition`` catches it.)"""
    rng = np.random.default_rng(0)
    n_functions = 0
    hits = np.zeros(len(THETAS))
    pairs = [_pair(t, 12, rng) for t in THETAS]
    for seed in range(8):
        fam = HHash(d=12, bits=4096, seed=seed)
        for a, (x, w) in enumerate(pairs):
            px, pw = _bits(fam.project(x)[0]), _bits(fam.project_queries(w)[0])
            same = (px[0::2] == pw[0::2]) & (px[1::2] == pw[1::2])
            hits[a] += same.sum()
        n_functions += 2048
    measured = hits / n_functions
    expect = hhash_collision(THETAS)
    se = np.sqrt(expect * (1 - expect) / n_functions)
    assert np.all(np.abs(measured - expect) < 4 * se), (measured, expect)
    # the shape the index relies on: most likely at pi/2 (x on the hyperplane)
    assert measured.argmax() == 3


def test_hhash_definition():
    """Bit 2j is u_j = row 2j of the counter-based Gaussians, bit 2j+1 is v_j = row 2j+1;
    points [u^T x, v^T x], queries [u^T w, -v^T w].  Bugs caught: u and v swapped on one side
    (planted: invisible to the collision probability), the sign on the wrong bit."""
    from lshdist.hashing.families import gaussian_matrix

    rng = np.random.default_rng(7)
    # float32 inputs (what the family computes on), products in float64
    X = rng.normal(size=(4, 5)).astype(np.float32).astype(np.float64)
    W = rng.normal(size=(3, 5)).astype(np.float32).astype(np.float64)
    R = gaussian_matrix(9, 5, 10)
    fam = HHash(d=5, bits=10, seed=9)
    np.testing.assert_allclose(fam.project(X), X @ R.T, rtol=1e-6)
    expect = W @ R.T
    expect[:, 1::2] *= -1
    np.testing.assert_allclose(fam.project_queries(W), expect, rtol=1e-6)


def _eh_collisions(pairs, *, d: int, seeds: int) -> np.ndarray:
    """The measured collision rate of EH-Hash at each (point, normal) pair of ``pairs``
    (4,096 functions a seed), checked against arccos(cos^2 theta)/pi at `THETAS` within 4
    standard errors; returns the rates."""
    hits = np.zeros(len(pairs))
    for seed in range(seeds):
        fam = EHHash(d=d, bits=4096, seed=seed)
        for a, (x, w) in enumerate(pairs):
            hits[a] += (_bits(fam.project(x)[0]) == _bits(fam.project_queries(w)[0])).sum()
    measured = hits / (4096 * seeds)
    expect = ehhash_collision(THETAS)
    se = np.sqrt(expect * (1 - expect) / (4096 * seeds))
    assert np.all(np.abs(measured - expect) < 4 * se), (measured, expect)
    return measured


def test_ehhash_collision_probability_matches_paper():
    """Pr = arccos(cos^2 theta)/pi (the paper's arccos(sin^2 theta')/pi, theta' the angle to
    the hyperplane), 16,384 functions, 7 angles, 4 standard errors.  Bugs caught: the query
    side not negated (Pr = 1 - arccos(cos^2)/pi: largest far from the hyperplane), w^T U x
    instead of w^T U w (a linear, not quadratic, embedding: Pr = 1 - theta/pi)."""
    rng = np.random.default_rng(1)
    measured = _eh_collisions([_pair(t, 8, rng) for t in THETAS], d=8, seeds=4)
    assert measured.argmax() == 3


def test_collision_formulas_agree_with_paper_forms():
    """The formulas in the paper's own variables: theta' = theta - pi/2 (angle between x and the
    hyperplane); H: 1/4 - theta'^2/pi^2; EH: arccos(sin^2 theta')/pi.  Bug caught: cos and sin
    exchanged in the EH form."""
    tp = THETAS - np.pi / 2
    np.testing.assert_allclose(hhash_collision(THETAS), 0.25 - tp**2 / np.pi**2)
    np.testing.assert_allclose(ehhash_collision(THETAS), np.arccos(np.sin(tp) ** 2) / np.pi)
    # EH collides at pi/2 with probability 1/2, H-Hash with 1/4
    assert ehhash_collision(np.pi / 2) == pytest.approx(0.5)
    assert hhash_collision(np.pi / 2) == pytest.approx(0.25)


def test_sampled_eh_query_embedding_converges_to_exact():
    """Bits of the sampled query embedding (Lemma 3.4) agree with the exact ones more as t
    grows.  Measured on 20 random normals x 1,024 bits, d = 8: agreement rises with t and
    reaches > 0.93 at t = 20,000.  Bugs caught: no importance weight 1/(w_i w_j) (the estimate
    of vec(ww^T) biased: agreement plateaus well below), the sign of the query side differing
    between the exact and the sampled routes (agreement near 0)."""
    rng = np.random.default_rng(2)
    W = rng.normal(size=(20, 8))
    exact = _bits(EHHash(d=8, bits=1024, seed=3).project_queries(W))
    agree = []
    for t in (10, 100, 1_000, 20_000):
        sampled = _bits(EHHash(d=8, bits=1024, seed=3, samples=t).project_queries(W))
        agree.append(float((sampled == exact).mean()))
    assert all(a < b for a, b in itertools.pairwise(agree)), agree
    assert agree[0] < 0.75 and agree[-1] > 0.93, agree


def test_sparse_rows_hash_like_dense_rows():
    """Sparse rows over feature ids 0..d-1 give the dense rows' projections, both sides, both
    families (U's and u, v's entries are per-feature counters).  Bugs caught: the sparse path
    using local column numbers as counters (depends on which features a block has), the dense
    path with another pair key."""
    import scipy.sparse as sp

    rng = np.random.default_rng(4)
    X = rng.normal(size=(9, 6)).astype(np.float32)
    X[rng.random(X.shape) < 0.5] = 0
    S = SparseBlock.from_csr(sp.csr_matrix(X))
    for fam in (HHash(d=6, bits=64, seed=1), EHHash(d=6, bits=64, seed=1),
                EHHash(d=6, bits=64, seed=1, samples=50)):
        np.testing.assert_allclose(fam.project(S), fam.project(X), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fam.project_queries(S), fam.project_queries(X), rtol=1e-5,
                                   atol=1e-5)


def _cut(X: np.ndarray, m: int) -> np.ndarray:
    """Numpy reference of the terms cut: each row's m largest |entries| (ties: lower column),
    the rest zeroed."""
    out = np.zeros_like(X)
    for r, x in enumerate(X):
        nz = np.flatnonzero(x)
        keep = nz[np.lexsort((nz, -np.abs(x[nz])))][:m]
        out[r, keep] = x[keep]
    return out


def test_ehhash_terms_is_ehhash_of_the_cut_rows():
    """EH-Hash with terms=m is EH-Hash of each row and normal cut to its m largest entries
    (numpy reference), on dense rows (the dense-U path and the pairs path), sparse rows over
    feature ids 0..d-1, with the bias feature among the entries, both sides and the sampled
    query side; rows with at most m nonzeros hash as before.  Bugs caught: the cut on one
    side only (the query side exact), the bias feature appended after the cut (m + 1 entries
    hashed), the smallest entries kept, the sampled route ignoring the cut."""
    import scipy.sparse as sp

    import lshdist.hashing.hyperplane as hp

    rng = np.random.default_rng(12)
    X = np.round(rng.normal(size=(15, 9)), 2)
    X[rng.random(X.shape) < 0.3] = 0
    W = rng.normal(size=(6, 9))
    W[0, 3:] = 0  # at most m nonzeros with the bias: hashed whole
    b = rng.normal(size=6)
    S = SparseBlock.from_csr(sp.csr_matrix(X.astype(np.float32)))
    ones = np.ones((len(X), 1))
    for m in (1, 4, 7):
        plain = EHHash(d=10, bits=64, seed=3)
        cut = EHHash(d=9, bits=64, seed=3, bias=True, terms=m)
        expect_p = plain.project(_cut(np.hstack([X, ones]), m))
        expect_q = plain.project_queries(_cut(np.hstack([W, b[:, None]]), m))
        np.testing.assert_allclose(cut.project(X), expect_p, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(cut.project_queries(W, b), expect_q, rtol=1e-9, atol=1e-9)
        sampled = EHHash(d=9, bits=64, seed=3, bias=True, terms=m, samples=40)
        np.testing.assert_allclose(
            sampled.project_queries(W, b),
            EHHash(d=10, bits=64, seed=3, samples=40).project_queries(
                _cut(np.hstack([W, b[:, None]]), m)), rtol=1e-9, atol=1e-9)
        # sparse rows (the pairs kernel): the same projections as the dense rows
        cut_s = EHHash(d=1, bits=64, seed=3, terms=m)
        np.testing.assert_allclose(cut_s.project(S),
                                   EHHash(d=9, bits=64, seed=3).project(
                                       _cut(X.astype(np.float32).astype(np.float64), m)),
                                   rtol=1e-5, atol=1e-5)
    # the pairs path of dense rows (U too large to materialise): the same cut
    old = hp.DENSE_U_ENTRIES
    try:
        hp.DENSE_U_ENTRIES = 0
        np.testing.assert_allclose(EHHash(d=9, bits=64, seed=3, bias=True, terms=4).project(X),
                                   EHHash(d=10, bits=64, seed=3).project(
                                       _cut(np.hstack([X, ones]), 4)), rtol=1e-9, atol=1e-9)
    finally:
        hp.DENSE_U_ENTRIES = old
    whole = EHHash(d=9, bits=64, seed=3, bias=True)
    np.testing.assert_allclose(
        EHHash(d=9, bits=64, seed=3, bias=True, terms=4).project_queries(W[:1], b[:1]),
        whole.project_queries(W[:1], b[:1]), rtol=1e-12)
    with pytest.raises(InputError, match=r"terms=0: m must be an integer >= 1"):
        EHHash(d=9, bits=64, terms=0)
    with pytest.raises(InputError, match=r"terms \(m\) applies to eh-hash only"):
        hyperplane_family("h-hash", d=9, bits=64, terms=5)


def test_sparse_hashing_does_not_depend_on_the_block():
    """A row's key is the same alone and among other rows.  Bug caught: counters from local
    column numbers of the block."""
    import scipy.sparse as sp

    rng = np.random.default_rng(5)
    M = sp.random(12, 1_000_000, density=3e-5, random_state=5, format="csr") * 3
    S = SparseBlock.from_csr(M)
    for fam in (HHash(d=1, bits=32, seed=2), EHHash(d=1, bits=32, seed=2)):
        all_rows = fam.hash(S)
        one = fam.hash(S.take([4]))
        assert np.array_equal(one[0], all_rows[4])
    del rng


def test_bias_is_a_constant_feature():
    """With bias, point x -> [x, 1], query (w, b) -> [w, b]: the hyperplane w^T x + b = 0.
    Bugs caught: the constant appended to the query as 1 (b ignored), to the point as b."""
    rng = np.random.default_rng(6)
    X = rng.normal(size=(5, 4))
    W = rng.normal(size=(3, 4))
    b = np.array([0.5, -1.0, 2.0])
    fam = HHash(d=4, bits=16, seed=0, bias=True)
    plain = HHash(d=5, bits=16, seed=0)
    np.testing.assert_allclose(fam.project(X), plain.project(np.hstack([X, np.ones((5, 1))])),
                               rtol=1e-6)
    np.testing.assert_allclose(fam.project_queries(W, b),
                               plain.project_queries(np.hstack([W, b[:, None]])), rtol=1e-6)
    # sparse rows: the bias feature is BIAS_FEATURE
    Sx = SparseBlock.from_arrays([0, 2, 3], np.array([0, 3, 1], np.uint64), [1.0, 2.0, 3.0])
    eh = EHHash(d=1, bits=8, seed=0, bias=True)
    ref = SparseBlock.from_arrays([0, 3, 5], np.array([0, 3, BIAS_FEATURE, 1, BIAS_FEATURE],
                                                      np.uint64), [1.0, 2.0, 1.0, 3.0, 1.0])
    np.testing.assert_allclose(eh.project(Sx), EHHash(d=1, bits=8, seed=0).project(ref))


def test_errors():
    with pytest.raises(InputError, match="two bits per function"):
        HHash(d=3, bits=7)
    with pytest.raises(InputError, match="points have 4 features, but the hash family has d=3"):
        HHash(d=3, bits=8).project(np.zeros((2, 4)))
    with pytest.raises(InputError, match="t must be an integer >= 1"):
        EHHash(d=3, bits=8, samples=0)
    with pytest.raises(InputError, match="n_threads=0: must be an integer >= 1"):
        EHHash(d=3, bits=8, n_threads=0)
    with pytest.raises(InputError, match="offsets were given, but the hash family has "
                                         "bias=False"):
        HHash(d=3, bits=8).project_queries(np.ones((1, 3)), np.ones(1))
    with pytest.raises(InputError, match="choose one of"):
        hyperplane_family("x-hash", d=3, bits=8)
    with pytest.raises(InputError, match="eh-hash only"):
        hyperplane_family("h-hash", d=3, bits=8, samples=5)
    assert samples_for(0.01) == 10_000


def test_hhash_feature_cache_gives_the_same_keys():
    """`HHash.cache_features`: sparse rows projected through the cached Gaussians (float32)
    equal the generated ones to float32 rounding and give the same keys (a sign differs only
    where a projection is within rounding of 0; none here), bias feature included, and a row
    with a feature the cache lacks falls back to generating.  Bugs caught: cache rows
    misaligned with the feature ids (searchsorted position off by one), the bias feature
    missing from the cache."""
    import scipy.sparse as sp

    from lshdist.hashing.hyperplane import HHash

    m = sp.random(40, 300, density=0.05, format="csr", random_state=1)
    S = SparseBlock.from_csr(m)
    plain = HHash(d=1, bits=64, seed=5, bias=True)
    cached = HHash(d=1, bits=64, seed=5, bias=True)
    cached.cache_features(S.features[::2])  # half the features: rows miss some
    np.testing.assert_array_equal(cached.hash(S), plain.hash(S))
    cached.cache_features(S.features)
    P = plain.project(S)
    np.testing.assert_allclose(cached.project(S), P, rtol=0, atol=1e-6 * np.abs(P).max())
    np.testing.assert_array_equal(cached.hash(S), plain.hash(S))
    b = np.arange(40, dtype=np.float64) - 20
    np.testing.assert_array_equal(cached.hash_queries(S, b), plain.hash_queries(S, b))


def test_hash_points_of_prepared_rows_is_hash():
    # encode_points hashes the rows `points` prepared once (checked, the bias appended):
    # the keys must be hash(X)'s, dense and sparse, with and without the bias
    import scipy.sparse as sp

    rng = np.random.default_rng(6)
    X = rng.normal(size=(40, 7)).astype(np.float32)
    X[rng.random(X.shape) < 0.4] = 0
    for rows in (X, SparseBlock.from_csr(sp.csr_matrix(X))):
        for fam in (HHash(d=7, bits=128, seed=2, bias=True), EHHash(d=7, bits=64, seed=2),
                    HHash(d=7, bits=64, seed=3)):
            assert np.array_equal(fam.hash_points(fam.points(rows)), fam.hash(rows))


def _sparse_pair(theta: float, nnz: int, rng: np.random.Generator
                 ) -> tuple[SparseBlock, SparseBlock]:
    """Sparse x and w at angle theta over ``nnz`` shared random ids out of 2^40 (x with a few
    ids of its own too, at zero weight in w)."""
    ids = np.sort(rng.choice(2**40, size=nnz + 5, replace=False)).astype(np.uint64)
    Q, _ = np.linalg.qr(rng.normal(size=(nnz, 2)))
    w = np.concatenate([2.5 * Q[:, 0], np.zeros(5)])
    x = 0.7 * (np.cos(theta) * Q[:, 0] + np.sin(theta) * Q[:, 1])
    x = np.concatenate([np.sqrt(1 - 1e-6) * x, np.full(5, 0.7e-3 / np.sqrt(5))])
    one = np.array([0, nnz + 5])
    return SparseBlock.from_arrays(one, ids, x), SparseBlock.from_arrays(one, ids, w)


def test_ehhash_collision_probability_on_sparse_rows():
    """The sparse path (pairs over feature ids, the symmetric U of `eh_project_rows`) collides
    with probability arccos(cos^2 theta)/pi: 8,192 functions, 7 angles, 40 nonzeros out of
    2^40 ids, within 4 standard errors.  Bugs caught: the sparse query side not negated (Pr =
    1 - arccos(cos^2 theta)/pi), the query side over other pair keys than the point side (Pr =
    1/2 everywhere).  (Off-diagonal pairs weighted x_i x_j instead of sqrt(2) x_i x_j is *not*
    caught here -- planted, 40 spread nonzeros barely move Pr -- the kernel's quadratic-form
    test catches it.)"""
    rng = np.random.default_rng(11)
    _eh_collisions([_sparse_pair(t, 40, rng) for t in THETAS], d=1, seeds=2)


def test_ehhash_threads_and_chunks_give_the_same_keys(monkeypatch, caplog):
    """Sparse rows hashed on 2 threads in ~100 chunks (progress logged) give the keys of one
    call on one thread, and the estimate and progress lines are logged.  Bugs caught: a chunk
    boundary dropping or repeating a row, rows of a chunk written to another's place."""
    import logging

    import scipy.sparse as sp

    import lshdist.hashing.hyperplane as hp

    M = sp.random(300, 5_000, density=0.01, random_state=3, format="csr")
    S = SparseBlock.from_csr(M)
    one = EHHash(d=1, bits=128, seed=4).project(S)
    monkeypatch.setattr(hp, "EH_LOG_PAIR_BITS", 1.0)
    monkeypatch.setattr(hp, "EH_WARN_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="lshdist.hashing.hyperplane"):
        two = EHHash(d=1, bits=128, seed=4, n_threads=2).project(S)
    np.testing.assert_array_equal(one, two)
    text = caplog.text
    assert "EH-Hash of 300 points:" in text and "pair-bits, about" in text
    assert "fewer bits" in text and "100% in" in text
