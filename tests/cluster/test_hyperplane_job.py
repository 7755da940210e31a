"""Hyperplane queries on Dask: ``lshdist index --family`` and ``lshdist query
--hyperplanes``, against `HyperplaneIndex` in one process and the exhaustive margins.

Each test names the bug it catches; each was checked once by planting that bug.
"""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from lshdist.blocks import SparseBlock
from lshdist.cli import main
from lshdist.index.hyperplane import HyperplaneIndex
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.index import read_manifest
from lshdist.store.model import save_model
from lshdist.store.results import read_results

CLUSTER = ["--in-process", "--workers", "1"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("hyperplane")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(900, 10)).astype(np.float32)
    ids = rng.permutation(10_000)[:900].astype(np.int64)  # ids do not rise with rows
    write_dataset(root / "data", X, ids=ids, shard_rows=150)  # 6 shards, 3 segments of 300
    W = rng.normal(size=(23, 10))
    W[5] *= 30.0
    np.save(root / "W.npy", W)
    save_model(root / "model", ExplicitMetric.identity(10))
    return root, X, ids, W


def _build(root, family, out, *extra):
    return main(["index", "--data", str(root / "data"), "--model", str(root / "model"),
                 "--out", str(out), "--family", family, "--bits", "32", "--permutations", "8",
                 "--window", "4", "--segment-rows", "300", *CLUSTER, *extra])


@pytest.mark.parametrize("family", ["h-hash", "eh-hash"])
def test_distributed_equals_one_process_per_segment_and_merge(job, tmp_path, family):
    """Three segments searched on Dask and merged equal three `HyperplaneIndex`es in one process,
    merged by margin then id; scan mode equals the exhaustive ranking.  Bugs caught: the
    query side of the family not used on the workers (point-side keys), distances written
    unnormalised, query ids not the rows of W."""
    root, X, ids, W = job
    assert _build(root, family, tmp_path / "idx") == 0
    m = read_manifest(tmp_path / "idx")
    assert m["family"] == {"name": family, "samples": None,
                           **({"version": 2} if family == "eh-hash" else {})}
    assert len(m["segments"]) == 3
    k = 6
    assert main(["query", "--index", str(tmp_path / "idx"), "--hyperplanes", str(root / "W.npy"),
                 "--k", str(k), "--out", str(tmp_path / "res"), *CLUSTER]) == 0
    _, nb, dist, cand = read_results(tmp_path / "res", np.arange(len(W)))
    # one process, segment by segment, merged
    parts_d, parts_i = [], []
    for s in range(3):
        rows = slice(300 * s, 300 * (s + 1))
        ix = HyperplaneIndex(family=family, bits=32, n_permutations=8, window=4, seed=0)
        d, i = ix.fit(X[rows], ids[rows]).query(W, k)
        parts_d.append(d)
        parts_i.append(i)
    D, I = np.hstack(parts_d), np.hstack(parts_i)
    order = np.lexsort((I, D), axis=1)[:, :k]
    assert np.array_equal(nb, np.take_along_axis(I, order, 1))
    np.testing.assert_allclose(dist, np.take_along_axis(D, order, 1), rtol=1e-6)
    assert (cand > 0).all()
    # exhaustive
    assert main(["query", "--index", str(tmp_path / "idx"), "--hyperplanes", str(root / "W.npy"),
                 "--k", str(k), "--out", str(tmp_path / "scan"), "--mode", "scan",
                 *CLUSTER]) == 0
    _, nb_s, dist_s, _ = read_results(tmp_path / "scan", np.arange(len(W)))
    M = np.abs(X.astype(np.float64) @ W.T) / np.linalg.norm(W, axis=1)
    for q in range(len(W)):
        o = np.lexsort((ids, M[:, q].astype(np.float32)))[:k]
        assert np.array_equal(nb_s[q], ids[o])
        np.testing.assert_allclose(dist_s[q], M[o, q], rtol=1e-5)
    info = json.loads((tmp_path / "res" / "results.json").read_text())["info"]
    assert info["hyperplanes"] == family


