"""Dense payloads on their exact uint8 grid: found, stored, read back and re-ranked from it.

Rows that are ``lo + g u`` exactly (pixels, counts) are stored as uint8 and held that way after
a load; every answer must be the float32 rows' bit for bit."""

import pickle

import numpy as np
import pytest

from lshdist._kernels.search import column_bounds, exact_grid, rerank_dense
from lshdist.errors import FormatError, InputError
from lshdist.index.payload import DensePayload, column_bounds_parallel, exact_grid_parallel
from lshdist.index.scan import scan_topk


def _grid(Z):
    Z = np.ascontiguousarray(Z, dtype=np.float32)
    return exact_grid(Z, *column_bounds(Z, 0, len(Z)))


def test_exact_grid_finds_pixels_counts_and_their_power_of_two_multiples(fashion):
    """Fashion-MNIST pixels: unit 1, U the pixels; the same times 2^-8 and shifted by -3.5:
    unit 2^-8; integer counts with negative minima; constant columns.  Refused: real-valued
    rows, a column spanning 256 units, a unit whose multiples are not float32 numbers
    (0.3 u), integers beside one half-integer (no one unit but 0.5, then 511 units wide).
    Bugs caught: the unit taken from one column, u past 255 wrapping in uint8, an inexact
    g u accepted (rows rebuilt 1 ulp off)."""
    X = fashion.X_train[:3_000].astype(np.float32)
    ok, g, U = _grid(X)
    assert ok and g == 1.0 and np.array_equal(U, X.astype(np.uint8))
    ok, g, U = _grid(X * np.float32(2.0 ** -8) - np.float32(3.5))
    assert ok and g == 2.0 ** -8 and np.array_equal(U, X.astype(np.uint8))
    rng = np.random.default_rng(0)
    C = rng.integers(-40, 200, size=(500, 30)).astype(np.float32)
    C[:, 4] = 7.0
    ok, g, U = _grid(C)
    assert ok and g == 1.0 and np.array_equal(U.astype(np.float32) + C.min(0), C)
    assert not _grid(rng.normal(size=(500, 30)))[0]
    wide = C.copy()
    wide[0, 2] = C[:, 2].min() + 256
    assert not _grid(wide)[0]
    assert not _grid(np.arange(256, dtype=np.float32)[:, None] * np.float32(0.3))[0]
    half = np.ascontiguousarray(X[:500, :40] % 200)
    half[3, 5] += np.float32(0.5)
    assert not _grid(half)[0]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_grid_found_on_threads_is_the_one_piece_grid(fashion, threads):
    """`exact_grid_parallel` (row ranges on threads: the unit the smallest of the parts', each
    part checked against it, the largest u per column merged over the parts) gives the
    one-piece kernel's grid, and refuses what it refuses: pixels at unit 1/4; a smaller unit
    present only in the last part (every part's u doubles); an off-grid value above the
    floor only in the last part (the other parts pass on their own); a column at 2^17 whose
    only step, 2 units of 2^-7, lies in the last part — its entries are float32 numbers but
    2^17 + 2^-7 is not, so the float32 table test must see that column's u of 2 from the last
    part.  Bugs caught: a part's own unit used for its rows, a failing part's verdict lost,
    the largest u taken from one part (the table test passed for the others' columns)."""
    X = np.ascontiguousarray(fashion.X_train[:13_000], dtype=np.float32) * np.float32(0.25)

    def both(Z):
        Z = np.ascontiguousarray(Z, dtype=np.float32)
        b = column_bounds_parallel(Z, threads)
        got = exact_grid_parallel(Z, b, threads)
        ok, g, U = exact_grid(Z, *b)
        assert (got is not None) == ok
        if ok:
            assert got is not None and np.all(got[1] == np.float32(g))
            assert np.array_equal(got[0], b[0]) and np.array_equal(got[2], U)
        return got

    got = both(X)
    assert got is not None and got[1][0] == 0.25
    # pixels below 128 in steps of 0.125 (0 .. 15.875), one 1/16 step in the last part: 254
    # units of 1/16
    small = (fashion.X_train[:13_000, :40] % 128).astype(np.float32) * np.float32(0.125)
    small[-1, 3] = np.float32(0.0625)
    got = both(small)
    assert got is not None and got[1][0] == 0.0625 and got[2][-1, 3] == 1
    real = X.copy()
    real[-1, 5] = np.float32(10.1)  # above the floor (0.25): off the grid, in the last part
    assert both(real) is None
    # unit 2^-7 from the pixels; a column at 2^17 (float32 spacing 2^-6 there) whose one
    # step, u = 2, is in the last row
    tall = np.concatenate([fashion.X_train[:13_000, :40].astype(np.float32)
                           * np.float32(2.0 ** -7),
                           np.full((13_000, 1), 2.0 ** 17, dtype=np.float32)], axis=1)
    tall[-1, 40] = np.float32(2.0 ** 17 + 2.0 ** -6)
    assert both(tall) is None
    tall[-1, 40] = np.float32(2.0 ** 17)  # the column constant again: the grid holds
    got = both(tall)
    assert got is not None and got[1][0] == 2.0 ** -7


