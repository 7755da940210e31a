"""``lshdist gc INDEX``: remove what a failed or interrupted build left in or beside an index."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lshdist.jobs.common import positive_float


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "gc", help="remove an index's orphans (left by failed builds)",
        description="Remove segment directories the manifest of INDEX does not name and "
                    "temporary or replaced copies (.*.tmp-*, .*.old-*) inside and beside it. "
                    "Holds the index lock meanwhile, so no build or append runs at the same "
                    "time. On object storage (s3://...), where there is no lock, unnamed "
                    "segments younger than --min-age are kept: an append may still be writing "
                    "them.")
    p.add_argument("index", metavar="INDEX", help="an index directory")
    p.add_argument("--dry-run", action="store_true",
                   help="list what would be removed, remove nothing (default: remove)")
    p.add_argument("--timeout", type=positive_float, default=30.0, metavar="SECONDS",
                   help="how long to wait for a running build's lock (default 30)")
    p.add_argument("--min-age", type=positive_float, default=None, metavar="SECONDS",
                   help="object storage only: keep unnamed segments younger than this "
                        "(default 21600, 6 hours)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from lshdist.store.index import remove_orphans

    removed = remove_orphans(args.index, timeout=args.timeout, dry_run=args.dry_run,
                             min_age=args.min_age)
    verb = "would remove" if args.dry_run else "removed"
    for path in removed:
        sys.stdout.write(f"{verb} {path}\n")
    sys.stdout.write(f"{args.index}: {verb} {len(removed)} orphans\n" if removed
                     else f"{args.index}: no orphans\n")
    return 0
