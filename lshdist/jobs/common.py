"""Argument types shared by the jobs."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers >= 1, comma-separated")
    return values


def percentiles(text: str):
    if text in ("code", "paper"):
        return text
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give 'code' (5,95), 'paper' (1,99) or two numbers LO,HI") from None
    return (lo, hi)


def add_learner_options(p: argparse.ArgumentParser) -> None:
    """The ITML options of `lshdist learn` (also used by `lshdist evaluate`)."""
    g = p.add_argument_group("metric learning (ITML)")
    g.add_argument("--kind", choices=("explicit", "implicit"),
                   help="explicit d x d (default for dense data) or kernelized over c basis "
                        "points (default for sparse data)")
    g.add_argument("--basis", type=positive_int, default=300, metavar="c",
                   help="implicit: number of basis points (default 300)")
    g.add_argument("--route", choices=("span", "basis"), default="span",
                   help="implicit: constraints among any points via span coordinates (default) "
                        "or among basis points via Lemma 2")
    g.add_argument("--constraints", type=positive_int, metavar="n",
                   help="pairs drawn from labels (default 10000 explicit, 2000 implicit)")
    g.add_argument("--strategy", choices=("neighbors", "random"), default="neighbors",
                   help="how pairs are drawn from labels (default neighbors)")
    g.add_argument("--neighbors", type=positive_int, default=10, metavar="k",
                   help="neighbors strategy: neighbours per anchor (default 10)")
    g.add_argument("--gamma", type=positive_float, default=1.0, help="slack (default 1)")
    g.add_argument("--percentiles", type=percentiles, default="code",
                   help="bounds: 'code' = 5th/95th (default), 'paper' = 1st/99th, or LO,HI")
    g.add_argument("--max-iter", type=positive_int, help="passes over the constraints "
                   "(default 1000 explicit, 100 implicit)")
    g.add_argument("--tol", type=positive_float, default=1e-3, help="convergence tolerance")
    g.add_argument("--prior", choices=("identity", "inverse-covariance"), default="identity",
                   help="explicit: prior A0 (default identity)")
    g.add_argument("--seed", type=int, default=0, help="seed of constraints, basis and hashes")


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="an existing Dask scheduler (default: start a LocalCluster)")
    g.add_argument("--workers", type=positive_int, default=2,
                   help="LocalCluster worker processes, one thread each (default 2)")
    g.add_argument("--connect-timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help="how long to wait for --scheduler (default 10)")
    g.add_argument("--in-process", action="store_true",
                   help="run the LocalCluster's workers as threads of this process")


def add_hash_options(p: argparse.ArgumentParser, *, window: int = 8) -> None:
    """b, epsilon | M, W and H: the hashing and search options of `index` and `evaluate`."""
    p.add_argument("--bits", type=positive_int, default=256, metavar="b")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--epsilon", type=positive_float, metavar="e",
                   help="M = ceil(2 n^(1/(1+e))) permutations for n indexed rows (default e=1)")
    g.add_argument("--permutations", type=positive_int, metavar="M")
    p.add_argument("--window", type=positive_int, default=window, metavar="W")
    p.add_argument("--hamming-keep", type=int, default=0, metavar="H",
                   help="re-rank only the H candidates nearest in Hamming distance (0: all)")


def client_from_args(args: argparse.Namespace):
    """The Dask client the cluster options ask for (a context manager)."""
    from lshdist.cluster.client import dask_client

    return dask_client(args.scheduler, workers=args.workers, processes=not args.in_process,
                       timeout=args.connect_timeout)
