"""``lshdist compact INDEX``: merge an index's small segments into larger ones."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lshdist.config import ClusterConfig, DailyConfig, from_args
from lshdist.jobs.common import (
    add_cluster_options,
    client_from_config,
    positive_float,
    positive_int,
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "compact", help="merge an index's small segments into larger ones",
        description="When INDEX has at least --min-segments segments of fewer than "
                    "--segment-rows rows, merge them (in manifest order) into segments of at "
                    "most --segment-rows rows. By default the small segments are packed, file "
                    "for file, as parts of one segment each: every query, hashed or exact, "
                    "answers exactly as before, with fewer segments to load and fewer tasks. "
                    "With --refit their lists are fitted again over the merged rows (a fresh "
                    "build's segments; hashed answers change, the operating point is "
                    "calibrated again). Holds the index lock; the manifest is swapped in one "
                    "rename, then the old segments are removed: a query sees the old or the "
                    "new index.")
    p.add_argument("index", metavar="INDEX", help="an index directory")
    p.add_argument("--min-segments", type=positive_int,
                   default=DailyConfig.compact_min_segments, metavar="N",
                   help="compact only when at least N segments are small (default %(default)s)")
    p.add_argument("--segment-rows", type=positive_int,
                   default=DailyConfig.compact_segment_rows, metavar="n",
                   help="segments below n rows are small; merged segments have at most n rows "
                        "(default %(default)s)")
    p.add_argument("--refit", action="store_true",
                   help="fit the merged segments' lists again (as a fresh build with larger "
                        "segments) instead of packing them; hashed answers change")
    p.add_argument("--timeout", type=positive_float, default=30.0, metavar="SECONDS",
                   help="how long to wait for a running build's lock (default 30)")
    add_cluster_options(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from lshdist.cluster.compact import plan_compact, run_compact

    cluster = from_args(ClusterConfig, args)
    plan = plan_compact(args.index, min_segments=args.min_segments,
                        segment_rows=args.segment_rows, refit=args.refit)
    if not plan.groups:
        sys.stdout.write(f"{args.index}: {plan.segments} segments, fewer than "
                         f"{args.min_segments} small ones; nothing to compact\n")
        return 0
    with client_from_config(cluster) as client:
        out = run_compact(client, plan, lock_timeout=args.timeout, stall=cluster.stall_timeout)
    sys.stdout.write(f"{args.index}: {out['before']} -> {out['after']} segments "
                     f"({'re-fitted' if args.refit else 'packed: answers unchanged'})\n")
    return 0
