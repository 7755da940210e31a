"""Distributed index and query: same results everywhere, failures contained."""

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lshdist.cli import main
from lshdist.cluster.client import dask_client
from lshdist.cluster.pipeline import build_index, query_index
from lshdist.config import IndexConfig, QueryConfig
from lshdist.index import MetricIndex
from lshdist.index.permutation import merge_topk
from lshdist.metric.learned import sq_euclidean
from lshdist.store.model import load_model


def read_results(path):
    """Results as arrays in query-id order (through the results format's own reader)."""
    from lshdist.store.results import read_results as read

    qids, nb, dist, cand = read(path)
    o = np.argsort(qids)
    return {"query_id": qids[o], "neighbor_id": nb[o].ravel(), "distance": dist[o].ravel(),
            "candidates": cand[o]}


INDEX = IndexConfig(bits=64, permutations=30, window=4, hamming_keep=0, segment_rows=4000)
# measured 2026-11-22: 1-NN 0.9555, recall@5 0.9565 (the fixture model: ITML, 2,000 pairs)
ACC_MIN, RECALL_MIN = 0.950, 0.945


def Q(k=5, mode="hash", query_chunk=5000):
    return QueryConfig(k=k, mode=mode, query_chunk=query_chunk)


def run_job(client, job, out, data="train-a", mode="hash"):
    build_index(client, data=str(job / data), model=str(job / "model"), out=str(out / "idx"),
                cfg=INDEX)
    query_index(client, index=str(out / "idx"), queries=str(job / "queries"),
                out=str(out / "res"), cfg=Q(mode=mode, query_chunk=1500))
    return read_results(out / "res")


