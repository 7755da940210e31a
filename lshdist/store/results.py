"""Query results on disk: the one owner of their format (ARCHITECTURE.md section 3).

Layout of a results directory::

    results.json                  format, version, k, queries, parts (written last)
    neighbors/part-NNNNN.parquet  query_id:int64, rank:int32, neighbor_id:int64, distance:float32
    stats/part-NNNNN.parquet      query_id:int64, candidates:int32

A query with fewer than k neighbours has fewer rows in ``neighbors``; every query has one row
in ``stats``.  The directory is written aside and renamed into place (`write_results`), so a
reader sees a previous complete result or the new complete one, never a mix.

Readers (`read_results`, `iter_parts`) return neighbours by query id: part rows are matched to
their query through the ids themselves, never through their order.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lshdist.errors import FormatError, InputError
from lshdist.store.atomic import atomic_dir, atomic_write_text
from lshdist.store.files import check_file, load_json
from lshdist.store.objects import ObjectPath, as_path

FORMAT = "lshdist-results"
VERSION = 1
MANIFEST = "results.json"
NEIGHBORS_SCHEMA = pa.schema([("query_id", pa.int64()), ("rank", pa.int32()),
                              ("neighbor_id", pa.int64()), ("distance", pa.float32())])
STATS_SCHEMA = pa.schema([("query_id", pa.int64()), ("candidates", pa.int32())])


def arrow_path(path: Path | ObjectPath) -> tuple[str, Any]:
    """``(path, filesystem)`` for pyarrow: a local path as is, an object through its fsspec
    file system."""
    if isinstance(path, ObjectPath):
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        return path.key, PyFileSystem(FSSpecHandler(path.fs))
    return str(path), None


def part_name(chunk: int) -> str:
    return f"part-{chunk:05d}.parquet"


#: result rows (queries x k) merged and written at a time, at most (a Parquet row group;
#: `queries_per_group`): a chunk's whole table is never in memory at once
GROUP_ROWS = 1 << 17


def queries_per_group(k: int) -> int:
    """Queries whose k results each go into one row group (`GROUP_ROWS` rows), at least 1."""
    return max(1, GROUP_ROWS // max(int(k), 1))


class PartWriter:
    """One chunk's Parquet parts (``neighbors/`` and ``stats/``), written a block of queries
    at a time (`write`), each block a row group; both files exist, with their schema, once
    the writer is closed, even for no queries."""

    def __init__(self, out_dir: str | os.PathLike[str], chunk: int) -> None:
        root = as_path(out_dir)
        self._paths = (root / "neighbors" / part_name(chunk), root / "stats" / part_name(chunk))
        where, fs = arrow_path(self._paths[0])
        self._neighbors = pq.ParquetWriter(where, NEIGHBORS_SCHEMA, filesystem=fs)
        try:
            where, fs = arrow_path(self._paths[1])
            self._stats = pq.ParquetWriter(where, STATS_SCHEMA, filesystem=fs)
        except BaseException:
            self._neighbors.close()
            self._paths[0].unlink(missing_ok=True)
            raise
        self.queries = 0

    def write(self, query_ids: np.ndarray, dist: np.ndarray, ids: np.ndarray,
              candidates: np.ndarray) -> None:
        """Results of the next queries: ``dist``/``ids`` (Q, k) ascending, -1 ids for missing
        neighbours; ``candidates`` (Q,)."""
        Q, k = ids.shape
        keep = (ids >= 0).ravel()
        self._neighbors.write_table(pa.table({
            "query_id": np.repeat(np.asarray(query_ids, np.int64), k)[keep],
            "rank": np.tile(np.arange(k, dtype=np.int32), Q)[keep],
            "neighbor_id": np.asarray(ids, np.int64).ravel()[keep],
            "distance": np.asarray(dist, np.float32).ravel()[keep],
        }, schema=NEIGHBORS_SCHEMA))
        capped = np.minimum(candidates, np.iinfo(np.int32).max).astype(np.int32)
        self._stats.write_table(pa.table({"query_id": np.asarray(query_ids, np.int64),
                                          "candidates": capped}, schema=STATS_SCHEMA))
        self.queries += int(Q)

    def close(self) -> None:
        try:
            self._neighbors.close()
        finally:
            self._stats.close()

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        try:
            self.close()
        finally:
            if kind is not None:  # a failed chunk leaves no truncated part behind
                for path in self._paths:
                    path.unlink(missing_ok=True)


def write_part(out_dir: str | os.PathLike[str], chunk: int, query_ids: np.ndarray,
               dist: np.ndarray, ids: np.ndarray, candidates: np.ndarray) -> int:
    """Write one chunk's results: ``dist``/``ids`` (Q, k) ascending, -1 ids for missing
    neighbours; ``candidates`` (Q,).  Returns Q."""
    with PartWriter(out_dir, chunk) as out:
        out.write(query_ids, dist, ids, candidates)
    return out.queries


@contextlib.contextmanager
def write_results(path: str | os.PathLike[str], *, k: int, overwrite: bool = False,
                  inputs: tuple[str | os.PathLike[str], ...] = (),
                  info: dict[str, Any] | None = None) -> Iterator[Path]:
    """Yield a temporary results directory (with ``neighbors/`` and ``stats/``) beside
    ``path``; parts are written into it with `write_part` or `PartWriter`; on success the
    manifest is written and the directory renamed to ``path``.  An existing ``path`` is
    replaced only with ``overwrite``, and only if it is an lshdist results directory.
    ``info`` (how the query ran: mode, operating point) is recorded in the manifest."""
    with atomic_dir(path, overwrite=overwrite, kind=FORMAT, inputs=inputs) as tmp:
        (tmp / "neighbors").mkdir()
        (tmp / "stats").mkdir()
        yield tmp
        parts = sorted(p.name for p in (tmp / "neighbors").glob("part-*.parquet"))
        n = 0
        for p in parts:
            where, fs = arrow_path(tmp / "stats" / p)
            n += pq.read_metadata(where, filesystem=fs).num_rows
        atomic_write_text(tmp / MANIFEST, json.dumps(
            {"format": FORMAT, "version": VERSION, "k": int(k), "queries": int(n),
             "parts": parts, "info": info or {}}, indent=2))


@dataclass(frozen=True)
class ResultsMeta:
    path: Path | ObjectPath
    k: int
    queries: int
    parts: tuple[str, ...]
    info: dict[str, Any]


def read_meta(path: str | os.PathLike[str]) -> ResultsMeta:
    root = as_path(path)
    if not root.is_dir():
        raise InputError(f"results {str(root)!r} do not exist; run `lshdist query` first")
    f = root / MANIFEST
    try:
        meta = load_json(f, f"{str(root)!r}: {MANIFEST}", "run the query again", root)
    except FileNotFoundError:
        raise FormatError(f"{str(root)!r} is not an lshdist results directory (no {MANIFEST}); "
                          "run `lshdist query` to write one") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FormatError(f"{str(root)!r} is not an lshdist results directory")
    if meta.get("version") != VERSION:
        raise FormatError(f"{str(root)!r}: results format version {meta.get('version')!r}, "
                          f"this lshdist reads {VERSION}")
    try:
        k, n, parts = int(meta["k"]), int(meta["queries"]), tuple(str(p) for p in meta["parts"])
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{str(root)!r}: {MANIFEST} lacks or mangles {exc}") from None
    for p in parts:
        if Path(p).name != p or not p.startswith("part-"):
            raise FormatError(f"{str(root)!r}: {MANIFEST} names part {p!r} outside the directory")
    info = meta.get("info", {})
    return ResultsMeta(root, k, n, parts, info if isinstance(info, dict) else {})


def _read_part(root: Path | ObjectPath, name: str, k: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                        np.ndarray]:
    try:
        for sub in ("neighbors", "stats"):  # no device or FIFO read without end
            check_file(root / sub / name, root)
        where, fs = arrow_path(root / "neighbors" / name)
        t = pq.read_table(where, schema=NEIGHBORS_SCHEMA, filesystem=fs)
        where, fs = arrow_path(root / "stats" / name)
        s = pq.read_table(where, schema=STATS_SCHEMA, filesystem=fs)
    except (OSError, pa.ArrowInvalid) as exc:
        raise FormatError(f"{str(root)!r}: part {name!r} is unreadable ({exc}); "
                          "run the query again") from None
    qids = s.column("query_id").to_numpy()
    cand = s.column("candidates").to_numpy()
    tq = t.column("query_id").to_numpy()
    rank = t.column("rank").to_numpy()
    if len(tq) and (rank.min() < 0 or rank.max() >= k):
        raise FormatError(f"{str(root)!r}: part {name!r} has ranks outside 0..{k - 1}; "
                          "run the query again")
    row = rows_of(qids, tq, what=f"{str(root)!r}: the stats of part {name!r}")
    nb = np.full((len(qids), k), -1, np.int64)
    dist = np.full((len(qids), k), np.inf, np.float32)
    nb[row, rank] = t.column("neighbor_id").to_numpy()
    dist[row, rank] = t.column("distance").to_numpy()
    return qids, nb, dist, cand


def iter_parts(results: str | os.PathLike[str]) -> Iterator[tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray, np.ndarray]]:
    """Per part: ``(query_ids (Q,), neighbor_ids (Q, k), distances (Q, k), candidates (Q,))``,
    rows in the part's query order, -1 / inf where a query has fewer than k neighbours."""
    meta = read_meta(results)
    for name in meta.parts:
        yield _read_part(meta.path, name, meta.k)


