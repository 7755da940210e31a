"""Calibration: exact recall of nested operating points, and the pure selection rule."""

from dataclasses import replace

import numpy as np
import pytest

from lshdist._kernels.search import candidate_hamming, candidate_recall_grid, collect_candidates
from lshdist.errors import InputError
from lshdist.index.calibrate import (
    FIRST_STAGE_QUERIES,
    SAMPLE_QUERIES,
    Calibration,
    Point,
    calibrate,
    choose_point,
    decide_mode,
    extend_sample,
    query_sample_size,
    recall_margin,
    widen_windows,
)
from lshdist.index.scan import scan_topk
from lshdist.index.searcher import MetricIndex, encode
from lshdist.metric.learned import ExplicitMetric


def _pt(m, w, h, recall, secs=None, kept=100.0):
    return Point(m, w, h, recall, kept, kept / 1e4, secs)


def test_choose_the_cheapest_point_at_target():
    # cost = M (64 + 8 W) + reranked (width + 8)
    pts = [_pt(8, 2, 40, 0.85, kept=40), _pt(16, 4, 40, 0.91, kept=40),
           _pt(32, 4, 80, 0.95, kept=80), _pt(64, 8, 0, 0.99, kept=3000)]
    p = choose_point(pts, 0.9, width=16)
    assert (p.permutations, p.window) == (16, 4)
    assert choose_point(pts, 0.97, width=16).permutations == 64  # further along the curve
    assert choose_point(pts, 0.995, width=16) is None
    # a wide payload makes re-ranked rows dear: fewer re-ranked rows win
    wide = [_pt(16, 4, 0, 0.95, kept=500), _pt(64, 16, 40, 0.95, kept=40)]
    assert choose_point(wide, 0.9, width=784).permutations == 64
    assert choose_point(wide, 0.9, width=1).permutations == 16
    with pytest.raises(InputError, match="must be in"):
        choose_point(pts, 1.5, 1.0)


def test_scan_when_the_hashed_point_is_no_faster():
    fast = _pt(16, 4, 40, 0.91, secs=1e-4)
    assert decide_mode(fast, 1e-3)[0] == "hash"
    slow = _pt(16, 4, 40, 0.91, secs=0.95e-3)  # within the noise margin of the scan
    mode, p, why = decide_mode(slow, 1e-3)
    assert (mode, p) == ("scan", None) and "no slower" in why


def _assert_grid_is_collect_candidates(full, codes, qcodes, truth, qself, ms, ws, keeps):
    """`candidate_recall_grid` against the real search's cut (`collect_candidates`) at every
    (M', W', H): hits by true-neighbour rank (a row repeated in the truth counts once, at its
    first rank; -1 is no row) and rows re-ranked other than the query's own."""
    Q, W = len(full), full.shape[2] // 2
    ham = candidate_hamming(full, codes, qcodes)
    hits, reranked = candidate_recall_grid(full, ham, 64 * codes.shape[1], truth, qself, ms,
                                           ws, keeps)
    kt = truth.shape[1]
    for a, m in enumerate(ms):
        for b, w in enumerate(ws):
            cand = np.ascontiguousarray(full[:, :m, W - w: W + w]).reshape(Q, -1)
            for j, h in enumerate(keeps):
                off, rows, _ = collect_candidates(cand, codes, qcodes, int(h))
                owner = np.repeat(np.arange(Q), np.diff(off))
                ref_hits = np.zeros(kt, np.int64)
                for q in range(Q):
                    found = np.isin(truth[q], rows[owner == q]) & (truth[q] >= 0)
                    first = np.array([truth[q, t] not in truth[q, :t] for t in range(kt)])
                    ref_hits += found & first
                ref_rr = int((rows != qself[owner]).sum())
                assert np.array_equal(hits[a, b, j], ref_hits), (m, w, h)
                assert reranked[a, b, j] == ref_rr, (m, w, h)


def test_candidate_recall_grid_matches_collect_candidates():
    # catches: a Hamming cut that differs from collect_candidates (ties in discovery order),
    # self-matches counted as hits, off-by-one at the cut, a wrong (M', W') slice
    rng = np.random.default_rng(0)
    N, Q, M, W, words = 300, 40, 4, 6, 2
    codes = rng.integers(0, 2**63, size=(N, words), dtype=np.int64).view(np.uint64)
    qcodes = codes[:Q] ^ (rng.integers(0, 2**8, size=(Q, words)).astype(np.uint64))
    full = rng.integers(-1, N, size=(Q, M, 2 * W)).astype(np.int64)
    truth = rng.integers(0, N, size=(Q, 5)).astype(np.int64)
    qself = np.arange(Q, dtype=np.int64)
    _assert_grid_is_collect_candidates(full, codes, qcodes, truth, qself, np.array([1, 2, 4]),
                                       np.array([1, 3, 6]),
                                       np.array([0, 3, 10, 25, 1000], np.int64))


