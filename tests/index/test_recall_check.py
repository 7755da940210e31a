"""The recall a query job measures on its own queries: sample size, per-query recall, the
interval and the policy that keeps the promise (`lshdist.index.recall_check`)."""

from __future__ import annotations

import numpy as np
import pytest

from lshdist.index.recall_check import (
    MAX_CHECK_QUERIES,
    MIN_CHECK_QUERIES,
    check_rows,
    check_size,
    enforce,
    interval,
    measured,
    per_query_recall,
    verdict,
)


def test_check_size_bounds():
    assert check_size(0) == 0
    assert check_size(30) == 30                      # all of a small job
    assert check_size(300) == MIN_CHECK_QUERIES      # at least 50
    assert check_size(10_000) == 200                 # 2 %
    assert check_size(10**7) == MAX_CHECK_QUERIES    # at most 500


def test_check_rows_seeded_sorted_unique_and_not_the_calibration_sample():
    from lshdist.index.calibrate import sample_rows

    a, b = check_rows(5000, 7), check_rows(5000, 7)
    assert np.array_equal(a, b) and np.all(np.diff(a) > 0) and len(a) == 100
    assert not np.array_equal(check_rows(5000, 8), a)
    assert not np.array_equal(sample_rows(5000, 100, 7), a)  # its own stream


def test_per_query_recall_counts_true_ids_only():
    truth = np.array([[1, 2, 3, 4], [5, 6, -1, -1]])
    found = np.array([[4, 3, 9, 8], [6, 5, 7, -1]])
    # query 0: 2 of 4; query 1: the database held 2 neighbours, both found
    assert per_query_recall(found, truth, 4).tolist() == [0.5, 1.0]
    # k smaller than the lists: only the first k of each count
    assert per_query_recall(found, truth, 2).tolist() == [0.0, 1.0]


def test_interval_matches_student_t_with_finite_population_correction():
    from scipy import stats

    rng = np.random.default_rng(0)
    v = rng.uniform(0.6, 1.0, 80)
    mean, lo, hi = interval(v, 1000)
    half = stats.t.ppf(0.975, 79) * v.std(ddof=1) / np.sqrt(80) * np.sqrt(920 / 999)
    assert mean == pytest.approx(v.mean())
    assert (lo, hi) == pytest.approx((v.mean() - half, v.mean() + half))
    # every query checked: the recall is known exactly
    assert interval(v, 80) == (pytest.approx(v.mean()),) * 3


def test_interval_of_a_sample_without_spread_is_not_zero_wide():
    mean, lo, hi = interval(np.ones(50), 10_000)
    assert mean == 1.0 and hi == 1.0 and 0.9 < lo < 0.95  # Wilson: 50 / (50 + z^2) = 0.929


def test_interval_covers_the_population_mean():
    """95 % intervals of 50-query samples cover the recall of the whole job about 95 % of the
    time (a too-narrow interval, e.g. without the t quantile or with sd/n, fails)."""
    rng = np.random.default_rng(1)
    pop = np.clip(rng.beta(8, 1.5, 2000), 0, 1)
    pop = np.round(pop * 10) / 10  # recall@10 takes tenths
    covered = 0
    for _ in range(400):
        s = pop[rng.choice(len(pop), 50, replace=False)]
        _, lo, hi = interval(s, len(pop))
        covered += lo <= pop.mean() <= hi
    assert 0.91 <= covered / 400 <= 0.99


def test_verdict():
    m = measured(np.array([[1, 2]] * 60), np.array([[1, 3]] * 60), 2, 1000, mode="hash",
                 target=0.9, estimate=0.95)
    assert m.value == 0.5 and verdict(m, 0.9) == "miss"
    assert verdict(m, 0.5) == "ok"


def _fake(value: float, n: int = 100, population: int = 5000):
    """A measure callback whose recall is ``value`` on every sampled query."""
    found = np.tile(np.arange(10), (n, 1))
    truth = found.copy()
    miss = round((1 - value) * 10)
    truth[:, :miss] += 100
    return lambda point, estimate: measured(found, truth, 10, population, mode="hash",
                                            target=0.9, estimate=estimate)


def test_a_planted_optimistic_calibration_is_caught_and_corrected():
    """The calibration says 0.97 at point A; the queries measure 0.7 there: the job calibrates
    again on the queries (point B), checks B (1.0) and answers at B, and says so."""
    calls = []

    def measure(point, estimate):
        calls.append(point)
        return _fake(0.7 if point == "A" else 1.0)(point, estimate)

    d = enforce(mode="hash", point="A", estimate=0.97, target=0.9, auto=True, n_queries=5000,
                k=10, measure=measure, recalibrate=lambda: ("hash", "B", "chose B", 0.93))
    assert calls == ["A", "B"]
    assert (d.mode, d.point, d.recall.action) == ("hash", "B", "recalibrated")
    assert d.recall.value == pytest.approx(1.0) and d.recall.estimate == 0.93
    assert d.recall.checks[0]["value"] == pytest.approx(0.7)
    assert d.recall.checks[0]["estimate"] == 0.97
    assert "calibrated again" in d.reason


