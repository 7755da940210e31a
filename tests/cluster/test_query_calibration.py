"""A bulk ``lshdist query --mode auto`` calibrates on a sample of its own queries.

A database holding near-copies of its rows (augmented data) makes its own rows easy queries:
the index's build-time calibration (leave-one-out) picks a point whose recall on real queries
falls short.  A query set of at least `RECALIBRATE_QUERIES` rows is calibrated again on a sample
of itself before it runs, and meets the target; an index calibrated on that very query dataset
(as `lshdist run` builds it) is not calibrated twice.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from lshdist.cluster.pipeline import build_index, plan_query, query_index
from lshdist.config import IndexConfig, QueryConfig
from lshdist.index.searcher import RECALIBRATE_QUERIES
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.model import save_model
from lshdist.store.results import read_results


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from distributed import Client, LocalCluster

    root = tmp_path_factory.mktemp("qcal")
    rng = np.random.default_rng(5)
    base = rng.normal(size=(1000, 16)).astype(np.float32)
    db = np.concatenate([base] + [base + rng.normal(scale=0.02, size=base.shape)
                                  .astype(np.float32) for _ in range(4)])
    write_dataset(root / "db", db, shard_rows=1000)
    q = rng.normal(size=(RECALIBRATE_QUERIES, 16)).astype(np.float32)
    write_dataset(root / "q", q, ids=np.arange(len(q)) + 10**6, shard_rows=1000)
    save_model(root / "model", ExplicitMetric.identity(16, center=db.mean(0)))
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield root, client


def _recall(found, exact) -> float:
    return float(np.mean([len(np.intersect1d(a, b)) / a.size for a, b in zip(found, exact)]))


def test_bulk_query_is_calibrated_on_its_queries(setup):
    root, client = setup
    cfg = IndexConfig(segment_rows=5000, seed=1)
    build_index(client, data=str(root / "db"), model=str(root / "model"),
                out=str(root / "idx"), cfg=cfg)
    plan = plan_query(index=str(root / "idx"), queries=str(root / "q"), out=str(root / "r"),
                      cfg=QueryConfig(k=10))
    assert plan.recalibrate
    out = {}
    for name, qcfg in (("auto", QueryConfig(k=10)),
                       ("rows", QueryConfig(k=10, mode="hash")),  # the build's point
                       ("scan", QueryConfig(k=10, mode="scan"))):
        query_index(client, index=str(root / "idx"), queries=str(root / "q"),
                    out=str(root / f"r-{name}"), cfg=qcfg)
        qid, nb, _, _ = read_results(root / f"r-{name}")
        out[name] = nb[np.argsort(qid, kind="stable")]
    info = json.loads((root / "r-auto" / "results.json").read_text())
    assert "calibrated on the queries" in json.dumps(info)
    got, got_rows = _recall(out["auto"], out["scan"]), _recall(out["rows"], out["scan"])
    print(f"\nbulk auto {got:.3f} ({info}); the build's point {got_rows:.3f}")
    assert got >= 0.88 and got > got_rows + 0.03


def test_index_calibrated_on_the_same_queries_is_not_calibrated_again(setup):
    root, client = setup
    cfg = replace(IndexConfig(bits=64, segment_rows=5000, seed=1),
                  calibration_queries=str(root / "q"))
    build_index(client, data=str(root / "db"), model=str(root / "model"),
                out=str(root / "idx-q"), cfg=cfg)
    plan = plan_query(index=str(root / "idx-q"), queries=str(root / "q"),
                      out=str(root / "r2"), cfg=QueryConfig(k=10))
    assert not plan.recalibrate


def test_an_index_of_several_segments_is_calibrated_for_the_merged_answer(setup):
    """Five segments: the grid is measured over every segment for the merged answer's true
    neighbours (most rank first or second within their own segment), so each segment
    searches for less than its own recall@10 — and the merged answer's recall is what was
    calibrated.  Catches: one segment standing for all, a merged recall that over-promises."""
    root, client = setup
    cfg = replace(IndexConfig(segment_rows=1000, seed=1), calibration_queries=str(root / "q"))
    build_index(client, data=str(root / "db"), model=str(root / "model"),
                out=str(root / "idx-5"), cfg=cfg)
    manifest = json.loads((root / "idx-5" / "index.json").read_text())
    assert len(manifest["segments"]) == 5
    cal = manifest["calibration"]
    w = np.array(cal["extra"]["rank_weights"])
    assert w.shape == (10,) and w.sum() == pytest.approx(1.0) and w[0] > 2 * w[-1]
    # every true neighbour of the 200-query sample is measured, in its own segment
    assert cal["extra"]["rows_measured"] == 200 * 10
    # each query walks every segment's lists: the cost model counts all five
    assert {p["parts"] for p in cal["points"]} == {5}
    # at 1,000 rows of 16-d the scan is the faster (auto keeps it); the hashed point is the
    # one timed against it, and what --mode hash searches at
    chosen = cal["chosen"] or cal["extra"]["timed"]
    out = {}
    for name, qcfg in (("hash", QueryConfig(k=10, mode="hash")),
                       ("scan", QueryConfig(k=10, mode="scan"))):
        query_index(client, index=str(root / "idx-5"), queries=str(root / "q"),
                    out=str(root / f"r5-{name}"), cfg=qcfg)
        qid, nb, _, _ = read_results(root / f"r5-{name}")
        out[name] = nb[np.argsort(qid, kind="stable")]
    got = _recall(out["hash"], out["scan"])
    print(f"\nmerged recall {got:.3f}, calibrated {chosen['recall']:.3f}, weights {w.round(2)}")
    assert got >= 0.88 and abs(got - chosen["recall"]) < 0.03