def read_results(results: str | os.PathLike[str], query_ids: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All results in memory: ``(query_ids, neighbor_ids, distances, candidates)``.

    With ``query_ids``, rows follow that order (every one must be present); otherwise the
    order of the parts.
    """
    parts = list(iter_parts(results))
    qids = np.concatenate([p[0] for p in parts])
    nb, dist, cand = (np.concatenate([p[i] for p in parts]) for i in (1, 2, 3))
    if query_ids is None:
        return qids, nb, dist, cand
    rows = rows_of(qids, np.asarray(query_ids, np.int64), what=f"results {str(results)!r}")
    return qids[rows], nb[rows], dist[rows], cand[rows]


def rows_of(ids: np.ndarray, wanted: np.ndarray, *, what: str) -> np.ndarray:
    """Positions in ``ids`` (unique, any order) of every id in ``wanted``; refuses a missing id."""
    if not len(ids):
        rows, missing = np.zeros(len(wanted), np.int64), np.ones(len(wanted), bool)
    else:
        order = np.argsort(ids, kind="stable")
        pos = np.minimum(np.searchsorted(ids, wanted, sorter=order), len(ids) - 1)
        rows = order[pos]
        missing = ids[rows] != wanted
    if missing.any():
        raise FormatError(f"{what} holds no row for id {int(wanted[missing][0])} "
                          f"({int(missing.sum())} ids missing)")
    return rows