@pytest.fixture(scope="module")
def reference(letter_job, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    with dask_client(workers=1, processes=False) as client:
        return run_job(client, letter_job, out)


def test_in_process_matches_one_process_search(letter_job, reference, letter):
    """Segments are searched independently and merged: with one segment the distributed result
    equals `MetricIndex` in one process."""
    metric, _ = load_model(letter_job / "model")
    assert reference["query_id"].min() == 16000 and len(reference["query_id"]) == 4000
    ix = MetricIndex(metric, bits=64, n_permutations=30, window=4).fit(letter.X_train[:4000])
    _d, _ids = ix.query(letter.X_test, 5)
    tmp = Path(letter_job / "one-seg")
    with dask_client(workers=1, processes=False) as client:
        build_index(client, data=str(letter_job / "first"), model=str(letter_job / "model"),
                    out=str(tmp / "idx"),
                    cfg=IndexConfig(bits=64, permutations=30, window=4, hamming_keep=0,
                                    segment_rows=8000))
        query_index(client, index=str(tmp / "idx"), queries=str(letter_job / "queries"),
                    out=str(tmp / "res"), cfg=Q())
    r = read_results(tmp / "res")
    ix8 = MetricIndex(metric, bits=64, n_permutations=30, window=4).fit(letter.X_train[:8000])
    d8, ids8 = ix8.query(letter.X_test, 5)
    assert np.array_equal(r["neighbor_id"].reshape(-1, 5), ids8)
    assert np.array_equal(r["distance"].reshape(-1, 5), d8)
    # and the hashed search is good: 1-NN accuracy of the learned metric on Letter and recall@5
    # against the exact scan (a random hash gets neither)
    y = np.concatenate([letter.y_train, letter.y_test])
    found = reference["neighbor_id"].reshape(-1, 5)
    acc = (y[found[:, 0]] == letter.y_test).mean()
    D = sq_euclidean(metric.transform(letter.X_test), metric.transform(letter.X_train))
    exact = np.argsort(D, axis=1, kind="stable")[:, :5]
    recall = np.mean([len(np.intersect1d(a, b)) / 5 for a, b in zip(found, exact)])
    assert acc >= ACC_MIN and recall >= RECALL_MIN


def _received(dask_worker):
    """Names of the keys a worker fetched from another worker."""
    return [str(k) for e in dask_worker.transfer_incoming_log for k in e["keys"]]


def test_two_workers_and_shard_sizes_give_identical_results(letter_job, reference, tmp_path):
    import dask
    from distributed import get_task_stream

    # placements are preferences that Dask's work stealing may override: off here, so that
    # where the tasks ran is what lshdist asked for
    with dask.config.set({"distributed.scheduler.work-stealing": False}), \
            dask_client(workers=2) as client:
        with get_task_stream(client) as ts:
            got_a = run_job(client, letter_job, tmp_path / "a", data="train-a")
        got_b = run_job(client, letter_job, tmp_path / "b", data="train-b")
        received = [k for keys in client.run(_received).values() for k in keys]
    # each query chunk is encoded once (one encoding per written chunk, not one per worker),
    # its encoding travels to the other worker, and each worker's partial answers are merged
    # before they do: no segment's partial answer travels
    names = [x["key"][0] if isinstance(x["key"], tuple) else x["key"] for x in ts.data]
    kinds = [n.split("-")[0] for n in names]
    assert kinds.count("merge_and_write") > 1
    assert kinds.count("encode_queries") == kinds.count("merge_and_write")
    assert any(k.startswith("merge_partials") for k in received), received
    assert any(k.startswith("encode_queries") for k in received), received
    assert not [k for k in received if k.startswith("search_segment")]
    for got in (got_a, got_b):
        for col in reference:
            assert np.array_equal(got[col], reference[col]), col


@pytest.mark.cluster
def test_external_scheduler_gives_identical_results(letter_job, reference, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    addr = f"tcp://127.0.0.1:{port}"
    dask = str(Path(sys.executable).parent / "dask")
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], stderr=subprocess.DEVNULL)]
    time.sleep(2)
    procs += [subprocess.Popen([dask, "worker", addr, "--nthreads", "1", "--no-dashboard"],
                               stderr=subprocess.DEVNULL) for _ in range(2)]
    try:
        with dask_client(addr, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
            got = run_job(client, letter_job, tmp_path)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    for col in reference:
        assert np.array_equal(got[col], reference[col]), col


@pytest.mark.cluster
def test_worker_killed_mid_query_costs_a_retry(letter_job, reference, tmp_path):
    with dask_client(workers=2) as client:
        build_index(client, data=str(letter_job / "train-a"), model=str(letter_job / "model"),
                    out=str(tmp_path / "idx"), cfg=INDEX)
        killed = []

        def killer():
            # wait until the query has written a part, then kill a worker process
            deadline = time.time() + 60
            while time.time() < deadline:
                if list(tmp_path.glob(".res.tmp-*/neighbors/*.parquet")):
                    w = sorted(client.scheduler_info()["workers"])[0]
                    with contextlib.suppress(Exception):  # the worker dies while answering
                        client.run(os._exit, 1, workers=[w])
                    killed.append(w)
                    return
                time.sleep(0.01)

        t = threading.Thread(target=killer)
        t.start()
        query_index(client, index=str(tmp_path / "idx"), queries=str(letter_job / "queries"),
                    out=str(tmp_path / "res"), cfg=Q(query_chunk=100))
        t.join()
    assert killed, "the query finished before a worker could be killed"
    got = read_results(tmp_path / "res")
    for col in reference:
        assert np.array_equal(got[col], reference[col]), col


def test_segments_held_from_the_build_answer_like_the_stored_index(letter_job, reference,
                                                                    tmp_path):
    """`run_build(hold=...)` keeps the segments as written in worker memory; a query given them
    answers exactly as one that reads the index back (hashed and exact), and a wrong count of
    segments is refused."""
    from lshdist.cluster.pipeline import plan_build, plan_query, run_build, run_query
    from lshdist.errors import InputError

    with dask_client(workers=2) as client:
        held: list = []
        run_build(client, plan_build(data=str(letter_job / "train-a"),
                                     model=str(letter_job / "model"), out=str(tmp_path / "idx"),
                                     cfg=INDEX), hold=held)
        assert len(held) == 4 and all(f.status == "finished" for f in held)
        from lshdist.cluster.driver import holders

        homes = holders(client, held)  # where the query will encode its chunks
        assert sorted(set(homes)) == sorted(client.scheduler_info()["workers"])
        for mode in ("hash", "scan"):
            out = tmp_path / f"res-{mode}"
            plan = plan_query(index=str(tmp_path / "idx"), queries=str(letter_job / "queries"),
                              out=str(out), cfg=Q(mode=mode, query_chunk=1500))
            run_query(client, plan, segments=held)
            got = read_results(out)
            want = reference if mode == "hash" else None
            if want is None:
                query_index(client, index=str(tmp_path / "idx"),
                            queries=str(letter_job / "queries"), out=str(tmp_path / "scan-disk"),
                            cfg=Q(mode="scan", query_chunk=1500))
                want = read_results(tmp_path / "scan-disk")
            for col in want:
                assert np.array_equal(got[col], want[col]), (mode, col)
        with pytest.raises(InputError, match="1 segments in memory for an index of 4"):
            run_query(client, plan, segments=held[:1])
        client.cancel(held)


#: the write and query plan of `test_a_query_planned_with_its_build_runs_while_the_segments_are_
#: written` (module-level: tasks are pickled by reference, even to in-process workers)
_HELD: dict = {"lock": threading.Lock()}


def _held_write(*args, **kw):
    """The first segment write waits (up to a minute) for the query's plan."""
    with _HELD["lock"]:
        _HELD["calls"].append(1)
        first = len(_HELD["calls"]) == 1
    if first and not _HELD["started"].wait(60):
        raise AssertionError("the query was not planned while the build was writing")
    return _HELD["write"](*args, **kw)


def _planned(*args, **kw):
    _HELD["started"].set()
    return _HELD["planned"](*args, **kw)


def _full_disk(*args, **kw):
    """A segment write that fails, once the query is planned (and so under way)."""
    _HELD["started"].wait(60)
    raise OSError(28, "No space left on device")


def _following(letter_job, tmp_path, out="res"):
    from lshdist.cluster.pipeline import plan_build, plan_following_query

    plan = plan_build(data=str(letter_job / "train-a"), model=str(letter_job / "model"),
                      out=str(tmp_path / "idx"), cfg=INDEX)
    return plan, plan_following_query(plan, queries=str(letter_job / "queries"),
                                      out=str(tmp_path / out), cfg=Q(query_chunk=1500))


def test_a_query_planned_with_its_build_runs_while_the_segments_are_written(
        letter_job, reference, tmp_path, monkeypatch):
    """`build_and_query` plans and starts the query once the build is calibrated: a segment
    write held back until the query is planned does not stop the job (run one after the
    other, the query is planned after the index's commit, which waits for that write).
    Answers, manifest and recall check are those of the build followed by the query."""
    from lshdist.cluster import pipeline, tasks
    from lshdist.cluster.pipeline import build_and_query
    from lshdist.store.index import read_permutation_manifest

    _HELD.update(started=threading.Event(), calls=[], write=tasks.write_fitted,
                 planned=pipeline._planned)
    monkeypatch.setattr(tasks, "write_fitted", _held_write)
    monkeypatch.setattr(pipeline, "_planned", _planned)
    plan, following = _following(letter_job, tmp_path)
    with dask_client(workers=2, processes=False) as client:
        held: list = []
        manifest, result, seconds = build_and_query(client, plan, following, hold=held)
        assert len(held) == 4 and all(f.status == "finished" for f in held)
        client.cancel(held)
    assert _HELD["started"].is_set() and len(_HELD["calls"]) == 4
    stored = read_permutation_manifest(tmp_path / "idx", "test")
    assert manifest == dataclasses.replace(stored, checksum=None)  # (added when written)
    assert result["queries"] == len(reference["query_id"]) and result["mode"] == "hash"
    assert result["measured_recall"]["action"] == "kept"
    got = read_results(tmp_path / "res")
    for col in reference:
        assert np.array_equal(got[col], reference[col]), col
    assert max(seconds["index"], seconds["query"]) <= seconds["total"]


def test_the_recall_check_after_a_build_takes_the_builds_exact_neighbours(letter_job,
                                                                          tmp_path):
    """The build finds the following query's check sample's exact neighbours on the fitted
    segments, in the calibration's scans (`tasks.segment_neighbours`, one task a segment, no
    task of its own); the query reads them instead of scanning the segments it holds again.
    The recall it measures is the one a query of the stored index measures by its own scan,
    and the truth found (by `segment_neighbours`, timed or not, and by `check_truth`, a
    single segment's) is the scan search's of the segment as kept (on its uint8 grid),
    distances and ties included, beside the calibration's own neighbours unchanged."""
    from distributed import get_task_stream

    from lshdist.cluster import tasks
    from lshdist.cluster.pipeline import build_and_query, plan_query, run_query
    from lshdist.index.recall_check import check_rows

    plan, following = _following(letter_job, tmp_path)
    with dask_client(workers=2, processes=False) as client:
        with get_task_stream(client) as ts:
            _, result, _ = build_and_query(client, plan, following)
        names = [x["key"][0] if isinstance(x["key"], tuple) else x["key"] for x in ts.data]
        stored = run_query(client, plan_query(index=str(tmp_path / "idx"),
                                              queries=str(letter_job / "queries"),
                                              out=str(tmp_path / "res-stored"),
                                              cfg=Q(query_chunk=1500)))
    kinds = [n.split("-")[0] for n in names]
    assert kinds.count("segment_neighbours") == len(plan.segments) == 4
    assert kinds.count("check_truth") == 0
    assert kinds.count("check_answer") == 1
    # only the hashed answer of the sample is encoded, once
    assert kinds.count("encode_query_rows") == 1
    assert result["measured_recall"] == stored["measured_recall"]
    assert result["measured_recall"]["queries_sampled"] > 0

    from lshdist.metric.learned import ExplicitMetric
    from lshdist.store.model import save_model

    save_model(tmp_path / "identity", ExplicitMetric.identity(16))  # (integer features)
    for model, on_grid in ((letter_job / "model", False), (tmp_path / "identity", True)):
        family = tasks.load_family(str(model), INDEX.bits, INDEX.seed, True)
        sample = tasks.read_query_rows(str(letter_job / "queries"),
                                       check_rows(4000, INDEX.seed), family)
        fit = tasks.fit_segment(str(letter_job / "train-a"), plan.segments[0], family, 30,
                                None, INDEX.seed)
        kept = tasks.truncated(fit, 30)
        assert kept.payload_.held_on_grid == on_grid
        want = tasks.search_segment(kept, tasks.encode_query_rows(sample, family, False), 7,
                                    "scan")
        got = tasks.check_truth(fit, sample, family, 7)
        for a, b in zip(got, want):
            assert np.array_equal(a, b)
        cal = tasks.calibration_sample(None, None, str(letter_job / "queries"), INDEX.seed,
                                       family)
        for timed in (True, False):
            alone = tasks.segment_neighbours(fit, cal, family, 10, timed)
            both = tasks.segment_neighbours(fit, cal, family, 10, timed, sample, 7)
            assert alone.check is None and both.check is not None
            for a, b in zip(both.check, want):
                assert np.array_equal(a, b)
            for a, b in zip(both.parts[0][:3], alone.parts[0][:3]):
                assert np.array_equal(a, b)
            assert (both.parts[0][3] is None) == (not timed)
        for found in (both, got):  # (either kind of answer, merged over one segment)
            rows, ids = tasks.check_answer(np.arange(len(want[0])), [found], 7)
            assert np.array_equal(ids, want[1]) and np.array_equal(rows, np.arange(len(ids)))


def test_a_build_that_fails_after_its_calibration_fails_its_query(letter_job, tmp_path,
                                                                   monkeypatch):
    """A segment write that fails (a full disk) once the query has started: the job raises the
    build's error, and neither the index nor the query's results are kept (the results wait
    for the index's commit)."""
    from lshdist.cluster import pipeline, tasks
    from lshdist.cluster.pipeline import build_and_query
    from lshdist.errors import InputError

    _HELD.update(started=threading.Event(), planned=pipeline._planned)
    monkeypatch.setattr(pipeline, "_planned", _planned)
    monkeypatch.setattr(tasks, "write_fitted", _full_disk)
    plan, following = _following(letter_job, tmp_path)
    with dask_client(workers=2, processes=False) as client, \
            pytest.raises(InputError, match=r"cannot write .*idx'?: the disk is full"):
        build_and_query(client, plan, following)
    assert _HELD["started"].is_set()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_query_planned_with_its_build_is_checked_before_it(letter_job, tmp_path):
    """`plan_following_query` refuses an append, and results written over the data, as a
    query's planning does — before any cluster starts."""
    from lshdist.cluster.pipeline import build_index, plan_build, plan_following_query
    from lshdist.errors import InputError

    plan, _ = _following(letter_job, tmp_path)
    with pytest.raises(InputError, match=r"output .*queries.* would overwrite the input"):
        plan_following_query(plan, queries=str(letter_job / "queries"),
                             out=str(letter_job / "queries"), cfg=Q(), overwrite=True)
    with dask_client(workers=1, processes=False) as client:
        build_index(client, data=str(letter_job / "first"), model=str(letter_job / "model"),
                    out=str(tmp_path / "idx"), cfg=INDEX)
    append = plan_build(data=str(letter_job / "second"), model=str(letter_job / "model"),
                        out=str(tmp_path / "idx"), cfg=INDEX, append=True)
    with pytest.raises(InputError, match="needs a fresh build, not --append"):
        plan_following_query(append, queries=str(letter_job / "queries"),
                             out=str(tmp_path / "res"), cfg=Q())


def test_a_query_after_its_build_takes_the_builds_hash_family(letter_job, tmp_path):
    """The hash family is loaded once for a build and the queries that follow in the same
    client (`driver.share` with ``reuse``, keyed by the model's checksum); the family's task
    refuses a model replaced since the job was planned."""
    from distributed import get_task_stream

    from lshdist.cluster import tasks
    from lshdist.cluster.pipeline import plan_build, plan_query, run_build, run_query
    from lshdist.errors import InputError

    with dask_client(workers=2) as client, get_task_stream(client) as ts:
        held: list = []
        run_build(client, plan_build(data=str(letter_job / "train-a"),
                                     model=str(letter_job / "model"), out=str(tmp_path / "idx"),
                                     cfg=INDEX), hold=held)
        for out in ("a", "b"):
            run_query(client, plan_query(index=str(tmp_path / "idx"),
                                         queries=str(letter_job / "queries"),
                                         out=str(tmp_path / out), cfg=Q()), segments=held)
        client.cancel(held)
    loads = {t["key"] for t in ts.data if "load_family" in str(t["key"])}
    assert len(loads) == 1, loads
    assert np.array_equal(read_results(tmp_path / "a")["neighbor_id"],
                          read_results(tmp_path / "b")["neighbor_id"])
    with pytest.raises(InputError, match="was replaced while the job ran"):
        tasks.load_family(str(letter_job / "model"), 64, 0, True, "0" * 64)


def test_append_equals_building_from_both(letter_job, tmp_path):
    with dask_client(workers=1, processes=False) as client:
        build_index(client, data=str(letter_job / "first"), model=str(letter_job / "model"),
                    out=str(tmp_path / "idx"), cfg=INDEX)
        build_index(client, data=str(letter_job / "second"), model=str(letter_job / "model"),
                    out=str(tmp_path / "idx"), append=True, cfg=INDEX)
        query_index(client, index=str(tmp_path / "idx"), queries=str(letter_job / "queries"),
                    out=str(tmp_path / "res"), cfg=Q())
        both = run_job(client, letter_job, tmp_path / "both")
    got = read_results(tmp_path / "res")
    for col in both:
        assert np.array_equal(got[col], both[col]), col
    assert main(["info", str(tmp_path / "idx")]) == 0


def test_failed_index_run_leaves_previous_index_intact(letter_job, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(letter_job / "second", broken)
    (broken / "X" / "c" / "1" / "0").write_bytes(b"not zstd")  # one shard corrupted
    idx = tmp_path / "idx"
    with dask_client(workers=1, processes=False) as client:
        build_index(client, data=str(letter_job / "first"), model=str(letter_job / "model"),
                    out=str(idx), cfg=INDEX)
        before = (idx / "index.json").read_bytes()
        query_index(client, index=str(idx), queries=str(letter_job / "queries"),
                    out=str(tmp_path / "r1"), cfg=Q())
    code = main(["index", "--data", str(broken), "--model", str(letter_job / "model"),
                 "--out", str(idx), "--append", "--in-process", "--workers", "1"])
    assert code == 2
    assert "corrupted" in capsys.readouterr().err
    assert (idx / "index.json").read_bytes() == before
    assert len(list((idx / "segments").iterdir())) == 2  # the failed run's segments are gone
    with dask_client(workers=1, processes=False) as client:
        query_index(client, index=str(idx), queries=str(letter_job / "queries"),
                    out=str(tmp_path / "r2"), cfg=Q())
    a, b = read_results(tmp_path / "r1"), read_results(tmp_path / "r2")
    assert all(np.array_equal(a[c], b[c]) for c in a)


def test_scan_mode_is_exact(letter_job, letter, tmp_path):
    with dask_client(workers=1, processes=False) as client:
        got = run_job(client, letter_job, tmp_path, mode="scan")
    metric, _ = load_model(letter_job / "model")
    Z, Zq = metric.transform(letter.X_train), metric.transform(letter.X_test)
    D = sq_euclidean(Zq, Z)
    top = np.argsort(D, axis=1, kind="stable")[:, :5]
    assert (got["neighbor_id"].reshape(-1, 5) == top).mean() > 0.999  # float32 ties aside


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), parts=st.integers(1, 5), k=st.integers(1, 8), seed=st.integers(0, 999))
def test_merge_of_partial_topk_equals_global_topk(n, parts, k, seed):
    rng = np.random.default_rng(seed)
    dist = rng.integers(0, 6, size=(3, n)).astype(np.float32)  # many ties
    ids = np.tile(rng.permutation(1000)[:n], (3, 1))
    splits = np.array_split(np.arange(n), parts)

    def topk(cols):
        o = np.lexsort((ids[:, cols], dist[:, cols]), axis=1)[:, :k]
        d, i = np.take_along_axis(dist[:, cols], o, 1), np.take_along_axis(ids[:, cols], o, 1)
        pad = k - d.shape[1]
        return (np.pad(d, ((0, 0), (0, pad)), constant_values=np.inf),
                np.pad(i, ((0, 0), (0, pad)), constant_values=-1))

    tops = [topk(c) for c in splits if len(c)]
    merged = merge_topk([t[0] for t in tops], [t[1] for t in tops], k)
    expect = topk(np.arange(n))
    assert np.array_equal(merged[1], expect[1]) and np.array_equal(merged[0], expect[0])