def _candidates(rng, Q, N, n):
    rows = np.concatenate([rng.permutation(N)[:n] for _ in range(Q)]).astype(np.int64)
    return np.arange(0, Q * n + 1, n, dtype=np.int64), rows


@pytest.mark.parametrize("n", [6, 40, 300])
def test_payload_read_on_its_grid_answers_bit_for_bit_without_float_rows(fashion, n):
    """A payload stored on its grid (`arrays` -> `from_arrays`) is held as uint8: re-ranks with
    few and many candidates per query (the exact pass rebuilding rows) and a pickled copy give
    `rerank_dense`'s answer on the float32 rows, and never make those rows; the in-memory
    payload with the same rows answers the same through its own grid; the float32 rows come
    back exactly when asked for.  Bugs caught: a rebuilt row rounded differently (ties or last
    bits off), the few-candidates path reading the missing float rows, a pickle that
    materialises them."""
    rng = np.random.default_rng(n)
    Z = np.ascontiguousarray(fashion.X_train[:4_000], dtype=np.float32)
    Zq = DensePayload(fashion.X_test[:50].astype(np.float32))
    ids = rng.permutation(10**6)[:4_000].astype(np.int64)
    ids[7] = ids[8] - 1 if ids[8] > 0 else 1  # near ids for the duplicates below
    Z[8] = Z[7]  # a duplicate row: an exact tie, broken by id
    offsets, rows = _candidates(rng, 50, 4_000, n)
    rows[:n][:2] = (7, 8)
    want = rerank_dense(offsets, rows, Z, Zq.Z, 10, ids)
    mem = DensePayload(Z)
    stored = mem.arrays()
    assert sorted(stored) == ["U", "lo", "step"] and stored["U"].dtype == np.uint8
    held = DensePayload.from_arrays(stored)
    assert held.held_on_grid and len(held) == 4_000 and held.shape == (4_000, 784)
    for p in (held, mem, pickle.loads(pickle.dumps(held))):
        got = p.rerank(offsets, rows, Zq, 10, ids)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert held.held_on_grid
    part = held.take(np.array([5, 1, 9]))
    assert part.held_on_grid and np.array_equal(part.Z, Z[[5, 1, 9]])
    assert np.array_equal(held.Z, Z) and not held.held_on_grid


@pytest.mark.parametrize("shift", [0.0, 1e6])
@pytest.mark.parametrize("prune", [False, True])
def test_scan_of_a_payload_held_on_its_grid_is_the_float_scan(fashion, monkeypatch, shift,
                                                              prune):
    """The exact scan (`scan_topk`, whose product needs float rows) of a payload held on its
    grid makes its rows a block at a time and keeps none of them (kept, a query's recall
    check held 4x the grid's bytes per segment): the same centre and norms as the float
    payload's, the same answers, pruned or not, near the origin or far from it (then each
    block is centred)."""
    import lshdist.index.payload as payload_mod

    monkeypatch.setattr(payload_mod, "GRID_BLOCK_BYTES", 700 * 784 * 4)  # blocks and a part
    Z = fashion.X_train[:3_000].astype(np.float32) + np.float32(shift)
    q = DensePayload(fashion.X_test[:40].astype(np.float32) + np.float32(shift))
    floats = DensePayload(Z)
    want = scan_topk(floats, q, 10, prune=prune)
    held = DensePayload.from_arrays(DensePayload(Z).arrays())
    assert held.held_on_grid
    got = scan_topk(held, q, 10, prune=prune)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert held.held_on_grid  # no float rows made whole, none kept
    c, norms, _, far = held._centred()
    c0, norms0, _, far0 = floats._centred()
    assert np.array_equal(c, c0) and np.array_equal(norms, norms0) and far == far0
    assert far == (shift > 0)
    np.testing.assert_allclose(held.distances(q), floats.distances(q), rtol=1e-5,
                               atol=1e-3 * float(norms.max()))
    # float rows made after the centring (another path asked for Z): rows far from the
    # origin are still multiplied centred, as the scan's rounding bound assumes
    assert held.Z is not None and not held.held_on_grid
    np.testing.assert_allclose(held.distances(q), floats.distances(q), rtol=1e-5,
                               atol=1e-3 * float(norms.max()))
    again = scan_topk(held, q, 10, prune=prune)
    assert np.array_equal(again[0], want[0]) and np.array_equal(again[1], want[1])
    assert np.array_equal(held.Z, Z)  # the rows multiplied centred were not changed


