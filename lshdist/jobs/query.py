"""``lshdist query``: bulk k-NN of a query dataset against an index, results in Parquet."""

from __future__ import annotations

import argparse

from lshdist.cluster.pipeline import query_index
from lshdist.jobs.common import add_cluster_options, client_from_args, positive_int


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("query", help="answer a query dataset in bulk on Dask",
                              description="k nearest neighbours of every row of QUERIES under the "
                                          "index's learned metric; Parquet parts in RESULTS.")
    p.add_argument("--index", required=True, metavar="INDEX")
    p.add_argument("--queries", required=True, metavar="DATASET")
    p.add_argument("--k", type=positive_int, default=10)
    p.add_argument("--out", required=True, metavar="RESULTS")
    p.add_argument("--mode", choices=("hash", "scan"), default="hash",
                   help="hashed search (default) or the exact distributed linear scan")
    p.add_argument("--query-chunk", type=positive_int, default=5_000, metavar="n")
    p.add_argument("--overwrite", action="store_true")
    add_cluster_options(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        r = query_index(client, index=args.index, queries=args.queries, k=args.k, out=args.out,
                        mode=args.mode, query_chunk=args.query_chunk, overwrite=args.overwrite)
    print(f"{r['queries']} queries x {r['segments']} segments -> {r['out']}")
    return 0
