"""`lshdist._kernels.unary` and `lshdist._kernels.sets` against plain numpy references.

Each test names the plausible bug it catches; each was checked once by planting that bug.
"""

import numpy as np

from lshdist._kernels.hashing import gaussian_rows
from lshdist._kernels.sets import (
    intersection_paired,
    intersection_pairwise,
    pair_ids,
    pyramid_bin_ids,
)
from lshdist._kernels.unary import unary_id, unary_ids, unary_projection

MASK = (1 << 64) - 1


def splitmix_ref(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def channel_ref(tag: int, channel: int, h: int) -> int:
    z = splitmix_ref(splitmix_ref(tag ^ channel) ^ h)
    return (channel << 56) | (z & ((1 << 56) - 1))


def test_unary_ids_match_reference():
    # Bugs caught: coordinate j counted from 1; the tag added to the feature instead of j;
    # bins > 2**63 mixed as signed.
    ids = np.array([5, 2**63 + 11, 7], dtype=np.uint64)
    counts = np.array([3, 0, 2], dtype=np.int64)
    want = [splitmix_ref(f ^ splitmix_ref((j + 0xA4093822299F31D0) & MASK))
            for f, c in zip(ids.tolist(), counts.tolist()) for j in range(c)]
    assert unary_ids(ids, counts).tolist() == want
    assert unary_id(np.uint64(7), 1) == want[-1]


def unary_projection_ref(seed, indptr, ids, counts, values, bits):
    out = np.zeros((len(indptr) - 1, bits))
    for y in range(len(indptr) - 1):
        for k in range(indptr[y], indptr[y + 1]):
            if counts[k]:
                G = gaussian_rows(np.uint64(seed), unary_ids(ids[k:k + 1], counts[k:k + 1]), bits)
                out[y] += values[k] * G.sum(axis=0)
    return out


def test_unary_projection_matches_gaussian_rows():
    # Bugs caught: the first n+1 Gaussians summed (j <= n); the entry value ignored or applied
    # squared; the odd last bit (bits=7) dropped; a row's last bin skipped (indptr off by one);
    # an empty row in the middle shifting the rows after it.
    rng = np.random.default_rng(1)
    indptr = np.array([0, 3, 3, 7], dtype=np.int64)
    ids = rng.integers(0, 2**63, 7, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    counts = np.array([1, 4, 0, 2, 7, 1, 3], dtype=np.int64)
    values = rng.uniform(0.1, 2.0, 7)
    got = unary_projection(np.uint64(9), indptr, ids, counts, values, 7)
    want = unary_projection_ref(9, indptr, ids, counts, values, 7)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert not got[1].any()


def test_pyramid_bin_ids_match_reference():
    # Bugs caught: the shift subtracted; bin side 2**(i+1) (level off by one); floor written as
    # truncation (negative coordinates); the level missing from the top byte; coordinates hashed
    # in another order (a transpose).
    X = np.array([[0.2, -0.7], [3.9, 1.0], [-2.5, 5.5]])
    shift = np.array([0.5, 1.25])
    got = pyramid_bin_ids(X, shift, 0.5, 4, 77)
    for p in range(3):
        for i in range(4):
            side = 0.5 * 2**i
            h = 0x243F6A8885A308D3
            for j in range(2):
                c = int(np.floor((X[p, j] + shift[j]) / side))
                h = splitmix_ref(h ^ (c & MASK))
            assert int(got[p, i]) == channel_ref(77, i, h), (p, i)
    assert (got >> np.uint64(56)).tolist() == [[0, 1, 2, 3]] * 3


def test_pair_ids_are_ordered():
    # Bug caught: a symmetric mix (a ^ b) giving (a, b) and (b, a) one bin.
    a = np.array([1, 2], dtype=np.int64)
    got = pair_ids(3, 5, a, a[::-1].copy())
    assert got[0] != got[1] and (got >> np.uint64(56)).tolist() == [5, 5]


def _random_csr(rng, n, universe):
    rows, ptr = [], [0]
    for _ in range(n):
        ids = np.sort(rng.choice(universe, rng.integers(0, 6), replace=False))
        rows.append((ids, rng.integers(1, 5, len(ids)).astype(float)))
        ptr.append(ptr[-1] + len(ids))
    ids = np.concatenate([r[0] for r in rows]).astype(np.uint64)
    vals = np.concatenate([r[1] for r in rows])
    dense = np.zeros((n, len(universe)))
    for i, (f, v) in enumerate(rows):
        dense[i, np.searchsorted(universe, f)] = v
    return np.array(ptr, np.int64), ids, vals, dense


def test_intersection_matches_dense_min_sum():
    # Bugs caught: max for min; a row's last entry skipped in the merge; the pairwise matrix
    # transposed (n_a != n_b here); ids compared as signed (ids >= 2**63 in the universe).
    rng = np.random.default_rng(2)
    universe = np.concatenate([np.arange(8, dtype=np.uint64),
                               np.uint64(2**63) + np.arange(4, dtype=np.uint64)])
    A = _random_csr(rng, 5, universe)
    B = _random_csr(rng, 3, universe)
    want = np.minimum(A[3][:, None, :], B[3][None]).sum(axis=2)
    np.testing.assert_array_equal(intersection_pairwise(*A[:3], *B[:3]), want)
    A2 = _random_csr(rng, 3, universe)
    np.testing.assert_array_equal(intersection_paired(*A2[:3], *B[:3]),
                                  np.minimum(A2[3], B[3]).sum(axis=1))
