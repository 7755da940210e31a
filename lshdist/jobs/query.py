"""``lshdist query``: bulk k-NN of a query dataset against an index, results in Parquet."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lshdist.config import ClusterConfig, QueryConfig, add_options, from_args
from lshdist.jobs.common import add_cluster_options, client_from_config


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "query", help="answer a query dataset in bulk on Dask",
        description="k nearest neighbours of every row of QUERIES under the "
                    "index's learned metric; Parquet parts in RESULTS.")
    p.add_argument("--index", required=True, metavar="INDEX", help="an index from `lshdist index`")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--queries", metavar="DATASET", help="the query rows")
    src.add_argument("--hyperplanes", metavar="W.npy|DATASET",
                     help="hyperplane queries (an index built with --family): the points "
                          "nearest to each hyperplane w^T x = 0, rows of W being the normals w; "
                          "query_id = row of W.npy (or the dataset's ids), distance = "
                          "|w^T x|/||w||")
    p.add_argument("--out", required=True, metavar="RESULTS", help="the results directory")
    add_options(p, QueryConfig, title="search")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing results at RESULTS (only lshdist results)")
    add_cluster_options(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Plan the query with the index's kind (`lshdist.cluster.kinds.for_index`: every input
    checked before any cluster starts), then run it on the cluster driver."""
    from lshdist.cluster import driver, kinds

    cluster = from_args(ClusterConfig, args)
    kind = kinds.for_index(args.index)
    hyperplanes = args.hyperplanes is not None
    plan = kind.plan_query(index=args.index, source=args.hyperplanes if hyperplanes
                           else args.queries, out=args.out, cfg=from_args(QueryConfig, args),
                           overwrite=args.overwrite, hyperplanes=hyperplanes)
    with client_from_config(cluster) as client:
        r = driver.query(client, kind, plan, stall=cluster.stall_timeout)
    sys.stdout.write(kind.summary(r) + "\n")
    return 0
