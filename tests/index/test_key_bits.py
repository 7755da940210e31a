"""The key length b when none is given (`lshdist.config.default_key_bits`): 256 for a build
followed by a known number of queries under an explicit metric where hashing is most of the
job (rows + queries >= 2 queries segments), else 512; a given b is kept, and what a build used
is recorded in its manifest."""

from __future__ import annotations

import numpy as np
import pytest

from lshdist.config import IndexConfig, default_key_bits, from_mapping
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric


def test_the_rule():
    # Fashion-MNIST's run: 60,000 rows in 2 segments, 10,000 queries
    assert default_key_bits(True, rows=60_000, queries=10_000, segments=2) == 256
    # the million-row job: 1,020,000 rows in 11 segments, 100,000 queries
    assert default_key_bits(True, rows=1_020_000, queries=100_000, segments=11) == 512
    # the boundary: rows + queries = 2 queries segments
    assert default_key_bits(True, rows=30_000, queries=10_000, segments=2) == 256
    assert default_key_bits(True, rows=29_999, queries=10_000, segments=2) == 512
    # queries not known (an index built alone), or a kernelized metric: 512
    assert default_key_bits(True, rows=60_000) == 512
    assert default_key_bits(True) == 512
    assert default_key_bits(False, rows=60_000, queries=10_000, segments=2) == 512


def test_a_given_b_is_kept():
    assert IndexConfig.bits is None
    for cfg in (from_mapping(IndexConfig, {"bits": 512}, where="index"), IndexConfig(bits=512)):
        assert cfg.key_bits(True, rows=60_000, queries=10_000, segments=2) == 512
    assert IndexConfig(bits=64).key_bits(False) == 64
    assert IndexConfig().key_bits(True, rows=60_000, queries=10_000, segments=2) == 256


def test_the_in_process_index_takes_the_default_of_an_index_built_alone():
    from lshdist.index.searcher import MetricIndex

    assert MetricIndex(ExplicitMetric.identity(4)).bits == 512
    assert MetricIndex(ImplicitMetric.identity(np.eye(3, dtype=np.float32), d=3)).bits == 512
    assert MetricIndex(ExplicitMetric.identity(4), bits=128).bits == 128
    X = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(8), bits=256, seed=0).fit(X)
    assert ix.family_.bits == 256 and ix.index_.bits_ == 256


def test_the_public_index_resolves_at_fit():
    import lshdist

    X = np.random.default_rng(1).normal(size=(300, 8)).astype(np.float32)
    est = lshdist.MetricIndex(target_recall=None, permutations=4).fit(X)
    assert est.bits is None  # the parameter as given (scikit-learn's convention)
    _, ids = est.kneighbors(X[:5], n_neighbors=1)
    assert ids.shape == (5, 1)


@pytest.fixture()
def job(tmp_path):
    from lshdist.store.dataset import write_dataset
    from lshdist.store.model import save_model

    rng = np.random.default_rng(2)
    write_dataset(tmp_path / "db", rng.normal(size=(400, 6)).astype(np.float32), shard_rows=200)
    write_dataset(tmp_path / "few", rng.normal(size=(100, 6)).astype(np.float32),
                  ids=np.arange(100) + 10_000, shard_rows=100)
    write_dataset(tmp_path / "many", rng.normal(size=(300, 6)).astype(np.float32),
                  ids=np.arange(300) + 10_000, shard_rows=300)
    save_model(tmp_path / "model", ExplicitMetric.identity(6))
    return tmp_path


@pytest.mark.parametrize("given", [None, 512, 96])
def test_a_build_alone_records_the_b_it_used(job, given):
    from lshdist.cluster.pipeline import plan_build

    cfg = IndexConfig(bits=given)
    plan = plan_build(data=str(job / "db"), model=str(job / "model"), out=str(job / "idx"),
                      cfg=cfg)
    want = 512 if given is None else given
    assert plan.cfg.bits == want and plan.manifest.bits == want
    assert plan.bits_given == (given is not None)


@pytest.mark.parametrize(("queries", "given", "want"),
                         [("few", None, 256), ("many", None, 512), ("few", 512, 512)])
def test_a_build_with_its_queries_chooses_b_by_them(job, queries, given, want):
    """400 rows in 2 segments: 100 queries (400 + 100 >= 2 x 100 x 2) take 256 bits, 300
    (700 < 1,200) 512; a given b is kept.  The job's family, segments and manifest use it."""
    from distributed import Client, LocalCluster

    from lshdist.cluster.pipeline import build_and_query, plan_build, plan_following_query
    from lshdist.config import QueryConfig
    from lshdist.store.index import read_permutation_manifest, read_segment

    plan = plan_build(data=str(job / "db"), model=str(job / "model"), out=str(job / "idx"),
                      cfg=IndexConfig(bits=given, segment_rows=200, permutations=4, window=2))
    search = plan_following_query(plan, queries=str(job / queries), out=str(job / "res"),
                                  cfg=QueryConfig(k=3, check_recall=False))
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        built, _, _ = build_and_query(client, plan, search)
    m = read_permutation_manifest(str(job / "idx"), "the test")
    assert built.bits == m.bits == want and len(m.segments) == 2
    seg = read_segment(str(job / "idx"), m.segments[0], m)
    assert seg.bits_ == want and seg.codes_.shape[1] == want // 64
