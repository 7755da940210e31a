"""The subspace-partition index on Dask: ``lshdist index --method subspace`` and
``lshdist query`` of such an index.

The distributed build must be the one-process `SubspaceIndex` on the same rows and seed (same
rounds, groups, codes) and the distributed query its answer (same ids, distances and
re-ranked counts), on synthetic rows with subspace structure in 7 uneven shards (ids a random
permutation, not rising with rows), on a LocalCluster of 2 workers (threads: fast).
"""

import json
import shutil

import numpy as np
import pytest

from lshdist.cli import main
from lshdist.cluster import driver
from lshdist.cluster.client import dask_client
from lshdist.cluster.subspace import masked_median, plan_subspace_build
from lshdist.cluster.subspace_query import SUBSPACE, plan_subspace_query
from lshdist.config import IndexConfig, QueryConfig
from lshdist.errors import FormatError, InputError
from lshdist.index.subspace import SubspaceIndex
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.index import read_manifest, verify_index
from lshdist.store.model import save_model
from lshdist.store.results import read_results
from lshdist.store.subspace import read_group

N, D, NQ = 3000, 48, 300
CFG = dict(rank=4, bits=16, eta=0.1, max_rounds=8, krylov_iters=3, probe=2, candidates=60,
           seed=5)


def _synth(n, d=D, k=4, seed=0):
    """Four orthogonal k-dim subspaces (1/2, 1/4, 1/8, 1/8 of the rows) plus noise."""
    rng = np.random.default_rng(seed)
    sizes = [n // 2, n // 4, n // 8, n - n // 2 - n // 4 - n // 8]
    bases = np.linalg.qr(rng.standard_normal((d, 4 * k)))[0]
    X = [rng.standard_normal((s, k)) * 10 @ bases[:, i * k:(i + 1) * k].T
         + rng.standard_normal((s, d)) * 0.5 / np.sqrt(d) + 3.0 for i, s in enumerate(sizes)]
    return np.vstack(X).astype(np.float32)[rng.permutation(n)]


def _metric(d, seed=3):
    """A learned-looking explicit metric (asymmetric G, so a transpose bug shows)."""
    rng = np.random.default_rng(seed)
    L = np.eye(d) + 0.3 * rng.standard_normal((d, d)) / np.sqrt(d)
    return ExplicitMetric(L @ L.T)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("subspace_job")
    X = _synth(N + NQ)
    ids = np.random.default_rng(1).permutation(5 * N)[:N].astype(np.int64)
    write_dataset(root / "data", X[:N], ids=ids, shard_rows=430)  # 7 shards, the last short
    write_dataset(root / "queries", X[N:], ids=10 * N + np.arange(NQ), shard_rows=128)
    metric = _metric(D)
    save_model(root / "model", metric)
    save_model(root / "l2", ExplicitMetric.identity(D))
    return root, X[:N], X[N:], ids, metric


def _cfg(**kw):
    values = {**CFG, **kw}
    return IndexConfig(method="subspace", **values, given_=frozenset({"method", *values}))


def _build_and_query(client, root, model, out, k=10, **qkw):
    plan = plan_subspace_build(data=str(root / "data"), model=str(root / model),
                               out=str(out / "idx"), cfg=_cfg())
    manifest = driver.build(client, SUBSPACE, plan).to_json()
    q = plan_subspace_query(index=str(out / "idx"), queries=str(root / "queries"),
                            out=str(out / "res"), cfg=QueryConfig(k=k, query_chunk=70, **qkw))
    driver.query(client, SUBSPACE, q)
    qids, nb, dist, cand = read_results(out / "res")
    o = np.argsort(qids)
    return manifest, qids[o], nb[o], dist[o], cand[o]


@pytest.mark.parametrize("model", ["model", "l2"])
def test_distributed_equals_one_process(job, tmp_path, model):
    root, X, Xq, ids, metric = job
    m = metric if model == "model" else None
    one = SubspaceIndex(rank=4, bits=16, eta=0.1, max_rounds=8, krylov_iters=3, n_probe=2,
                        n_candidates=60, metric=m, seed=5).fit(X, ids)
    D1, I1 = one.query(Xq, 10)
    import dask

    with dask.config.set({"distributed.scheduler.work-stealing": False}), \
            dask_client(workers=2, processes=False) as client:
        manifest, qids, nb, dist, cand = _build_and_query(client, root, model, tmp_path)
        received = [str(k) for keys in client.run(
            lambda dask_worker: [k for e in dask_worker.transfer_incoming_log
                                 for k in e["keys"]]).values() for k in keys]
    # every worker routes the chunks its groups search: no routed chunk travels
    assert not [k for k in received if k.startswith("route_chunk")]
    rec = manifest["subspace"]
    assert manifest["method"] == "subspace" and rec["group_sizes"] == one.group_sizes_
    assert len(one.groups_) >= 3  # a real partition, not one group
    assert [r["captured"] for r in rec["rounds"]] == [r.captured for r in one.rounds_]
    for r, r1 in zip(rec["rounds"], one.rounds_):
        assert r["alpha"] == pytest.approx(r1.alpha, rel=1e-9)
    for e, g in zip(manifest["segments"], one.groups_):
        seg = read_group(tmp_path / "idx", e, manifest)
        assert np.array_equal(seg.ids, ids[g.rows])  # same members, in id order
        assert np.array_equal(seg.group.codes, g.codes)
        assert np.allclose(seg.group.basis, g.basis, atol=1e-9)
        assert e["final"] == g.final
    assert np.array_equal(qids, 10 * N + np.arange(NQ))
    assert np.array_equal(nb, I1)
    assert np.allclose(dist, D1, rtol=1e-6)
    assert np.array_equal(cand, one.stats_["reranked"])


def test_scan_mode_is_exact_and_overrides(built, job, tmp_path):
    """--mode scan searches every group by the exact scan: the exact answer; --probe and
    --candidates override the index's own at query time (the one-process overrides)."""
    root, X, Xq, ids, metric = job
    with dask_client(workers=2, processes=False) as client:
        driver.query(client, SUBSPACE, plan_subspace_query(
            index=str(built), queries=str(root / "queries"), out=str(tmp_path / "res"),
            cfg=QueryConfig(k=5, mode="scan", query_chunk=70)))
        qids, nb, _, cand = read_results(tmp_path / "res")
        nb, cand = nb[np.argsort(qids)], cand[np.argsort(qids)]
        q = plan_subspace_query(index=str(built), queries=str(root / "queries"),
                                out=str(tmp_path / "res2"),
                                cfg=QueryConfig(k=5, probe=1, candidates=20))
        driver.query(client, SUBSPACE, q)
    Z, Zq = metric.transform(X), metric.transform(Xq)
    d = ((Zq[:, None, :].astype(np.float64) - Z[None]) ** 2).sum(-1)
    want = ids[np.lexsort((np.broadcast_to(ids, d.shape), d), axis=1)[:, :5]]
    assert np.array_equal(nb, want) and np.all(cand == N)
    one = SubspaceIndex(rank=4, bits=16, eta=0.1, max_rounds=8, krylov_iters=3, metric=metric,
                        seed=5).fit(X, ids)
    _, I1 = one.query(Xq, 5, n_probe=1, n_candidates=20)
    qids, nb2, _, cand2 = read_results(tmp_path / "res2")
    o = np.argsort(qids)
    assert np.array_equal(nb2[o], I1) and np.array_equal(cand2[o], one.stats_["reranked"])


def test_masked_median_is_exact():
    """The distributed selection equals np.median, odd and even counts, with ties, with
    brackets that need several narrowing steps (values far apart and clustered)."""
    import dask.array as da

    from lshdist.cluster import subspace as sub

    rng = np.random.default_rng(0)
    v = np.concatenate([rng.standard_normal(20_000) * 1e-6, rng.standard_normal(500) * 1e6,
                        np.full(3000, 0.25)])
    rng.shuffle(v)
    old = sub.SELECT_GATHER
    sub.SELECT_GATHER = 50  # force several rounds of narrowing on these small arrays
    try:
        with dask_client(workers=2, processes=False) as client:
            for n_mask in (len(v) - 1, len(v) // 3 * 2):
                mask = np.zeros(len(v), bool)
                mask[rng.permutation(len(v))[:n_mask]] = True
                got = masked_median(client, da.from_array(v, chunks=3001),
                                    da.from_array(mask, chunks=3001), int(mask.sum()))
                assert got == np.median(v[mask])
    finally:
        sub.SELECT_GATHER = old


@pytest.fixture(scope="module")
def built(job, tmp_path_factory):
    """The index built through the CLI (`lshdist index --method subspace`)."""
    root = job[0]
    out = tmp_path_factory.mktemp("built")
    flags = [x for key, v in CFG.items() for x in (f"--{key.replace('_', '-')}", str(v))]
    assert main(["index", "--method", "subspace", "--data", str(root / "data"), "--model",
                 str(root / "model"), "--out", str(out / "idx"), *flags, "--in-process"]) == 0
    return out / "idx"


def test_manifest_round_trip_and_verify(built, job, tmp_path):
    m = verify_index(built)
    assert m["method"] == "subspace" and m["rows"] == N
    assert m["subspace"]["version"] == 1 and m["subspace"]["bits"] == 16
    assert sum(m["subspace"]["group_sizes"]) == N
    assert main(["verify", str(built)]) == 0
    assert main(["info", str(built)]) == 0
    # the CLI query answers it like the one-process index (same data and seed)
    root, X, Xq, ids, metric = job
    assert main(["query", "--index", str(built), "--queries", str(root / "queries"), "--k", "4",
                 "--out", str(tmp_path / "res"), "--in-process"]) == 0
    _, nb, _, _ = read_results(tmp_path / "res", 10 * N + np.arange(NQ))
    one = SubspaceIndex(rank=4, bits=16, eta=0.1, max_rounds=8, krylov_iters=3, n_probe=2,
                        n_candidates=60, metric=metric, seed=5).fit(X, ids)
    assert np.array_equal(nb, one.query(Xq, 4)[1])
    # an edited manifest (its checksum no longer matches) is refused
    bad = tmp_path / "idx"
    shutil.copytree(built, bad)
    text = (bad / "index.json").read_text().replace('"n_probe": 2', '"n_probe": 3')
    (bad / "index.json").write_text(text)
    with pytest.raises(FormatError, match="does not match its checksum"):
        read_manifest(bad)


def test_damaged_files_are_refused(built, job, tmp_path):
    root = job[0]
    m = read_manifest(built)
    for what, target in [("segment", f"segments/{m['segments'][1]['name']}/payload/Z"),
                         ("router", f"segments/{m['subspace']['router']}/bases")]:
        bad = tmp_path / what
        shutil.copytree(built, bad)
        chunk = next(p for p in sorted((bad / target).rglob("*")) if p.is_file()
                     and p.name != "zarr.json")
        data = bytearray(chunk.read_bytes())
        data[len(data) // 2] ^= 0xFF
        chunk.write_bytes(bytes(data))
        with pytest.raises(FormatError, match="checksum"):
            verify_index(bad)
        assert main(["query", "--index", str(bad), "--queries", str(root / "queries"),
                     "--k", "3", "--out", str(tmp_path / f"res-{what}"), "--in-process"]) == 2
        assert not (tmp_path / f"res-{what}").exists()
    # a newer record version is refused with the version named
    bad = tmp_path / "version"
    shutil.copytree(built, bad)
    meta = json.loads((bad / "index.json").read_text())
    meta["subspace"]["version"] = 99
    from lshdist.store.index import manifest_checksum

    meta["checksum"] = manifest_checksum(meta)
    (bad / "index.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="subspace index version 99"):
        read_manifest(bad)


def test_the_router_is_a_named_segment_and_older_indexes_still_read(built, job, tmp_path):
    """A build stores the router in a segment directory of a fresh name that the manifest
    records (a build replacing an index in place never writes over the router the old
    manifest names); an index written before, its router in ``subspaces/``, still reads, and
    ``subspaces/`` beside a named router is an orphan."""
    from lshdist.store.index import list_orphans, manifest_checksum

    root = job[0]
    m = read_manifest(built)
    router = m["subspace"]["router"]
    assert router not in {e["name"] for e in m["segments"]}
    assert (built / "segments" / router / "bases").is_dir()
    assert not (built / "subspaces").exists() and list_orphans(built) == []
    old = tmp_path / "legacy"
    shutil.copytree(built, old)
    (old / "segments" / router).rename(old / "subspaces")
    meta = json.loads((old / "index.json").read_text())
    del meta["subspace"]["router"]
    meta["checksum"] = manifest_checksum(meta)
    (old / "index.json").write_text(json.dumps(meta))
    assert verify_index(old)["subspace"].get("router") is None and list_orphans(old) == []
    for index, out in ((built, "new"), (old, "old")):
        assert main(["query", "--index", str(index), "--queries", str(root / "queries"),
                     "--k", "4", "--out", str(tmp_path / out), "--in-process"]) == 0
    ids = 10 * N + np.arange(NQ)
    assert np.array_equal(read_results(tmp_path / "new", ids)[1],
                          read_results(tmp_path / "old", ids)[1])
    stale = tmp_path / "stale"
    shutil.copytree(built, stale)
    shutil.copytree(old / "subspaces", stale / "subspaces")
    assert list_orphans(stale) == [stale / "subspaces"]
    shutil.rmtree(stale / "subspaces")
    (stale / "subspaces").mkdir()  # not a router lshdist wrote: not an orphan
    (stale / "subspaces" / "notes.txt").write_text("mine")
    assert list_orphans(stale) == []
    # a router name that is not a segment name, or is a group's, is refused
    for i, (bad_name, match) in enumerate((("../x", "is not seg-<16 hex digits>"),
                                           (5, "router=5 is not a segment name"),
                                           (m["segments"][0]["name"],
                                            "is also a group's segment"))):
        bad = tmp_path / f"bad-{i}"
        shutil.copytree(built, bad)
        meta = json.loads((bad / "index.json").read_text())
        meta["subspace"]["router"] = bad_name
        meta["checksum"] = manifest_checksum(meta)
        (bad / "index.json").write_text(json.dumps(meta))
        with pytest.raises(FormatError, match=match):
            read_manifest(bad)


def test_other_jobs_refuse_a_subspace_index(built, job, tmp_path):
    root = job[0]
    with pytest.raises(InputError, match=r"subspace index .*compact"):
        from lshdist.cluster.compact import plan_compact

        plan_compact(str(built), min_segments=2, segment_rows=10_000)
    with pytest.raises(InputError, match="give one or the other"):
        plan_subspace_query(index=str(built), queries=str(root / "queries"),
                            out=str(tmp_path / "r"), cfg=QueryConfig(target_recall=0.9, probe=2))


def test_target_recall_calibrates_on_the_queries(built, job, tmp_path):
    """The calibrated point's recall on the sample is predicted exactly (the one-process index
    searched at that point finds the same share of the exact top-k), reaches the target, and
    costs less than searching everything."""
    from lshdist.index.calibrate import SAMPLE_QUERIES, recall_margin, sample_rows

    root, X, Xq, ids, metric = job
    with dask_client(workers=2, processes=False) as client:
        q = plan_subspace_query(index=str(built), queries=str(root / "queries"),
                                out=str(tmp_path / "res"), cfg=QueryConfig(k=10,
                                                                          target_recall=0.9))
        r = driver.query(client, SUBSPACE, q)
    cal = r["calibration"]
    chosen = cal["chosen"]
    assert (r["operating_point"]["n_probe"], r["operating_point"]["n_candidates"]) == (
        chosen["n_probe"], chosen["n_candidates"])
    assert chosen["recall"] >= 0.9 + recall_margin(0.9, NQ if NQ < SAMPLE_QUERIES else
                                                   SAMPLE_QUERIES)
    assert chosen["reranked"] < 0.5 * N  # far from searching everything
    rows = sample_rows(NQ, SAMPLE_QUERIES, 5)  # the index's seed
    one = SubspaceIndex(rank=4, bits=16, eta=0.1, max_rounds=8, krylov_iters=3, metric=metric,
                        seed=5).fit(X, ids)
    _, I = one.query(Xq[rows], 10, n_probe=chosen["n_probe"],
                     n_candidates=chosen["n_candidates"])
    Z, Zq = metric.transform(X), metric.transform(Xq[rows])
    d = ((Zq[:, None, :].astype(np.float64) - Z[None]) ** 2).sum(-1)
    _, It = one.query(Xq[rows], 10, n_probe=len(one.groups_), n_candidates=N)
    assert np.array_equal(It, ids[np.lexsort((np.broadcast_to(ids, d.shape), d),
                                             axis=1)[:, :10]])
    real = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(I, It)])
    assert real == pytest.approx(chosen["recall"], abs=1e-12)
    # and so is every point of the curve (catches an off-by-one in the Hamming ranks)
    for p in cal["points"][::7]:
        _, I = one.query(Xq[rows], 10, n_probe=p["n_probe"], n_candidates=p["n_candidates"])
        real = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(I, It)])
        assert real == pytest.approx(p["recall"], abs=1e-12), p
        assert one.stats_["reranked"].mean() == pytest.approx(p["reranked"])
    # the cheaper points of the curve miss the target: the choice is the cheapest that reaches it
    need = 0.9 + recall_margin(0.9, len(rows))
    assert all(p["recall"] < need for p in cal["points"] if p["reranked"] < chosen["reranked"])


