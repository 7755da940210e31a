import json
import re
from pathlib import Path

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
    assert "scan" in out and "hash" in out and "stage seconds" in out
    report = json.loads((tmp_path / "work" / "report.json").read_text())
    assert report["scan"]["knn_accuracy"]["1"] >= 0.9  # digits, learned metric, exact scan
    assert report["hash"]["recall_at_k"] >= 0.7
    assert report["hash"]["fraction_searched"] < 0.3
    for f in ("accuracy_vs_bits.png", "recall_vs_searched.png", "results-hash", "results-scan"):
        assert (tmp_path / "work" / f).exists(), f


def test_every_config_parses(monkeypatch, tmp_path):
    from lshdist.config import load_run_config

    monkeypatch.setenv("LSHDIST_DATA_DIR", str(tmp_path))
    for f in CONFIGS.glob("*.yaml"):
        cfg = load_run_config(str(f))
        assert cfg.index.given_ and cfg.train.shard_rows >= 1


@pytest.mark.parametrize("text, message", [
    ("workdir: x\ndata: {train: {builtin: digits}, test: {builtin: digits}}\nbogus: 1\n",
     r"unknown sections \['bogus'\]"),
    ("workdir: x\n", "needs a 'data' section"),
    ("[1, 2", "is not valid YAML"),
    ("workdir: x\ndata: {train: {inputs: ['${NO_SUCH_VAR_XYZ}/a']}, test: {builtin: digits}}\n",
     "unset environment variable"),
])
def test_bad_configs(tmp_path, capsys, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["run", str(path)]) == 2
    assert re.search(message, capsys.readouterr().err)
