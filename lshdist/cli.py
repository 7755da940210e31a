"""The ``lshdist`` command line: argument parsing only; the work is in `lshdist.jobs`.

Every subcommand lives in a module of `lshdist.jobs` exposing ``add_parser(subparsers)`` and
``run(args) -> int``.  Errors from `lshdist.errors` (bad input) exit with code 2 and a one-line
message, never a traceback.  A job module imports what its work needs (Dask, numba, Zarr) inside
``run``, not at its top: building the parser loads none of them, and ``lshdist --help`` answers
at once (a test checks it).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable
from importlib.metadata import version
from typing import NoReturn

from lshdist.errors import LshdistError
from lshdist.limits import keep_freed_memory
from lshdist.store.atomic import describe_os_error

#: subcommand modules, in the order `lshdist --help` lists them
JOBS = ["ingest", "info", "verify", "gc", "learn", "evaluate", "index", "query", "compact",
        "run", "active"]


DESCRIPTION = ("Fast similarity search under learned metrics: learn a metric with ITML, hash "
               "a dataset with learned LSH functions on Dask, answer bulk k-NN queries.")
EPILOG = ("Typical use: lshdist ingest FILES --out DATA; lshdist learn --data DATA --out MODEL; "
          "lshdist index --data DATA --model MODEL --out INDEX; lshdist query --index INDEX "
          "--queries Q --out RESULTS.  `lshdist JOB --help` lists a job's options.")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # usage errors: exit 2 with the usage line
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lshdist", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"lshdist {version('lshdist')}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="-v: lshdist's debug messages and Dask's info; -vv: Dask's debug "
                             "messages too (default: lshdist's progress, Dask's warnings)")
    parser.add_argument("--storage-options", metavar="JSON", default=None,
                        help="options for object storage (s3://, gs://, abfs://) as a JSON "
                             "object handed to its fsspec file system, e.g. "
                             "'{\"endpoint_url\": \"http://127.0.0.1:9000\"}' (default: the "
                             "LSHDIST_STORAGE_OPTIONS environment variable; credentials come "
                             "from the AWS_* environment as usual)")
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


def configure_logging(verbose: int) -> None:
    """0: lshdist at INFO, Dask at WARNING; 1: lshdist DEBUG, Dask INFO; 2+: DEBUG for all."""
    logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("lshdist").setLevel(logging.DEBUG if verbose else logging.INFO)
    dask_level = ("debug", "info", "warning")[max(0, 2 - verbose)]
    # distributed sets its loggers' levels from dask's config when it is first imported,
    # after this point, or it logs at INFO (dozens of lines a job, and a traceback when a
    # stream closes at shutdown).  Dask's config is loaded first (the parser no longer does
    # it, and a job soon will) so that a user's own setting -- the environment variable, a
    # Dask YAML file -- is seen and stands; the level goes into the loaded config and, for
    # the worker processes a LocalCluster spawns, into the environment.
    import dask.config

    if dask.config.get("logging.distributed", None) is None:
        dask.config.set({"logging.distributed": dask_level})
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", dask_level)
    for noisy in ("distributed", "bokeh", "tornado"):
        logging.getLogger(noisy).setLevel(dask_level.upper())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    keep_freed_memory()
    return guarded(f"lshdist {args.job}", lambda: args.func(local_paths(args)))


#: options whose value is an address or a label, never a path
_NOT_PATHS = {"scheduler", "listen", "batch", "job", "storage_options"}


def local_paths(args: argparse.Namespace) -> argparse.Namespace:
    """Every path argument of a job checked before the job starts: ``file://`` URLs become
    paths; an object-store URL (``s3://``...) is kept when its scheme is known and its back end
    installed (`lshdist.store.objects.as_path`), refused otherwise; ``--storage-options``
    checked and handed on (to the workers too) through the environment."""
    from lshdist.store.objects import OPTIONS_ENV, as_path, is_url, storage_options

    options = getattr(args, "storage_options", None)
    if options is not None:
        os.environ[OPTIONS_ENV] = options
        storage_options()  # refuses what is not a JSON object

    def one(value: str) -> str:
        if is_url(value):
            return str(as_path(value))
        path = as_path(value)
        return str(path) if str(path) != value and "://" in value else value

    for dest, value in vars(args).items():
        if dest in _NOT_PATHS:
            continue
        if isinstance(value, str):
            setattr(args, dest, one(value))
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            setattr(args, dest, [one(v) for v in value])
    return args


def guarded(name: str, call: Callable[[], int | None]) -> int:
    """Run a job; its exit code: 0 done, 2 bad input (a one-line message on stderr, no
    traceback: `LshdistError`, an OS error such as a full disk or a file size limit -- its
    traceback logged at debug level, ``-v``), 130 interrupted.  Anything else is a bug and
    keeps its traceback (exit 1)."""
    try:
        return int(call() or 0)
    except LshdistError as exc:
        sys.stderr.write(f"{name}: error: {exc}\n")
        return 2
    except BrokenPipeError:  # `lshdist info X | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141
    except OSError as exc:
        logging.getLogger("lshdist").debug("%s: %r", name, exc, exc_info=True)
        sys.stderr.write(f"{name}: error: {describe_os_error(exc)}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