def _index(seed=0, n=1500, d=12):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    metric = ExplicitMetric.identity(d, center=X.mean(0))
    return X, metric


def test_calibrated_recall_is_the_real_searchs_recall():
    """The recall a point is calibrated at is what the real search with those parameters
    achieves on the same leave-one-out queries (nested lists, sliced windows, same cut)."""
    X, metric = _index()
    ix = MetricIndex(metric, bits=64, n_permutations=32, window=8).fit(X)
    qrows = np.arange(0, 1500, 15, dtype=np.int64)
    qc, qp = encode(metric, ix.family_, X[qrows], query=True)
    cal = calibrate(ix.index_, qrows, qc, qp, k=5, target=0.5, permutations=[8, 32],
                    windows=[2, 8], hamming_keeps=[0, 20])
    _, truth = scan_topk(ix.index_.payload_, qp, 6)
    for p in cal.points:
        _, found, st = ix.index_.search(qc, qp, 6, n_permutations=p.permutations,
                                        window=p.window, hamming_keep=p.hamming_keep)
        hits = sum(len(np.intersect1d(np.setdiff1d(f, [r]), np.setdiff1d(t, [r])[:5]))
                   for f, t, r in zip(found, truth, qrows))
        assert hits / (len(qrows) * 5) == pytest.approx(p.recall)
        assert p.reranked == pytest.approx((st["reranked"].sum() - len(qrows)) / len(qrows))
    assert json_round_trip(cal) == cal


def json_round_trip(cal):
    import json

    return Calibration.from_json(json.loads(json.dumps(cal.to_json())))


