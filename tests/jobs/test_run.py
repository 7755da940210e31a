import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from lshdist.cli import main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_run_digits_config_end_to_end(tmp_path, capsys):
    cfg = yaml.safe_load((CONFIGS / "digits.yaml").read_text())
    cfg["workdir"] = str(tmp_path / "work")
    cfg["evaluate"]["plots"] = True
    path = tmp_path / "digits.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "scan" in out and "calibration" in out and "stage seconds" in out
    report = json.loads((tmp_path / "work" / "report.json").read_text())
    assert report["scan"]["knn_accuracy"]["1"] >= 0.9  # digits, learned metric, exact scan
    sec = report["seconds"]  # the search overlaps the index's writes: the pair's wall time
    assert max(sec["index"], sec["query-search"]) <= sec["index-and-search"] \
        <= sec["index"] + sec["query-search"] + 0.5
    search = report["search"]
    if search["mode"] == "hash":  # calibrated for recall 0.9 at k=10
        assert search["recall_at_k"] >= 0.85 and search["fraction_searched"] < 0.3
    else:  # the scan was judged no slower: then it is the exact answer
        assert search["recall_at_k"] == 1.0
    for f in ("cost_vs_bits.png", "recall_vs_cost.png", "calibration.png", "results-search",
              "results-scan"):
        assert (tmp_path / "work" / f).exists(), f


def test_every_config_parses(monkeypatch, tmp_path):
    from lshdist.config import load_run_config

    monkeypatch.setenv("LSHDIST_DATA_DIR", str(tmp_path))
    names = []
    for f in CONFIGS.glob("*.yaml"):
        cfg = load_run_config(str(f))
        assert (cfg.active.given_ if cfg.active else cfg.index.given_) and \
            cfg.train.shard_rows >= 1
        names.append(f.stem)
    assert {"active-20newsgroups", "active-fashion-mnist", "digits"} <= set(names)


