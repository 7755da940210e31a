"""The distributed pipeline on sparse rows with an implicit (kernelized) model, without the real
datasets: equal to the one-process `MetricIndex` searched segment by segment and merged."""

import numpy as np
import scipy.sparse as sp

from lshdist.cluster.client import dask_client
from lshdist.cluster.pipeline import build_index, query_index
from lshdist.config import IndexConfig, QueryConfig
from lshdist.index import MetricIndex
from lshdist.index.permutation import merge_topk
from lshdist.metric.itml import KernelITML
from lshdist.store.dataset import write_dataset
from lshdist.store.model import load_model, save_model
from lshdist.store.results import read_results


def _sparse_data(n, d=400, nnz=12, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    rows = np.repeat(np.arange(n), nnz)
    cols = rng.integers(0, d, size=n * nnz)
    cols[::nnz] = y * 7  # a class feature, so that constraints have something to learn
    vals = rng.random(n * nnz).astype(np.float32) + 0.1
    X = sp.csr_matrix((vals, (rows, cols)), shape=(n, d))
    X.sum_duplicates()
    X = sp.csr_matrix(X.multiply(1.0 / np.sqrt(X.multiply(X).sum(axis=1))))
    return X.astype(np.float32), y


def test_sparse_implicit_pipeline_equals_one_process_per_segment(tmp_path):
    # catches: a sparse segment encoded with another family or basis than the one-process index,
    # the last (partial) segment dropped or mis-offset, merged lists not tied by id
    X, y = _sparse_data(900)
    Xq, _ = _sparse_data(60, seed=1)
    rng = np.random.default_rng(2)
    ids = rng.permutation(10**6)[:900] + 5_000  # ids that do not rise with rows
    write_dataset(tmp_path / "db", X, y, ids=ids, shard_rows=200)  # 5 shards: 400, 400, 100
    write_dataset(tmp_path / "q", Xq, shard_rows=25, ids=np.arange(60) * 3 + 1)
    est = KernelITML(n_basis=40, n_constraints=300, max_iter=20, seed=0).fit(X, y)
    save_model(tmp_path / "model", est.metric(d=400))
    metric, _ = load_model(tmp_path / "model")
    cfg = IndexConfig(bits=64, permutations=12, window=4, hamming_keep=30, segment_rows=400)
    with dask_client(workers=1, processes=False) as client:
        m = build_index(client, data=str(tmp_path / "db"), model=str(tmp_path / "model"),
                        out=str(tmp_path / "idx"), cfg=cfg)
        query_index(client, index=str(tmp_path / "idx"), queries=str(tmp_path / "q"),
                    out=str(tmp_path / "res"), cfg=QueryConfig(k=5, mode="hash"))
    assert [e.rows for e in m.segments] == [400, 400, 100]  # the last one partial
    qids, nb, dist, _ = read_results(tmp_path / "res", np.arange(60) * 3 + 1)
    assert qids.tolist() == (np.arange(60) * 3 + 1).tolist()
    parts = []
    for a, b in ((0, 400), (400, 800), (800, 900)):
        ix = MetricIndex(metric, bits=64, n_permutations=12, window=4, hamming_keep=30,
                         seed=0).fit(X[a:b], ids=ids[a:b])
        d, i = ix.query(Xq, 5, mode="hash")
        parts.append((d, i, None))
    d_ref, i_ref = merge_topk([p[0] for p in parts], [p[1] for p in parts], 5)
    assert np.array_equal(nb, i_ref)
    assert np.allclose(dist, d_ref, rtol=1e-6, atol=1e-7)
    assert (nb >= 0).all() and set(np.unique(nb)) <= set(ids.tolist())


def test_index_calibrates_on_a_given_query_sample(tmp_path, capsys):
    from lshdist.cli import main
    from lshdist.store.index import read_manifest

    X, y = _sparse_data(600)
    Xq, _ = _sparse_data(80, seed=3)
    write_dataset(tmp_path / "db", X, y, shard_rows=300)
    write_dataset(tmp_path / "q", Xq)
    write_dataset(tmp_path / "dense", np.zeros((5, 3), np.float32))
    est = KernelITML(n_basis=30, n_constraints=200, max_iter=10, seed=0).fit(X, y)
    save_model(tmp_path / "model", est.metric(d=400))
    base = ["index", "--data", str(tmp_path / "db"), "--model", str(tmp_path / "model"),
            "--in-process", "--workers", "1"]
    assert main([*base, "--out", str(tmp_path / "bad"), "--calibration-queries",
                 str(tmp_path / "dense")]) == 2
    assert "calibration queries" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main([*base, "--out", str(tmp_path / "idx"), "--calibration-queries",
                 str(tmp_path / "q")]) == 0
    cal = read_manifest(tmp_path / "idx")["calibration"]
    assert cal["n_queries"] == 80 and cal["n_database"] == 600  # the given sample, all rows
