"""The batch entry points of ``jobs/`` (``python jobs/NAME.py CONFIG``): argument parsing and
the typed job config (`lshdist.config.load_job_config`) only; the work is the library's.

Exit codes (every script): 0 done, or nothing to do (a day appended already); 2 bad input, a
bad config, a lock held by another run past its timeout, an unreachable or stalled cluster
(one line on stderr, nothing half-written); 130 interrupted; 1 a bug (with its traceback).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable, Sequence

from lshdist.cli import configure_logging, guarded
from lshdist.config import JobConfig, load_job_config
from lshdist.jobs.common import client_from_config

EXIT_CODES = ("exit codes: 0 done or nothing to do; 2 bad input or config, lock held by "
              "another run, cluster unreachable or stalled (one-line message); 130 "
              "interrupted; 1 unexpected error (traceback)")


def _parser(name: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"jobs/{name}.py", description=description,
                                epilog=EXIT_CODES)
    p.add_argument("config", metavar="CONFIG", help="the job's YAML file (configs/jobs/)")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="-v: debug messages; -vv: Dask's too")
    return p


def _main(name: str, p: argparse.ArgumentParser, argv: Sequence[str] | None,
          work: Callable[[JobConfig, argparse.Namespace], int]) -> int:
    args = p.parse_args(argv)
    configure_logging(args.verbose)
    return guarded(f"jobs/{name}.py", lambda: work(load_job_config(args.config), args))


def build_index(argv: Sequence[str] | None = None) -> int:
    """``jobs/build_index.py CONFIG [--overwrite]``: paths.data under paths.model into
    paths.index, with the index: and cluster: sections."""
    p = _parser("build_index", "Build the index of a job config (paths.data, paths.model -> "
                               "paths.index).")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index")

    def work(job: JobConfig, args: argparse.Namespace) -> int:
        from lshdist.cluster import driver, kinds

        kind = kinds.for_build(job.index)
        plan = kind.plan_build(data=str(job.input("data")), model=str(job.input("model")),
                               out=str(job.output("index")), cfg=job.index,
                               overwrite=args.overwrite)
        with client_from_config(job.cluster) as client:
            m = driver.build(client, kind, plan, stall=job.cluster.stall_timeout)
        sys.stdout.write(f"index {plan.out}: {kind.describe(m)}\n")
        return 0

    return _main("build_index", p, argv, work)


def bulk_query(argv: Sequence[str] | None = None) -> int:
    """``jobs/bulk_query.py CONFIG [--overwrite]``: paths.queries against paths.index into
    paths.results, with the query: and cluster: sections."""
    p = _parser("bulk_query", "Answer a job config's queries (paths.index, paths.queries -> "
                              "paths.results).")
    p.add_argument("--overwrite", action="store_true", help="replace existing results")

    def work(job: JobConfig, args: argparse.Namespace) -> int:
        from lshdist.cluster import driver, kinds

        index = str(job.input("index"))
        kind = kinds.for_index(index)
        plan = kind.plan_query(index=index, source=str(job.input("queries")),
                               out=str(job.output("results")), cfg=job.query,
                               overwrite=args.overwrite)
        with client_from_config(job.cluster) as client:
            r = driver.query(client, kind, plan, stall=job.cluster.stall_timeout)
        sys.stdout.write(f"results {r['out']}: {r['queries']} queries, mode {r['mode']}\n")
        return 0

    return _main("bulk_query", p, argv, work)


def _day(text: str) -> str:
    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a day YYYY-MM-DD") from None


def daily_append(argv: Sequence[str] | None = None) -> int:
    """``jobs/daily_append.py CONFIG [--day YYYY-MM-DD]``: append a day (default yesterday)."""
    p = _parser("daily_append", "Append one day's input (daily.input) to paths.index: at most "
                                "once per day, one run at a time, ids unique per day; then "
                                "compact when small segments pile up.")
    p.add_argument("--day", type=_day, metavar="YYYY-MM-DD",
                   default=(datetime.date.today() - datetime.timedelta(days=1)).isoformat(),
                   help="the day to append (default: yesterday, %(default)s)")

    def work(job: JobConfig, args: argparse.Namespace) -> int:
        from lshdist.cluster.daily import daily_append as append

        r = append(job, args.day, client_from_config)
        what = (f"appended {r['rows']} rows" if r["appended"]
                else "already appended, nothing added")
        sys.stdout.write(f"day {r['day']}: {what}; index has {r['segments']} segments"
                         + (f" ({r['compacted']} merged away)" if r["compacted"] else "") + "\n")
        return 0

    return _main("daily_append", p, argv, work)
