"""The radix argsort against numpy's stable argsort."""

import numpy as np
import pytest

from lshdist._kernels.sort import radix_argsort_u64, radix_sort_u64


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