def test_bad_input_at_the_cli(letter_job, letter, tmp_path, capsys):
    from lshdist.store.dataset import write_dataset

    with dask_client(workers=1, processes=False) as client:
        build_index(client, data=str(letter_job / "first"), model=str(letter_job / "model"),
                    out=str(tmp_path / "idx"), cfg=INDEX)
    write_dataset(tmp_path / "q15", np.zeros((5, 15), np.float32))
    base = ["--in-process", "--workers", "1"]
    assert main(["query", "--index", str(tmp_path / "idx"), "--queries", str(tmp_path / "q15"),
                 "--out", str(tmp_path / "r"), *base]) == 2
    assert "has 15 features, but the model was learned on 16" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    # a query whose learned distances overflow float32 (answered before as inf, ranked by id)
    far = np.array(letter.X_test[:50], np.float32)
    far[3] *= np.float32(1e19)
    write_dataset(tmp_path / "far", far)
    assert main(["query", "--index", str(tmp_path / "idx"), "--queries", str(tmp_path / "far"),
                 "--out", str(tmp_path / "r"), *base]) == 2
    err = capsys.readouterr().err
    assert "exceeds float32's range (3.4e38): its neighbours cannot be ranked" in err, err
    assert not (tmp_path / "r").exists()
    # unreachable scheduler
    assert main(["query", "--index", str(tmp_path / "idx"),
                 "--queries", str(letter_job / "queries"),
                 "--out", str(tmp_path / "r"), "--scheduler", "tcp://127.0.0.1:9",
                 "--connect-timeout", "1"]) == 2
    assert "could not reach the Dask scheduler at 'tcp://127.0.0.1:9'" in capsys.readouterr().err
    # a model that does not match the index
    from lshdist.metric.learned import ExplicitMetric
    from lshdist.store.model import save_model

    other = tmp_path / "model2"
    shutil.copytree(letter_job / "model", other)

    from lshdist.store.index import read_manifest, write_manifest

    m = read_manifest(tmp_path / "idx")
    m["model"] = str(other)
    write_manifest(tmp_path / "idx", m)  # a consistent manifest naming another model
    save_model(other, ExplicitMetric.identity(16), overwrite=True)
    assert main(["query", "--index", str(tmp_path / "idx"),
                 "--queries", str(letter_job / "queries"),
                 "--out", str(tmp_path / "r"), *base]) == 2
    assert "does not match index" in capsys.readouterr().err
    assert main(["index", "--data", str(letter_job / "first"), "--model", str(other),
                 "--out", str(tmp_path / "idx"), "--append", *base]) == 2
    assert "was built with another model" in capsys.readouterr().err
    # not an index
    (tmp_path / "plain").mkdir()
    assert main(["query", "--index", str(tmp_path / "plain"),
                 "--queries", str(letter_job / "queries"),
                 "--out", str(tmp_path / "r"), *base]) == 2
    assert "is not an lshdist index (no index.json)" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_append_conflicts_and_unsafe_outputs_exit_2_writing_nothing(letter_job, tmp_path, capsys):
    idx = tmp_path / "idx"
    with dask_client(workers=1, processes=False) as client:
        build_index(client, data=str(letter_job / "first"), model=str(letter_job / "model"),
                    out=str(idx), cfg=INDEX)
    before = {p: p.stat().st_mtime_ns for p in idx.rglob("*")}
    base = ["--in-process", "--workers", "1"]
    common = ["--data", str(letter_job / "second"), "--model", str(letter_job / "model"),
              "--out", str(idx), "--append", *base]
    assert main(["index", *common, "--bits", "256", "--window", "4"]) == 2
    err = capsys.readouterr().err
    assert "--bits 256 (the index has 64)" in err and "--window" not in err  # W=4 agrees
    assert err.count("\n") == 1
    # appending data whose ids are already in the index (a day ingested with ids from 0)
    assert main(["index", *common[:1], str(letter_job / "first"), *common[2:]]) == 2
    assert "has ids already in index" in capsys.readouterr().err
    # outputs that are inputs, or not lshdist artefacts of the same kind
    q = ["query", "--index", str(idx), "--queries", str(letter_job / "queries"), *base]
    assert main([*q, "--out", str(idx), "--overwrite"]) == 2
    assert "would overwrite the input" in capsys.readouterr().err
    assert main([*q, "--out", str(letter_job / "model"), "--overwrite"]) == 2
    assert "would overwrite the input" in capsys.readouterr().err
    (tmp_path / "docs").mkdir()
    assert main([*q, "--out", str(tmp_path / "docs"), "--overwrite"]) == 2
    assert "not an lshdist artefact" in capsys.readouterr().err
    assert main(["index", "--data", str(letter_job / "first"), "--model",
                 str(letter_job / "model"), "--out", str(letter_job / "queries"),
                 "--overwrite", *base]) == 2
    err = capsys.readouterr().err
    assert "it is an lshdist dataset, and this job writes an lshdist index" in err
    assert {p: p.stat().st_mtime_ns for p in idx.rglob("*")} == before
    # the same parameters given explicitly are no conflict
    assert main(["index", *common, "--bits", "64"]) == 0
    assert main(["info", str(idx)]) == 0


