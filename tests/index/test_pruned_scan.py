"""The pruned exact scan (`lshdist.index.scan._pruned`): rows ruled out by a lower bound in the
rows' principal directions, the same answer as the full scan — ties, far data, data the bound
cannot prune — and a bound that holds (and is tight enough to prune real images)."""

import numpy as np
import pytest

import lshdist.index.scan as scan
from lshdist.index.payload import DensePayload
from lshdist.index.scan import PRUNE_RANK, prunes, scan_topk


def _both(monkeypatch, Z, Q, k, ids=None, n_threads=1):
    """(full scan, pruned scan, how many blocks fell back to the full scan)."""
    full = scan_topk(DensePayload(Z), DensePayload(Q), k, ids=ids, n_threads=n_threads)
    fallbacks = []
    real = scan._pruned

    def spy(*a, **kw):
        got = real(*a, **kw)
        fallbacks.append(got is None)
        return got

    with monkeypatch.context() as m:
        m.setattr(scan, "_pruned", spy)
        pruned = scan_topk(DensePayload(Z), DensePayload(Q), k, ids=ids, n_threads=n_threads,
                           prune=True)
    assert fallbacks, "the pruned path was not taken"
    return full, pruned, sum(fallbacks)


def test_the_cost_gate():
    assert prunes(100_000, 1_000, 784, 11)
    assert not prunes(100_000, 200, 784, 11)  # the rows' projection would cost as much
    assert not prunes(100_000, 10_000, 4 * PRUNE_RANK - 1, 11)  # too narrow to pay
    assert not prunes(1_000, 10_000, 784, 11)  # a few re-ranks' worth of rows


def test_fashion_images_give_the_full_scans_answer(monkeypatch, fashion):
    Xtr, _, Xte, _ = fashion
    Z = np.ascontiguousarray(Xtr[:12_000], dtype=np.float32)
    Q = np.ascontiguousarray(Xte[:600], dtype=np.float32)
    ids = np.arange(12_000, dtype=np.int64)[::-1] * 3  # ties go by these, not by row
    (d0, i0), (d1, i1), fell = _both(monkeypatch, Z, Q, 10, ids=ids, n_threads=2)
    assert fell == 0  # every block pruned
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_array_equal(d1, d0)


def test_the_bound_holds_and_prunes_real_images(fashion):
    Xtr, _, Xte, _ = fashion
    Z = np.ascontiguousarray(Xtr[:6_000], dtype=np.float32)
    Q = np.ascontiguousarray(Xte[:300], dtype=np.float32)
    p = DensePayload(Z)
    proj = p.projection(PRUNE_RANK)
    S, offset, slack, rel = p.lower_bounds(DensePayload(Q), proj)
    assert 0 < rel < 1e-4  # the re-rank's relative rounding (d + 2 float32 operations)
    Q64, Z64 = Q.astype(np.float64), Z.astype(np.float64)  # float64: ~1e-16 of the norms
    exact = (Q64 ** 2).sum(1)[:, None] - 2 * Q64 @ Z64.T + (Z64 ** 2).sum(1)[None, :]
    low = S.astype(np.float64) + offset[:, None] - slack[:, None]
    assert np.all(low <= proj.s2 * exact)
    # tight enough to prune: within the 10th distance, a few per cent of the rows (a bound
    # that were the distance in fewer directions, or a slack far too wide, would keep more)
    d10 = np.sort(exact, axis=1)[:, 9]
    kept = (S + offset[:, None] <= proj.s2 * d10[:, None] + slack[:, None]).mean()
    assert kept < 0.08
    assert np.median(slack) < 0.05 * np.median(d10)
    # the basis is orthonormal to rounding
    assert 1.0 <= proj.s2 < 1.0 + 1e-5


@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_duplicates_and_far_rows_tie_by_id(monkeypatch, fashion, offset):
    # images (small integers) three times over: queries at distance 0 from three rows, and
    # many equal distances; far from the origin too (the scan's centring)
    Xtr, _, Xte, _ = fashion
    base = np.asarray(Xtr[:1_200], dtype=np.float32)
    Z = np.concatenate([base, base[:500], base[:300]]) + np.float32(offset)
    Q = np.concatenate([base[:300], np.asarray(Xte[:300], np.float32)]) + np.float32(offset)
    ids = np.random.default_rng(0).permutation(len(Z)).astype(np.int64)
    (d0, i0), (d1, i1), fell = _both(monkeypatch, Z, Q, 7, ids=ids)
    assert fell == 0
    assert np.all(d0[:300, :2] == 0)  # each copied image finds its copies first
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_array_equal(d1, d0)


