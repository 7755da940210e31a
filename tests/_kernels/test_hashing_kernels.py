"""`lshdist._kernels.hashing` against plain Python / numpy references.

Each test names the plausible bug it catches; each was checked once by planting that bug.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lshdist._kernels.hashing import gaussian_rows, hamming, pack_signs, permuted_prefix, popcount64

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


def _words(bits01: np.ndarray) -> np.ndarray:
    """Reference packing: big-endian bytes of each 64-bit group (bit i -> word i // 64, MSB
    first)."""
    b = bits01.shape[1]
    padded = np.pad(bits01, ((0, 0), (0, -b % 64)))
    return np.ascontiguousarray(np.packbits(padded, axis=1)).view(">u8").astype(np.uint64)


def test_counter_gaussians_match_reference():
    # Bugs caught: the odd last bit (bits=7) dropped or taken from cos; features >= 2**63
    # (uint64 ids) mixed as signed; sin/cos or u1/u2 swapped.
    feats = np.array([0, 1, 12345, 2**63 + 7, 2**64 - 1], dtype=np.uint64)
    got = gaussian_rows(np.uint64(42), feats, 7)
    for i, f in enumerate(feats.tolist()):
        np.testing.assert_allclose(got[i], gaussian_ref(42, f, 7), rtol=1e-12, atol=1e-12)
    big = gaussian_rows(np.uint64(1), np.arange(20000, dtype=np.uint64), 64)
    assert abs(big.mean()) < 0.01 and abs(big.std() - 1) < 0.01  # standard normal


@settings(max_examples=20, deadline=None)
@given(bits=st.integers(1, 200), seed=st.integers(0, 2**32))
def test_pack_signs_matches_numpy(bits, seed):
    # Bugs caught: last partial word dropped (ceil(b/64) written as b // 64); LSB-first bit order
    # (63 - i % 64 written as i % 64); a zero projection giving a 0 bit ([p > 0] for [p >= 0]).
    rng = np.random.default_rng(seed)
    P = rng.normal(size=(9, bits))
    P[rng.random(P.shape) < 0.1] = 0.0  # [p >= 0]: zero is a 1 bit
    codes = pack_signs(P)
    assert codes.shape == (9, (bits + 63) // 64)
    assert np.array_equal(codes, _words((P >= 0).astype(np.uint8)))


def test_permuted_prefix_matches_numpy():
    # Bugs caught: positions read as "prefix bit -> key bit" the wrong way round (the inverse
    # permutation); a word index off by one for key bits >= 64; short prefixes right-aligned.
    rng = np.random.default_rng(0)
    P = rng.normal(size=(50, 130))
    bits = (P >= 0).astype(np.uint8)
    codes = pack_signs(P)
    for L in (64, 10, 1):  # fewer than 64 positions: left-aligned
        perm = rng.permutation(130)[:L]
        got = permuted_prefix(codes, perm.astype(np.int64))
        assert np.array_equal(got, _words(bits[:, perm]).ravel())


def test_drawn_whole_byte_positions_and_their_prefix():
    """`draw_positions` for b = 512: 64 distinct bits per list from 8 whole key bytes, the
    lists of a block of 8 on disjoint bytes, the bits in random order within the prefix (a
    prefix's leading 8 bits are not one key byte -- the order that cut 20 Newsgroups' recall);
    the prefix equals a bit-by-bit reference.  Other b: 64 (or b) random distinct bits.
    Bugs caught: bits of a byte left together; a block's lists reusing a byte; fewer than M
    lists when M is not a multiple of the block."""
    from lshdist.index.permutation import draw_positions

    rng = np.random.default_rng(1)
    P = rng.normal(size=(200, 512))
    bits = (P >= 0).astype(np.uint8)
    codes = pack_signs(P)
    pos = draw_positions(np.random.default_rng(2), 512, 20)
    assert pos.shape == (20, 64) and pos.dtype == np.int64
    lead_bytes = []
    for row in pos:
        assert len(set(row)) == 64 and len(set(row // 8)) == 8
        assert all(np.sum(row // 8 == b) == 8 for b in row // 8)  # whole bytes
        lead_bytes.append(len(set(row[:8] // 8)))
        assert np.array_equal(permuted_prefix(codes, row), _words(bits[:, row]).ravel())
    assert np.mean(lead_bytes) > 4  # the leading 8 bits come from several bytes
    for blk in (pos[:8], pos[8:16]):
        assert len(set((blk // 8).ravel())) == 64  # a block's lists share no byte
    assert not np.array_equal(pos[:8], pos[8:16])
    for b, L in ((100, 64), (40, 40), (64, 64)):
        other = draw_positions(np.random.default_rng(3), b, 5)
        assert other.shape == (5, L) and all(len(set(r)) == L for r in other)
        assert other.max() < b


@settings(max_examples=30, deadline=None)
@given(words=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_hamming_and_popcount_match_numpy(words, seed):
    # Bugs caught: a wrong SWAR mask or shift (popcount of all-ones / the top bit); the last
    # word of a multi-word key not compared (range off by one).
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**64, size=words, dtype=np.uint64)
    b = rng.integers(0, 2**64, size=words, dtype=np.uint64)
    a[0] = np.uint64(2**64 - 1)
    b[-1] ^= np.uint64(1 << 63)
    ref = int(np.unpackbits((a ^ b).view(np.uint8)).sum())
    assert hamming(a, b) == ref
    for x in (*a, *b, np.uint64(0), np.uint64(2**64 - 1), np.uint64(1 << 63)):
        assert popcount64(np.uint64(x)) == bin(int(x)).count("1")
