"""Index kinds are plug-ins of one cluster driver: a new kind is one module (`scan_kind`, an
exact scan) that the driver runs and the commands find, with no edit of lshdist."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lshdist.cli import main
from lshdist.cluster import driver, kinds
from lshdist.cluster.client import dask_client
from lshdist.config import IndexConfig
from lshdist.metric.learned import sq_euclidean
from lshdist.store.dataset import Dataset
from lshdist.store.model import load_model
from lshdist.store.results import read_results

HERE = Path(__file__).parent
CLUSTER = ["--in-process", "--workers", "2"]


def _exact(job, k):
    """The exact top-k ids of the Letter queries under the job's learned metric (numpy)."""
    metric, _ = load_model(job / "model")
    X, Q = Dataset(job / "train-a").read_rows(0, 16000), Dataset(job / "queries").read_rows(0, 4000)
    D = sq_euclidean(metric.transform(Q).astype(np.float32), metric.transform(X).astype(np.float32))
    return np.argsort(D, axis=1, kind="stable")[:, :k]


def test_an_index_without_its_plugin_is_refused_by_name(letter_job, tmp_path):
    """A plug-in kind's index read where the plug-in is not installed: exit 2, one line saying
    which method and what to do (a fresh interpreter: nothing registered)."""
    built = _build(letter_job, tmp_path / "idx")
    env = {**os.environ, "PYTHONPATH": ""}
    p = subprocess.run([sys.executable, "-m", "lshdist.cli", "info", str(built)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "method='scan'" in p.stderr and "plug-in" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.cluster
def test_a_plugin_installed_through_its_entry_point_is_found(letter_job, tmp_path):
    """An installed package's entry point (group lshdist.index_kinds) registers the kind and
    its manifest: a fresh `lshdist info` / `query` reads the plug-in's index."""
    built = _build(letter_job, tmp_path / "idx")
    dist = tmp_path / "site" / "lshdist_scan_kind-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lshdist-scan-kind\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text("[lshdist.index_kinds]\nscan = scan_kind:SCAN\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{HERE}"}
    p = subprocess.run([sys.executable, "-m", "lshdist.cli", "query", "--index", str(built),
                        "--queries", str(letter_job / "queries"), "--out", str(tmp_path / "r"),
                        "--k", "3", "--in-process", "--workers", "1"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "4000 queries x 4 segments" in p.stdout
    qids, nb, _, _ = read_results(tmp_path / "r")
    assert (nb[np.argsort(qids)] == _exact(letter_job, 3)).all(axis=1).mean() > 0.995


def _build(job, out):
    import scan_kind

    kinds.register(scan_kind.SCAN, scan_kind.ScanManifest)
    plan = scan_kind.SCAN.plan_build(data=str(job / "train-a"), model=str(job / "model"),
                                     out=str(out), cfg=IndexConfig(segment_rows=4000))
    with dask_client(workers=2, processes=False) as client:
        m = driver.build(client, scan_kind.SCAN, plan)
    assert m.method == "scan" and m.rows == 16000 and len(m.segments) == 4
    return out


def test_a_kind_in_one_module_runs_on_the_driver(letter_job, tmp_path, capsys):
    """Built by `driver.build`, queried by `lshdist query` (the kind found from the index's
    manifest), verified and described by `lshdist verify` / `info`: the answers are the
    exact neighbours under the learned metric, equal to the permutation index's --mode scan."""
    import scan_kind

    idx = _build(letter_job, tmp_path / "idx")
    assert kinds.for_index(str(idx)) is scan_kind.SCAN
    argv = ["query", "--index", str(idx), "--queries", str(letter_job / "queries"), "--out",
            str(tmp_path / "res"), "--k", "5", "--query-chunk", "1500", *CLUSTER]
    assert main(argv) == 0
    assert "4000 queries x 4 segments" in capsys.readouterr().out
    qids, nb, _, _ = read_results(tmp_path / "res")
    o = np.argsort(qids)
    exact = _exact(letter_job, 5)
    got = nb[o]
    assert np.array_equal(qids[o], np.arange(16000, 20000))
    # float32 ties may order two equidistant rows either way; all but a handful agree
    assert (got == exact).all(axis=1).mean() > 0.995
    info = json.loads((tmp_path / "res" / "results.json").read_text())
    assert info["info"] == {"mode": "scan", "method": "scan"}

    # the permutation index's exact scan, a peer: the same neighbours
    assert main(["index", "--data", str(letter_job / "train-a"), "--model",
                 str(letter_job / "model"), "--out", str(tmp_path / "perm"), "--bits", "64",
                 "--permutations", "8", "--segment-rows", "4000", *CLUSTER]) == 0
    assert main(["query", "--index", str(tmp_path / "perm"), "--queries",
                 str(letter_job / "queries"), "--out", str(tmp_path / "perm-res"), "--k", "5",
                 "--mode", "scan", *CLUSTER]) == 0
    q2, nb2, _, _ = read_results(tmp_path / "perm-res")
    assert (nb2[np.argsort(q2)] == got).all(axis=1).mean() > 0.995

    # `lshdist index --method scan`: the plug-in found by the configuration
    assert main(["index", "--method", "scan", "--data", str(letter_job / "train-a"), "--model",
                 str(letter_job / "model"), "--out", str(tmp_path / "cli"), "--segment-rows",
                 "8000", *CLUSTER]) == 0
    assert "16000 rows in 2 segments (scan)" in capsys.readouterr().out
    assert main(["query", "--index", str(tmp_path / "cli"), "--queries",
                 str(letter_job / "queries"), "--out", str(tmp_path / "cli-res"), "--k", "5",
                 *CLUSTER]) == 0
    q3, nb3, _, _ = read_results(tmp_path / "cli-res")
    assert np.array_equal(nb3[np.argsort(q3)], got)  # other segments, the same exact answer

    capsys.readouterr()
    assert main(["verify", str(idx)]) == 0
    assert main(["info", str(idx)]) == 0
    out = capsys.readouterr().out
    assert "scan" in out and "16000" in out


def test_a_damaged_plugin_segment_is_refused_by_name(letter_job, tmp_path, capsys):
    """The store verifies a plug-in kind's segments as it does every index's."""
    idx = _build(letter_job, tmp_path / "idx")
    seg = sorted((idx / "segments").iterdir())[0]
    chunk = next(p for p in (seg / "Z").rglob("*") if p.is_file() and p.name != "zarr.json")
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(["query", "--index", str(idx), "--queries", str(letter_job / "queries"),
                 "--out", str(tmp_path / "res"), *CLUSTER]) == 2
    err = capsys.readouterr().err
    assert seg.name in err and ("checksum" in err or "unreadable" in err), err
    assert not (tmp_path / "res").exists()


def test_kinds_are_found_by_configuration_and_manifest():
    from lshdist.errors import InputError

    with pytest.raises(InputError, match="--method nope: not an index kind of this lshdist"):
        kinds.for_build(IndexConfig(method="nope"))
    assert kinds.for_build(IndexConfig()).name == "permutation"
    assert kinds.for_build(IndexConfig(method="subspace")).name == "subspace"
    assert kinds.for_build(IndexConfig(family="h-hash")).name == "hyperplane"
    with pytest.raises(ValueError, match="taken"):
        from lshdist.store.manifest import KindManifest, register_manifest

        class Clash(KindManifest):
            method = "subspace"

        register_manifest(Clash)


def test_a_kind_that_does_not_call_back_is_queried_after_its_build(letter_job, tmp_path):
    """`driver.build_and_query` with a kind whose build never reports its operating point
    early (`Run.calibrated`): the query is planned from the committed manifest and reads its
    segments from the index; the answers are the exact neighbours."""
    import scan_kind

    from lshdist.config import QueryConfig

    kinds.register(scan_kind.SCAN, scan_kind.ScanManifest)
    plan = scan_kind.SCAN.plan_build(data=str(letter_job / "train-a"),
                                     model=str(letter_job / "model"), out=str(tmp_path / "idx"),
                                     cfg=IndexConfig(segment_rows=4000))

    def plan_of(manifest):
        assert manifest.method == "scan" and len(manifest.segments) == 4
        return scan_kind.SCAN.plan_query(index=str(tmp_path / "idx"),
                                         source=str(letter_job / "queries"),
                                         out=str(tmp_path / "res"), cfg=QueryConfig(k=3))

    with dask_client(workers=2, processes=False) as client:
        m, r, seconds = driver.build_and_query(client, scan_kind.SCAN, plan, plan_of)
    assert m.rows == 16000 and r["queries"] == 4000 and r["segments"] == 4
    qids, nb, _, _ = read_results(tmp_path / "res")
    got = nb[np.argsort(qids)]
    assert np.array_equal(np.sort(got, axis=1), np.sort(_exact(letter_job, 3), axis=1))
    assert seconds["index"] <= seconds["total"]