def test_auto_picks_the_scan_for_a_tiny_low_dimensional_database():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 2)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(2), target_recall=0.9).fit(X)
    assert ix.mode_ == "scan" and ix.calibration_.mode == "scan"
    _, ids = ix.query(X[:5], 3)
    assert ix.last_mode_ == "scan" and ids[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_same_seed_same_choice_and_results_equal_without_calibration():
    X, metric = _index(2, n=3000)
    a = MetricIndex(metric, bits=64, target_recall=0.9, seed=3).fit(X)
    b = MetricIndex(metric, bits=64, target_recall=0.9, seed=3).fit(X)
    pa, pb = a.calibration_.chosen, b.calibration_.chosen
    assert [(p.permutations, p.window, p.hamming_keep, p.recall) for p in a.calibration_.points] \
        == [(p.permutations, p.window, p.hamming_keep, p.recall) for p in b.calibration_.points]
    if a.mode_ == b.mode_ == "hash":
        assert (pa.permutations, pa.window, pa.hamming_keep) == (pb.permutations, pb.window,
                                                                 pb.hamming_keep)
        # the same parameters without calibration: identical answers
        plain = MetricIndex(metric, bits=64, n_permutations=a.index_.n_permutations_,
                            window=pa.window, hamming_keep=pa.hamming_keep, seed=3).fit(X)
        q = X[:50] + 0.01
        _, i1 = a.query(q, 10, mode="hash")
        _, i2 = plain.index_.search(*encode(metric, plain.family_, q, query=True), 10,
                                    n_permutations=pa.permutations)[:2]
        assert np.array_equal(i1, i2)
    # (the hash/scan decision alone rests on a timing; here both are far apart)


def test_calibration_queries_correct_a_database_of_near_copies():
    """A database holding a near-copy of every row (augmented data) makes its own rows easy
    queries: leave-one-out calibration overestimates the recall of real queries; calibrating
    on rows like the real queries gives the right estimate."""
    rng = np.random.default_rng(5)
    base = rng.normal(size=(1000, 16)).astype(np.float32)
    db = np.concatenate([base] + [base + rng.normal(scale=0.02, size=base.shape)
                                  .astype(np.float32) for _ in range(4)])  # 4 near-copies
    real = rng.normal(size=(400, 16)).astype(np.float32)
    sample = rng.normal(size=(400, 16)).astype(np.float32)
    metric = ExplicitMetric.identity(16, center=db.mean(0))

    def measured(ix):
        p = ix.calibration_.chosen or Point(**ix.calibration_.extra["timed"])
        _, found = ix.query(real, 10, mode="hash")
        _, exact = ix.query(real, 10, mode="scan")
        got = np.mean([len(np.intersect1d(a, b)) / 10 for a, b in zip(found, exact)])
        return p.recall, got

    est_loo, got_loo = measured(MetricIndex(metric, bits=64, target_recall=0.9, seed=1).fit(db))
    est_q, got_q = measured(MetricIndex(metric, bits=64, target_recall=0.9, seed=1,
                                        calibration_queries=sample).fit(db))
    assert est_loo - got_loo > 0.05  # the bias this option exists for
    assert abs(est_q - got_q) < 0.04 and got_q >= 0.85


def test_bulk_query_calibrates_on_itself_and_fit_defers_calibration():
    """The same database of near-copies, no calibration_queries: a bulk ``query(mode="auto")``
    (>= RECALIBRATE_QUERIES rows) calibrates on a sample of its own rows and meets the target on
    them, where the leave-one-out point misses it; ``fit`` calibrates nothing until needed.
    Bug caught: a bulk query answered at the database-rows point (recall ~0.8 here)."""
    from lshdist.index.searcher import RECALIBRATE_QUERIES

    rng = np.random.default_rng(5)
    base = rng.normal(size=(1000, 16)).astype(np.float32)
    db = np.concatenate([base] + [base + rng.normal(scale=0.02, size=base.shape)
                                  .astype(np.float32) for _ in range(4)])
    real = rng.normal(size=(RECALIBRATE_QUERIES, 16)).astype(np.float32)
    metric = ExplicitMetric.identity(16, center=db.mean(0))
    ix = MetricIndex(metric, bits=64, target_recall=0.9, seed=1).fit(db)
    assert ix._calibration is None  # deferred
    ix.query(real, 10)  # auto, bulk: calibrated on a sample of `real`
    # the sample drawn, used in stages (a bulk of known size)
    qc = ix.query_calibration_
    assert ix._calibration is None and qc.extra["sample"]["drawn"] == SAMPLE_QUERIES
    assert qc.n_queries in (FIRST_STAGE_QUERIES, SAMPLE_QUERIES)
    auto_mode = ix.last_mode_
    _, exact = ix.query(real, 10, mode="scan")
    _, hashed = ix.query(real, 10, mode="hash")  # at the point calibrated on the queries
    assert ix._calibration is None  # "hash" kept the queries' point, no other calibration
    got = np.mean([len(np.intersect1d(a, b)) / 10 for a, b in zip(hashed, exact)])
    assert got >= 0.88, got
    # the database-rows point, asked for explicitly, overestimates these queries
    loo = MetricIndex(metric, bits=64, target_recall=0.9, seed=1, recalibrate=False).fit(db)
    _, f2 = loo.query(real, 10, mode="hash")
    got_loo = np.mean([len(np.intersect1d(a, b)) / 10 for a, b in zip(f2, exact)])
    print(f"\nbulk auto: {auto_mode}; hashed at the queries' point {got:.3f}, at the "
          f"database-rows point {got_loo:.3f}")
    assert loo.calibration_ is not None and got_loo < got - 0.03, (got_loo, got)


def test_choose_point_margin():
    pts = [_pt(8, 1, 20, 0.915), _pt(16, 2, 40, 0.95)]
    assert choose_point(pts, 0.9, 10.0).recall == 0.915
    m = recall_margin(0.9, 200)
    assert 0.021 < m < 0.0213
    assert choose_point(pts, 0.9, 10.0, m).recall == 0.95  # 0.915 is within one error
    assert choose_point(pts, 0.99, 10.0, m) is None


def test_query_sample_size_grows_with_the_queries_within_bounds():
    """2 % of the queries, at least 200 (all of them if fewer), at most 1,000."""
    assert [query_sample_size(n) for n in (50, 200, 4_000, 10_000, 24_000, 100_000, 10**7)
            ] == [50, 200, 200, 200, 480, 1000, 1000]


def test_windows_widen_only_while_the_target_is_out_of_reach(monkeypatch):
    """The grid's windows are doubled (up to MAX_WINDOW) only while no point reaches the
    target: an easy target keeps the given grid, a hard one extends it."""
    import lshdist.index.calibrate as cal_mod
    from lshdist.index.searcher import calibrate_index

    monkeypatch.setattr(cal_mod, "WINDOWS", (1,))
    monkeypatch.setattr(cal_mod, "MAX_WINDOW", 16)
    X, metric = _index(seed=3, n=3000)
    ix = MetricIndex(metric, bits=64, n_permutations=8).fit(X)
    fixed = {"permutations": None, "window": None, "hamming_keep": None}

    def windows(target):
        c = calibrate_index(ix.index_, metric, ix.family_, X, k=10, target=target, seed=0,
                            fixed=fixed)
        return sorted({p.window for p in c.points}), c
    easy, c1 = windows(0.05)
    assert easy == [1] and c1.reference is not None  # chosen, or timed where the scan won
    hard, c2 = windows(0.999)
    assert hard == [1, 2, 4, 8, 16]
    assert max(p.recall for p in c2.points if p.window == 16) > max(
        p.recall for p in c2.points if p.window == 1)


def test_reference_point_is_the_chosen_or_the_timed_one():
    p, t = _pt(8, 2, 40, 0.95, secs=1e-4), _pt(16, 4, 80, 0.93, secs=2e-4)
    base = dict(k=10, target=0.9, n_database=100, n_queries=20, scan_seconds_per_query=1e-3,
                points=(p, t))
    from dataclasses import asdict

    assert Calibration(**base, mode="hash", chosen=p, reason="").reference == p
    scan = Calibration(**base, mode="scan", chosen=None, reason="", extra={"timed": asdict(t)})
    assert scan.reference == t
    assert Calibration(**base, mode="scan", chosen=None, reason="").reference is None


def _segments(X, S, metric, family, rng, split="random"):
    """S segments of X's rows (random rows, or contiguous blocks), sharing the hash family and
    the permutations, as the distributed build makes them."""
    from lshdist.index.permutation import PermutationIndex

    order = rng.permutation(len(X)) if split == "random" else np.arange(len(X))
    segs = []
    for part in np.array_split(order, S):
        part = np.sort(part)
        codes, payload = encode(metric, family, X[part])
        segs.append(PermutationIndex(n_permutations=32, seed=7).fit(codes, family.bits,
                                                                    payload, part))
    return segs


def _merged_recall(segs, qc, qp, k, p, truth):
    from lshdist.index.permutation import merge_topk

    parts = [s.search(qc, qp, k, n_permutations=p.permutations, window=p.window,
                      hamming_keep=p.hamming_keep)[:2] for s in segs]
    _, ids = merge_topk([d for d, _ in parts], [i for _, i in parts], k)
    return np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(ids, truth)])


