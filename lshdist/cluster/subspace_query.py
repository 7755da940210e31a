"""Queries of a subspace-partition index on Dask (``lshdist query`` of an index built with
``lshdist index --method subspace``, `lshdist.cluster.subspace`).

The model and the router are loaded once on a worker each (`share`) and copied; the group
segments are loaded (verified) spread over the workers.  Per query chunk one task maps the
queries to ``G x``, routes them (`probe_mask`: the ``n_probe`` nearest subspaces, more while
they hold fewer than k rows), one task per (chunk, group) runs where the group lives and
searches the chunk's queries routed there (`search_group`), and the partial top-k lists are
merged by (distance, id) and written as Parquet parts (`lshdist.cluster.tasks.merge_and_write`,
the permutation index's writer).  ``--mode scan`` searches every group by the exact scan: the
exact answer under the index's metric.  ``--target-recall R`` first calibrates n_probe and
n_candidates on a sample of the queries (`lshdist.index.subspace_calibrate`: the exact top-k
of the sample by a scan of every group, then the Hamming ranks of the true neighbours in their
groups, one task per group each; the grid is counted on the driver) and records the choice
and the curve in the results' ``results.json``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lshdist.cluster import driver, tasks
from lshdist.cluster.answers import Partial
from lshdist.cluster.checks import check_query_inputs
from lshdist.cluster.subspace import (
    SubspaceBuildPlan,
    build_groups,
    load_metric,
    plan_subspace_build,
)
from lshdist.config import IndexConfig, QueryConfig
from lshdist.errors import InputError
from lshdist.index.krylov import subspace_residuals
from lshdist.index.recall_check import MeasuredRecall, check_rows, enforce, measured
from lshdist.index.subspace import probe_mask, search_group
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import Dataset
from lshdist.store.index import read_index_manifest
from lshdist.store.manifest import GroupEntry, IndexManifest, SubspaceManifest
from lshdist.store.objects import ObjectPath, as_path
from lshdist.store.subspace import METHOD, GroupSegment, read_group, read_subspaces

log = logging.getLogger(__name__)

#: one query chunk routed: (centred float64 (Q, d), probe mask (Q, G), query ids, Zq float32)
Routed = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


# ------------------------------------------------------------------------------ worker tasks


def load_group(index_dir: str, entry: GroupEntry, manifest: SubspaceManifest) -> GroupSegment:
    return read_group(index_dir, entry, manifest)


def load_router(index_dir: str, manifest: SubspaceManifest) -> tuple[np.ndarray, np.ndarray]:
    return read_subspaces(index_dir, manifest)


def route_chunk(queries_path: str, start: int, stop: int, metric: ExplicitMetric,
                router: tuple[np.ndarray, np.ndarray], sizes: np.ndarray, k: int,
                n_probe: int) -> Routed:
    """Queries ``start:stop`` in the learned space, and the groups each one searches."""
    ds = Dataset(queries_path)
    Zq = metric.transform(ds.read_rows(start, stop))
    bases, center = router
    Zqc = Zq.astype(np.float64) - center
    route = np.stack([subspace_residuals(Zqc, V) for V in bases], axis=1)
    mask, _ = probe_mask(route, sizes, k, n_probe)
    return Zqc, mask, np.asarray(ds.ids()[start:stop], np.int64), Zq


def route_rows(queries_path: str, rows: np.ndarray, metric: ExplicitMetric,
               router: tuple[np.ndarray, np.ndarray], sizes: np.ndarray, k: int,
               n_probe: int) -> Routed:
    """`route_chunk` of the query rows numbered ``rows`` (the recall check's sample)."""
    ds = Dataset(queries_path)
    rows = np.asarray(rows, np.int64)
    Zq = metric.transform(ds.read_row_set(rows))
    bases, center = router
    Zqc = Zq.astype(np.float64) - center
    route = np.stack([subspace_residuals(Zqc, V) for V in bases], axis=1)
    mask, _ = probe_mask(route, sizes, k, n_probe)
    return Zqc, mask, np.asarray(ds.ids()[rows], np.int64), Zq


def search_group_task(segment: GroupSegment, routed: Routed, k: int, n_candidates: int,
                      mode: str = "hash") -> Partial:
    """Partial top-k of one query chunk in one group (queries not routed there: inf / -1);
    ``mode="scan"``: every member of the group, by the exact scan (`scan_topk`)."""
    from lshdist.index.payload import DensePayload
    from lshdist.index.scan import scan_topk

    Zqc, mask, _, Zq = routed
    Q = len(Zq)
    dist = np.full((Q, k), np.inf, np.float32)
    ids = np.full((Q, k), -1, np.int64)
    reranked = np.zeros(Q, np.int64)
    qs = np.flatnonzero(mask[:, segment.number])
    if len(qs) and mode == "scan":
        m = min(k, len(segment))
        dist[qs, :m], ids[qs, :m] = scan_topk(segment.payload, DensePayload(Zq[qs]), m,
                                              ids=segment.ids)
        reranked[qs] = len(segment)
    elif len(qs):
        d, i, c = search_group(segment.group, segment.payload, segment.ids, Zqc[qs], Zq[qs], k,
                               n_candidates)
        dist[qs], ids[qs], reranked[qs] = d, i, c
    return dist, ids, reranked


def route_sample(sample: tuple[Any, Any], metric: ExplicitMetric,
                 router: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray]:
    """A calibration sample (`tasks.calibration_sample`) in the learned space: centred float64
    rows, their distances to every subspace (Q, G), the float32 rows."""
    Zq = metric.transform(sample[0])
    bases, center = router
    Zqc = Zq.astype(np.float64) - center
    return Zqc, np.stack([subspace_residuals(Zqc, V) for V in bases], axis=1), Zq


def group_topk(segment: GroupSegment, routed: tuple[np.ndarray, np.ndarray, np.ndarray], k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """The exact top-k of every sample query within one group (inf / -1 past its rows)."""
    from lshdist.index.payload import DensePayload
    from lshdist.index.scan import scan_topk

    Zq = routed[2]
    dist = np.full((len(Zq), k), np.inf, np.float32)
    ids = np.full((len(Zq), k), -1, np.int64)
    m = min(k, len(segment))
    dist[:, :m], ids[:, :m] = scan_topk(segment.payload, DensePayload(Zq), m, ids=segment.ids)
    return dist, ids


def group_truth_ranks(segment: GroupSegment, routed: tuple[np.ndarray, np.ndarray, np.ndarray],
                      truth: np.ndarray) -> np.ndarray:
    """Hamming ranks (`hamming_ranks`) in this group of the true neighbours ``truth`` (Q, k)
    that are its members; -1 for the others."""
    from lshdist.index.subspace_calibrate import hamming_ranks

    at = np.minimum(np.searchsorted(segment.ids, truth), len(segment) - 1)
    mine = (segment.ids[at] == truth) & (truth >= 0)
    return hamming_ranks(segment.group, routed[0], np.where(mine, at, -1))


# ------------------------------------------------------------------------------------- query


@dataclass
class SubspaceQueryPlan(driver.DatasetQuery):
    """A checked query of a subspace index: everything `run_subspace_query` needs."""

    index: Path | ObjectPath
    queries: Dataset
    out: Path | ObjectPath
    cfg: QueryConfig
    overwrite: bool
    manifest: SubspaceManifest
    mode: str
    n_probe: int
    n_candidates: int


def plan_subspace_query(*, index: str, queries: str, out: str, cfg: QueryConfig | None = None,
                        overwrite: bool = False) -> SubspaceQueryPlan:
    """Check a query of a subspace index on the driver (no cluster)."""
    cfg = cfg or QueryConfig()
    manifest = read_index_manifest(index)
    if not isinstance(manifest, SubspaceManifest):
        raise InputError(f"index {index!r} is not a subspace index")
    if cfg.mode == "rank":
        raise InputError("--mode rank answers --hyperplanes queries of an index built with "
                         "--family h-hash or eh-hash; a subspace index takes auto, hash or scan")
    if cfg.target_recall is not None and (cfg.mode == "scan" or cfg.probe is not None
                                          or cfg.candidates is not None):
        raise InputError("--target-recall calibrates --probe and --candidates on a sample of "
                         "the queries; give one or the other (and not --mode scan)")
    _, qds = check_query_inputs(index, manifest, queries, out, overwrite)
    rec = manifest.subspace
    built_target = rec.target_recall
    if (cfg.mode == "auto" and cfg.target_recall is None and cfg.probe is None
            and cfg.candidates is None and built_target is not None):
        # the index was built for a recall: calibrate for it on a sample of these queries
        cfg = replace(cfg, target_recall=float(built_target))
    if cfg.mode == "scan":
        mode, probe, cand = "scan", len(manifest.segments), max(rec.group_sizes)
    else:
        mode = "hash"
        probe = cfg.probe if cfg.probe is not None else rec.n_probe
        cand = cfg.candidates if cfg.candidates is not None else rec.n_candidates
    return SubspaceQueryPlan(as_path(index), qds, as_path(out), cfg, overwrite, manifest, mode,
                             probe, cand)


def _prepare(client: Any, plan: SubspaceQueryPlan, loaded: driver.Loaded, run: driver.Run
             ) -> tuple[SubspaceQueryPlan, dict[str, Any]]:
    """``--target-recall``: n_probe and n_candidates calibrated on a sample of the queries (the
    exact scan where the point re-ranks `SCAN_SHARE` of the rows); then the recall check."""
    m, stall = plan.manifest, run.stall
    reason = ("the index's own parameters" if plan.mode == "hash"
              else "asked for (--mode scan): every group by the exact scan")
    calibration = None
    recall: MeasuredRecall | None = None
    if plan.cfg.target_recall is not None:
        plan, calibration = _calibrated(client, plan, loaded, stall)
        reason = calibration["reason"]
        if plan.cfg.mode == "auto" and calibration["chosen"]["reranked"] >= SCAN_SHARE * m.rows:
            plan = _as_scan(plan)
            reason = (f"{reason}; it re-ranks {calibration['chosen']['reranked']:.0f} of "
                      f"the {m.rows} rows per query (>= {SCAN_SHARE:.0%}): the exact scan "
                      "is no slower")
    if plan.cfg.check_recall:
        plan, recall, why = _checked_subspace(client, plan, calibration, loaded, stall)
        reason = why or reason
    return plan, {"mode": plan.mode, "method": METHOD,
                  "operating_point": {"n_probe": plan.n_probe,
                                      "n_candidates": plan.n_candidates},
                  "reason": reason, "calibration": calibration,
                  "measured_recall": None if recall is None else recall.to_json()}


def _route(plan: SubspaceQueryPlan, loaded: driver.Loaded, fn: Any, rows: Any,
           n_probe: int) -> tuple[Any, ...]:
    """The encode task of a chunk (``rows``: ``(start, stop)`` or a row sample)."""
    sizes = np.asarray(plan.manifest.subspace.group_sizes, np.int64)
    return (fn, str(plan.queries.path), *rows, loaded.shared["metric"], loaded.shared["router"],
            sizes, plan.cfg.k, n_probe)


#: an auto query whose calibrated point re-ranks at least this share of the rows answers by
#: the exact scan: the routing and the Hamming ranking of the probed groups come on top of
#: the re-rank, so such a point is no faster than scanning every row
SCAN_SHARE = 0.5


def _as_scan(plan: SubspaceQueryPlan) -> SubspaceQueryPlan:
    sizes = plan.manifest.subspace.group_sizes
    return replace(plan, mode="scan", n_probe=len(plan.manifest.segments),
                 n_candidates=max(sizes))


def _checked_subspace(client: Any, plan: SubspaceQueryPlan, calibration: dict[str, Any] | None,
                      loaded: driver.Loaded, stall: float
                      ) -> tuple[SubspaceQueryPlan, MeasuredRecall, str]:
    """The recall check of a subspace query (`lshdist.index.recall_check`, as the
    permutation index's `lshdist.cluster.pipeline._checked`): a seeded sample of the queries
    answered by the exact scan of every group and at the planned (n_probe, n_candidates);
    a proven miss under ``--mode auto`` is answered by the scan.  Returns the plan, the
    record and the reason of a change ("" for none)."""
    cfg, qds = plan.cfg, plan.queries
    k = cfg.k
    rows = check_rows(qds.n, plan.manifest.seed)
    n_groups = len(plan.manifest.segments)
    sizes = plan.manifest.subspace.group_sizes
    truth: list[np.ndarray] = []

    def answer(mode: str, n_probe: int, n_candidates: int) -> np.ndarray:
        return driver.sample_answer(
            client, loaded, k,
            driver.Chunk(_route(plan, loaded, route_rows, (rows,), n_probe),
                         (search_group_task, k, n_candidates, mode)), stall)

    def measure(point: tuple[int, int], estimate: float | None) -> MeasuredRecall:
        if not truth:
            truth.append(answer("scan", n_groups, int(max(sizes))))
        got = measured(answer("hash", *point), truth[0], k, qds.n, mode="hash",
                       target=cfg.target_recall, estimate=estimate)
        log.info("recall check at n_probe=%d, n_candidates=%d: %s", *point, got.line())
        return got

    estimate = None if calibration is None else float(calibration["chosen"]["recall"])
    d = enforce(mode=plan.mode, point=(plan.n_probe, plan.n_candidates), estimate=estimate,
                target=cfg.target_recall, auto=cfg.mode == "auto", n_queries=qds.n, k=k,
                measure=measure, recalibrate=None)
    log.info("%s", d.recall.line())
    if d.mode == "scan" and plan.mode != "scan":
        log.warning("query mode scan: %s", d.reason)
        return _as_scan(plan), d.recall, d.reason
    return plan, d.recall, ""


def _calibrated(client: Any, plan: SubspaceQueryPlan, loaded: driver.Loaded, stall: float
                ) -> tuple[SubspaceQueryPlan, dict[str, Any]]:
    """``--target-recall``: n_probe and n_candidates calibrated on a sample of the queries
    (`lshdist.index.subspace_calibrate`): the exact top-k of the sample by a scan of every group
    (one task per group, merged by (distance, id)), then the Hamming ranks of the true
    neighbours in their groups (one task per group); the grid is counted on the driver."""
    from dataclasses import asdict, replace

    from lshdist.index.calibrate import query_sample_size
    from lshdist.index.permutation import merge_topk
    from lshdist.index.subspace_calibrate import choose, grid

    t0 = time.perf_counter()
    k, target = plan.cfg.k, float(plan.cfg.target_recall or 0.0)
    seed = plan.manifest.seed
    segs = loaded.segments
    metric_f, router_f = loaded.shared["metric"], loaded.shared["router"]
    sizes = np.asarray(plan.manifest.subspace.group_sizes, np.int64)
    sample_f = client.submit(tasks.calibration_sample, None, None, str(plan.queries.path), seed,
                             pure=False, retries=2)
    routed_f = client.submit(route_sample, sample_f, metric_f, router_f, pure=False, retries=2)
    tops = [client.submit(group_topk, s, routed_f, k, pure=False, retries=2) for s in segs]
    held = [sample_f, routed_f, *tops]
    try:
        for _ in driver.progress(tops, "truth", stall):
            pass
        parts = [f.result() for f in tops]
        _, truth = merge_topk([p[0] for p in parts], [p[1] for p in parts], k)
        ranks = [client.submit(group_truth_ranks, s, routed_f, truth, pure=False, retries=2)
                 for s in segs]
        held += ranks
        for _ in driver.progress(ranks, "calibrate", stall):
            pass
        per_group = np.stack([f.result() for f in ranks])  # (G, Q, k)
        route = routed_f.result()[1]
    finally:
        client.cancel(held)
    in_group = per_group >= 0
    truth_group = np.where(in_group.any(axis=0), in_group.argmax(axis=0), -1)
    truth_rank = per_group.max(axis=0)
    n_truth = int((truth >= 0).sum())
    points = grid(route, sizes, k, truth_group, truth_rank, n_truth)
    Q = len(truth)
    best, reason = choose(points, target, Q, k)
    log.info("calibration on %d of the %d queries (%.1fs): n_probe %d, n_candidates %d — %s",
             Q, plan.queries.n, time.perf_counter() - t0, best.n_probe, best.n_candidates, reason)
    record = {"target": target, "k": k, "n_queries": Q,
              "sample_size": query_sample_size(plan.queries.n),
              "chosen": asdict(best), "reason": f"calibrated on the queries: {reason}",
              "seconds": time.perf_counter() - t0, "points": [asdict(p) for p in points]}
    return replace(plan, n_probe=best.n_probe, n_candidates=best.n_candidates), record


# ------------------------------------------------------------------------------ the kind


class SubspaceKind:
    """The subspace-partition index (``--method subspace``) as an index kind of
    `lshdist.cluster.driver`: built by `lshdist.cluster.subspace.build_groups`, queried by
    routing each chunk to its nearest subspaces and searching the groups there."""

    name = METHOD

    def chooses(self, cfg: IndexConfig) -> bool:
        return cfg.method == METHOD and cfg.family is None

    def answers(self, manifest: IndexManifest) -> bool:
        return isinstance(manifest, SubspaceManifest)

    def plan_build(self, *, data: str, model: str, out: str, cfg: IndexConfig,
                   append: bool = False, overwrite: bool = False, batch: str | None = None
                   ) -> SubspaceBuildPlan:
        return plan_subspace_build(data=data, model=model, out=out, cfg=cfg,
                                   overwrite=overwrite, append=append, batch=batch)

    def landed(self, plan: SubspaceBuildPlan, manifest: IndexManifest) -> bool:
        return False

    def build(self, client: Any, plan: SubspaceBuildPlan, index_dir: Path | ObjectPath,
              run: driver.Run) -> driver.Built:
        return build_groups(client, plan, index_dir, run)

    def plan_query(self, *, index: str, source: str, out: str, cfg: QueryConfig,
                   overwrite: bool = False, hyperplanes: bool = False) -> SubspaceQueryPlan:
        if hyperplanes:
            raise InputError(f"index {index!r} was built for k-NN queries (a subspace index); "
                             "--hyperplanes needs an index built with --family h-hash or "
                             "eh-hash (or use --queries)")
        return plan_subspace_query(index=index, queries=source, out=out, cfg=cfg,
                                   overwrite=overwrite)

    def load(self, client: Any, plan: SubspaceQueryPlan
             ) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
        m, index = plan.manifest, str(plan.index)
        shared = {"metric": driver.share(client, load_metric, m.model),
                  "router": driver.share(client, load_router, index, m)}
        return shared, [(e.rows, (load_group, index, e, m)) for e in m.segments]

    def prepare(self, client: Any, plan: SubspaceQueryPlan, loaded: driver.Loaded,
                run: driver.Run) -> tuple[SubspaceQueryPlan, dict[str, Any]]:
        return _prepare(client, plan, loaded, run)

    def chunk(self, plan: SubspaceQueryPlan, loaded: driver.Loaded, start: int, stop: int
              ) -> driver.Chunk:
        return driver.Chunk(_route(plan, loaded, route_chunk, (start, stop), plan.n_probe),
                            (search_group_task, plan.cfg.k, plan.n_candidates, plan.mode))

    def describe(self, manifest: IndexManifest) -> str:
        if not isinstance(manifest, SubspaceManifest):
            raise InputError("not a subspace index")
        rec = manifest.subspace
        return (f"{manifest.rows} rows in {len(manifest.segments)} groups ({len(rec.rounds)} "
                f"rounds; subspace, k={rec.rank}, r={rec.bits}, probe={rec.n_probe}, "
                f"candidates={rec.n_candidates})")

    def summary(self, result: dict[str, Any]) -> str:
        op = result["operating_point"]
        return (f"{result['queries']} queries x {result['segments']} groups ({result['mode']}, "
                f"probe={op['n_probe']}, candidates={op['n_candidates']}) -> {result['out']}")


SUBSPACE = SubspaceKind()
