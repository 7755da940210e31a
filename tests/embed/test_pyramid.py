"""PMK histograms against a brute-force pyramid match, and the PMK's known properties."""

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist

from lshdist.blocks import SparseBlock
from lshdist.embed import IntersectionKernel, PointSets, PyramidMatch
from lshdist.embed.histogram import channels
from lshdist.errors import InputError, NotFittedError


def pmk_reference(Y, Z, wY, wZ, shift, side0, L, weights):
    """``sum_i w_i (I_i - I_{i-1})`` with dictionaries of bin coordinates (no hashing)."""
    total, prev = 0.0, 0.0
    for i in range(L):
        side = side0 * 2.0**i
        hY, hZ = {}, {}
        for P, W, h in ((Y, wY, hY), (Z, wZ, hZ)):
            for p, w in zip(P, W):
                key = tuple(np.floor((p.astype(np.float64) + shift) / side).astype(int))
                h[key] = h.get(key, 0.0) + w
        I = sum(min(v, hZ[k]) for k, v in hY.items() if k in hZ)
        total += weights[i] * (I - prev)
        prev = I
    return total


def _sets(rng, n, d, span, lo=2, hi=12):
    return [rng.uniform(0, span, (rng.integers(lo, hi), d)).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("weights", [None, [4.0, 3.0, 3.0, 1.0, 0.5, 0.0]])
def test_pmk_matches_brute_force(weights):
    # Bugs caught: level weights not differenced (w_i for w_i - w_{i+1}); the last level's
    # weight dropped (w_L taken as w_{L-1}); a level-side or shift error; hashed bins colliding
    # across levels; rows of the block permuted (sets of different sizes).
    rng = np.random.default_rng(3)
    sets = PointSets.from_list(_sets(rng, 7, 3, 20.0))
    pm = PyramidMatch(levels=6, finest_side=0.75, weights=weights, seed=5).fit(sets)
    K = IntersectionKernel()(pm.transform(sets), pm.transform(sets))
    w = 0.5 ** np.arange(6) if weights is None else np.array(weights)
    for a in range(7):
        for b in range(7):
            Y, Z = sets.take([a]).values, sets.take([b]).values
            want = pmk_reference(Y, Z, np.ones(len(Y)), np.ones(len(Z)), pm.shift_, 0.75, 6, w)
            assert K[a, b] == pytest.approx(want, abs=1e-6), (a, b)
    assert np.allclose(K, K.T)


def test_pmk_point_weights_are_rounded_to_the_resolution():
    # Bugs caught: point weights ignored; counts rounded per point instead of per bin.
    rng = np.random.default_rng(4)
    raw = _sets(rng, 4, 2, 10.0)
    wts = [rng.integers(1, 9, len(s)) / 4.0 for s in raw]  # multiples of 1/4: exact
    sets = PointSets.from_list(raw, weights=wts)
    pm = PyramidMatch(levels=5, count_resolution=0.25, seed=1).fit(sets)
    K = IntersectionKernel()(pm.transform(sets), pm.transform(sets))
    for a in range(4):
        for b in range(4):
            want = pmk_reference(raw[a], raw[b], wts[a], wts[b], pm.shift_, 1.0, 5,
                                 0.5 ** np.arange(5))
            assert K[a, b] == pytest.approx(want, abs=1e-6)


def test_identical_sets_are_maximal_and_self_similarity_is_the_mass():
    # Bugs caught: normalisation by the wrong diagonal (rows vs columns); k(Y, Y) != w_0 |Y|.
    rng = np.random.default_rng(5)
    sets = PointSets.from_list(_sets(rng, 9, 4, 30.0))
    pm = PyramidMatch(levels=7, seed=2).fit(sets)
    H = pm.transform(sets)
    np.testing.assert_allclose(IntersectionKernel().diag(H), sets.sizes)
    Kn = IntersectionKernel(normalize=True)(H, H)
    np.testing.assert_allclose(np.diag(Kn), 1.0)
    off = Kn[~np.eye(9, dtype=bool)]
    assert off.max() < 1.0 and off.min() >= 0.0
    Q = pm.transform(sets.take([2, 0]))
    Kq = IntersectionKernel(normalize=True)(Q, H)
    assert Kq.argmax(axis=1).tolist() == [2, 0]
    np.testing.assert_allclose(IntersectionKernel(normalize=True).paired(Q, H.take([2, 0])), 1.0)


def test_histograms_do_not_depend_on_the_batch():
    # Bug caught: bins or rows that depend on which sets are embedded together (a shard).
    rng = np.random.default_rng(6)
    sets = PointSets.from_list(_sets(rng, 10, 3, 16.0))
    pm = PyramidMatch(levels=6, seed=0).fit(sets)
    full = pm.transform(sets)
    part = pm.transform(sets.take([7, 3, 4]))
    np.testing.assert_array_equal(IntersectionKernel()(part, full),
                                  IntersectionKernel()(full.take([7, 3, 4]), full))
    assert set(channels(full.features).tolist()) == set(range(6))


def _level_units(HY: SparseBlock, HZ: SparseBlock, pm: PyramidMatch) -> np.ndarray:
    """Matches ``I_i`` at each level, read off the hashed histograms (units per channel)."""
    out = []
    for i in range(pm.levels):
        f = np.union1d(HY.features, HZ.features)
        f = f[channels(f) == i]
        a, b = HY.over(f).toarray(), HZ.over(f).toarray()
        out.append(np.minimum(a, b).sum() / pm.quanta_[i])
    return np.array(out)


def test_pyramid_match_cost_bounds_the_optimal_matching():
    # The pyramid match implies a matching (finest bins first) whose L1 cost is at most
    # sum_i d * side_i * (I_i - I_{i-1}), so that bound is >= the optimal matching cost C*
    # on every pair; its mean ratio to C* stays within a stated factor (Grauman & Darrell:
    # O(d log D) in expectation).  Bugs caught: levels counted coarse to fine; a shift that
    # moves the grid per level; matches double-counted across levels.
    rng = np.random.default_rng(7)
    d, m, span, L = 2, 12, 32.0, 7  # top side 64 = 2 x span: nearly everything matches
    ratios = []
    for t in range(40):
        Y, Z = rng.uniform(0, span, (m, d)), rng.uniform(0, span, (m, d))
        sets = PointSets.from_list([Y, Z])
        pm = PyramidMatch(levels=L, seed=t).fit(sets)
        H = pm.transform(sets)
        I = _level_units(H.take([0]), H.take([1]), pm)
        assert np.all(np.diff(I) >= -1e-9) and I[-1] <= m
        new = np.diff(np.concatenate([[0.0], I]))
        cost = float(np.sum(new * d * 2.0 ** np.arange(L))) + (m - I[-1]) * d * span
        rows, cols = linear_sum_assignment(cdist(Y, Z, "cityblock"))
        opt = float(cdist(Y, Z, "cityblock")[rows, cols].sum())
        assert cost >= opt - 1e-9
        ratios.append(cost / opt)
    # measured here (d=2, D=32, 40 pairs of 12 points): mean 4.47, min 2.89, max 7.53; the
    # theory allows O(d log2 D) = O(10) in expectation
    assert np.mean(ratios) < 5.0 and np.max(ratios) < 8.5


def test_errors():
    sets = PointSets.from_list([np.zeros((2, 3))])
    with pytest.raises(InputError, match=r"weights .* must be finite, non-negative and "
                                         r"non-increasing"):
        PyramidMatch(levels=3, weights=[1, 2, 0]).fit(sets)
    with pytest.raises(InputError, match="weights has 2 entries, but levels=3"):
        PyramidMatch(levels=3, weights=[1, 0]).fit(sets)
    with pytest.raises(InputError, match=r"levels=0: the number of levels must be an integer"):
        PyramidMatch(levels=0).fit(sets)
    with pytest.raises(NotFittedError, match="not fitted"):
        PyramidMatch().transform(sets)
    pm = PyramidMatch().fit(sets)
    with pytest.raises(InputError, match="the sets have 2 features, but the pyramid was "
                                         "fitted on 3"):
        pm.transform(PointSets.from_list([np.zeros((2, 2))]))
    with pytest.raises(InputError, match="offsets must be non-decreasing"):
        PointSets.from_arrays(np.zeros((3, 2)), [0, 2, 1, 3])
    with pytest.raises(InputError, match="needs non-negative histograms"):
        IntersectionKernel()(-np.ones((1, 2)), np.ones((1, 2)))
