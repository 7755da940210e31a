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
    from lshdist.cluster.pipeline import plan_query, run_query
    from lshdist.store.index import SubspaceManifest, read_index_manifest

    cluster = from_args(ClusterConfig, args)
    if args.hyperplanes is not None:
        return _run_hyperplanes(args, cluster)
    if isinstance(read_index_manifest(args.index), SubspaceManifest):
        return _run_subspace(args, cluster)
    plan = plan_query(index=args.index, queries=args.queries, out=args.out,
                      cfg=from_args(QueryConfig, args), overwrite=args.overwrite)
    with client_from_config(cluster) as client:
        r = run_query(client, plan, stall=cluster.stall_timeout)
    sys.stdout.write(f"{r['queries']} queries x {r['segments']} segments -> {r['out']}\n")
    if r.get("measured_recall"):
        from lshdist.index.recall_check import line_of

        sys.stdout.write(line_of(r["measured_recall"]) + "\n")
    return 0


def _run_hyperplanes(args: argparse.Namespace, cluster: ClusterConfig) -> int:
    from lshdist.cluster.hyperplane import plan_hyperplane_query, run_hyperplane_query

    plan = plan_hyperplane_query(index=args.index, hyperplanes=args.hyperplanes, out=args.out,
                                 cfg=from_args(QueryConfig, args), overwrite=args.overwrite)
    with client_from_config(cluster) as client:
        r = run_hyperplane_query(client, plan, stall=cluster.stall_timeout)
    sys.stdout.write(f"{r['queries']} hyperplanes x {r['segments']} segments -> {r['out']}\n")
    return 0


def _run_subspace(args: argparse.Namespace, cluster: ClusterConfig) -> int:
    """A subspace index (`lshdist.cluster.subspace`): routed to its groups, searched there."""
    from lshdist.cluster.subspace_query import plan_subspace_query, run_subspace_query

    plan = plan_subspace_query(index=args.index, queries=args.queries, out=args.out,
                               cfg=from_args(QueryConfig, args), overwrite=args.overwrite)
    with client_from_config(cluster) as client:
        r = run_subspace_query(client, plan, stall=cluster.stall_timeout)
    op = r["operating_point"]
    sys.stdout.write(f"{r['queries']} queries x {r['segments']} groups ({r['mode']}, probe="
                     f"{op['n_probe']}, candidates={op['n_candidates']}) -> {r['out']}\n")
    return 0