def test_merged_relevance_leaves_the_query_out_and_marks_each_neighbour_once():
    from lshdist.index.calibrate import merged_relevance

    D = np.array([[0.0, 1.0, 2.0, 3.0]])
    I = np.array([[7, 3, 4, 5]])
    # one segment: each rank once, every row relevant
    w, (rel,) = merged_relevance([D], [I], 3)
    assert np.allclose(w, 1 / 3) and rel.all()
    # the own row (7) left out: ranks 3, 4, 5 -> 1, 2, 3 within the segment
    w, (rel,) = merged_relevance([D], [I], 3, own=np.array([7]))
    assert np.allclose(w, 1 / 3) and rel.all()
    # two segments interleaved: merged top-4 = 0 (seg a r1), .5 (b r1), 1 (a r2), 1.5 (b r2)
    Db = np.array([[0.5, 1.5, 2.5, 3.5]])
    Ib = np.array([[10, 11, 12, 13]])
    w, (ra, rb) = merged_relevance([D, Db], [I, Ib], 4)
    assert np.allclose(w, [0.5, 0.5, 0, 0])
    assert ra.tolist() == rb.tolist() == [[True, True, False, False]]
    # padding (-1) never counts
    Ip = np.array([[10, -1, -1, -1]])
    w, (ra, rb) = merged_relevance([D, Db], [I, Ip], 4)
    assert np.allclose(w, [0.5, 0.25, 0.25, 0])
    assert ra.tolist() == [[True, True, True, False]]
    assert rb.tolist() == [[True, False, False, False]]


def test_short_timings_are_repeated_and_the_fastest_kept():
    """A hash-or-scan decision on a tiny database compares runs of a few microseconds: one
    run measures the machine's noise.  Catches: a single timing, the mean instead of the
    best, repeating long runs."""
    from lshdist.index.calibrate import _best_of

    clock = [0.0]
    durations = iter([0.004, 0.001, 0.003, 0.002, 0.006, 0.009, 0.009, 0.009])
    calls = []

    def run():
        calls.append(1)
        clock[0] += next(durations)

    assert _best_of(0.005, run, lambda: clock[0]) == pytest.approx(0.001)
    assert len(calls) == 5  # 0.005 + 0.004 + 0.001 + 0.003 + 0.002 + 0.006 > 0.02: stop
    assert _best_of(0.5, run, lambda: clock[0]) == 0.5 and len(calls) == 5


def test_a_decisively_faster_search_is_timed_once():
    """The hashed search's timing is repeated only where the verdict could turn on it: a
    first run well under the scan (`DECISIVE` x `SCAN_MARGIN`) is kept as it is — repeats
    could only lower it.  Catches: repeats where they cannot change the verdict (0.01-0.02 s
    of a Fashion-MNIST calibration), no repeats where they can."""
    from lshdist.index.calibrate import DECISIVE, SCAN_MARGIN, timed_search

    clock = [0.0]
    calls = []

    def run(dt=0.004):
        calls.append(1)
        clock[0] += dt

    # 100 queries in 4 ms (+ 1 us each of hashing) against a 1 ms/query scan: decisive
    t = timed_search(run, lambda: clock[0], 100, 1e-6, 1e-3)
    assert t == pytest.approx(4e-5 + 1e-6) and len(calls) == 1
    # the same run against a scan a little faster than decisive needs: repeated (short runs)
    scan = (4e-5 + 1e-6) / (DECISIVE * SCAN_MARGIN) * 0.99
    calls.clear()
    t = timed_search(run, lambda: clock[0], 100, 1e-6, scan)
    assert len(calls) == 5 and t == pytest.approx(4e-5 + 1e-6)  # 5 x 4 ms reach 0.02 s
    # a quick run on fewer queries first: kept when decisive, else the full timing decides
    # (a small batch's fixed costs made Letter's hashed search look slower than the scan)
    quick = []

    def small(dt=0.003):
        quick.append(1)
        clock[0] += dt

    calls.clear()
    t = timed_search(run, lambda: clock[0], 100, 1e-6, 1e-3, quick=(small, 50))
    assert (len(quick), len(calls)) == (1, 0) and t == pytest.approx(6e-5 + 1e-6)
    quick.clear()
    t = timed_search(run, lambda: clock[0], 100, 1e-6, 8e-5, quick=(small, 50))
    assert (len(quick), len(calls)) == (1, 5) and t == pytest.approx(4e-5 + 1e-6)


