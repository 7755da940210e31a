"""``lshdist index``: encode a dataset's shards on the cluster and build the segments."""

from __future__ import annotations

import argparse

from lshdist.cluster.pipeline import build_index
from lshdist.jobs.common import add_cluster_options, add_hash_options, client_from_args, positive_int


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("index", help="build (or --append to) a hashed index on Dask",
                              description="Hash DATASET with MODEL's learned hash functions on "
                                          "Dask workers; one permutation-sorted segment per task.")
    p.add_argument("--data", required=True, metavar="DATASET")
    p.add_argument("--model", required=True, metavar="MODEL")
    p.add_argument("--out", required=True, metavar="INDEX")
    add_hash_options(p)
    p.add_argument("--segment-rows", type=positive_int, default=100_000, metavar="n")
    p.add_argument("--baseline", action="store_true",
                   help="Charikar's random hyperplanes instead of the learned hash functions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--append", action="store_true",
                   help="add segments for DATASET to an existing INDEX (same model)")
    p.add_argument("--overwrite", action="store_true")
    add_cluster_options(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        m = build_index(client, data=args.data, model=args.model, out=args.out, bits=args.bits,
                        epsilon=args.epsilon, permutations=args.permutations,
                        window=args.window, hamming_keep=args.hamming_keep,
                        segment_rows=args.segment_rows, learned=not args.baseline,
                        seed=args.seed, append=args.append, overwrite=args.overwrite)
    print(f"index {args.out}: {m['rows']} rows in {len(m['segments'])} segments "
          f"(b={m['bits']}, W={m['window']})")
    return 0
