"""lshdist: fast similarity search under learned metrics, as a distributed Dask batch job.

The public API (`lshdist.api`): the estimators `ITML` and `KernelITML`, the one-process
`MetricIndex`, the jobs `ingest`, `learn`, `build_index` and `query_index`, and
`read_results`.  They are loaded on first use, so that ``import lshdist`` (and the command
line's ``--help``) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["ITML", "KernelITML", "MetricIndex", "__version__", "build_index", "ingest",
           "learn", "query_index", "read_results"]

if TYPE_CHECKING:
    from lshdist.api import (
        ITML,
        KernelITML,
        MetricIndex,
        build_index,
        ingest,
        learn,
        query_index,
        read_results,
    )


def __getattr__(name: str) -> Any:
    if name in __all__:
        from lshdist import api

        value = getattr(api, name)
        globals()[name] = value  # once loaded, an ordinary attribute
        return value
    raise AttributeError(f"module 'lshdist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