@pytest.mark.parametrize("split", ["random", "blocks"])
def test_the_grid_pooled_over_segments_is_the_merged_search_exactly(split):
    """Measured over every segment (`merged_relevance`, `part_truth`, `grid_counts`,
    `pooled_points`), a point's recall is the merged search's recall on the sample exactly,
    and its rows re-ranked are the sum over segments.  Catches: a true neighbour counted in
    two segments or none, truth ranks off by the own row, re-ranked rows of one segment."""
    from lshdist.index.calibrate import grid_counts, merged_relevance, part_truth, pooled_points

    rng = np.random.default_rng(8)
    n, d, S, k = 4000, 8, 4, 10
    X = rng.normal(size=(n, d)).astype(np.float32)
    if split == "blocks":
        X = X[np.argsort(X[:, 0])]
    metric = ExplicitMetric.identity(d, center=X.mean(0))
    family = MetricIndex(metric, bits=64).fit(X[:10]).family_
    segs = _segments(X, S, metric, family, rng, split)
    Xq = (X[rng.choice(n, 150, replace=False)] + 0.3 * rng.normal(size=(150, d))
          ).astype(np.float32)
    qc, qp = encode(metric, family, Xq, query=True)
    tops = [scan_topk(s.payload_, qp, k + 1, ids=s.ids_) for s in segs]
    w, masks = merged_relevance([t[0] for t in tops], [t[1] for t in tops], k)
    assert sum(int(m.sum()) for m in masks) == 150 * k and w.sum() == pytest.approx(1.0)
    ms, ws, hs = [4, 16], [1, 4], [0, 20, 40]
    stats = []
    for seg, (_, ids), mask in zip(segs, tops, masks):
        truth, qself = part_truth(ids, seg.ids_, None, k)
        stats.append(grid_counts(seg, qc, truth, qself, mask, ms, ws, hs))
    counts = np.sum([m.sum(0) for m in masks], axis=0).astype(float)
    points = pooled_points(stats, counts, 150, n, ms, ws, hs)
    _, truth_all = scan_topk(encode(metric, family, X)[1], qp, k)
    for p in points:
        assert p.recall == pytest.approx(_merged_recall(segs, qc, qp, k, p, truth_all), abs=1e-9)
        reranked = sum(s.search(qc, qp, k, n_permutations=p.permutations, window=p.window,
                                hamming_keep=p.hamming_keep)[2]["reranked"].sum() for s in segs)
        assert p.reranked == pytest.approx(reranked / 150)


def test_grid_counts_on_threads_equal_one_thread():
    """The grid counted in parallel parts of the sample is the one-thread grid exactly."""
    from lshdist.index.calibrate import grid_counts

    X, metric = _index(seed=5, n=2000)
    ix = MetricIndex(metric, bits=64, n_permutations=16).fit(X)
    rows = np.arange(0, 2000, 10)
    qcodes, qpayload = encode(metric, ix.family_, X[rows], query=True)
    _, truth = scan_topk(ix.index_.payload_, qpayload, 10)
    axes = ([4, 16], [1, 2, 4], [0, 20, 40])
    one = grid_counts(ix.index_, qcodes, truth, rows, np.ones(truth.shape, bool), *axes)
    two = grid_counts(ix.index_, qcodes, truth, rows, np.ones(truth.shape, bool), *axes,
                      n_threads=3)
    assert one[0].sum() > 0
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[1], two[1])


def test_candidate_recall_grid_with_many_ties_and_repeats():
    """The grid's places in the cut order (histogram, no sort) against collect_candidates
    where most candidates tie (keys differing in a few bits), rows repeat across lists and
    windows, the query's own row is a true neighbour too, and M' stops short of the lists."""
    rng = np.random.default_rng(3)
    N, Q, M, W, words = 60, 30, 6, 5, 1
    codes = (rng.integers(0, 2, size=(N, words)) << rng.integers(0, 3, size=(N, words))
             ).astype(np.uint64)
    qcodes = codes[:Q].copy()
    full = rng.integers(-1, N, size=(Q, M, 2 * W)).astype(np.int64)
    truth = rng.integers(-1, N, size=(Q, 6)).astype(np.int64)
    qself = np.arange(Q, dtype=np.int64)
    truth[:, 0] = qself  # the query's own row listed as its nearest
    assert len(np.unique(candidate_hamming(full, codes, qcodes))) <= 4  # mostly ties
    _assert_grid_is_collect_candidates(full, codes, qcodes, truth, qself, np.array([1, 3, 4]),
                                       np.array([1, 2, 5]),
                                       np.array([0, 1, 2, 5, 9, 40], np.int64))