@pytest.mark.parametrize("family", ["h-hash", "eh-hash"])
def test_rank_mode_equals_one_process_per_segment_and_merge(job, tmp_path, family):
    """``--mode rank --candidates 120``: shared by the three 300-row segments, every segment's
    40 rows of smallest angle score re-ranked, merged by (margin, id), equal to three
    one-process indexes queried in mode "rank" and merged; the results record the mode and
    the candidates.  Bugs caught: the
    candidates option not reaching the workers, EH-Hash keys scored as H-Hash pairs."""
    root, X, ids, W = job
    assert _build(root, family, tmp_path / "idx") == 0
    k = 6
    assert main(["query", "--index", str(tmp_path / "idx"), "--hyperplanes", str(root / "W.npy"),
                 "--k", str(k), "--out", str(tmp_path / "res"), "--mode", "rank",
                 "--candidates", "120", *CLUSTER]) == 0
    _, nb, dist, cand = read_results(tmp_path / "res", np.arange(len(W)))
    parts_d, parts_i = [], []
    for s in range(3):
        rows = slice(300 * s, 300 * (s + 1))
        ix = HyperplaneIndex(family=family, bits=32, n_permutations=8, window=4, seed=0)
        d, i = ix.fit(X[rows], ids[rows]).query(W, k, mode="rank", candidates=40)
        parts_d.append(d)
        parts_i.append(i)
    D, I = np.hstack(parts_d), np.hstack(parts_i)
    order = np.lexsort((I, D), axis=1)[:, :k]
    assert np.array_equal(nb, np.take_along_axis(I, order, 1))
    np.testing.assert_allclose(dist, np.take_along_axis(D, order, 1), rtol=1e-6)
    assert (cand == 120).all()
    info = json.loads((tmp_path / "res" / "results.json").read_text())["info"]
    assert info["mode"] == "rank" and info["candidates"] == 120


def test_sparse_dataset_of_hyperplanes(tmp_path):
    """Sparse rows and sparse normals (a dataset): the results equal the one-process index.
    Bug caught: the dataset's ids not used as query ids, the sparse payload not registered with
    the index store (the segment unreadable)."""
    rng = np.random.default_rng(1)
    Xs = sp.random(400, 50, density=0.2, random_state=1, format="csr", dtype=np.float32)
    Ws = sp.random(12, 50, density=0.5, random_state=2, format="csr", dtype=np.float32)
    write_dataset(tmp_path / "data", SparseBlock.from_csr(Xs), shard_rows=400)
    qids = rng.permutation(500)[:12].astype(np.int64)
    write_dataset(tmp_path / "W", SparseBlock.from_csr(Ws), ids=qids)
    basis = SparseBlock.from_csr(Xs[:3])
    save_model(tmp_path / "model", ImplicitMetric.identity(basis, d=2**64))  # hashed ids
    assert main(["index", "--data", str(tmp_path / "data"), "--model", str(tmp_path / "model"),
                 "--out", str(tmp_path / "idx"), "--family", "h-hash", "--bits", "16",
                 "--permutations", "6", "--window", "3", *CLUSTER]) == 0
    assert main(["query", "--index", str(tmp_path / "idx"), "--hyperplanes",
                 str(tmp_path / "W"), "--k", "4", "--out", str(tmp_path / "res"), *CLUSTER]) == 0
    _, nb, dist, _ = read_results(tmp_path / "res", qids)
    ix = HyperplaneIndex(family="h-hash", bits=16, n_permutations=6, window=3)
    d, i = ix.fit(SparseBlock.from_csr(Xs)).query(SparseBlock.from_csr(Ws), 4)
    assert np.array_equal(nb, i)
    np.testing.assert_allclose(dist, d, rtol=1e-6)


