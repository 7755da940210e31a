"""The typed configuration: one set of rules for CLI flags and run YAML; clear refusals."""

import importlib
import re

import pytest

from lshdist.cli import JOBS, build_parser, main
from lshdist.config import IndexConfig, LearnConfig, from_mapping
from lshdist.errors import InputError

_RUN_OK = "workdir: {w}\ndata: {{train: {{builtin: digits}}, test: {{builtin: digits}}}}\n"


@pytest.mark.parametrize("extra, message", [
    ("index: {bitz: 64}\n", r"index: unknown key 'bitz'; allowed keys: .*bits"),
    ("index: {bits: sixty}\n", r"index.bits: expected an integer in 1..4096, got 'sixty'"),
    ("index: {bits: 0}\n", r"index.bits: expected an integer in 1..4096, got 0"),
    ("index: {window: true}\n", r"index.window: expected an integer >= 1, got True"),
    ("index: {epsilon: 1, permutations: 4}\n", r"give epsilon or permutations \(M\), not both"),
    ("learn: {strategy: nearest}\n", r"learn.strategy: expected one of neighbors, random"),
    ("learn: {percentiles: [90, 10]}\n", r"learn.percentiles: expected 'code'"),
    ("query: {k: 2.5}\n", r"query.k: expected an integer >= 1, got 2.5"),
    ("query: [1]\n", r"query: expected a mapping of options"),
    ("cluster: {workers: 0}\n", r"cluster.workers: expected an integer >= 1, got 0"),
    ("evaluate: {ks: [1, x]}\n", r"evaluate.ks: expected a list of integers >= 1"),
])
def test_bad_run_configs_exit_2_naming_the_key(tmp_path, capsys, extra, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(_RUN_OK.format(w=tmp_path / "work") + extra)
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "work").exists()  # nothing written


def test_data_split_needs_inputs_or_builtin(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"workdir: {tmp_path / 'w'}\ndata: {{train: {{shard_rows: 5}}, "
                   "test: {builtin: digits}}\n")
    assert main(["run", str(cfg)]) == 2
    assert "exactly one of 'inputs' (files) or 'builtin'" in capsys.readouterr().err


def test_flags_and_yaml_share_rules_and_defaults():
    args = build_parser().parse_args(["index", "--data", "d", "--model", "m", "--out", "o",
                                      "--bits", "64", "--window", "2"])
    from lshdist.config import from_args

    cli = from_args(IndexConfig, args)
    yml = from_mapping(IndexConfig, {"bits": 64, "window": 2}, where="index")
    assert cli == yml and cli.given_ == yml.given_ == {"bits", "window"}
    assert IndexConfig().window == cli.__class__().window  # one default, in one place
    with pytest.raises(InputError, match=r"learn\.gamma: expected a number > 0, got -1"):
        from_mapping(LearnConfig, {"gamma": -1}, where="learn")


def test_a_flag_on_by_default_is_turned_off_by_its_no_flag():
    """``active.center`` defaults to true: the CLI offers ``--no-center`` (not ``--center``),
    and it equals ``center: false`` in YAML."""
    from lshdist.config import ActiveConfig, from_args

    base = ["active", "--pool", "p", "--test", "t", "--out", "o"]
    assert from_args(ActiveConfig, build_parser().parse_args(base)).center is True
    off = from_args(ActiveConfig, build_parser().parse_args([*base, "--no-center"]))
    assert off == from_mapping(ActiveConfig, {"center": False}, where="active")
    assert off.given_ == {"center"}
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--center"])


def test_every_subcommand_help_lists_every_option_with_help(capsys):
    for job in JOBS:
        try:
            importlib.import_module(f"lshdist.jobs.{job}")
        except ModuleNotFoundError:
            continue
        with pytest.raises(SystemExit) as e:
            main([job, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        parser = build_parser()
        sub = next(a for a in parser._actions if a.dest == "job").choices[job]
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{job} {action.option_strings} has no help"
        assert "{'option_strings'" not in out
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "{'option_strings'" not in top and "argument parsing only" not in top


def test_query_of_a_missing_index_fails_before_any_cluster(tmp_path, capsys, monkeypatch):
    import lshdist.cluster.client as client

    def no_cluster(*a, **k):
        raise AssertionError("a cluster was started before the input was checked")

    monkeypatch.setattr(client, "dask_client", no_cluster)
    assert main(["query", "--index", str(tmp_path / "nope"), "--queries", str(tmp_path / "q"),
                 "--out", str(tmp_path / "r")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["index", "--data", str(tmp_path / "nope"), "--model", str(tmp_path / "m"),
                 "--out", str(tmp_path / "i")]) == 2
    assert not (tmp_path / "i").exists()


def test_mode_names_and_their_check_have_one_home():
    """The modes a query may ask for are config's lists; every layer checks them with
    check_mode (one message), the one-process searcher as the query job and the API do."""
    import numpy as np

    from lshdist.config import (
        HYPERPLANE_MODES,
        KNN_MODES,
        QUERY_MODES,
        QueryConfig,
        check_mode,
    )
    from lshdist.index.searcher import MetricIndex
    from lshdist.metric.learned import ExplicitMetric

    assert set(QUERY_MODES) == set(KNN_MODES) | set(HYPERPLANE_MODES)
    assert from_mapping(QueryConfig, {"mode": "rank"}, where="query").mode == "rank"
    with pytest.raises(InputError, match=r"mode: .*one of auto, hash, scan, rank"):
        from_mapping(QueryConfig, {"mode": "fast"}, where="query")
    assert check_mode("scan", KNN_MODES) == "scan"
    with pytest.raises(InputError, match=r"mode='rank'; choose one of \['auto', 'hash', 'scan'\]"):
        check_mode("rank", KNN_MODES)
    X = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    ix = MetricIndex(ExplicitMetric.identity(4), bits=16, n_permutations=2).fit(X)
    with pytest.raises(InputError, match=r"mode='rank'; choose one of \['auto', 'hash', 'scan'\]"):
        ix.query(X[:3], 2, mode="rank")
