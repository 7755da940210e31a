"""Argument types shared by the jobs."""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager
from typing import Any

from lshdist.config import (
    INT_LIST,
    NONNEG,
    POSITIVE,
    POSITIVE_FLOAT,
    ClusterConfig,
    add_options,
    cli_type,
)

#: argparse types of options outside the config sections, with the config's own rules
positive_int = cli_type(POSITIVE, "positive_int")
non_negative_int = cli_type(NONNEG, "non_negative_int")
positive_float = cli_type(POSITIVE_FLOAT, "positive_float")
int_list = cli_type(INT_LIST, "int_list")


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    """The options of `ClusterConfig` (every job that runs on Dask)."""
    add_options(p, ClusterConfig, title="cluster")


def client_from_config(cfg: ClusterConfig) -> AbstractContextManager[Any]:
    """The Dask client a `ClusterConfig` asks for (a context manager)."""
    from lshdist.cluster.client import client_for

    return client_for(cfg)