@pytest.mark.parametrize("text, message", [
    ("workdir: x\ndata: {train: {builtin: digits}, test: {builtin: digits}}\nbogus: 1\n",
     r"unknown sections \['bogus'\]"),
    ("workdir: x\n", "needs a 'data' section"),
    ("[1, 2", "is not valid YAML"),
    ("workdir: x\ndata: {train: {inputs: ['${NO_SUCH_VAR_XYZ}/a']}, test: {builtin: digits}}\n",
     "unset environment variable"),
    ("workdir: x\ndata: {train: {builtin: digits}, test: {builtin: digits}}\nactive: {}\n"
     "learn: {}\n", r"an 'active' run takes no \['learn'\] section"),
    ("workdir: x\ndata: {train: {builtin: digits}, test: {builtin: digits}}\n"
     "active: {rounds: 0}\n", r"active\.rounds: expected .*, got 0"),
    ("workdir: x\ndata: {train: {builtin: digits}, test: {builtin: digits}}\n"
     "active: {methods: 'h-hash,bogus'}\n", r"methods='h-hash,bogus'"),
])
def test_bad_configs(tmp_path, capsys, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["run", str(path)]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_run_with_shuffled_noncontiguous_ids(tmp_path, capsys):
    """Labels and recall are looked up by id: ids that are shuffled and far from 0..N-1 give
    the same report as the same data with plain ids (once crashed with IndexError, or scored
    the wrong queries)."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(3)
    ids = rng.permutation(10**7)[: len(y)] + 10**9  # not sorted, not contiguous
    np.savez(tmp_path / "train.npz", X=X[:1500], y=y[:1500], ids=ids[:1500])
    np.savez(tmp_path / "test.npz", X=X[1500:], y=y[1500:], ids=ids[1500:])
    np.savez(tmp_path / "train0.npz", X=X[:1500], y=y[:1500])
    np.savez(tmp_path / "test0.npz", X=X[1500:], y=y[1500:])
    reports = []
    for tag, tr, te in (("shuffled", "train.npz", "test.npz"), ("plain", "train0.npz",
                                                                    "test0.npz")):
        cfg = {"name": tag, "workdir": str(tmp_path / tag),
               "cluster": {"workers": 1, "in_process": True},
               "data": {"train": {"inputs": [str(tmp_path / tr)], "shard_rows": 500},
                        "test": {"inputs": [str(tmp_path / te)], "shard_rows": 500}},
               "learn": {"constraints": 500},
               "index": {"bits": 64, "permutations": 20, "window": 4, "segment_rows": 1000},
               # the hashed search in both runs: `auto` times hash against scan in each run,
               # and at this size either may win (the comparison below would then differ)
               "query": {"k": 10, "query_chunk": 100, "mode": "hash"},
               "evaluate": {"ks": [1, 4]}}
        (tmp_path / f"{tag}.yaml").write_text(yaml.safe_dump(cfg))
        assert main(["run", str(tmp_path / f"{tag}.yaml")]) == 0
        reports.append(json.loads((tmp_path / tag / "report.json").read_text()))
    shuffled, plain = reports
    assert shuffled["scan"]["knn_accuracy"]["1"] >= 0.9
    for key in ("knn_accuracy", "recall_at_k", "fraction_searched"):
        assert shuffled["scan"][key] == plain["scan"][key], ("scan", key)
    # the hashed search: the same candidates (fraction searched), the same answers but where
    # rows tie at a query's k-th distance (digits' integer pixels): ties go by id, and which
    # of two tied rows the candidates hold decides a hit -- measured 0.83367 / 0.83333, one
    # neighbour of 2,970
    assert shuffled["search"]["fraction_searched"] == plain["search"]["fraction_searched"]
    a, b = shuffled["search"], plain["search"]
    assert abs(a["recall_at_k"] - b["recall_at_k"]) <= 0.002, (a, b)
    assert a["knn_accuracy"].keys() == b["knn_accuracy"].keys() == {"1", "4"}
    assert all(abs(a["knn_accuracy"][k] - b["knn_accuracy"][k]) <= 2 / 297
               for k in ("1", "4")), (a, b)  # 297 queries: at most two votes swayed by a tie


def test_run_refuses_a_workdir_it_does_not_own(tmp_path, capsys):
    work = tmp_path / "mine"
    work.mkdir()
    (work / "thesis.tex").write_text("precious")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"workdir: {work}\ndata: {{train: {{builtin: digits}}, "
                   "test: {builtin: digits}}\n")
    assert main(["run", str(cfg), "--fresh"]) == 2
    assert "is not an lshdist workdir" in capsys.readouterr().err
    # a marker-named file of the wrong kind does not make it one: a user's summary.json that
    # says "lshdist-workdir" (only .lshdist.json marks a workdir), nor an oversized marker
    (work / "summary.json").write_text(json.dumps({"format": "lshdist-workdir"}))
    assert main(["run", str(cfg), "--fresh"]) == 2
    assert "is not an lshdist workdir" in capsys.readouterr().err
    (work / "results.json").write_text(json.dumps({"format": "lshdist-results",
                                                    "pad": "x" * (17 * 2**20)}))
    from lshdist.store.atomic import artefact_kind

    assert artefact_kind(work) is None
    assert (work / "thesis.tex").read_text() == "precious"
    assert (work / "thesis.tex").read_text() == "precious"


def test_run_active_config_end_to_end(tmp_path, capsys):
    """An ``active:`` run ingests the splits and runs `lshdist active` into workdir/active; a
    second run replaces that output (its own kind), and the summary is the job's."""
    work = tmp_path / "work"
    cfg = {"name": "active-digits", "workdir": str(work),
           "data": {"train": {"builtin": "digits", "shard_rows": 500},
                    "test": {"builtin": "digits", "shard_rows": 500}},
           "active": {"methods": "h-hash,exhaustive,random", "rounds": 4, "runs": 1,
                      "bits": 256, "classes": 3}}
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for _ in range(2):
        assert main(["run", str(path)]) == 0
        out = capsys.readouterr().out
        assert "h-hash: AUROC" in out and "exhaustive: AUROC" in out
        summary = json.loads((work / "active" / "summary.json").read_text())
        assert summary["format"] == "lshdist-active" and summary["settings"]["rounds"] == 4
        assert summary["classes"] == [0, 1, 2] and summary["n_pool"] == 1500
        m = summary["methods"]
        # one selection per class and round, near the boundary (each method has its own
        # hyperplanes after round 0: compared with random selection only)
        assert m["exhaustive"]["selected_margin_mean"] < 0.5 * m["random"]["selected_margin_mean"]
        assert m["h-hash"]["selected_margin_mean"] < 0.5 * m["random"]["selected_margin_mean"]
        assert m["exhaustive"]["fraction_scanned"] == 1.0
    assert (work / "train").exists() and (work / "test").exists()
    # something else under workdir/active is never replaced
    import shutil

    shutil.rmtree(work / "active")
    (work / "active").mkdir()
    (work / "active" / "notes.txt").write_text("precious")
    shutil.rmtree(work / "train")
    assert main(["run", str(path)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (work / "active" / "notes.txt").read_text() == "precious"
    assert not (work / "train").exists()  # refused before the ingest
