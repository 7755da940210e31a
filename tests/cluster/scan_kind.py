"""A toy index kind in one module: the exact scan under a model's explicit metric.

It is what a plug-in kind is: a manifest class (`ScanManifest`) and a kind object (`SCAN`)
with the methods of `lshdist.cluster.driver.IndexKind`, run by the one cluster driver and
found by `lshdist.cluster.kinds` once registered -- nothing of lshdist is edited for it.  Each
segment holds ``G x`` of its rows (float32) and their ids; a query chunk is mapped to ``G q``
once per worker and every segment answers its exact top k.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from lshdist.cluster import driver
from lshdist.cluster.checks import check_data_for_model, check_query_inputs
from lshdist.cluster.pipeline import segment_shards
from lshdist.config import IndexConfig, QueryConfig
from lshdist.errors import FormatError, InputError
from lshdist.metric.learned import ExplicitMetric, sq_euclidean
from lshdist.store.atomic import check_not_input, check_output
from lshdist.store.dataset import Dataset
from lshdist.store.index import (
    FORMAT,
    KindEntry,
    KindManifest,
    new_segment_name,
    read_arrays_segment,
    read_index_manifest,
    write_arrays_segment,
)
from lshdist.store.model import load_model, read_model_meta
from lshdist.store.objects import ObjectPath, as_path, resolved


@dataclass(frozen=True, kw_only=True)
class ScanManifest(KindManifest):
    method: ClassVar[str] = "scan"

    @classmethod
    def check_params(cls, params: Any, where: str) -> None:
        if params.get("space") != "Gx":
            raise FormatError(f"{where}: params.space={params.get('space')!r}, expected 'Gx'")


# ------------------------------------------------------------------------- worker tasks


def load_metric(model: str) -> ExplicitMetric:
    metric, _ = load_model(model)
    assert isinstance(metric, ExplicitMetric)
    return metric


def write_rows(data: str, shards: tuple[int, int], metric: ExplicitMetric, index_dir: str,
               name: str) -> KindEntry:
    ds = Dataset(data)
    a, b = (int(ds.shard_bounds[i]) for i in shards)
    Z = metric.transform(ds.read_rows(a, b)).astype(np.float32)
    return write_arrays_segment(index_dir, name, {"ids": np.asarray(ds.ids()[a:b], np.int64),
                                                  "Z": Z})


def load_rows(index: str, entry: KindEntry) -> tuple[np.ndarray, np.ndarray]:
    arrays, _ = read_arrays_segment(index, entry)
    return arrays["ids"], arrays["Z"]


def encode(queries: str, start: int, stop: int, metric: ExplicitMetric
           ) -> tuple[np.ndarray, None, np.ndarray]:
    ds = Dataset(queries)
    return (metric.transform(ds.read_rows(start, stop)).astype(np.float32), None,
            np.asarray(ds.ids()[start:stop], np.int64))


def search(segment: tuple[np.ndarray, np.ndarray], encoded: tuple[Any, ...], k: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids, Z = segment
    D = sq_euclidean(encoded[0], Z)
    m = min(k, len(ids))
    order = np.lexsort((np.broadcast_to(ids, D.shape), D), axis=1)[:, :m]  # (distance, id)
    dist = np.take_along_axis(D, order, axis=1)
    pad = ((0, 0), (0, k - m))
    return (np.pad(dist, pad, constant_values=np.inf), np.pad(ids[order], pad, constant_values=-1),
            np.full(len(D), len(ids), np.int64))


# ---------------------------------------------------------------------------- the kind


@dataclass
class ScanBuild:
    data: Dataset
    model: Path | ObjectPath
    out: Path | ObjectPath
    overwrite: bool
    meta: dict[str, Any]
    segments: list[tuple[int, int]] = field(default_factory=list)
    append: bool = False
    skipped: bool = False

    @property
    def inputs(self) -> tuple[Any, ...]:
        return (self.data.path, self.model)

    @property
    def memory_bytes(self) -> int:
        return 0


@dataclass
class ScanQuery(driver.DatasetQuery):
    index: Path | ObjectPath
    queries: Dataset
    out: Path | ObjectPath
    cfg: QueryConfig
    overwrite: bool
    manifest: ScanManifest


class ScanKind:
    name = "scan"
    manifest = ScanManifest

    def chooses(self, cfg: IndexConfig) -> bool:
        return cfg.method == self.name

    def answers(self, manifest: Any) -> bool:
        return isinstance(manifest, ScanManifest)

    def plan_build(self, *, data: str, model: str, out: str, cfg: IndexConfig,
                   append: bool = False, overwrite: bool = False, batch: str | None = None
                   ) -> ScanBuild:
        if append or batch:
            raise InputError("the scan kind builds whole indexes only")
        ds, meta = Dataset(data), read_model_meta(model)
        check_data_for_model(ds, meta, "dataset")
        if meta["kind"] != "explicit" or ds.kind != "dense":
            raise InputError("the scan kind needs dense rows and an explicit metric")
        check_not_input(out, (data, model))
        check_output(out, overwrite, kind=FORMAT)
        return ScanBuild(ds, as_path(model), as_path(out), overwrite, meta,
                         segment_shards(ds.shard_bounds.tolist(), cfg.segment_rows))

    def landed(self, plan: ScanBuild, manifest: Any) -> bool:
        return False

    def build(self, client: Any, plan: ScanBuild, index_dir: Path | ObjectPath,
              run: driver.Run) -> driver.Built:
        (index_dir / "segments").mkdir(parents=True, exist_ok=True)
        metric_f = driver.share(client, load_metric, resolved(plan.model))
        names = [new_segment_name() for _ in plan.segments]
        writes = [client.submit(write_rows, str(plan.data.path), s, metric_f, str(index_dir), n,
                                pure=False) for s, n in zip(plan.segments, names)]
        try:
            entries = driver.wait_all(writes, "scan", run.stall)
        finally:
            client.cancel([metric_f, *writes])
        m = ScanManifest(model=resolved(plan.model), model_checksum=plan.meta["checksum"],
                         kind="explicit", d=plan.data.d, seed=0, rows=sum(e.rows for e in entries),
                         segments=tuple(entries), params={"space": "Gx"})
        return driver.Built(names, lambda current: m)

    def plan_query(self, *, index: str, source: str, out: str, cfg: QueryConfig,
                   overwrite: bool = False, hyperplanes: bool = False) -> ScanQuery:
        m = read_index_manifest(index)
        if hyperplanes or not isinstance(m, ScanManifest):
            raise InputError("the scan kind answers k-NN queries of scan indexes")
        _, qds = check_query_inputs(index, m, source, out, overwrite)
        return ScanQuery(as_path(index), qds, as_path(out), cfg, overwrite, m)

    def load(self, client: Any, plan: ScanQuery) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
        return ({"metric": driver.share(client, load_metric, plan.manifest.model)},
                [(e.rows, (load_rows, str(plan.index), e)) for e in plan.manifest.segments])

    def prepare(self, client: Any, plan: ScanQuery, loaded: driver.Loaded, run: driver.Run
                ) -> tuple[ScanQuery, dict[str, Any]]:
        return plan, {"mode": "scan", "method": self.name}

    def chunk(self, plan: ScanQuery, loaded: driver.Loaded, start: int, stop: int
              ) -> driver.Chunk:
        return driver.Chunk((encode, str(plan.queries.path), start, stop,
                             loaded.shared["metric"]), (search, plan.cfg.k))

    def describe(self, manifest: Any) -> str:
        return f"{manifest.rows} rows in {len(manifest.segments)} segments (scan)"

    def summary(self, result: dict[str, Any]) -> str:
        return f"{result['queries']} queries x {result['segments']} segments -> {result['out']}"


SCAN = ScanKind()
