"""`MetricIndex.query` measures its recall on a sample of its queries (``measured_recall_``)
and keeps the promise where the calibration was optimistic: a database of near-copies
calibrated leave-one-out, queried by fresh rows without copies."""

from __future__ import annotations

import numpy as np

from lshdist.evaluation import recall_at_k
from lshdist.index.searcher import RECALIBRATE_QUERIES, MetricIndex
from lshdist.metric.learned import ExplicitMetric


def _nearcopies():
    rng = np.random.default_rng(5)
    base = rng.normal(size=(1000, 16)).astype(np.float32)
    db = np.concatenate([base] + [base + rng.normal(scale=0.02, size=base.shape)
                                  .astype(np.float32) for _ in range(4)])
    q = rng.normal(size=(1000, 16)).astype(np.float32)
    assert len(q) < RECALIBRATE_QUERIES
    return db, q, ExplicitMetric.identity(16, center=db.mean(0))


def test_near_copies_fool_leave_one_out_and_the_check_corrects_it():
    """At 5,000 rows of 16-d the scan is the honest answer (calibration picks it); the hashed
    point it timed is planted as the operating point, as an optimistic calibration would.
    At 512 bits, where that point's miss on these queries (below 0.87) was measured."""
    db, q, metric = _nearcopies()
    ix = MetricIndex(metric, bits=512, target_recall=0.9, seed=1).fit(db)
    _, exact = ix.query(q, 10, mode="scan")
    point = ix.calibration_.reference
    assert point is not None and point.recall >= 0.9  # leave-one-out: the copies are easy
    ix.set_operating_point("hash", point)  # planted: auto answers hashed at that point
    _, plain = ix.query(q, 10, mode="hash")
    fooled = recall_at_k(plain, exact, 10)
    print(f"\nleave-one-out estimate {point.recall:.3f}, real {fooled:.3f}")
    assert fooled < 0.87

    _, ids = ix.query(q, 10)  # auto
    got = recall_at_k(ids, exact, 10)
    m = ix.measured_recall_
    print(f"checked {got:.3f}: {m.line()}")
    assert got >= 0.88
    assert m.action in ("recalibrated", "scan") and ix.last_mode_ == m.mode
    first = m.checks[0]
    assert first["value"] < 0.9 and first["estimate"] == point.recall
    assert abs(first["value"] - fooled) < 0.08  # the sample saw the real miss
    if m.action == "recalibrated":
        assert m.low - 0.03 <= got <= m.high + 0.03

    off = MetricIndex(metric, bits=512, target_recall=0.9, seed=1, check_recall=False).fit(db)
    off.calibration_
    off.set_operating_point("hash", point)
    _, ids = off.query(q, 10)
    assert recall_at_k(ids, exact, 10) == fooled and not hasattr(off, "measured_recall_")


def test_the_check_reports_an_explicit_hash_mode_without_changing_it():
    db, q, metric = _nearcopies()
    ix = MetricIndex(metric, target_recall=0.9, seed=1).fit(db)
    ix.set_operating_point("hash", ix.calibration_.reference)
    _, ids = ix.query(q, 10, mode="hash")
    m = ix.measured_recall_
    assert m.action == "reported" and ix.last_mode_ == "hash"
    _, exact = ix.query(q, 10, mode="scan")
    assert abs(m.value - recall_at_k(ids, exact, 10)) < 0.06
    assert ix.measured_recall_.value == 1.0  # the scan's own record
