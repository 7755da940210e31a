"""``lshdist index``: encode a dataset's shards on the cluster and build the segments."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lshdist.config import ClusterConfig, IndexConfig, add_options, from_args
from lshdist.jobs.common import add_cluster_options, client_from_config


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "index", help="build (or --append to) a hashed index on Dask",
        description="Hash DATASET with MODEL's learned hash functions on "
                    "Dask workers; one permutation-sorted segment per run "
                    "of whole dataset shards.")
    p.add_argument("--data", required=True, metavar="DATASET", help="the dataset to index")
    p.add_argument("--model", required=True, metavar="MODEL",
                   help="the model whose hash functions and metric the index uses")
    p.add_argument("--out", required=True, metavar="INDEX", help="the index directory")
    add_options(p, IndexConfig, title="hashing and search")
    p.add_argument("--append", action="store_true",
                   help="add segments for DATASET to the existing INDEX (same model; the "
                        "index's own hashing parameters)")
    p.add_argument("--batch", metavar="LABEL",
                   help="label of this data (e.g. a day), recorded in the index: an --append "
                        "whose label the index has already adds nothing (re-runs are safe)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing index at INDEX (only an lshdist index)")
    add_cluster_options(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Plan the build with its index kind (`lshdist.cluster.kinds.for_build`: every input
    checked before any cluster starts), then run it on the cluster driver."""
    from lshdist.cluster import driver, kinds

    cluster = from_args(ClusterConfig, args)
    cfg = from_args(IndexConfig, args)
    kind = kinds.for_build(cfg)
    plan = kind.plan_build(data=args.data, model=args.model, out=args.out, cfg=cfg,
                           append=args.append, overwrite=args.overwrite, batch=args.batch)
    if not plan.skipped:  # (checked again under the index lock: a racing run may land it)
        with client_from_config(cluster) as client:
            m = driver.build(client, kind, plan, stall=cluster.stall_timeout)
    if plan.skipped:
        sys.stdout.write(f"index {args.out}: batch {args.batch!r} is in it already; nothing "
                         "appended\n")
        return 0
    sys.stdout.write(f"index {args.out}: {kind.describe(m)}\n")
    return 0