def test_errors(job, tmp_path, capsys):
    root, *_ = job
    assert _build(root, "h-hash", tmp_path / "idx") == 0
    bad = tmp_path / "bad.npy"
    np.save(bad, np.ones((3, 4)))
    cases = [
        (["query", "--index", str(tmp_path / "idx"), "--queries", str(root / "data"), "--out",
          str(tmp_path / "r1")], "built for hyperplane queries"),
        (["query", "--index", str(tmp_path / "idx"), "--hyperplanes", str(bad), "--out",
          str(tmp_path / "r2")], r"expected a numeric \(Q, 10\) array"),
        (["index", "--data", str(root / "data"), "--model", str(root / "model"), "--out",
          str(tmp_path / "i2"), "--family", "h-hash", "--bits", "31"], "two bits per function"),
        (["index", "--data", str(root / "data"), "--model", str(root / "model"), "--out",
          str(tmp_path / "idx"), "--family", "h-hash", "--append"], "not supported"),
        (["index", "--data", str(root / "data"), "--model", str(root / "model"), "--out",
          str(tmp_path / "idx"), "--append"], "hyperplane index"),
        (["query", "--index", str(tmp_path / "idx"), "--hyperplanes", str(root / "W.npy"),
          "--out", str(tmp_path / "r3"), "--candidates", "40"], "applies to --mode rank"),
        (["query", "--index", str(tmp_path / "idx"), "--queries", str(root / "data"), "--out",
          str(tmp_path / "r4"), "--mode", "rank"], "ranks hyperplane keys"),
    ]
    for argv, message in cases:
        capsys.readouterr()
        assert main([*argv, *CLUSTER]) == 2, argv
        import re

        assert re.search(message, capsys.readouterr().err), (argv, message)


def test_hyperplane_queries_measure_their_recall_and_keep_a_target(job, tmp_path, capsys):
    """Every hyperplane query measures recall@k of its answer against the exact margins on its
    own sample (here all 23 normals: the measurement is exact); with ``--target-recall`` above
    what the fixed (M, W, H) reach, ``auto`` answers by the scan and says so; with ``--mode
    hash`` the target is refused (nothing would hold it)."""
    from lshdist.store.results import read_meta

    root, _, _, W = job
    assert _build(root, "h-hash", tmp_path / "idx") == 0
    common = ["query", "--index", str(tmp_path / "idx"), "--hyperplanes", str(root / "W.npy"),
              "--k", "6", *CLUSTER]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--out", str(tmp_path / "scan"), "--mode", "scan"]) == 0
    _, nb, _, _ = read_results(tmp_path / "plain", np.arange(len(W)))
    _, exact, _, _ = read_results(tmp_path / "scan", np.arange(len(W)))
    real = np.mean([len(np.intersect1d(a, b)) / 6 for a, b in zip(nb, exact)])
    rec = read_meta(tmp_path / "plain").info["measured_recall"]
    assert rec["queries_sampled"] == len(W) and rec["value"] == pytest.approx(real, abs=1e-6)
    assert rec["action"] == "reported" and real < 0.99  # 8 lists of 32 bits miss some rows
    assert main([*common, "--out", str(tmp_path / "held"), "--target-recall", "0.99"]) == 0
    info = read_meta(tmp_path / "held").info
    assert info["mode"] == "scan" and info["measured_recall"]["action"] == "scan"
    _, nb, _, _ = read_results(tmp_path / "held", np.arange(len(W)))
    assert np.array_equal(nb, exact)
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "bad"), "--mode", "hash",
                 "--target-recall", "0.9"]) == 2
    assert "it needs --mode auto, not hash" in capsys.readouterr().err


def test_an_eh_hash_index_of_the_earlier_definition_is_refused(job, tmp_path, capsys):
    """EH-Hash's Gaussian matrix is drawn differently since version 2 of the family: an index
    built before (no version in its family record) would be searched with keys that do not
    match; it is refused with the fix, not answered."""
    import json

    from lshdist.store.index import manifest_checksum

    root, *_ = job
    assert _build(root, "eh-hash", tmp_path / "idx") == 0
    m = read_manifest(tmp_path / "idx")
    del m["family"]["version"]
    m.pop("checksum")
    m["checksum"] = manifest_checksum(m)  # sealed as the earlier lshdist wrote it
    (tmp_path / "idx" / "index.json").write_text(json.dumps(m))
    capsys.readouterr()
    assert main(["query", "--index", str(tmp_path / "idx"), "--hyperplanes",
                 str(root / "W.npy"), "--out", str(tmp_path / "r"), *CLUSTER]) == 2
    err = capsys.readouterr().err
    assert "an eh-hash index built by an earlier lshdist" in err and "rebuild it" in err
    assert not (tmp_path / "r").exists()
