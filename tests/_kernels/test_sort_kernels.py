"""The radix argsort against numpy's stable argsort."""

import numpy as np
import pytest

from lshdist._kernels.sort import (
    leading_passes,
    radix_argsort_u64,
    radix_sort_leading,
    radix_sort_u64,
)


@pytest.mark.parametrize("n, spread", [(0, 64), (1, 64), (7, 64), (5000, 64), (5000, 20),
                                       (5000, 3), (70_000, 64)])
def test_radix_argsort_is_numpys_stable_argsort(n, spread):
    # catches: a pass in the wrong digit order (most significant first), an unstable pass (ties
    # not in input order), a skipped pass that did have two digit values, the last digit's bucket
    rng = np.random.default_rng(n + spread)
    keys = rng.integers(0, 2**spread, size=n, dtype=np.uint64) if spread < 64 else \
        rng.integers(0, 2**63, size=n, dtype=np.int64).view(np.uint64) << np.uint64(1)
    if n > 10:
        keys[::7] = keys[3]  # many exact ties
        keys[-1] = np.uint64(2**64 - 1)  # the last bucket of every digit
    got = radix_argsort_u64(keys)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.argsort(keys, kind="stable"))
    # the keys sorted by the passes themselves, and an int32 order carried alike
    keys_before = keys.copy()
    sk, o32 = radix_sort_u64(keys, np.arange(n, dtype=np.int32))
    assert o32.dtype == np.int32 and sk.dtype == np.uint64
    assert np.array_equal(o32, got) and np.array_equal(sk, keys[got])
    assert np.array_equal(keys, keys_before)  # the input is not changed


@pytest.mark.parametrize("n, kind", [(0, "random"), (1, "random"), (2, "random"), (3, "ties"),
                                     (5000, "random"), (5000, "ties"), (5000, "low"),
                                     (5000, "clustered"), (70_000, "random"),
                                     (70_000, "clustered"), (70_000, "low")])
def test_leading_digit_sort_is_the_full_sort(n, kind):
    """`radix_sort_leading` gives exactly `radix_sort_u64`'s arrays (numpy's stable argsort):
    random keys (runs finished by insertion), many exact ties (insertion must keep them in
    input order), keys equal in their leading 44 bits (one long run: the full sort) and
    clusters of a few leading values with random low bits (runs over and under the bound)."""
    rng = np.random.default_rng(n + len(kind))
    if kind == "random":
        keys = rng.integers(0, 2**63, size=n, dtype=np.int64).view(np.uint64) << np.uint64(1)
    elif kind == "ties":
        keys = rng.integers(0, 5, size=n).astype(np.uint64) << np.uint64(60)
    elif kind == "low":
        keys = rng.integers(0, 2**20, size=n, dtype=np.uint64)
    else:
        lead = rng.integers(0, 64, size=n).astype(np.uint64) << np.uint64(58)
        keys = lead | rng.integers(0, 2**40, size=n, dtype=np.uint64)
    if n > 10:
        keys[::11] = keys[2]
        keys[-1] = np.uint64(2**64 - 1)
    before = keys.copy()
    order = np.arange(n, dtype=np.int32)
    sk, so = radix_sort_leading(keys, order)
    ref = np.argsort(keys, kind="stable")
    assert so.dtype == np.int32 and np.array_equal(so, ref) and np.array_equal(sk, keys[ref])
    assert np.array_equal(keys, before) and np.array_equal(order, np.arange(n))


def test_leading_passes():
    assert [leading_passes(n) for n in (1, 500, 30_000, 1_000_000, 2**21, 10**12, 10**14)] == \
        [1, 1, 2, 2, 3, 4, 5]
