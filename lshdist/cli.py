"""The ``lshdist`` command: argument parsing only; the work is in `lshdist.jobs`.

Every subcommand lives in a module of `lshdist.jobs` exposing ``add_parser(subparsers)`` and
``run(args) -> int``.  Errors from `lshdist.errors` (bad input) exit with code 2 and a one-line
message, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from lshdist import __version__
from lshdist.errors import LshdistError

#: subcommand modules, in the order `lshdist --help` lists them
JOBS = ["ingest", "info", "learn", "evaluate", "index", "query", "run"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors: exit 2 with the usage line (argparse's way)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lshdist", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"lshdist {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="job", required=True, parser_class=_Parser)
    for name in JOBS:
        try:
            module = importlib.import_module(f"lshdist.jobs.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"lshdist.jobs.{name}":
                continue  # a job not built yet is simply not offered
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose > 1 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.verbose < 2:  # Dask's INFO chatter (and shutdown tracebacks logged at INFO) off;
        # distributed reads this when it is first imported, which happens after this point
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
        for noisy in ("distributed", "bokeh", "tornado"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except LshdistError as exc:
        sys.stderr.write(f"lshdist {args.job}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