def test_candidate_recall_grid_on_many_rows_few_entries():
    """The grid's bitmaps of rows seen and rows true: with far more rows than a pass has
    entries, a pass's bits are cleared by its own entries, not the whole map — rows left
    marked would hide the next pass's or query's candidates.  Rows repeat within a 64-row
    word and across queries (neighbouring queries share candidates), the truth holds rows
    beyond any candidate (the grid's row count comes from the candidates)."""
    rng = np.random.default_rng(5)
    N, Q, M, W, words = 100_000, 25, 3, 4, 2
    codes = rng.integers(0, 2**63, size=(N, words), dtype=np.int64).view(np.uint64)
    qcodes = codes[rng.integers(0, N, Q)] ^ rng.integers(0, 2**6, size=(Q, words)).astype(
        np.uint64)
    words_used = rng.integers(0, N // 64, size=12) * 64  # a few 64-row words, shared
    full = (rng.choice(words_used, size=(Q, M, 2 * W)) + rng.integers(0, 3, size=(Q, M, 2 * W))
            ).astype(np.int64)
    full[rng.random(full.shape) < 0.1] = -1
    truth = np.where(rng.random((Q, 6)) < 0.7, full[:, 0, :6], N - 1).astype(np.int64)
    qself = full[:, 1, 2].copy()
    _assert_grid_is_collect_candidates(full, codes, qcodes, truth, qself, np.array([1, 3]),
                                       np.array([1, 2, 4]),
                                       np.array([0, 2, 5, 30], np.int64))


def test_cost_counts_the_lists_of_every_part():
    """A merged answer of several parts walks every part's lists; its rows re-ranked are
    already summed over them.  Bug caught: lists counted once against rows summed over 11
    segments — at 1 M rows (96, 32, 60) looked cheaper than (128, 16, 80) and searched ~40 %
    more list entries."""
    wide = Point(96, 32, 60, 0.92, 660.0, 0.0, parts=11)
    narrow = Point(128, 16, 80, 0.93, 880.0, 0.0, parts=11)
    assert narrow.cost(784) < wide.cost(784)
    assert choose_point([wide, narrow], 0.9, 784) == narrow
    # one part: the same points ordered the other way
    one = [replace(p, parts=1) for p in (wide, narrow)]
    assert choose_point(one, 0.9, 784) == one[0]
    assert wide.cost(784) == pytest.approx(11 * 96 * (50 + 90 * 32) + 660 * 792)
    # a stored curve without the field reads as one part
    d = Calibration(k=10, target=0.9, n_database=10, n_queries=5, scan_seconds_per_query=1.0,
                    points=(narrow,), mode="scan", chosen=None, reason="").to_json()
    del d["points"][0]["parts"]
    assert Calibration.from_json(d).points[0].parts == 1


def test_calibration_makes_the_search_structures_before_timing(monkeypatch):
    """A segment fitted without them (as a worker fits one) gets the re-rank's in-memory
    structures (the dense payload's uint8 copy) before calibration times anything, whatever
    the index's own Hamming cut: a copy made inside the first timed run would be timed as
    search.  Bug caught: the warm-up on a few rows, which left the copy to the cut-dependent
    `prepare` of the warm-up search (an index cut of 1..4 rows with k <= 4 skipped it)."""
    from lshdist.index.permutation import PermutationIndex

    X, metric = _index(d=40)  # >= 32 columns: the re-rank takes the uint8 first pass
    ix = MetricIndex(metric, bits=64, n_permutations=16, window=2, hamming_keep=3).fit(X)
    payload = type(ix.index_.payload_)(ix.index_.payload_.Z)  # a fresh, unprepared copy
    seg = PermutationIndex(n_permutations=16, window=2, hamming_keep=3, seed=1).fit(
        ix.index_.codes_, 64, payload)
    assert payload._quantized is None
    qrows = np.arange(0, 1500, 15, dtype=np.int64)
    qc, qp = encode(metric, ix.family_, X[qrows], query=True)
    import lshdist.index.calibrate as calibration

    made = []  # at every timed scan of the whole database: was the copy there already?

    def scan(payload_, *args, **kwargs):
        if len(payload_) == len(X):
            made.append(payload._quantized is not None)
        return scan_topk(payload_, *args, **kwargs)

    monkeypatch.setattr(calibration, "scan_topk", scan)
    calibrate(seg, qrows, qc, qp, k=3, target=0.5)
    assert made and all(made)


def _pooled_reference(stats, counts, Q, N, ms, ws, hs, parts=1):
    """`pooled_points` one point at a time with numpy scalars (its earlier form: the
    reference the vectorised one must equal)."""
    from lshdist.index.calibrate import Point

    hits = np.sum([h for h, _ in stats], axis=0)
    reranked = np.sum([r for _, r in stats], axis=0)
    total = max(float(counts.sum()), 1.0)
    points = []
    for a, m in enumerate(ms):
        for b, w in enumerate(ws):
            seen = set()
            for j, h in enumerate(hs):
                kept = float(reranked[a, b, j]) / Q
                if kept in seen:
                    continue
                seen.add(kept)
                by_rank = hits[a, b, j] / np.maximum(counts, 1.0)
                points.append(Point(int(m), int(w), int(h), float(hits[a, b, j].sum()) / total,
                                    kept, kept / max(N, 1),
                                    rank_recall=tuple(round(float(x), 6) for x in by_rank),
                                    parts=int(parts)))
    return points


def test_pooled_points_equal_the_per_point_form():
    """The grid's points from whole-grid arrays are the per-point computation's, value for
    value (recall, rows re-ranked, fraction, rank recalls and the skipped repeats of the same
    re-ranked count).  Catches: hits and re-ranked axes swapped, counts of one part only, the
    repeat test dropped, a rounding other than Python's."""
    from lshdist.index.calibrate import pooled_points

    rng = np.random.default_rng(3)
    ms, ws, hs, k, Q, N = [8, 12, 16], [1, 2, 4, 6], [0, 20, 30, 40, 60], 7, 123, 5_000
    stats = []
    for _ in range(3):
        hits = rng.integers(0, Q, size=(len(ms), len(ws), len(hs), k))
        rer = rng.integers(0, 40 * Q, size=(len(ms), len(ws), len(hs)))
        rer[:, :, 2] = rer[:, :, 1]  # a cut that keeps as many rows as the one before it
        stats.append((hits, rer))
    counts = rng.integers(1, 3 * Q, size=k).astype(float)
    counts[3] = 0.0  # a rank no true neighbour holds
    got = pooled_points(stats, counts, Q, N, ms, ws, hs, parts=3)
    want = _pooled_reference(stats, counts, Q, N, ms, ws, hs, parts=3)
    assert got == want and len(got) < len(ms) * len(ws) * len(hs)


def test_extend_sample_when_the_narrower_margin_pays():
    """`extend_sample`: a larger sample gains (net > 0) only when the cheaper point its
    narrower margin admits saves the answered queries more (in cost units) than the added
    sample queries cost; it must grow (+inf) when no point reaches the target by the smaller
    sample's margin but one does by the larger's, and never gains when neither does.  Pure:
    the same curve gives the same answer.  Bugs caught: the saving not scaled by the answered
    queries, the sample grown where it cannot change the choice, the margins of the two sizes
    swapped."""
    m100, m200 = recall_margin(0.9, 100), recall_margin(0.9, 200)  # 0.030, 0.021
    cheap = _pt(16, 4, 40, 0.9 + (m100 + m200) / 2, kept=40)  # qualifies at 200 only
    dear = _pt(64, 16, 160, 0.9 + m100 + 0.001, kept=160)  # qualifies at both
    pts = [cheap, dear]
    saving_per_query = dear.cost(784) - cheap.cost(784)
    per_sample_query = 60_000 * 784 * 0.093 + 128 * 64 * 270.0
    needed = 100 * per_sample_query / saving_per_query  # answered queries that break even
    net, why = extend_sample(pts, 0.9, 784, 100, 200, int(needed * 1.1), 60_000, 128 * 64)
    assert net > 0 and "save" in why
    assert net == pytest.approx(int(needed * 1.1) * saving_per_query - 100 * per_sample_query)
    net, why = extend_sample(pts, 0.9, 784, 100, 200, int(needed * 0.9), 60_000, 128 * 64)
    assert net < 0
    # the same point either way: nothing to gain, whatever the bulk
    assert extend_sample([dear], 0.9, 784, 100, 200, 10**9, 60_000, 128 * 64)[0] < 0
    # none by 100's margin, one by 200's: grow (else the scan would win for want of queries)
    net, why = extend_sample([cheap], 0.9, 784, 100, 200, 1, 60_000, 128 * 64)
    assert net == float("inf") and "one does" in why
    assert extend_sample([_pt(8, 1, 20, 0.85)], 0.9, 784, 100, 200, 10**9, 60_000, 64)[0] < 0


def test_staged_calibration_adds_up_to_the_whole_sample(monkeypatch):
    """A calibration told how many queries it answers uses its sample in stages: grown at
    every stage (`extend_sample` forced), the stages add up to the grid of the whole sample —
    every point's recall and rows re-ranked, and the choice, as the calibration that used it
    at once; for a small bulk it stops at the first stage, says why, and is deterministic
    (the same choice and sample twice).  Bugs caught: a stage's counts left out of (or
    counted twice in) the sum, the truth of a later stage missing (its hits not counted),
    the first stage taken as the sample's first rows in file order."""
    import lshdist.index.calibrate as cal_mod

    X, metric = _index()
    ix = MetricIndex(metric, bits=64, n_permutations=32, window=8).fit(X)
    rng = np.random.default_rng(3)
    Xq = (X[rng.permutation(len(X))[:400]] + rng.normal(scale=0.05, size=(400, X.shape[1]))
          ).astype(np.float32)
    qrows = np.full(400, -1, dtype=np.int64)
    qc, qp = encode(metric, ix.family_, Xq, query=True)
    args = dict(k=5, target=0.9, permutations=[8, 16, 32], windows=[2, 4, 8])
    whole = calibrate(ix.index_, qrows, qc, qp, **args)
    with monkeypatch.context() as mp:
        mp.setattr(cal_mod, "extend_sample", lambda *a: (float(a[4] == 2 * a[3]), "forced"))
        big = calibrate(ix.index_, qrows, qc, qp, **args, answered=10**12)
    assert whole.n_queries == big.n_queries == 400 and "sample" not in whole.extra
    assert big.extra["sample"]["stages"] == [100, 200, 400]
    key = [(p.permutations, p.window, p.hamming_keep) for p in whole.points]
    assert key == [(p.permutations, p.window, p.hamming_keep) for p in big.points]
    for a, b in zip(whole.points, big.points):
        assert a.recall == pytest.approx(b.recall) and a.reranked == pytest.approx(b.reranked)
    small = [calibrate(ix.index_, qrows, qc, qp, **args, answered=50) for _ in range(2)]
    for s in small:
        assert s.n_queries == FIRST_STAGE_QUERIES == s.extra["sample"]["used"]
        assert s.extra["sample"]["stages"] == [FIRST_STAGE_QUERIES]
        assert s.extra["sample"]["why"]
        assert s.extra["margin"] == pytest.approx(recall_margin(0.9, FIRST_STAGE_QUERIES))
    assert [p.recall for p in small[0].points] == [p.recall for p in small[1].points]
    def key(cal):  # the point chosen from the curve (not the timed hash-or-scan verdict)
        c = choose_point(cal.points, 0.9, cal.width, cal.extra["margin"])
        return None if c is None else (c.permutations, c.window, c.hamming_keep)

    assert key(small[0]) == key(small[1])
    assert key(whole) == key(big) and whole.extra["margin"] == big.extra["margin"]
    for bad in (0, -5, 2.5, True):  # a count of queries, or None
        with pytest.raises(InputError, match="positive integer"):
            calibrate(ix.index_, qrows, qc, qp, **args, answered=bad)
    # the first stage is a random subset of the sample, not its first rows
    first = calibrate(ix.index_, qrows[:100], qc[:100], qp.take(slice(0, 100)), **args)
    assert [p.recall for p in first.points] != [p.recall for p in small[0].points]


def test_windows_widen_until_a_point_reaches_the_target_by_the_margin():
    """One widening rule for every calibration: the largest window doubles while no point
    reaches target + margin, stops at the first grid that does, at MAX_WINDOW (256), and never
    when W was given.  Planted bugs it catches: widening once too often (checking before
    measuring), ignoring the margin, or widening a fixed W."""
    asked: list[list[int]] = []

    def measure(ws: list[int]) -> list[Point]:
        asked.append(ws)  # recall grows with the widest window: 0.9 is reached at W=64
        return [Point(8, w, 0, min(0.99, 0.8 + w / 640), 10.0, 0.01) for w in ws]

    points, ws = widen_windows(measure, [1, 2, 4, 16], 0.88, 0.02, fixed=False)
    assert asked == [[1, 2, 4, 16], [1, 2, 4, 16, 32], [1, 2, 4, 16, 32, 64]]
    assert ws == [1, 2, 4, 16, 32, 64] and max(p.recall for p in points) == pytest.approx(0.9)
    asked.clear()
    _, ws = widen_windows(measure, [1, 2], 1.0, 0.0, fixed=False)  # never reached: up to 256
    assert ws[-1] == 256 and len(asked) == 8
    asked.clear()
    _, ws = widen_windows(measure, [4], 0.99, 0.0, fixed=True)
    assert asked == [[4]] and ws == [4]
    asked.clear()
    given = measure([1, 2])
    asked.clear()
    widen_windows(measure, [1, 2], 0.5, 0.0, fixed=False, points=given)
    assert asked == []  # the grid given is not measured again
    with pytest.raises(InputError, match=r"target recall 1.5: must be in \(0, 1\]"):
        widen_windows(measure, [1], 1.5, 0.0, fixed=False)
