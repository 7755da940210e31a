"""MkDocs hook: render `lshdist --help` and `lshdist JOB --help` into the CLI reference.

The page ``reference/cli.md`` holds the marker ``<!-- cli-reference -->``; at build time it is
replaced by the help text of the real parser (`lshdist.cli.build_parser`), job by job, so the
reference cannot drift from the command line.  Nothing generated is committed.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- cli-reference -->"
WIDTH = "100"  # argparse wraps to $COLUMNS: a fixed width keeps the page the same everywhere


def _help_text() -> str:
    from lshdist.cli import build_parser

    parser = build_parser()
    parts = ["## `lshdist`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            parts += [f"## `lshdist {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        return markdown.replace(MARKER, _help_text())
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