def _append(args):
    import contextlib
    import io

    from lshdist.cli import main as cli

    with contextlib.redirect_stderr(io.StringIO()) as err:
        code = cli(args)
    return code, err.getvalue()


@pytest.mark.parametrize("trial", [0, *[pytest.param(t, marks=pytest.mark.drills)
                                       for t in range(1, 20)]])
def test_concurrent_appends_both_land(letter_job, tmp_path, trial):
    """Two appends from two processes: both land (the index lock serialises the manifest swap)
    or one fails clearly; every row is in the index exactly once."""
    import multiprocessing as mp

    from lshdist.store.dataset import Dataset, write_dataset
    from lshdist.store.index import read_manifest, segment_ids

    Xtr = Dataset(letter_job / "train-a").read_rows(0, 3000)
    write_dataset(tmp_path / "p", Xtr[:1000], ids=np.arange(100_000, 101_000), shard_rows=500)
    write_dataset(tmp_path / "q", Xtr[1000:3000], ids=np.arange(200_000, 202_000),
                  shard_rows=500)
    idx = tmp_path / "idx"
    with dask_client(workers=1, processes=False) as client:
        build_index(client, data=str(letter_job / "first"), model=str(letter_job / "model"),
                    out=str(idx), cfg=INDEX)
    ctx = mp.get_context("spawn")
    args = [["index", "--data", str(tmp_path / d), "--model", str(letter_job / "model"),
             "--out", str(idx), "--append", "--in-process", "--workers", "1"] for d in "pq"]
    with ctx.Pool(2) as pool:
        results = pool.map(_append, args)
    m = read_manifest(idx)
    ids = np.concatenate([segment_ids(idx, e) for e in m["segments"]])
    assert len(ids) == len(np.unique(ids))
    expect = 8000 + sum(n for (code, _), n in zip(results, (1000, 2000)) if code == 0)
    assert len(ids) == m["rows"] == expect
    for code, err in results:
        assert code == 0 or ("lock" in err and err.count("\n") == 1), err
    assert {p.name for p in (idx / "segments").iterdir()} == {e["name"] for e in m["segments"]}


