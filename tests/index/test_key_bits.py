"""The key length b when none is given: 256 under an explicit metric, 512 under a kernelized
one (`lshdist.config.default_key_bits`); a given b is kept, and what a build used is recorded in
its manifest."""

from __future__ import annotations

import numpy as np
import pytest

from lshdist.config import IndexConfig, default_key_bits, from_mapping
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric


def test_default_by_the_metric_kind_and_a_given_b_kept():
    assert default_key_bits(True) == 256 and default_key_bits(False) == 512
    assert IndexConfig.bits is None
    assert IndexConfig().key_bits(True) == 256 and IndexConfig().key_bits(False) == 512
    given = from_mapping(IndexConfig, {"bits": 512}, where="index")
    assert given.key_bits(True) == 512 and given.key_bits(False) == 512
    assert IndexConfig(bits=64).key_bits(True) == 64  # built in Python: kept too
    assert from_mapping(IndexConfig, {"bits": 64}, where="index").key_bits(False) == 64


def test_the_in_process_index_takes_the_default_of_its_metric():
    from lshdist.index.searcher import MetricIndex

    assert MetricIndex(ExplicitMetric.identity(4)).bits == 256
    assert MetricIndex(ImplicitMetric.identity(np.eye(3, dtype=np.float32), d=3)).bits == 512
    assert MetricIndex(ExplicitMetric.identity(4), bits=128).bits == 128
    X = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(8), seed=0).fit(X)
    assert ix.family_.bits == 256 and ix.index_.bits_ == 256


def test_the_public_index_resolves_at_fit():
    import lshdist

    X = np.random.default_rng(1).normal(size=(300, 8)).astype(np.float32)
    est = lshdist.MetricIndex(target_recall=None, permutations=4).fit(X)
    assert est.bits is None  # the parameter as given (scikit-learn's convention)
    _, ids = est.kneighbors(X[:5], n_neighbors=1)
    assert ids.shape == (5, 1)


@pytest.mark.parametrize("given", [None, 512, 96])
def test_a_build_records_the_b_it_used(tmp_path, given):
    from lshdist.cluster.pipeline import plan_build
    from lshdist.store.dataset import write_dataset
    from lshdist.store.model import save_model

    X = np.random.default_rng(2).normal(size=(400, 6)).astype(np.float32)
    write_dataset(tmp_path / "db", X, shard_rows=200)
    save_model(tmp_path / "model", ExplicitMetric.identity(6))
    cfg = from_mapping(IndexConfig, {} if given is None else {"bits": given}, where="index")
    plan = plan_build(data=str(tmp_path / "db"), model=str(tmp_path / "model"),
                      out=str(tmp_path / "idx"), cfg=cfg)
    want = 256 if given is None else given
    assert plan.cfg.bits == want and plan.manifest.bits == want