def test_real_valued_rows_are_stored_as_floats():
    Z = np.random.default_rng(1).normal(size=(200, 40)).astype(np.float32)
    stored = DensePayload(Z).arrays()
    assert list(stored) == ["Z"] and stored["Z"] is not None
    assert not DensePayload.from_arrays(stored).held_on_grid


def test_grid_arrays_are_checked():
    U = np.zeros((3, 4), np.uint8)
    lo, step = np.zeros(4, np.float32), np.ones(4, np.float32)
    with pytest.raises(InputError, match="'U' must be 2-d uint8, got 2-d float32"):
        DensePayload.from_arrays({"U": U.astype(np.float32), "lo": lo, "step": step})
    with pytest.raises(InputError, match=r"U \(N, d\), lo \(d,\) and step \(d,\); got U "
                                         r"\(3, 4\), lo \(3,\)"):
        DensePayload.from_arrays({"U": U, "lo": lo[:3], "step": step})
    with pytest.raises(InputError, match="not all float32 numbers"):
        DensePayload.from_arrays({"U": U + 255, "lo": lo, "step": step * np.float32(0.3)})
    with pytest.raises(InputError, match=r"arrays \['Z'\] or \['U', 'lo', 'step'\], got "
                                         r"\['U', 'lo'\]"):
        DensePayload.from_arrays({"U": U, "lo": lo})


def test_a_segment_of_pixels_is_stored_and_searched_on_its_grid(fashion, tmp_path):
    """`write_segment` of integer rows stores ``payload/{U,lo,step}`` (no ``payload/Z``; a
    quarter of the payload's bytes on disk); `read_segment` verifies it and the loaded segment
    searches as the fitted one, held on its grid throughout; a flipped byte of ``U`` is caught
    by the checksum."""
    from lshdist.index.permutation import PermutationIndex
    from lshdist.store.index import new_segment_name, read_segment, segment_path, write_segment

    rng = np.random.default_rng(3)
    X = fashion.X_train[:2_000].astype(np.float32)
    codes = rng.integers(0, 2**63, size=(2_000, 1), dtype=np.int64).astype(np.uint64)
    ix = PermutationIndex(n_permutations=8, window=30, seed=1).fit(
        codes, 64, DensePayload(X), np.arange(2_000, dtype=np.int64))
    root = tmp_path / "idx"
    (root / "segments").mkdir(parents=True)
    name = new_segment_name()
    entry = write_segment(root, name, ix)
    path = segment_path(root, name)
    assert sorted(p.name for p in (path / "payload").iterdir()) == ["U", "lo", "step", "zarr.json"]
    manifest = {"bits": 64, "window": 30, "hamming_keep": 0, "seed": 1}
    got = read_segment(root, entry, manifest)
    assert got.payload_.held_on_grid
    q = DensePayload(fashion.X_test[:30].astype(np.float32))
    qcodes = rng.integers(0, 2**63, size=(30, 1), dtype=np.int64).astype(np.uint64)
    want = ix.search(qcodes, q, 5)
    have = got.search(qcodes, q, 5)
    assert all(np.array_equal(a, b) for a, b in zip(want[:2], have[:2], strict=True))
    assert got.payload_.held_on_grid
    chunk = next(p for p in (path / "payload" / "U").rglob("*") if p.is_file()
                 and p.name != "zarr.json")
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=r"unreadable|checksum"):
        read_segment(root, entry, manifest)