def test_a_miss_that_recalibration_does_not_mend_is_answered_by_the_scan():
    d = enforce(mode="hash", point="A", estimate=0.97, target=0.9, auto=True, n_queries=5000,
                k=10, measure=lambda p, e: _fake(0.7)(p, e),
                recalibrate=lambda: ("hash", "B", "chose B", 0.93))
    assert (d.mode, d.point, d.recall.action, d.recall.value) == ("scan", None, "scan", 1.0)
    assert len(d.recall.checks) == 2 and "exact scan" in d.reason


def test_a_proven_miss_without_recalibration_is_answered_by_the_scan():
    d = enforce(mode="hash", point="A", estimate=0.97, target=0.9, auto=True, n_queries=5000,
                k=10, measure=lambda p, e: _fake(0.7)(p, e), recalibrate=None)
    assert d.mode == "scan" and d.recall.action == "scan"


def test_a_point_within_noise_of_the_target_stands():
    d = enforce(mode="hash", point="A", estimate=0.91, target=0.9, auto=True, n_queries=5000,
                k=10, measure=lambda p, e: _fake(0.9)(p, e), recalibrate=None)
    assert (d.mode, d.point) == ("hash", "A") and d.recall.action == "kept"


def test_an_explicit_hash_mode_is_reported_not_changed():
    d = enforce(mode="hash", point="A", estimate=0.97, target=0.9, auto=False, n_queries=5000,
                k=10, measure=lambda p, e: _fake(0.7)(p, e),
                recalibrate=lambda: pytest.fail("must not recalibrate"))
    assert (d.mode, d.point, d.recall.action) == ("hash", "A", "reported")
    assert "asked for" in d.recall.note


def test_the_scan_is_not_sampled():
    d = enforce(mode="scan", point=None, estimate=None, target=0.9, auto=True, n_queries=50,
                k=10, measure=lambda p, e: pytest.fail("must not measure"), recalibrate=None)
    assert d.recall.value == 1.0 and d.recall.sampled == 0
    assert d.recall.to_json()["interval"] == [1.0, 1.0]


def test_bulk_scan_seconds_fits_a_fixed_cost_and_a_cost_per_query():
    """A scan that costs 2 s a call plus 10 ms a query, timed at 200 and 100 queries: a
    10,000-query scan costs 10.2 ms a query, not the 20 ms the 200-query timing says; the
    estimate is never above the timing, nor below a quarter of it."""
    from lshdist.index.calibrate import bulk_seconds

    t = lambda n: 2.0 + 0.01 * n  # noqa: E731
    assert bulk_seconds(t(200), 200, t(100), 100, 10_000) == pytest.approx(0.0102)
    # no fixed cost: the timing stands
    assert bulk_seconds(2.0, 200, 1.0, 100, 10_000) == pytest.approx(0.01)
    # noise (the half run slower than the full one): never above the measured time per query
    assert bulk_seconds(2.0, 200, 2.5, 100, 10_000) == pytest.approx(0.0025)
    assert bulk_seconds(2.0, 200, 0.5, 100, 10_000) == pytest.approx(0.01)


@pytest.mark.parametrize("learned", [True, False])
def test_calibration_charges_the_hashed_search_for_hashing_its_queries(monkeypatch, learned):
    """The hashed search pays for the queries' keys, the scan does not: calibration adds that
    time to the hashed search's, for the learned implicit (kernel) family too — left out once,
    which made auto choose a hashed search 3x slower than the scan on a news corpus."""
    import lshdist.index.searcher as searcher
    from lshdist.hashing.families import family_for
    from lshdist.index.permutation import PermutationIndex
    from lshdist.metric.itml import KernelITML

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 12)).astype(np.float32)
    y = rng.integers(0, 3, 400)
    X[:, 0] += 3 * y
    metric = KernelITML(n_basis=20, n_constraints=300, seed=1).fit(X, y).metric()
    family = family_for(metric, bits=64, seed=0, learned=learned)
    codes, payload = searcher.encode(metric, family, X)
    index = PermutationIndex(n_permutations=8, seed=0).fit(codes, 64, payload)
    seen = {}

    def fake_calibrate(*args, hash_overhead, **kw):
        seen["overhead"] = hash_overhead
        raise RuntimeError("stop")

    calls = []
    real = type(family).hash_with if learned else type(family).hash
    monkeypatch.setattr(type(family), "hash_with" if learned else "hash",
                        lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    monkeypatch.setattr(searcher, "calibrate", fake_calibrate)
    with pytest.raises(RuntimeError, match="stop"):
        searcher.calibrate_index(index, metric, family, X, k=5, target=0.9, seed=0, fixed={})
    assert seen["overhead"] > 0 and len(calls) >= 2  # the encoding's, and the timed one
