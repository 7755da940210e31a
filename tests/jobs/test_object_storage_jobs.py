"""The whole pipeline on object storage, against a real S3 server on 127.0.0.1 (moto's): the
same commands on ``s3://`` and on a local disk give the same neighbours; a damaged segment
object is refused; racing appends lose nothing; a killed append leaves the index whole; bad
URLs are one line with nothing written anywhere."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lshdist.cli import main
from lshdist.store.objects import ObjectPath
from lshdist.store.results import read_results

#: a fixed operating point: answers do not depend on the calibration's timings
FIXED = ["--permutations", "8", "--window", "6", "--hamming-keep", "40", "--seed", "3"]


def _lshdist(*args):
    return main([*args])


def _xy(letter):
    return (np.concatenate([letter.X_train, letter.X_test]),
            np.concatenate([letter.y_train, letter.y_test]))


def _letter_npz(letter, tmp_path, rows=4000, queries=500):
    X, y = _xy(letter)
    np.savez(tmp_path / "train.npz", X=X[:rows].astype(np.float32), y=y[:rows])
    np.savez(tmp_path / "test.npz", X=X[16000:16000 + queries].astype(np.float32),
             y=y[16000:16000 + queries])
    return tmp_path / "train.npz", tmp_path / "test.npz"


def _pipeline(root, train, test, *extra):
    """ingest, learn, index, query with every artefact under ``root`` (a path or URL)."""
    for args in (["ingest", str(train), "--out", f"{root}/tr", "--shard-rows", "1000"],
                 ["ingest", str(test), "--out", f"{root}/te"],
                 ["learn", "--data", f"{root}/tr", "--out", f"{root}/model", "--no-search",
                  "--seed", "1"],
                 ["index", "--data", f"{root}/tr", "--model", f"{root}/model", "--out",
                  f"{root}/idx", "--segment-rows", "2000", *FIXED, *extra],
                 ["query", "--index", f"{root}/idx", "--queries", f"{root}/te", "--out",
                  f"{root}/res", "--mode", "hash", *extra],
                 ["verify", f"{root}/idx"]):
        assert _lshdist(*args) == 0, args
    return read_results(f"{root}/res")


@pytest.fixture
def letter_small(letter, tmp_path):
    return _letter_npz(letter, tmp_path)


def test_the_pipeline_on_s3_answers_as_on_local_disk(bucket, letter_small, tmp_path, capsys):
    train, test = letter_small
    remote = _pipeline(f"{bucket}/run", train, test, "--in-process")
    local = _pipeline(tmp_path / "run", train, test, "--in-process")
    order = np.argsort(remote[0])
    lorder = np.argsort(local[0])
    np.testing.assert_array_equal(remote[0][order], local[0][lorder])
    np.testing.assert_array_equal(remote[1][order], local[1][lorder])  # the same neighbours
    np.testing.assert_array_equal(remote[2][order], local[2][lorder])
    assert (remote[1] >= 0).all()
    assert "OK index" in capsys.readouterr().out
    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir())  # nothing local


@pytest.mark.drills
def test_a_flipped_byte_in_a_segment_object_is_refused(bucket, letter_small, capsys):
    train, test = letter_small
    root = f"{bucket}/run"
    _pipeline(root, train, test, "--in-process")
    seg = next((ObjectPath(f"{root}/idx") / "segments").iterdir())
    chunk = next(f for f in seg.files() if f.startswith("codes/c/"))
    key = f"{seg.key}/{chunk}"
    data = bytearray(seg.fs.cat_file(key))
    data[len(data) // 3] ^= 0x01
    seg.fs.pipe_file(key, bytes(data))
    capsys.readouterr()
    assert _lshdist("query", "--index", f"{root}/idx", "--queries", f"{root}/te", "--out",
                    f"{root}/res2", "--mode", "hash", "--in-process") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"segment {seg.name!r}" in err
    assert "does not match its checksum" in err
    assert not ObjectPath(f"{root}/res2").exists()  # nothing answered
    assert _lshdist("verify", f"{root}/idx") == 2


@pytest.mark.parametrize("args,needles", [
    (["ingest", "{train}", "--out", "s3://no-such-bucket-lshdist/x"],
     ["the bucket 'no-such-bucket-lshdist' does not exist"]),
    (["learn", "--data", "s3://no-such-bucket-lshdist/x", "--out", "{tmp}/m"],
     ["does not exist"]),
])
def test_a_missing_bucket_is_one_line_and_nothing_is_written(s3_server, letter_small, tmp_path,
                                                             monkeypatch, capsys, args, needles):
    train, _ = letter_small
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [a.format(train=train, tmp=tmp_path) for a in args]
    assert _lshdist(*args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(n in err for n in needles), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no local 's3:' folder


def _append_proc(root, data):
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "lshdist"), "index", "--data", data, "--model",
         f"{root}/model", "--out", f"{root}/idx", "--append", "--in-process"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())


def _batches(letter, tmp_path, n):
    X, y = _xy(letter)
    paths = []
    for i in range(n):
        rows = slice(4000 + 500 * i, 4500 + 500 * i)
        np.savez(tmp_path / f"b{i}.npz", X=X[rows].astype(np.float32), y=y[rows],
                 ids=np.arange(rows.start, rows.stop))
        paths.append(tmp_path / f"b{i}.npz")
    return paths


@pytest.mark.drills
def test_racing_appends_on_s3_lose_nothing(bucket, letter, letter_small, tmp_path):
    """Four appends started together on one s3:// index: every one that exits 0 is there
    (the conditional commit merged the losers' segments into the winners' manifests)."""
    train, test = letter_small
    root = f"{bucket}/run"
    _pipeline(root, train, test, "--in-process")
    datasets = []
    for i, p in enumerate(_batches(letter, tmp_path, 4)):
        assert _lshdist("ingest", str(p), "--out", f"{root}/b{i}") == 0
        datasets.append(f"{root}/b{i}")
    procs = [_append_proc(root, d) for d in datasets]
    codes = [p.wait(300) for p in procs]
    errs = [p.stderr.read() for p in procs]
    assert codes == [0, 0, 0, 0], errs
    from lshdist.store.index import read_manifest, segment_ids

    m = read_manifest(f"{root}/idx")
    ids = np.concatenate([segment_ids(f"{root}/idx", e) for e in m["segments"]])
    assert m["rows"] == 4000 + 4 * 500 == len(ids) == len(np.unique(ids))
    assert set(range(4000, 6000)) <= set(ids.tolist())
    assert _lshdist("verify", f"{root}/idx") == 0


@pytest.mark.drills
def test_a_killed_append_leaves_the_index_whole(bucket, letter, letter_small, tmp_path):
    """SIGKILL once the append has written a segment object: the index is the old one (the
    usual case: the kill came before the commit) or the new one, whole either way."""
    from lshdist.store.index import read_manifest, segment_ids

    train, test = letter_small
    root = f"{bucket}/run"
    _pipeline(root, train, test, "--in-process")
    before = read_results(f"{root}/res")
    (p,) = _batches(letter, tmp_path, 1)
    assert _lshdist("ingest", str(p), "--out", f"{root}/b0") == 0
    proc = _append_proc(root, f"{root}/b0")
    segs = ObjectPath(f"{root}/idx") / "segments"
    n0 = len(list(segs.iterdir()))
    deadline = time.monotonic() + 120
    while len(list(segs.iterdir())) == n0 and time.monotonic() < deadline:
        time.sleep(0.02)  # until the append has written a segment object
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert _lshdist("verify", f"{root}/idx") == 0
    m = read_manifest(f"{root}/idx")
    ids = np.concatenate([segment_ids(f"{root}/idx", e) for e in m["segments"]])
    assert m["rows"] == len(ids) == len(np.unique(ids)) in (4000, 4500)
    if m["rows"] == 4000:  # not committed: the old index answers as before
        assert _lshdist("query", "--index", f"{root}/idx", "--queries", f"{root}/te", "--out",
                        f"{root}/res", "--overwrite", "--mode", "hash", "--in-process") == 0
        after = read_results(f"{root}/res")
        np.testing.assert_array_equal(before[1][np.argsort(before[0])],
                                      after[1][np.argsort(after[0])])


def test_gc_on_s3_keeps_young_unnamed_segments_and_removes_old_ones(bucket, letter_small,
                                                                    capsys):
    """No lock on object storage: an unnamed segment may be a running append's, so gc removes
    it only past --min-age."""
    train, test = letter_small
    root = f"{bucket}/run"
    _pipeline(root, train, test, "--in-process")
    segs = ObjectPath(f"{root}/idx") / "segments"
    named = {p.name for p in segs.iterdir()}
    next(segs.iterdir()).copytree(segs / "seg-00000000deadbeef")  # what a killed append left
    capsys.readouterr()
    assert _lshdist("gc", f"{root}/idx") == 0
    assert "no orphans" in capsys.readouterr().out
    assert "seg-00000000deadbeef" in {p.name for p in segs.iterdir()}
    assert _lshdist("gc", f"{root}/idx", "--min-age", "0.001", "--dry-run") == 0
    assert "would remove s3://" in capsys.readouterr().out
    assert _lshdist("gc", f"{root}/idx", "--min-age", "0.001") == 0
    assert "removed 1 orphans" in capsys.readouterr().out
    assert {p.name for p in segs.iterdir()} == named
    assert _lshdist("verify", f"{root}/idx") == 0


@pytest.mark.cluster
def test_letter_on_s3_with_two_workers_and_compaction(bucket, letter, tmp_path, capsys):
    """The full Letter split (16,000 / 4,000) on s3:// with two worker processes, against the
    same commands on local disk; then appends and a compaction on s3:// keep the answers."""
    train, test = _letter_npz(letter, tmp_path, rows=16000, queries=4000)
    remote = _pipeline(f"{bucket}/run", train, test)
    local = _pipeline(tmp_path / "run", train, test)
    np.testing.assert_array_equal(remote[1][np.argsort(remote[0])],
                                  local[1][np.argsort(local[0])])
    root = f"{bucket}/run"
    X, y = _xy(letter)
    for i in range(3):
        np.savez(tmp_path / f"a{i}.npz", X=X[16000 + i:16000 + i + 1].astype(np.float32) + 0,
                 y=y[16000 + i:16000 + i + 1], ids=np.array([100000 + i]))
        assert _lshdist("ingest", str(tmp_path / f"a{i}.npz"), "--out", f"{root}/a{i}") == 0
        assert _lshdist("index", "--data", f"{root}/a{i}", "--model", f"{root}/model", "--out",
                        f"{root}/idx", "--append") == 0
    assert _lshdist("compact", f"{root}/idx", "--min-segments", "2") == 0
    assert _lshdist("verify", f"{root}/idx") == 0
    assert _lshdist("gc", f"{root}/idx", "--min-age", "0.001") == 0