def test_data_the_bound_cannot_prune_falls_back_to_the_full_scan(monkeypatch):
    # isotropic noise in 400 dimensions: 64 directions hold a sixth of a distance, so nearly
    # every row stays within the bound; each block is scanned in full, the same answer
    rng = np.random.default_rng(3)
    Z = rng.normal(size=(3_000, 400)).astype(np.float32)
    Q = rng.normal(size=(1_000, 400)).astype(np.float32)
    (d0, i0), (d1, i1), fell = _both(monkeypatch, Z, Q, 5)
    assert fell == 4  # 1,000 queries: four blocks of at most 256, each fell back
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_array_equal(d1, d0)


def test_the_calibrations_truth_prunes_and_times_the_scan_a_search_runs(monkeypatch, fashion):
    from lshdist.index import calibrate
    from lshdist.index.calibrate import TIMED_QUERIES, exact_truth

    Xtr, _, Xte, _ = fashion
    Z = DensePayload(np.asarray(Xtr[:8_000], dtype=np.float32))
    Q = DensePayload(np.asarray(Xte[:700], dtype=np.float32))
    calls = []
    real = calibrate.scan_topk

    def spy(payload, qpayload, k, **kw):
        calls.append((len(qpayload), kw.get("prune", False)))
        return real(payload, qpayload, k, **kw)

    monkeypatch.setattr(calibrate, "scan_topk", spy)
    d0, i0 = scan_topk(Z, Q, 11)
    for batch, timed in ((None, [TIMED_QUERIES]), (10_000, [100, 200])):
        calls.clear()
        D, ids, spq = exact_truth(Z, Q, 11, batch=batch)
        np.testing.assert_array_equal(ids, i0)
        np.testing.assert_array_equal(D, d0)
        assert spq > 0
        # every query scanned once: the rest pruned first, then the first queries by the
        # scan a search runs (unpruned), timed -- repeated only if under MIN_TIMED_SECONDS
        rest = 700 - sum(timed)
        assert calls[0] == (rest, True)
        assert sorted(set(calls[1:])) == [(n, False) for n in sorted(set(timed))]
    # a sample too small for the bound to pay: all of it timed, after a one-query warm-up
    calls.clear()
    exact_truth(Z, Q.take(slice(0, 150)), 11)
    assert calls[0] == (1, False) and all(c == (150, False) for c in calls[1:])


@pytest.mark.parametrize("offset", [0.0, 4096.0])
def test_rows_in_few_directions_where_the_bound_is_the_distance(monkeypatch, offset):
    # integer rows spanning 40 directions of 400: the 64 principal directions hold all of
    # every distance, the bound equals it up to rounding, and many rows tie — the margins
    # (the basis's stretch, the re-rank's rounding, the slack) decide which rows are kept
    rng = np.random.default_rng(5)
    B = rng.integers(0, 2, size=(40, 400)).astype(np.float32)
    A = rng.integers(0, 3, size=(3_000, 40)).astype(np.float32)
    Z = A @ B + np.float32(offset)  # small integers: exact in float32
    Q = rng.integers(0, 3, size=(1_200, 40)).astype(np.float32) @ B + np.float32(offset)
    ids = rng.permutation(len(Z)).astype(np.int64)
    (d0, i0), (d1, i1), fell = _both(monkeypatch, Z, Q, 9, ids=ids)
    assert fell == 0
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_array_equal(d1, d0)


def test_an_overflowing_distance_leaves_the_decision_to_the_full_scan(monkeypatch, fashion):
    # rows whose squared distances overflow float32 among the best-bounded ones: the pruned
    # path gives the block back and the full scan answers (or refuses) as it always did
    Xtr, _, Xte, _ = fashion
    Z = np.array(Xtr[:3_000], dtype=np.float32)  # a copy: the fixture is shared
    Z[:5] *= np.float32(1e17)
    Q = np.asarray(Xte[:600], dtype=np.float32)
    calls = []
    real = scan._pruned
    monkeypatch.setattr(scan, "_pruned", lambda *a, **kw: calls.append(real(*a, **kw)))
    with pytest.raises(Exception) as full:
        scan_topk(DensePayload(Z), DensePayload(Q), 5)
    with pytest.raises(type(full.value)):
        scan_topk(DensePayload(Z), DensePayload(Q), 5, prune=True)
