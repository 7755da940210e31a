"""``jobs/`` entry points: build_index.py, bulk_query.py and daily_append.py on a LocalCluster.

Checks: the shipped configs (configs/jobs/) run end to end as ``python jobs/X.py CONFIG``; a
day appended twice changes nothing (manifest bytes equal); ids of day D are
``(D - epoch) * id_stride + row``; small segments are compacted once the threshold is reached;
a held job lock with ``lock_timeout: 0`` exits 2 naming the holder; outputs outside the workdir
are refused unless allowed; a missing day input and a day before the epoch exit 2.  Two
concurrent runs of one day (marked ``cluster``): both exit 0, the day lands once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from lshdist.config import load_job_config
from lshdist.errors import InputError
from lshdist.jobs.batch import daily_append
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import Dataset, write_dataset
from lshdist.store.index import index_lock, list_orphans, read_manifest, segment_ids
from lshdist.store.model import save_model
from lshdist.store.results import read_results

REPO = Path(__file__).resolve().parents[2]
FAST = {"bits": 64, "permutations": 8, "window": 4, "hamming_keep": 0, "segment_rows": 1000}
LOCAL = {"in_process": True, "workers": 1}


def _config(tmp: Path, name: str, **sections) -> Path:
    """configs/jobs/NAME.yaml with sections updated (the shipped file is the base)."""
    raw = yaml.safe_load((REPO / "configs" / "jobs" / f"{name}.yaml").read_text())
    for key, value in sections.items():
        raw[key] = {**raw[key], **value} if isinstance(raw.get(key), dict) else value
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def work(tmp_path, monkeypatch):
    rng = np.random.default_rng(20261124)
    wd = tmp_path / "work"
    (wd / "incoming").mkdir(parents=True)
    for day in ("2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"):
        np.save(wd / "incoming" / f"{day}.npy", rng.normal(size=(300, 16)).astype(np.float32))
    X = rng.normal(size=(1200, 16)).astype(np.float32)
    write_dataset(wd / "data", X, ids=rng.permutation(1200) * 5 + 1, shard_rows=300)
    write_dataset(wd / "queries", X[:100] + 0.01, ids=np.arange(100) + 10**6, shard_rows=50)
    save_model(wd / "model", ExplicitMetric.identity(16))
    monkeypatch.setenv("LSHDIST_WORKDIR", str(wd))
    return wd


def _daily(tmp: Path, **daily) -> Path:
    return _config(tmp, "daily", index=FAST, cluster=LOCAL,
                   daily={"epoch": "2026-11-01", "id_stride": 1000, "shard_rows": 100,
                          "compact_min_segments": 3, "compact_segment_rows": 1000, **daily})


def _ids(index: Path) -> np.ndarray:
    m = read_manifest(index)
    return np.sort(np.concatenate([segment_ids(index, e) for e in m["segments"]]))


def test_build_and_query_scripts(work, tmp_path):
    """`python jobs/build_index.py` and `jobs/bulk_query.py` as a scheduler runs them."""
    b = _config(tmp_path, "build", index=FAST, cluster=LOCAL)
    q = _config(tmp_path, "query", query={"k": 5, "query_chunk": 50}, cluster=LOCAL)
    env = {**os.environ, "LSHDIST_WORKDIR": str(work)}
    for script, cfg in (("build_index", b), ("bulk_query", q)):
        r = subprocess.run([sys.executable, str(REPO / "jobs" / f"{script}.py"), str(cfg)],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
    assert read_manifest(work / "index")["rows"] == 1200
    qid, nb, _dist, _ = read_results(work / "results")
    assert len(np.unique(qid)) == 100 and nb.shape == (100, 5)
    # the same again refuses to overwrite (exit 2, one line, no traceback)
    r = subprocess.run([sys.executable, str(REPO / "jobs" / "build_index.py"), str(b)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "error:" in r.stderr


def test_batch_jobs_build_and_query_every_index_kind(work, tmp_path, capsys):
    """build_index / bulk_query run on the one cluster driver: a subspace index from a job
    config is built and queried as the permutation index is (in-process entry points)."""
    from lshdist.jobs.batch import build_index, bulk_query

    b = _config(tmp_path, "build", cluster=LOCAL)
    raw = yaml.safe_load(b.read_text())
    raw["index"] = {"method": "subspace", "rank": 4, "seed": 0}  # (not merged: no layout keys)
    b.write_text(yaml.safe_dump(raw))
    q = _config(tmp_path, "query", query={"k": 5, "mode": "scan"}, cluster=LOCAL)
    assert build_index([str(b)]) == 0
    assert "groups" in capsys.readouterr().out
    assert read_manifest(work / "index")["method"] == "subspace"
    assert bulk_query([str(q)]) == 0
    qid, nb, _dist, _ = read_results(work / "results")
    X = np.asarray(Dataset(work / "data").read_rows(0, 1200), np.float64)
    ids = Dataset(work / "data").ids()
    Q = X[:100] + 0.01
    exact = ids[np.argsort(((Q[:, None, :] - X[None]) ** 2).sum(-1), axis=1)[:, :5]]
    o = np.argsort(qid)
    assert np.array_equal(nb[o], exact)  # --mode scan of every group: the exact answer


def test_daily_idempotent_ids_and_compaction(work, tmp_path, capsys):
    cfg = _daily(tmp_path)
    index = work / "index"
    assert daily_append([str(cfg), "--day", "2026-11-01"]) == 0
    first = (index / "index.json").read_bytes()
    assert np.array_equal(_ids(index), np.arange(300))
    assert daily_append([str(cfg), "--day", "2026-11-01"]) == 0  # again: nothing added
    assert "already appended" in capsys.readouterr().out
    assert (index / "index.json").read_bytes() == first
    assert daily_append([str(cfg), "--day", "2026-11-02"]) == 0
    m = read_manifest(index)
    assert m["batches"] == ["2026-11-01", "2026-11-02"] and len(m["segments"]) == 2
    assert np.array_equal(_ids(index), np.r_[np.arange(300), 1000 + np.arange(300)])
    assert daily_append([str(cfg), "--day", "2026-11-03"]) == 0  # 3 small: compacted
    m = read_manifest(index)
    assert len(m["segments"]) == 1 and m["rows"] == 900
    assert m["batches"] == ["2026-11-01", "2026-11-02", "2026-11-03"]
    assert np.array_equal(_ids(index), np.r_[np.arange(300), 1000 + np.arange(300),
                                             2000 + np.arange(300)])
    assert list_orphans(index) == []
    # the next day lands beside the packed segment; the packed days still refuse a re-run
    assert daily_append([str(cfg), "--day", "2026-11-04"]) == 0
    m = read_manifest(index)
    assert [len(e.get("parts", [])) for e in m["segments"]] == [3, 0] and m["rows"] == 1200
    assert np.array_equal(_ids(index), np.r_[np.arange(300), 1000 + np.arange(300),
                                             2000 + np.arange(300), 3000 + np.arange(300)])
    assert daily_append([str(cfg), "--day", "2026-11-02"]) == 0
    assert "already appended" in capsys.readouterr().out
    assert read_manifest(index)["rows"] == 1200


def test_daily_lock_held_exits_2(work, tmp_path, capsys):
    cfg = _daily(tmp_path, lock_timeout=0)
    with index_lock(f"{work / 'index'}.daily"):
        assert daily_append([str(cfg), "--day", "2026-11-01"]) == 2
    err = capsys.readouterr().err
    assert "another daily append of this index is running" in err and "pid" in err
    assert not (work / "index").exists()


def test_daily_bad_days(work, tmp_path, capsys):
    cfg = _daily(tmp_path)
    assert daily_append([str(cfg), "--day", "2026-11-09"]) == 2
    assert "no input for day 2026-11-09" in capsys.readouterr().err
    assert daily_append([str(cfg), "--day", "2026-10-31"]) == 2
    assert "before the id epoch" in capsys.readouterr().err


def test_outputs_stay_in_workdir(work, tmp_path, capsys):
    cfg = _config(tmp_path, "daily", paths={"index": "../elsewhere"}, cluster=LOCAL)
    assert daily_append([str(cfg), "--day", "2026-11-01"]) == 2
    assert "is outside the workdir" in capsys.readouterr().err
    assert not (work.parent / "elsewhere").exists()
    with pytest.raises(InputError, match="outside the workdir"):
        load_job_config(_config(tmp_path, "build", paths={"index": "/tmp/x"})).output("index")
    ok = _config(tmp_path, "build", paths={"index": "/tmp/x"}, allow_outside_workdir=True)
    assert load_job_config(ok).output("index") == Path("/tmp/x")


def test_config_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("LSHDIST_WORKDIR", raising=False)
    with pytest.raises(InputError, match="unset environment variable"):
        load_job_config(REPO / "configs" / "jobs" / "daily.yaml")
    p = tmp_path / "c.yaml"
    p.write_text("workdir: w\ndaily: {id_strid: 3}\n")
    with pytest.raises(InputError, match="unknown key 'id_strid'"):
        load_job_config(p)
    p.write_text("workdir: w\ncluster: {kind: slurm, scheduler: tcp://x:1}\n")
    with pytest.raises(InputError, match="give one of them"):
        load_job_config(p)


@pytest.mark.cluster
def test_two_concurrent_runs(work, tmp_path):
    """Two processes append the same day at once: both exit 0, the day lands once."""
    cfg = _daily(tmp_path)
    env = {**os.environ, "LSHDIST_WORKDIR": str(work)}
    cmd = [sys.executable, str(REPO / "jobs" / "daily_append.py"), str(cfg), "--day",
           "2026-11-04"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    said = sorted("appended 300 rows" in o for o, _ in outs)
    assert said == [False, True], outs
    m = read_manifest(work / "index")
    assert m["rows"] == 300 and m["batches"] == ["2026-11-04"]
    assert np.array_equal(_ids(work / "index"), 3000 + np.arange(300))