def test_oversized_permutation_lists_are_refused_before_any_cluster(letter_job, tmp_path, capsys):
    assert main(["index", "--data", str(letter_job / "first"), "--model",
                 str(letter_job / "model"), "--out", str(tmp_path / "idx"),
                 "--epsilon", "0.01"]) == 2
    assert "asks for M=" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a usage error: argparse exits 2
        main(["index", "--data", str(letter_job / "first"), "--model",
              str(letter_job / "model"), "--out", str(tmp_path / "idx"),
              "--permutations", "200000"])
    assert e.value.code == 2
    assert "expected an integer in 1..4096" in capsys.readouterr().err
    assert not (tmp_path / "idx").exists()


def test_segments_are_spread_over_the_workers_by_rows():
    from lshdist.cluster.driver import spread

    assert spread([500, 500, 20], ["a", "b"]) == ["a", "b", "a"]
    assert spread([100] * 5, ["a", "b"]) == ["a", "b", "a", "b", "a"]
    assert spread([10, 300, 200, 90], ["a", "b"]) == ["b", "a", "b", "b"]
    assert spread([1, 2], []) == [None, None]


def _interrupted(*args, **kw):
    raise KeyboardInterrupt


def test_an_interrupted_query_does_not_wait_for_its_build(letter_job, tmp_path, monkeypatch):
    """Ctrl-C while `build_and_query` plans its query: it returns at once (the build's writes
    still held back), no results are written, and the build then ends as any build does."""
    from lshdist.cluster import pipeline, tasks
    from lshdist.cluster.pipeline import build_and_query
    from lshdist.store.index import read_permutation_manifest

    _HELD.update(started=threading.Event(), calls=[], write=tasks.write_fitted)
    monkeypatch.setattr(tasks, "write_fitted", _held_write)
    monkeypatch.setattr(pipeline, "_planned", _interrupted)
    plan, following = _following(letter_job, tmp_path)
    with dask_client(workers=2, processes=False) as client:
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            build_and_query(client, plan, following)
        assert time.perf_counter() - t0 < 30  # not the held write's 60 s
        assert not (tmp_path / "res").exists()
        _HELD["started"].set()  # the write goes on; the build commits
        for _ in range(600):
            if (tmp_path / "idx").exists():
                break
            time.sleep(0.1)
    assert read_permutation_manifest(tmp_path / "idx", "test").rows == 16000
    assert not (tmp_path / "res").exists()