def test_sparse_model_refused_before_any_cluster(tmp_path, capsys, monkeypatch):
    import scipy.sparse as sp

    from lshdist.cluster import client as client_mod
    from lshdist.metric.itml import KernelITML

    def no_cluster(*a, **k):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(client_mod, "client_for", no_cluster)
    rng = np.random.default_rng(0)
    Xs = sp.random(300, 400, density=0.03, format="csr", random_state=1, dtype=np.float32)
    Xs = sp.csr_matrix(Xs + sp.eye(300, 400, format="csr", dtype=np.float32))  # no empty rows
    y = rng.integers(0, 2, 300)
    write_dataset(tmp_path / "sparse", Xs, y, shard_rows=100)
    metric = KernelITML(n_basis=20, n_constraints=50, max_iter=5).fit(Xs, y).metric(d=400)
    save_model(tmp_path / "model", metric)
    code = main(["index", "--method", "subspace", "--data", str(tmp_path / "sparse"),
                 "--model", str(tmp_path / "model"), "--out", str(tmp_path / "idx")])
    err = capsys.readouterr().err
    assert code == 2
    assert "--method subspace needs dense rows and an explicit d x d metric" in err
    assert "lshdist learn --kind explicit" in err and "Traceback" not in err
    assert not (tmp_path / "idx").exists()


