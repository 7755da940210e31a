"""Dask knows what lshdist's objects weigh (`lshdist.cluster.sizes`): a segment is its arrays,
not the 56 bytes of `sys.getsizeof`, so that work stealing does not move it as if it were free."""

import numpy as np
import pytest
import scipy.sparse as sp
from dask.sizeof import sizeof

from lshdist.cluster import tasks
from lshdist.cluster.client import dask_client
from lshdist.cluster.sizes import held_bytes
from lshdist.index.permutation import PackedSegment


def _arrays(seg):
    return [seg.codes_, seg.positions_, seg.sorted_prefix_, seg.sorted_rows_, seg.ids_,
            *seg.payload_.arrays().values()]


def _fit(job, lists=8, shards=(0, 2)):
    family = tasks.load_family(str(job / "model"), 64, 0, True)
    return tasks.fit_segment(str(job / "train-a"), shards, family, lists, None, 0), family


def test_a_segment_weighs_its_arrays(letter_job):
    seg, family = _fit(letter_job)
    arrays = sum(a.nbytes for a in _arrays(seg))
    assert arrays > 500_000  # 4,000 rows: keys, 8 lists and their prefixes, the re-rank rows
    # every array once, plus the attributes' few small scalars
    assert arrays <= sizeof(seg) <= arrays + 10_000
    assert sizeof(seg) == held_bytes(seg)
    # the hash family carries the metric's matrices and the hash coefficients
    assert sizeof(family) >= family.metric.G.nbytes + 64 * 16 * 4
    # the same arrays in a packed segment and in a tuple are counted once
    assert sizeof(PackedSegment([seg, seg])) == held_bytes(seg) + held_bytes([])
    # a truncated segment (views of the lists) weighs what it would copy
    few = seg.truncated(2)
    assert sizeof(few) == sizeof(seg) - 6 * (seg.sorted_prefix_[0].nbytes
                                             + seg.sorted_rows_[0].nbytes
                                             + seg.positions_[0].nbytes)


def test_held_bytes_walks_containers_views_and_sparse_rows():
    a = np.zeros((100, 10))
    assert held_bytes([a, a, {"x": a}]) == a.nbytes + held_bytes([]) + held_bytes({})
    assert held_bytes(a[:10]) == a[:10].nbytes
    m = sp.random(50, 40, density=0.1, format="csr", random_state=0)
    assert held_bytes(m) >= m.data.nbytes + m.indices.nbytes + m.indptr.nbytes


def _fitted_weight(obj):
    return held_bytes(obj)


def _scheduler_bytes(dask_scheduler, key):
    return dask_scheduler.tasks[key].nbytes


def _check_scheduler_knows(client, letter_job):
    family_f = client.submit(tasks.load_family, str(letter_job / "model"), 64, 0, True)
    fit = client.submit(tasks.fit_segment, str(letter_job / "train-a"), (0, 2), family_f, 8,
                        None, 0)
    weight = client.submit(_fitted_weight, fit).result()
    known = client.run_on_scheduler(_scheduler_bytes, key=fit.key)
    assert weight > 500_000 and known == weight
    # (a family caches arrays at its first use: sized when it was made, not the 56 bytes of
    # `sys.getsizeof`)
    assert client.run_on_scheduler(_scheduler_bytes, key=family_f.key) > 16 * 16 * 8


def test_the_scheduler_knows_a_fitted_segments_weight(letter_job):
    with dask_client(workers=1, processes=False) as client:
        _check_scheduler_knows(client, letter_job)


@pytest.mark.cluster
def test_worker_processes_size_segments_too(letter_job):
    # a spawned worker registers the sizes when it first imports lshdist.cluster
    with dask_client(workers=1) as client:
        _check_scheduler_knows(client, letter_job)


def test_a_default_size_cached_before_registration_is_replaced(letter_job):
    # a worker that sized an lshdist object (data replicated to it) before it imported
    # lshdist.cluster: Dask cached sys.getsizeof for the class; registering clears that
    from dask.sizeof import sizeof as dispatch

    from lshdist.cluster.sizes import register

    family = tasks.load_family(str(letter_job / "model"), 64, 0, True)
    dispatch._lookup[type(family)] = dispatch._lookup[object]  # what Dask would have cached
    assert sizeof(family) < 1_000
    register()
    assert sizeof(family) == held_bytes(family) > 16 * 16 * 8


def test_a_stall_names_the_paused_workers():
    from types import SimpleNamespace

    from lshdist.cluster.driver import stalled_reason

    def future(workers):
        return SimpleNamespace(client=SimpleNamespace(_scheduler_identity={"workers": workers}))

    msg = stalled_reason([future({"tcp://a:1": {"status": "paused"},
                                  "tcp://b:2": {"status": "running"}})])
    assert "tcp://a:1" in msg and "tcp://b:2" not in msg
    assert "does not spill to disk" in msg and "--workers" in msg
    assert "stalled" in stalled_reason([future({"tcp://b:2": {"status": "running"}})])
    assert "stalled" in stalled_reason([])


def test_a_segment_of_byte_rows_is_fitted_without_their_float32_copy(fashion, tmp_path):
    """Pixel rows (a dataset stored as bytes) under the identity metric are fitted from their
    uint8 rows: the segment holds them on their exact grid alone, with the keys and grid of
    the same rows fitted in float32; the query chunk's payload is on its grid too.  Under a
    learned metric the payload is G x, float32, as before."""
    from lshdist.index.searcher import encode
    from lshdist.metric.learned import ExplicitMetric
    from lshdist.store.dataset import write_dataset
    from lshdist.store.model import save_model

    X = np.ascontiguousarray(fashion.X_train[:1_500], dtype=np.uint8)
    write_dataset(tmp_path / "data", X, shard_rows=500)
    rng = np.random.default_rng(0)
    M = rng.normal(size=(784, 784))
    for name, metric in (("identity", ExplicitMetric.identity(784, center=X.mean(axis=0))),
                         ("learned", ExplicitMetric(np.eye(784) + M @ M.T / 784**2))):
        save_model(tmp_path / name, metric)
        family = tasks.load_family(str(tmp_path / name), 64, 0, True)
        seg = tasks.fit_segment(str(tmp_path / "data"), (1, 3), family, 8, None, 0)
        codes, payload = encode(family.metric, family, X[500:].astype(np.float32))
        assert np.array_equal(seg.codes_, codes)
        assert seg.payload_.held_on_grid == (name == "identity")
        want = payload.compact().arrays()
        assert all(np.array_equal(seg.payload_.arrays()[k], v) for k, v in want.items())
        _, q, _ = tasks.encode_queries(str(tmp_path / "data"), 0, 700, family)
        assert q.held_on_grid == (name == "identity")
