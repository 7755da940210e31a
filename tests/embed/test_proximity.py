"""PDK histograms against a brute-force count, and through the unary encoding."""

import numpy as np
import pytest

from lshdist.embed import IntersectionKernel, PointSets
from lshdist.embed.proximity import ProximityDistribution
from lshdist.embed.unary import unary_expand
from lshdist.errors import InputError, NotFittedError
from lshdist.metric.kernels import LinearKernel


def pdk_counts(words, xy, R):
    """``{(a, b, c): #pairs (p, q_r) with word a, word b, r <= c}`` by plain loops."""
    n, out = len(words), {}
    for p in range(n):
        dist = sorted((float(((xy[p] - xy[q]) ** 2).sum()), q) for q in range(n) if q != p)
        for r, (_, q) in enumerate(dist[:R], start=1):
            for c in range(r, R + 1):
                key = (int(words[p]), int(words[q]), c)
                out[key] = out.get(key, 0) + 1
    return out


def _sets(rng, n):
    feats = [rng.normal(size=(rng.integers(1, 9), 2)) for _ in range(n)]
    xy = [rng.integers(0, 4, (len(f), 2)).astype(float) for f in feats]  # grid: many ties
    return PointSets.from_list(feats, coords=xy)


def test_pdk_matches_brute_force():
    # Bugs caught: counts not cumulative over c; a point counted as its own neighbour; the
    # word pair unordered; ties broken other than by position; a set of one point (no pairs)
    # shifting the rows after it; fewer than R other points.
    rng = np.random.default_rng(0)
    sets = _sets(rng, 8)
    R = 4
    pdk = ProximityDistribution(n_words=5, neighbors=R, seed=1).fit(sets)
    H = pdk.transform(sets)
    K = IntersectionKernel()(H, H)
    w = pdk.words(sets)
    ref = []
    for s in range(len(sets)):
        lo, hi = sets.offsets[s], sets.offsets[s + 1]
        ref.append(pdk_counts(w[lo:hi], sets.coords[lo:hi], R))
    for a in range(len(sets)):
        for b in range(len(sets)):
            want = sum(min(v, ref[b][k]) for k, v in ref[a].items() if k in ref[b])
            assert K[a, b] == want, (a, b)
    F = unary_expand(H, pdk.quanta_)
    np.testing.assert_allclose(LinearKernel()(F, F), K)  # f(Y) . f(Z) is the PDK


def test_codebook_words_are_nearest_centres():
    rng = np.random.default_rng(1)
    sets = _sets(rng, 30)
    pdk = ProximityDistribution(n_words=6, neighbors=2, seed=0).fit(sets)
    D = ((sets.values[:, None, :] - pdk.codebook_[None]) ** 2).sum(axis=2)
    np.testing.assert_array_equal(pdk.words(sets), D.argmin(axis=1))
    again = ProximityDistribution(n_words=6, neighbors=2, seed=0).fit(sets)
    np.testing.assert_array_equal(again.codebook_, pdk.codebook_)  # seeded


def test_errors():
    rng = np.random.default_rng(2)
    sets = _sets(rng, 3)
    with pytest.raises(NotFittedError, match="not fitted"):
        ProximityDistribution().transform(sets)
    with pytest.raises(InputError, match=r"neighbors=0: must be an integer in 1..255"):
        ProximityDistribution(n_words=2, neighbors=0).fit(sets)
    with pytest.raises(InputError, match=r"n_words=1000, but the sets hold only"):
        ProximityDistribution(n_words=1000).fit(sets)
    pdk = ProximityDistribution(n_words=2).fit(sets)
    with pytest.raises(InputError, match="the PDK needs image coordinates"):
        pdk.transform(PointSets.from_list([np.zeros((2, 2))]))
