"""Where the scan wins, calibration still times one hashed point as the reference for
query-time targets (`Calibration.reference`, `Calibration.point_for`): the point the target
*plus its recall margin* selects, as a chosen point would be.  Without the margin the cheapest
of the points just at the target is timed -- one that the sample's luck put there."""

import numpy as np

from lshdist.index.calibrate import calibrate, choose_point, recall_margin
from lshdist.index.searcher import MetricIndex, encode
from lshdist.metric.learned import ExplicitMetric

GRID = dict(k=5, permutations=[4, 8, 16, 32], windows=[1, 2, 4, 8], hamming_keeps=[0, 20],
            hash_overhead=1.0)  # hashing costs 1 s a query: the scan always wins


def test_the_timed_reference_reaches_the_target_plus_its_margin():
    """Mutant caught: the reference chosen at ``min(target, top)`` instead of
    ``min(target + margin, top)`` (`lshdist.index.calibrate.calibrate`)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(1500, 12)).astype(np.float32)
    metric = ExplicitMetric.identity(12, center=X.mean(0))
    ix = MetricIndex(metric, bits=64, n_permutations=32, window=8).fit(X)
    qrows = np.arange(0, 1500, 15, dtype=np.int64)
    qc, qp = encode(metric, ix.family_, X[qrows], query=True)
    probe = calibrate(ix.index_, qrows, qc, qp, target=0.5, **GRID)
    # a target whose cheapest point lies within the margin above it, a dearer one beyond it
    for r in sorted({p.recall for p in probe.points if 0.3 < p.recall < 0.95}):
        target = r - 1e-9
        margin = recall_margin(target, len(qrows))
        near = choose_point(probe.points, target, probe.width)
        far = choose_point(probe.points, target + margin, probe.width)
        if near is not None and far is not None and near.recall < target + margin:
            break
    else:
        raise AssertionError("no target separates the two points on this grid")
    cal = calibrate(ix.index_, qrows, qc, qp, target=target, **GRID)
    assert cal.mode == "scan" and cal.chosen is None
    ref = cal.reference
    assert ref is not None and ref.seconds_per_query is not None
    assert cal.extra["margin"] == margin
    assert ref.recall >= target + margin > near.recall
    assert (ref.permutations, ref.window, ref.hamming_keep) == (far.permutations, far.window,
                                                                far.hamming_keep)
