"""The public API (`lshdist.api`, exported from `lshdist`): scikit-learn's protocol, the
one-process index on real data, and the jobs as functions on a caller's Dask client."""

import sys

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone

import lshdist
from lshdist.errors import InputError, NotFittedError


def recall_at(found, exact):
    k = exact.shape[1]
    return float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(found, exact)]))


def brute_force(X, Q, k):
    """Exact squared-L2 neighbours, float64, ties by row number (the reference)."""
    X, Q = np.asarray(X, np.float64), np.asarray(Q, np.float64)
    D = (Q * Q).sum(1)[:, None] + (X * X).sum(1)[None, :] - 2 * Q @ X.T
    order = np.argsort(D, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(D, order, axis=1), order


@pytest.fixture
def small():
    """Rows whose neighbours are unambiguous: 300 rows in 6 d, queries near given rows."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 6)).astype(np.float32) * np.arange(1, 7, dtype=np.float32)
    Q = X[rng.choice(300, 40, replace=False)] + 0.01 * rng.normal(size=(40, 6)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + 2 * (X[:, 1] > 0)
    return X, y, Q


# ------------------------------------------------------------------ scikit-learn's protocol


@pytest.mark.parametrize("est", [
    lshdist.ITML(gamma=0.5, percentiles=(1.0, 99.0), prior="inverse-covariance"),
    lshdist.KernelITML(n_basis=40, route="basis", bounds=(1.0, 4.0)),
    lshdist.MetricIndex(None, target_recall=0.8, bits=64, window=2),
])
def test_clone_get_params_set_params_round_trip(est):
    params = est.get_params()
    twin = clone(est)  # sklearn's clone: every parameter stored as given, none dropped
    assert type(twin) is type(est) and twin is not est
    assert twin.get_params() == params
    changed = {"seed": 5} if "seed" in params else {}
    assert twin.set_params(**changed) is twin
    assert twin.get_params() == {**params, **changed}
    assert est.get_params() == params  # the original is untouched
    assert all(not hasattr(twin, name) for name in vars(twin) if name.endswith("_"))


def test_parameters_are_keyword_only_and_listed_whole():
    assert set(lshdist.KernelITML().get_params()) >= {"n_basis", "route", "gamma", "seed",
                                                     "n_constraints", "percentiles"}
    assert lshdist.KernelITML().get_params()["n_constraints"] == 2000  # its own default
    with pytest.raises(TypeError):
        lshdist.ITML(0.5)  # positional parameters are not accepted
    with pytest.raises(InputError, match="'gama' is not a parameter of ITML; its parameters"):
        lshdist.ITML().set_params(gama=2.0)
    with pytest.raises(InputError, match="'k' is not a parameter of MetricIndex"):
        lshdist.MetricIndex().set_params(k=3)
    assert repr(lshdist.ITML(gamma=0.5)) == "ITML(gamma=0.5)"


def test_unfitted_estimators_say_so(small):
    X, _, Q = small
    with pytest.raises(NotFittedError, match="this ITML is not fitted yet; call fit"):
        lshdist.ITML().transform(X)
    with pytest.raises(NotFittedError, match="this MetricIndex is not fitted yet; call fit"):
        lshdist.MetricIndex().kneighbors(Q)
    with pytest.raises(NotFittedError, match="this MetricIndex is not fitted yet"):
        lshdist.MetricIndex().calibration_
    with pytest.raises(NotFittedError, match="this KernelITML is not fitted yet"):
        lshdist.MetricIndex(lshdist.KernelITML()).fit(X)


def test_bad_arguments_are_input_errors(small):
    X, _, Q = small
    index = lshdist.MetricIndex(target_recall=None, permutations=4).fit(X)
    with pytest.raises(InputError, match="n_neighbors=0: n_neighbors must be an integer >= 1"):
        index.kneighbors(Q, n_neighbors=0)
    with pytest.raises(InputError, match="n_neighbors=301, but the index holds 300 rows"):
        index.kneighbors(Q, n_neighbors=301)
    with pytest.raises(InputError, match=r"mode='fast'; choose one of \['auto', 'hash', 'scan'\]"):
        index.kneighbors(Q, mode="fast")
    with pytest.raises(InputError, match="X has 5 features, but the model was learned on 6"):
        index.kneighbors(Q[:, :5])
    with pytest.raises(InputError, match="but X has 300 rows: give 300 integer ids"):
        lshdist.MetricIndex().fit(X, ids=np.arange(299))
    with pytest.raises(InputError, match="ids are not unique"):
        lshdist.MetricIndex().fit(X, ids=np.zeros(300, np.int64))
    with pytest.raises(InputError, match=r"metric=int: give a fitted lshdist\.ITML"):
        lshdist.MetricIndex(42).fit(X)
    with pytest.raises(InputError, match="n_threads=0: give an integer >= 1 or None"):
        lshdist.MetricIndex(n_threads=0).fit(X)


# ------------------------------------------------------------------ kinds of rows


def test_scan_is_exact_for_dense_sparse_and_dask_rows(small):
    """The exact scan of every kind of input equals brute force (ids, order, distances);
    a metric over the wrong kind of rows or ids that do not rise with rows would show."""
    import dask.array as da

    X, _, Q = small
    ids = np.arange(300, dtype=np.int64)[::-1] * 7 + 11  # ids fall as rows rise
    want_d, want_rows = brute_force(X, Q, 5)
    for rows, queries in [(X, Q), (sp.csr_matrix(X), sp.csr_matrix(Q)),
                          (da.from_array(X, chunks=100), da.from_array(Q, chunks=20))]:
        index = lshdist.MetricIndex(target_recall=None, permutations=4).fit(rows, ids=ids)
        dist, got = index.kneighbors(queries, n_neighbors=5, mode="scan")
        np.testing.assert_array_equal(got, ids[want_rows])
        np.testing.assert_allclose(dist, want_d, rtol=1e-4, atol=1e-3)
        assert index.kneighbors(queries, n_neighbors=5, mode="scan",
                                return_distance=False).shape == (40, 5)
    assert lshdist.MetricIndex().fit(sp.csr_matrix(X)).n_features_in_ == 6


def test_a_dask_array_too_large_for_this_process_is_refused(small, monkeypatch):
    import dask.array as da

    import lshdist.api

    X, _, _ = small
    monkeypatch.setattr(lshdist.api, "DASK_MEMORY_FRACTION", 1e-12)
    with pytest.raises(InputError, match=r"X is a dask array of 0\.00 GB, more than .* "
                                         "lshdist.build_index"):
        lshdist.MetricIndex().fit(da.from_array(X, chunks=100))


def test_transform_gives_the_learned_distance(small):
    """L2 between transformed rows is the learned distance the index ranks by."""
    X, y, Q = small
    model = lshdist.ITML(n_constraints=500, prior="inverse-covariance").fit(X, y)
    assert model.A_.shape == (6, 6) and not np.allclose(model.A_, np.eye(6))
    want_d, want_rows = brute_force(model.transform(X), model.transform(Q), 3)
    dist, got = lshdist.MetricIndex(model, target_recall=None).fit(X).kneighbors(
        Q, n_neighbors=3, mode="scan")
    np.testing.assert_array_equal(got, want_rows)
    np.testing.assert_allclose(dist, want_d, rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------ the Letter script


def test_letter_itml_then_metric_index_reaches_the_recall(letter):
    """The script of docs/python-api.md: ITML on Letter's 16,000 training rows, a calibrated
    index, recall@10 of the hashed answer against the exact scan of the same index."""
    X, y, Q, _ = letter  # 16,000 training rows, 4,000 test rows as queries
    model = lshdist.ITML().fit(X, y)
    index = lshdist.MetricIndex(model).fit(X)
    dist, ids = index.kneighbors(Q, n_neighbors=10)
    _, exact = index.kneighbors(Q, n_neighbors=10, mode="scan")
    assert dist.shape == ids.shape == (4000, 10) and ids.dtype == np.int64
    assert (np.diff(dist, axis=1) >= 0).all()  # ascending, as scikit-learn
    assert recall_at(ids, exact) >= 0.88
    assert index.calibration_ is not None and index.calibration_.target == 0.9
    # the exact scan is the learned metric's: brute force on G x agrees on the nearest
    _, truth = brute_force(model.transform(X), model.transform(Q[:200]), 1)
    assert np.mean(exact[:200, 0] == truth[:, 0]) >= 0.99  # ties may order differently


# ------------------------------------------------------------------ the jobs as functions


def test_job_options_are_the_configs_fields(tmp_path):
    with pytest.raises(InputError, match=r"build_index\(\): unknown option 'bitz'; the options "
                                         r"are .*bits"):
        lshdist.build_index(tmp_path / "d", tmp_path / "m", tmp_path / "i", bitz=64)
    with pytest.raises(InputError, match=r"learn\(\)\.gamma: expected a number > 0"):
        lshdist.learn(tmp_path / "d", tmp_path / "m", gamma="big")
    with pytest.raises(InputError, match="query_index\\(\\): workers describe a cluster to "
                                         "start, but client= is given"):
        lshdist.query_index(tmp_path / "i", tmp_path / "q", tmp_path / "r", client=object(),
                            workers=3)


def test_ingest_takes_arrays(tmp_path, small):
    X, y, _ = small
    info = lshdist.ingest(X, tmp_path / "data", labels=y, rows=(100, 300), id_offset=1000,
                          shard_rows=64)
    assert (info["N"], info["d"], info["kind"], info["shards"], info["classes"]) == (
        200, 6, "dense", 4, 4)
    from lshdist.store.dataset import Dataset

    np.testing.assert_array_equal(Dataset(tmp_path / "data").ids(), np.arange(1100, 1300))
    with pytest.raises(InputError, match="ingest: header, weighting apply to input files"):
        lshdist.ingest(X, tmp_path / "other", header=True, weighting="counts")


def test_read_results_without_pandas_names_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pandas is not installed: pip install pandas"):
        lshdist.read_results(tmp_path)


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        yield c


@pytest.mark.cluster
def test_jobs_on_a_callers_client_give_the_clis_neighbours(data_root, tmp_path, client,
                                                            monkeypatch):
    """ingest -> learn -> build_index -> query_index with the caller's 2-worker cluster (no
    cluster of their own: starting one fails here), then the same index and queries through
    the command line: the same neighbours; read_results's DataFrame and its dtypes."""
    import lshdist.cluster.client as client_mod
    from lshdist.cli import main

    letter = data_root / "letter" / "letter-recognition.data"
    lshdist.ingest(letter, tmp_path / "train", rows=(0, 16000), shard_rows=4000)
    lshdist.ingest([letter], tmp_path / "test", rows=(16000, 20000), shard_rows=2000)
    learned = lshdist.learn(tmp_path / "train", tmp_path / "model", constraints=2000,
                            no_search=True, force_learned=True)
    assert learned["rows"] == 16000 and learned["params"]["kind"] == "explicit"

    def no_cluster(*a, **k):
        raise AssertionError("a cluster was started although the caller gave a client")

    with monkeypatch.context() as m:
        m.setattr(client_mod, "client_for", no_cluster)
        # a fixed operating point and mode: calibration chooses hash or scan by timing, which
        # two builds on a loaded machine need not agree on
        manifest = lshdist.build_index(tmp_path / "train", tmp_path / "model",
                                       tmp_path / "index", client=client, segment_rows=8000,
                                       permutations=16, window=8, hamming_keep=40)
        ran = lshdist.query_index(tmp_path / "index", tmp_path / "test", tmp_path / "api",
                                  k=10, client=client, mode="hash")
    assert manifest["rows"] == 16000 and len(manifest["segments"]) == 2
    assert ran["queries"] == 4000 and client.status == "running"
    assert len(client.scheduler_info()["workers"]) == 2

    assert main(["index", "--data", str(tmp_path / "train"), "--model",
                 str(tmp_path / "model"), "--out", str(tmp_path / "index-cli"),
                 "--segment-rows", "8000", "--permutations", "16", "--window", "8",
                 "--hamming-keep", "40", "--in-process"]) == 0
    assert main(["query", "--index", str(tmp_path / "index-cli"), "--queries",
                 str(tmp_path / "test"), "--out", str(tmp_path / "cli"), "--mode", "hash",
                 "--in-process"]) == 0

    api = lshdist.read_results(tmp_path / "api")
    cli = lshdist.read_results(tmp_path / "cli")
    assert list(api.columns) == ["query_id", "rank", "neighbor_id", "distance"]
    assert [str(t) for t in api.dtypes] == ["int64", "int32", "int64", "float32"]
    assert len(api) == 40_000 and set(api["query_id"]) == set(range(16000, 20000))
    key = ["query_id", "rank"]
    a, b = api.sort_values(key).reset_index(drop=True), cli.sort_values(key).reset_index(drop=True)
    assert a["neighbor_id"].equals(b["neighbor_id"]) and a["query_id"].equals(b["query_id"])
    np.testing.assert_allclose(a["distance"], b["distance"], rtol=1e-6)
    assert (a.groupby("query_id")["distance"].diff().dropna() >= 0).all()
