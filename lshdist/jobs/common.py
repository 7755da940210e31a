"""Argument types shared by the jobs."""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager
from typing import Any

from lshdist.config import ClusterConfig, add_options


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


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    """The options of `ClusterConfig` (every job that runs on Dask)."""
    add_options(p, ClusterConfig, title="cluster")


def client_from_config(cfg: ClusterConfig) -> AbstractContextManager[Any]:
    """The Dask client a `ClusterConfig` asks for (a context manager)."""
    from lshdist.cluster.client import dask_client

    return dask_client(cfg.scheduler, workers=cfg.workers, processes=not cfg.in_process,
                       timeout=cfg.connect_timeout)
