"""What Dask is told an lshdist object weighs in a worker's memory.

Dask sizes every task result with `dask.sizeof.sizeof`, and an object it does not know counts
as `sys.getsizeof`: 56 bytes for a fitted 100,000-row segment that holds ~0.5 GB of arrays.
Blind to the weights, the scheduler's work stealing moved segments between workers as if they
were free — in the 1 M index build, 11 of its tasks waited 10.8 s for fitted segments copied
from the other worker, and write tasks 3.5 s more — and
the workers' memory accounting saw none of the index.  `register` gives Dask the bytes of the
arrays an lshdist object holds (`held_bytes`).
"""

from __future__ import annotations

import sys
from typing import Any

#: modules whose objects are walked into (their attributes); others count as `sys.getsizeof`
_WALKED = ("lshdist", "scipy.sparse")


def held_bytes(obj: Any) -> int:
    """Bytes of the numpy arrays reachable from ``obj`` — through containers and the
    attributes of lshdist objects and scipy sparse matrices — each array counted once (by
    identity; a view counts its own bytes: what pickling it would copy), plus
    `sys.getsizeof` of every other leaf."""
    import numpy as np

    total, seen, stack = 0, set(), [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            total += int(o.nbytes)
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
        else:
            inner = _attributes(o) if type(o).__module__.startswith(_WALKED) else None
            if inner is None:
                total += sys.getsizeof(o)
            else:
                stack.extend(inner)
    return total


def _attributes(o: Any) -> list[Any] | None:
    """The values of an object's ``__dict__`` and ``__slots__`` (None if it has neither)."""
    values: list[Any] | None = None
    if hasattr(o, "__dict__"):
        values = list(vars(o).values())
    for cls in type(o).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(o, name):
                values = [*(values or []), getattr(o, name)]
    return values


def _register() -> None:
    from dask.sizeof import sizeof

    from lshdist.hashing.families import HashFamily
    from lshdist.index.hyperplane import HyperplaneIndex, MarginDensePayload, MarginSparsePayload
    from lshdist.index.payload import DensePayload, KernelPayload
    from lshdist.index.permutation import PackedSegment, PermutationIndex
    from lshdist.index.searcher import MetricIndex
    from lshdist.index.subspace import SubspaceIndex
    from lshdist.metric.learned import ExplicitMetric, ImplicitMetric
    from lshdist.store.subspace import GroupSegment

    sizeof.register((PermutationIndex, PackedSegment, DensePayload, KernelPayload,
                     MarginDensePayload, MarginSparsePayload, HyperplaneIndex, SubspaceIndex,
                     GroupSegment, MetricIndex, HashFamily, ExplicitMetric, ImplicitMetric),
                    held_bytes)  # type: ignore[no-untyped-call]


def register() -> None:
    """Size lshdist objects by `held_bytes` in this process (lazily: the classes are imported
    when Dask first sizes an object of an lshdist module).  Called when `lshdist.cluster` is
    imported — which a worker does before it runs any of lshdist's tasks.  A worker may have
    sized an lshdist object before (data replicated to it first): Dask cached the default for
    that class, and the cache is cleared here so that the lazy registration applies to it."""
    from dask.sizeof import sizeof

    sizeof.register_lazy("lshdist", _register)  # type: ignore[no-untyped-call]
    for cls in [c for c in sizeof._lookup if _ours(c)]:
        del sizeof._lookup[cls]


def _ours(cls: Any) -> bool:
    return str(getattr(cls, "__module__", "")).partition(".")[0] == "lshdist"