def test_ingest_reads_its_inputs_from_s3(bucket, letter_small, tmp_path, capsys):
    train, _ = letter_small
    src = ObjectPath(f"{bucket}/inputs/train.npz")
    src.write_bytes(train.read_bytes())
    assert _lshdist("ingest", src.url, "--out", f"{bucket}/tr") == 0
    assert _lshdist("ingest", str(train), "--out", str(tmp_path / "tr")) == 0
    from lshdist.store.dataset import Dataset

    assert Dataset(f"{bucket}/tr").attrs["checksums"] == Dataset(tmp_path / "tr").attrs[
        "checksums"]
    capsys.readouterr()
    assert _lshdist("ingest", f"{bucket}/inputs/nothing.npz", "--out", f"{bucket}/x") == 2
    assert "does not exist" in capsys.readouterr().err
    assert not ObjectPath(f"{bucket}/x").exists()


@pytest.mark.drills
def test_an_append_that_loses_the_commit_race_merges_and_retries(bucket, letter, letter_small,
                                                                 tmp_path, monkeypatch, caplog):
    """The race made certain: the append reads the manifest as it was before another append
    committed (a stale version tag), so its conditional write fails; it reads again, merges its
    segments into the newer manifest and commits -- both appends are in the index."""
    import logging

    import lshdist.cluster.driver as driver
    from lshdist.store.index import read_manifest, read_manifest_tagged, segment_ids

    train, test = letter_small
    root = f"{bucket}/run"
    _pipeline(root, train, test, "--in-process")
    b0, b1 = _batches(letter, tmp_path, 2)
    for i, p in enumerate((b0, b1)):
        assert _lshdist("ingest", str(p), "--out", f"{root}/b{i}") == 0
    stale = read_manifest_tagged(f"{root}/idx")
    assert _lshdist("index", "--data", f"{root}/b0", "--model", f"{root}/model", "--out",
                    f"{root}/idx", "--append", "--in-process") == 0
    calls = []

    def first_stale(index_dir):
        calls.append(index_dir)
        return stale if len(calls) == 1 else read_manifest_tagged(index_dir)

    monkeypatch.setattr(driver, "read_manifest_tagged", first_stale)
    with caplog.at_level(logging.INFO, logger="lshdist"):
        assert _lshdist("index", "--data", f"{root}/b1", "--model", f"{root}/model", "--out",
                        f"{root}/idx", "--append", "--in-process") == 0
    assert "another job committed first; merging and retrying" in caplog.text
    m = read_manifest(f"{root}/idx")
    ids = np.concatenate([segment_ids(f"{root}/idx", e) for e in m["segments"]])
    assert m["rows"] == len(ids) == len(np.unique(ids)) == 5000
    assert set(range(4000, 5000)) <= set(ids.tolist())


