"""The unary encoding of PMK histograms: exact kernel, implicit = explicit, collision rates."""

import numpy as np
import pytest

from lshdist.embed import IntersectionKernel, PointSets, PyramidMatch
from lshdist.embed.unary import unary_expand
from lshdist.errors import InputError
from lshdist.hashing.families import sparse_projection
from lshdist.hashing.unary import UnaryHyperplanes, unary_project
from lshdist.metric.kernels import LinearKernel


def _pmk(seed=0, n=6, levels=6, weights=None, resolution=1.0):
    rng = np.random.default_rng(seed)
    raw = [rng.uniform(0, 24, (rng.integers(2, 10), 3)) for _ in range(n)]
    wts = None if weights is None else [rng.integers(1, 7, len(s)) * weights for s in raw]
    sets = PointSets.from_list(raw, weights=wts)
    pm = PyramidMatch(levels=levels, count_resolution=resolution, seed=seed).fit(sets)
    return pm, pm.transform(sets)


@pytest.mark.parametrize("weights", [None, 0.5])
def test_unary_dot_products_are_the_intersection_kernel(weights):
    # f(Y) . f(Z) of the explicit unary vectors equals the PMK computed directly.  Bugs caught:
    # entries of value q instead of sqrt(q); units not divided by the resolution.
    pm, H = _pmk(1, weights=weights, resolution=0.5 if weights else 1.0)
    F = unary_expand(H, pm.quanta_)
    np.testing.assert_allclose(LinearKernel()(F, F), IntersectionKernel()(H, H),
                               rtol=1e-6, atol=1e-6)


def test_implicit_projection_equals_explicit():
    # r^T phi through the implicit encoding equals the product with the unary-expanded r (the
    # existing sparse projection of the explicit vectors).  Bug caught: a seed not mixed the
    # same way as gaussian_rows.
    pm, H = _pmk(2)
    got = unary_project(H, pm.quanta_, seed=11, bits=33)
    want = sparse_projection(unary_expand(H, pm.quanta_), 11, 33)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # float32 entries in F


def test_collision_rate_is_one_minus_angle_over_pi():
    # Charikar: P[h(Y) = h(Z)] = 1 - theta/pi, cos theta the normalised intersection kernel.
    # Pairs from identical to unrelated sets spread theta; each rate measured over 16384 bits
    # (4 families) must sit within 4 standard errors (expected 0.866, 0.805, 0.767, 0.629,
    # 0.547, 0.517, 0.511; mean deviations over 20 seeds within 0.0033).  Bugs caught: bins
    # sharing one Gaussian stream across units (collisions too high); unary ids of different
    # bins colliding.
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 32, (10, 3))
    others = [base + rng.normal(0, s, base.shape) for s in (0.0, 0.05, 0.1, 0.2, 0.5, 1.5, 6.0)]
    others.append(rng.uniform(0, 32, (10, 3)))
    sets = PointSets.from_list([base, *others])
    pm = PyramidMatch(levels=7, seed=0).fit(sets)
    H = pm.transform(sets)
    fams = [UnaryHyperplanes(pm.quanta_, bits=4096, seed=s) for s in range(4)]
    P = np.hstack([f.project(H) for f in fams])
    bits = P.shape[1]
    signs = P >= 0
    cos = IntersectionKernel(normalize=True)(H.take([0]), H)[0, 1:]
    want = 1 - np.arccos(np.clip(cos, -1, 1)) / np.pi
    got = (signs[1:] == signs[0]).mean(axis=1)
    se = np.sqrt(want * (1 - want) / bits) + 1e-12
    assert np.all(np.abs(got - want) <= 4 * se + 1e-9), (got, want)
    assert want.min() < 0.55 and want.max() == 1.0  # the pairs cover a range of angles
    assert fams[0].hash(H).shape == (9, 64)


def test_values_off_the_quanta_are_refused():
    pm, H = _pmk(4)
    with pytest.raises(InputError, match=r"is not an integer number .* of its quantum"):
        unary_project(H, pm.quanta_ * 3, seed=0, bits=8)
    with pytest.raises(InputError, match="unary hashing takes histograms"):
        UnaryHyperplanes(pm.quanta_, bits=8).project(np.ones((2, 3)))