@pytest.mark.parametrize("argv, message", [
    (["--method", "subspace", "--window", "4"], "--window: only for --method permutation"),
    (["--rank", "4"], "--rank: only for --method subspace"),
    (["--method", "subspace", "--target-recall", "0.9", "--probe", "2"],
     "--target-recall chooses --probe and --candidates of a subspace index; give the target"),
    (["--method", "subspace", "--rank", "0"], "expected an integer >= 1"),
    (["--method", "cluster"], "--method cluster: not an index kind of this lshdist"),
    (["--method", "Sub space"], "expected permutation, subspace or the name of an installed"),
    (["--method", "subspace", "--rank", "49"], "rank=49: the subspaces cannot exceed"),
    (["--method", "subspace", "--append"], "--append/--batch are not supported"),
])
def test_cli_bad_options_exit_2(job, tmp_path, capsys, argv, message):
    root = job[0]
    try:  # bad input exits 2: argparse (a value outside its rule) or the job (InputError)
        code = main(["index", "--data", str(root / "data"), "--model", str(root / "model"),
                     "--out", str(tmp_path / "idx"), *argv])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "idx").exists()


def test_run_config_refuses_the_subspace_method(tmp_path, capsys):
    """`lshdist run` evaluates permutation indexes only: refused before anything is written."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"name: x\nworkdir: {tmp_path / 'wd'}\ndata:\n"
                   "  train: {builtin: digits, shard_rows: 500}\n"
                   "  test: {builtin: digits, shard_rows: 500}\n"
                   "index: {method: subspace, rank: 8}\n")
    assert main(["run", str(cfg)]) == 2
    assert "index.method (subspace) is not evaluated by `lshdist run`" in capsys.readouterr().err
    assert not (tmp_path / "wd").exists()


def test_an_index_built_for_a_recall_is_queried_at_it_and_measured(job, tmp_path):
    """`lshdist index --method subspace --target-recall 0.9` (no --probe/--candidates): a plain
    `lshdist query` calibrates them for that recall on a sample of its queries, measures the
    recall on its own sample (`measured_recall`), and reaches the target against the scan."""
    from lshdist.store.results import read_meta

    root = job[0]
    flags = [x for key, v in CFG.items() if key not in ("probe", "candidates")
             for x in (f"--{key.replace('_', '-')}", str(v))]
    assert main(["index", "--method", "subspace", "--data", str(root / "data"), "--model",
                 str(root / "model"), "--out", str(tmp_path / "idx"), *flags,
                 "--target-recall", "0.9", "--in-process"]) == 0
    found = {}
    for mode in ("auto", "scan"):
        assert main(["query", "--index", str(tmp_path / "idx"), "--queries",
                     str(root / "queries"), "--out", str(tmp_path / mode), "--k", "10",
                     "--mode", mode, "--in-process"]) == 0
        qids, nb, _, _ = read_results(tmp_path / mode)
        found[mode] = nb[np.argsort(qids)]
    info = read_meta(tmp_path / "auto").info
    assert info["calibration"]["target"] == 0.9
    rec = info["measured_recall"]
    real = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found["auto"], found["scan"])])
    assert real >= 0.88
    assert rec["queries_sampled"] == min(NQ, 50) and rec["target"] == 0.9
    assert rec["interval"][0] - 0.02 <= real <= rec["interval"][1] + 0.02
    assert read_meta(tmp_path / "scan").info["measured_recall"]["value"] == 1.0