def test_jobs_that_write_local_files_refuse_a_url_before_any_work(tmp_path, capsys,
                                                                  monkeypatch):
    """evaluate and active write reports and plots, a run's workdir keeps its stages: an
    object-storage URL there is refused up front (no cluster started, nothing written)."""
    monkeypatch.chdir(tmp_path)
    assert _lshdist("evaluate", "--train", "tr", "--test", "te", "--out", "s3://b/eval") == 2
    err = capsys.readouterr().err
    assert "evaluate --out (a report with plots): 's3://b/eval' is an object-storage URL" in err
    cfg = tmp_path / "run.yaml"
    cfg.write_text("workdir: s3://bucket/run\ndata:\n  train: {inputs: [a.npy]}\n"
                   "  test: {inputs: [b.npy]}\n")
    assert _lshdist("run", str(cfg)) == 2
    assert "workdir: 's3://bucket/run' is a URL; a run's workdir is a local" in (
        capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


@pytest.mark.cluster
def test_subspace_and_hyperplane_indexes_on_s3(bucket, letter_small, tmp_path):
    """The other index kinds on s3:// answer as on local disk."""
    train, test = letter_small
    W = np.random.default_rng(0).normal(size=(20, 16)).astype(np.float32)
    np.save(tmp_path / "W.npy", W)
    answers = []
    for root in (f"{bucket}/run", tmp_path / "run"):
        _pipeline(root, train, test, "--in-process")
        for args in (["index", "--data", f"{root}/tr", "--model", f"{root}/model", "--out",
                      f"{root}/sub", "--method", "subspace", "--seed", "2"],
                     ["query", "--index", f"{root}/sub", "--queries", f"{root}/te", "--out",
                      f"{root}/subres", "--mode", "hash"],
                     ["index", "--data", f"{root}/tr", "--model", f"{root}/model", "--out",
                      f"{root}/hyp", "--family", "h-hash", "--seed", "2"],
                     ["query", "--index", f"{root}/hyp", "--hyperplanes",
                      str(tmp_path / "W.npy"), "--out", f"{root}/hres"],
                     ["verify", f"{root}/sub"], ["verify", f"{root}/hyp"]):
            assert _lshdist(*args, "--in-process") == 0 if args[0] != "verify" else (
                _lshdist(*args) == 0), args
        answers.append([read_results(f"{root}/{r}") for r in ("subres", "hres")])
    for remote, local in zip(*answers):
        np.testing.assert_array_equal(remote[1][np.argsort(remote[0])],
                                      local[1][np.argsort(local[0])])
    # replaced in place on s3://, the subspace index's router goes to a new name: the one the
    # old manifest names is never written over (a failed build leaves the old index whole)
    from lshdist.store.index import read_manifest

    sub = ObjectPath(f"{bucket}/run/sub")
    before = read_manifest(str(sub))
    assert _lshdist("index", "--data", f"{bucket}/run/tr", "--model", f"{bucket}/run/model",
                    "--out", str(sub), "--method", "subspace", "--seed", "3", "--overwrite",
                    "--in-process") == 0
    after = read_manifest(str(sub))
    assert after["subspace"]["router"] != before["subspace"]["router"]
    assert sorted(p.name for p in (sub / "segments").iterdir()) == sorted(
        [e["name"] for e in after["segments"]] + [after["subspace"]["router"]])
    assert _lshdist("verify", str(sub)) == 0
    # a router left in subspaces/ by an index of the layout before is gc's, once old enough
    from lshdist.store.index import list_orphans

    (sub / "segments" / after["subspace"]["router"]).copytree(sub / "subspaces")
    assert list_orphans(str(sub)) == []  # younger than ORPHAN_AGE: kept
    assert list_orphans(str(sub), min_age=0) == [sub / "subspaces"]
    assert _lshdist("verify", str(sub)) == 0


@pytest.mark.drills
def test_a_deleted_segment_object_set_is_named_missing(bucket, letter_small, capsys):
    train, test = letter_small
    root = f"{bucket}/run"
    _pipeline(root, train, test, "--in-process")
    seg = next((ObjectPath(f"{root}/idx") / "segments").iterdir())
    seg.rmtree()
    capsys.readouterr()
    assert _lshdist("query", "--index", f"{root}/idx", "--queries", f"{root}/te", "--out",
                    f"{root}/res2", "--in-process") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"segment {seg.name!r}" in err and "is missing" in err


def test_no_s3_back_end_installed_is_one_line_and_nothing_is_written(letter_small, tmp_path,
                                                                     monkeypatch, capsys):
    train, _ = letter_small
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if `pip install lshdist` only
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    for args in (["ingest", str(train), "--out", "s3://bucket/run/tr"],
                 ["query", "--index", "s3://bucket/idx", "--queries", "te", "--out", "res"]):
        assert _lshdist(*args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert "s3:// needs the s3fs package, which is not installed; pip install " \
               "'lshdist[s3]'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.drills
def test_overwriting_an_s3_index_drops_the_old_segments_after_the_commit(bucket, letter_small):
    train, test = letter_small
    root = f"{bucket}/run"
    _pipeline(root, train, test, "--in-process")
    segs = ObjectPath(f"{root}/idx") / "segments"
    old = {p.name for p in segs.iterdir()}
    assert _lshdist("index", "--data", f"{root}/tr", "--model", f"{root}/model", "--out",
                    f"{root}/idx", "--segment-rows", "1000", *FIXED, "--overwrite",
                    "--in-process") == 0
    new = {p.name for p in segs.iterdir()}
    assert len(new) == 4 and not new & old  # the old segments went once unnamed
    assert _lshdist("verify", f"{root}/idx") == 0
