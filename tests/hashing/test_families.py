import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lshdist._kernels.hashing import gaussian_rows, pack_signs, permuted_prefix
from lshdist.blocks import SparseBlock
from lshdist.errors import InputError
from lshdist.hashing.families import gaussian_matrix
from lshdist.hashing import LearnedExplicit, LearnedImplicit, RandomHyperplanes
from lshdist.metric.itml import ITML, KernelITML

MASK = (1 << 64) - 1


def splitmix_ref(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def gaussian_ref(seed: int, feature: int, bits: int) -> np.ndarray:
    key = splitmix_ref(splitmix_ref(seed) ^ feature)
    out = []
    for t in range((bits + 1) // 2):
        z1 = splitmix_ref((key + ((2 * t) * 0x9E3779B97F4A7C15)) & MASK)
        z2 = splitmix_ref((key + ((2 * t + 1) * 0x9E3779B97F4A7C15)) & MASK)
        u1 = ((z1 >> 11) + 0.5) / 2.0**53
        u2 = ((z2 >> 11) + 0.5) / 2.0**53
        r = np.sqrt(-2 * np.log(u1))
        out += [r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)]
    return np.array(out[:bits])


def test_counter_gaussians_match_reference():
    feats = np.array([0, 1, 12345, 2**63 + 7, 2**64 - 1], dtype=np.uint64)
    got = gaussian_rows(np.uint64(42), feats, 7)
    for i, f in enumerate(feats.tolist()):
        np.testing.assert_allclose(got[i], gaussian_ref(42, f, 7), rtol=1e-12, atol=1e-12)
    big = gaussian_rows(np.uint64(1), np.arange(20000, dtype=np.uint64), 64)
    assert abs(big.mean()) < 0.01 and abs(big.std() - 1) < 0.01  # standard normal


def _words(bits01: np.ndarray) -> np.ndarray:
    """Reference packing: big-endian bytes of each 64-bit group."""
    n, b = bits01.shape
    padded = np.pad(bits01, ((0, 0), (0, -b % 64)))
    return np.ascontiguousarray(np.packbits(padded, axis=1)).view(">u8").astype(np.uint64)


def test_pack_signs_and_prefix_match_numpy():
    rng = np.random.default_rng(0)
    P = rng.normal(size=(50, 130))
    P[0, 5] = 0.0  # [p >= 0]: zero is a 1 bit
    codes = pack_signs(P)
    bits = (P >= 0).astype(np.uint8)
    assert np.array_equal(codes, _words(bits))
    perm = rng.permutation(130)[:64]
    ref_prefix = _words(bits[:, perm]).ravel()
    assert np.array_equal(permuted_prefix(codes, perm.astype(np.int64)), ref_prefix)
    short = rng.permutation(130)[:10]  # fewer than 64 positions: left-aligned
    assert np.array_equal(
        permuted_prefix(codes, short.astype(np.int64)), _words(bits[:, short]).ravel()
    )


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
    with pytest.raises(InputError, match="bits=0"):
        RandomHyperplanes(d=3, bits=0)
    with pytest.raises(InputError, match="X has 4 features, but the hash family has d=3"):
        RandomHyperplanes(d=3, bits=8).hash(np.zeros((2, 4), np.float32))