def test_compact_keeps_pixels_on_their_grid_and_real_rows_as_they_are(fashion):
    """`compact` (what `run`'s kept segments and the workers' query chunks hold): integer rows
    come back held on their grid, a quarter of the bytes, answering the same; real-valued rows
    are the same object."""
    from lshdist.cluster.sizes import held_bytes

    Z = fashion.X_train[:2_000].astype(np.float32)
    p = DensePayload(Z)
    c = p.compact()
    assert c.held_on_grid and np.array_equal(c.Z, Z)
    assert held_bytes(DensePayload(Z).compact()) < 0.3 * Z.nbytes
    rng = np.random.default_rng(0)
    offsets, rows = _candidates(rng, 20, 2_000, 100)
    q = DensePayload(fashion.X_test[:20].astype(np.float32)).compact()
    assert q.held_on_grid
    want = p.rerank(offsets, rows, DensePayload(fashion.X_test[:20].astype(np.float32)), 5,
                    np.arange(2_000))
    got = DensePayload(Z).compact().rerank(offsets, rows, q.take(np.arange(20)), 5,
                                           np.arange(2_000))
    assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])
    R = DensePayload(rng.normal(size=(100, 40)))
    assert R.compact() is R


def test_a_compact_payload_borrows_the_float_rows_while_its_source_lives(fashion):
    """A segment kept in memory for a query (`compact`) scans with its fitted segment's float32
    rows while that one lives (its writes still running), not a second copy; once it is gone
    the rows are made from the grid -- the same numbers either way."""
    import gc

    Z = fashion.X_train[:2_000].astype(np.float32) + np.float32(0.5)
    src = DensePayload(Z.copy())
    c = src.compact()
    assert c.Z is src._Z and c.held_on_grid  # borrowed, not kept
    q = DensePayload(fashion.X_test[:30].astype(np.float32))
    lent = c.distances(q)
    del src
    gc.collect()
    made = c.Z
    assert made is not None and np.array_equal(made, Z) and not c.held_on_grid
    assert np.array_equal(DensePayload(made).distances(q), lent)


def _unit_f64(Z, lo, floor):
    """The grid unit as first written: per row, the smallest positive ``z - lo`` in float64."""
    t = Z.astype(np.float64) - lo.astype(np.float64)
    t = np.where(t > 0.0, t, np.inf)
    rows = t.min(axis=1) if t.shape[1] else np.full(len(t), np.inf)
    return -1.0 if np.any(rows < floor) else float(rows.min(initial=np.inf))


@pytest.mark.parametrize("seed", range(12))
def test_float32_unit_gives_the_float64_units_grid(fashion, seed):
    """The unit found in float32, per column, makes the same grid decision as the float64
    one per row: where `exact_grid` accepts, the float64 unit is the same number; where it
    refuses, the float64 unit is refused too (below the floor, not a float32, or its fill
    fails).  Rows: pixels scaled by a power of two and shifted, integers with negative
    minima, either one with an entry nudged off the grid by an ulp or by a small step, and
    real values.  Bug caught: a float32 difference rounding to a unit the float64 path would
    not take."""
    from lshdist._kernels.search import grid_fill_block, grid_floor, grid_table_exact, grid_unit

    rng = np.random.default_rng(seed)
    base = fashion.X_train[rng.permutation(60_000)[:700], :60].astype(np.float32)
    kind = seed % 4
    if kind == 0:
        Z = base * np.float32(2.0 ** -int(rng.integers(0, 12))) - np.float32(rng.integers(-9, 9))
    elif kind == 1:
        Z = rng.integers(-120, 130, size=(700, 60)).astype(np.float32)
    elif kind == 2:
        Z = base * np.float32(0.5) + np.float32(1000.25)
    else:
        Z = rng.normal(size=(700, 60)).astype(np.float32) * np.float32(rng.uniform(1e-3, 1e3))
    if seed >= 4 and kind != 3:
        i, j = rng.integers(0, 700), rng.integers(0, 60)
        Z[i, j] = np.nextafter(Z[i, j], np.float32(np.inf)) if seed % 2 else Z[i, j] + np.float32(
            rng.choice([0.5, 0.125, 1e-3]))
    Z = np.ascontiguousarray(Z)
    lo, hi = column_bounds(Z, 0, len(Z))
    ok, g, _ = exact_grid(Z, lo, hi)
    ref = _unit_f64(Z, lo, grid_floor(lo, hi))
    if ok:
        assert ref == g
        return
    if ref < 0.0 or grid_unit(ref) < 0.0:
        return
    umax = np.zeros(Z.shape[1], dtype=np.uint8)
    V = np.empty(Z.shape, dtype=np.uint8)
    g64 = grid_unit(ref)
    assert not (grid_fill_block(Z, lo, g64, 0, len(Z), V, umax)
                and grid_table_exact(lo, np.full(Z.shape[1], np.float32(g64)), umax))


