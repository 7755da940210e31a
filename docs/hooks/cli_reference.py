"""MkDocs hook: the references generated from the code, and the benchmark plots, at build time.

* ``<!-- cli-reference -->`` becomes ``lshdist --help`` and ``lshdist JOB --help`` of the real
  parser (`lshdist.cli.build_parser`), job by job;
* ``<!-- config-reference -->`` becomes one table per section of the typed configuration
  (`lshdist.config`: each field's YAML key, default, rule, flag and help line).

So neither reference can drift from the code.  The plots of ``benchmarks/results/*.png`` are
served as ``plots/NAME.png`` (the benchmarks page shows them; they live beside their results).
Nothing generated is committed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

CLI_MARKER = "<!-- cli-reference -->"
CONFIG_MARKER = "<!-- config-reference -->"
WIDTH = "100"  # argparse wraps to $COLUMNS: a fixed width keeps the page the same everywhere

#: (YAML section, config class name, where it is used); the last three are YAML only
SECTIONS = [
    ("data.train / data.test", "DataSpec", "`lshdist run`: the datasets, ingested if needed"),
    ("learn", "LearnConfig", "`lshdist learn`, `lshdist run`"),
    ("index", "IndexConfig", "`lshdist index`, `lshdist run`, the batch jobs"),
    ("query", "QueryConfig", "`lshdist query`, `lshdist run`, the batch jobs"),
    ("evaluate", "EvaluateConfig", "`lshdist evaluate`, `lshdist run`"),
    ("active", "ActiveConfig", "`lshdist active`, `lshdist run` with an `active:` section"),
    ("cluster", "ClusterConfig", "every job that runs on Dask"),
    ("paths", "PathsConfig", "the batch jobs (`jobs/`)"),
    ("daily", "DailyConfig", "`jobs/daily_append.py`"),
]


def _cli_text() -> str:
    from lshdist.cli import build_parser

    parser = build_parser()
    parts = ["## `lshdist`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            parts += [f"## `lshdist {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


YAML_ONLY = {"DataSpec", "PathsConfig", "DailyConfig"}


def _config_text() -> str:
    from lshdist import config

    parts: list[str] = []
    for key, name, used in SECTIONS:
        cls = getattr(config, name, None)
        if cls is None:
            continue
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        parts += [f"### `{key}`", "", f"{_cell(doc)} Used by {used}.", "",
                  "| key | default | allowed | flag | meaning |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            meta = f.metadata
            if "rule" not in meta:
                continue
            default = f.default if f.default is not dataclasses.MISSING else "(required)"
            flag = ((meta.get("flag") or "--" + f.name.replace("_", "-"))
                    if meta.get("cli", True) and name not in YAML_ONLY else "–")
            parts.append(f"| `{f.name}` | `{_cell(default)}` | {_cell(meta['rule'].describe)} "
                         f"| `{flag}` | {_cell(meta['help'])} |")
        parts.append("")
    return "\n".join(parts)


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    results = Path(config["config_file_path"]).parent / "benchmarks" / "results"
    for png in sorted(results.glob("*.png")):
        files.append(File.generated(config, f"plots/{png.name}", abs_src_path=str(png)))
    return files


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if CLI_MARKER not in markdown and CONFIG_MARKER not in markdown:
        return markdown
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        if CLI_MARKER in markdown:
            markdown = markdown.replace(CLI_MARKER, _cli_text())
        if CONFIG_MARKER in markdown:
            markdown = markdown.replace(CONFIG_MARKER, _config_text())
        return markdown
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