def _byte_cases(fashion):
    rng = np.random.default_rng(3)
    X = np.ascontiguousarray(fashion.X_train[:2_000], dtype=np.uint8)
    shifted = rng.integers(17, 200, size=(300, 12)).astype(np.uint8)  # nonzero minima
    even = (rng.integers(0, 100, size=(300, 12)) * 2 + 5).astype(np.uint8)  # unit 2
    even[:, 3] = 9  # and a constant column
    mixed = even.copy()
    mixed[7, 2] += 1  # one step not a multiple of the unit: no exact grid
    return {"pixels": X, "shifted": shifted, "even": even, "mixed": mixed,
            "constant": np.full((40, 5), 200, np.uint8), "one row": X[:1],
            "no rows": X[:0]}


def test_payload_from_bytes_is_the_compacted_float32_payload(fashion):
    """`DensePayload.from_bytes` of uint8 rows holds the exact grid that `compact` finds for
    the same rows in float32 (the same lo, unit and U, held on it alone), or, when there is
    none, the float32 rows; its distances are theirs, bit for bit.  Bugs caught: the unit
    taken as 1 for even-valued rows, U not shifted by nonzero column minima, a grid kept
    where one step is not a multiple of the unit, a constant column's unit of 0."""
    for name, B in _byte_cases(fashion).items():
        want = DensePayload(B.astype(np.float32)).compact()
        got = DensePayload.from_bytes(B)
        assert got.held_on_grid == want.held_on_grid == (name not in ("mixed", "no rows")), name
        a, b = want.arrays(), got.arrays()
        assert a.keys() == b.keys(), name
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), (name, key)
        if len(B) > 1:
            q = DensePayload(B[::3].astype(np.float32) + np.float32(0.5))
            assert np.array_equal(got.distances(q), want.distances(q)), name
    with pytest.raises(InputError, match="byte rows are uint8"):
        DensePayload.from_bytes(np.zeros((3, 2), np.float32))


def test_byte_rows_encode_as_their_float32_rows(fashion):
    """`encode` of uint8 rows under the identity metric (no float32 copy: hashed a block at a
    time, the payload on its grid) gives the keys and payload of the same rows in float32,
    hashed and not; under a learned metric the bytes take the float32 path (its payload is
    G x).  Bugs caught: the blocks hashed as uint8 products, a block boundary off by a row."""
    from lshdist.hashing.families import HASH_BLOCK_ROWS, family_for
    from lshdist.index.searcher import encode
    from lshdist.metric.learned import ExplicitMetric

    B = np.ascontiguousarray(fashion.X_train[:2 * HASH_BLOCK_ROWS + 37], dtype=np.uint8)
    rng = np.random.default_rng(0)
    M = rng.normal(size=(784, 784))
    centre = B.mean(axis=0)
    for metric in (ExplicitMetric.identity(784), ExplicitMetric.identity(784, center=centre),
                   ExplicitMetric(np.eye(784) + M @ M.T / 784**2)):
        family = family_for(metric, bits=128, seed=5, learned=True)
        for hashed in (True, False):
            kb, pb = encode(metric, family, B, hashed=hashed)
            kf, pf = encode(metric, family, B.astype(np.float32), hashed=hashed)
            assert np.array_equal(kb, kf) and kb.shape == kf.shape
            assert pb.held_on_grid == metric.is_identity
            pf = pf.compact()
            assert all(np.array_equal(pb.arrays()[k], v) for k, v in pf.arrays().items())
