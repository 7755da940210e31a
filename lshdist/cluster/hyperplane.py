"""Distributed hyperplane queries: ``lshdist index --family h-hash|eh-hash`` and
``lshdist query --hyperplanes`` (NIPS 2010; `lshdist.index.hyperplane` in one process).

The build is the k-NN build of `lshdist.cluster.pipeline` with another encoder: one task per
segment hashes its rows with the point side of the family and keeps the rows as the margin
payload; the manifest records the family (field ``family``) and is swapped in last.  There is
no calibration (no sample of hyperplane queries exists at build time): M, W and H are the ones
given (defaults `DEFAULT_PERMUTATIONS`, `DEFAULT_WINDOW`, H = 0), and the manifest's
calibration record says so.  Queries: the normals (a ``.npy`` array or a dataset) are hashed
with the query side, searched in every segment where it lives, partial top-k lists merged and
written as Parquet results (`lshdist.store.results`), ``distance`` = ``|w^T x| / ||w||``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lshdist.cluster import tasks
from lshdist.cluster.pipeline import (
    BuildPlan,
    _check_worker_memory,
    _progress,
    _remove_segments,
    _with_segments,
    chunk_rows,
    index_model_meta,
    load_segments,
    plan_build,
    query_chunks,
)
from lshdist.config import ClusterConfig, IndexConfig, QueryConfig
from lshdist.errors import InputError
from lshdist.hashing.hyperplane import HyperplaneFamily, hyperplane_family
from lshdist.index.calibrate import Calibration, Point
from lshdist.index.hyperplane import (
    RANK_CANDIDATES,
    candidate_shares,
    encode_hyperplanes,
    encode_points,
    search_hyperplanes,
)
from lshdist.index.permutation import PackedSegment, PermutationIndex, merge_topk
from lshdist.index.recall_check import MeasuredRecall, check_rows, enforce, measured
from lshdist.index.searcher import permutation_seed
from lshdist.limits import MAX_PERMUTATIONS
from lshdist.store.atomic import atomic_dir, check_output, os_error
from lshdist.store.dataset import Dataset
from lshdist.store.index import (
    EH_HASH_VERSION,
    FORMAT,
    index_lock,
    new_segment_name,
    read_index_manifest,
    write_manifest,
)
from lshdist.store.manifest import HashFamily, HyperplaneManifest
from lshdist.store.objects import ObjectPath, as_path
from lshdist.store.results import write_results

log = logging.getLogger(__name__)

#: M and W of a hyperplane index when not given (no calibration chooses them)
DEFAULT_PERMUTATIONS = 64
DEFAULT_WINDOW = 8


# ------------------------------------------------------------------------------ worker tasks


def make_family(name: str, d: int, bits: int, seed: int, samples: int | None
                ) -> HyperplaneFamily:
    return hyperplane_family(name, d=d, bits=bits, seed=seed, samples=samples)


def fit_segment(data_path: str, shards: tuple[int, int], family: HyperplaneFamily,
                lists: int | None, epsilon: float | None, seed: int) -> PermutationIndex:
    """Hash dataset shards ``shards[0]:shards[1]`` with the point side and fit their lists."""
    ds = Dataset(data_path)
    start, stop = (int(ds.shard_bounds[i]) for i in shards)
    codes, payload = encode_points(family, ds.read_rows(start, stop))
    index = PermutationIndex(n_permutations=lists, epsilon=epsilon, seed=permutation_seed(seed))
    index.fit(codes, family.bits, payload, ds.ids()[start:stop])
    return index


def encode_chunk(source: str | np.ndarray, start: int, stop: int, ids: np.ndarray | None,
                 family: HyperplaneFamily) -> tasks.Encoded:
    """Query-side keys, margin payload and query ids of normals ``start:stop`` (of an array,
    query ids = ``ids``, or of a dataset, its own ids)."""
    if isinstance(source, np.ndarray):
        W: Any = source
        qids = np.asarray(ids, np.int64)
    else:
        ds = Dataset(source)
        W, qids = ds.read_rows(start, stop), ds.ids()[start:stop]
    codes, payload = encode_hyperplanes(family, W)
    return codes, payload, qids


def encode_rows(source: str | np.ndarray, rows: np.ndarray, ids: np.ndarray | None,
                family: HyperplaneFamily) -> tasks.Encoded:
    """`encode_chunk` of the normals numbered ``rows`` (the recall check's sample)."""
    rows = np.asarray(rows, np.int64)
    if isinstance(source, np.ndarray):
        W: Any = source[rows]
        qids = np.asarray(ids, np.int64)[rows]
    else:
        ds = Dataset(source)
        W, qids = ds.read_row_set(rows), np.asarray(ds.ids()[rows], np.int64)
    codes, payload = encode_hyperplanes(family, W)
    return codes, payload, qids


def search_segment(segment: PermutationIndex | PackedSegment, encoded: tasks.Encoded, k: int,
                   mode: str, op: tuple[int, int, int] | None, candidates: int = 500,
                   paired: bool = True) -> tasks.Partial:
    """Partial top-k of one chunk of normals against one segment at ``op`` = (M, W, H)
    (M = 0: the segment's own lists), or by mode "rank" (``candidates`` rows, ``paired``:
    H-Hash keys); a packed segment's parts are searched as the segments they were and merged
    by (margin, id)."""
    if isinstance(segment, PackedSegment):
        share = candidate_shares(candidates, [len(p) for p in segment.parts])
        each = [search_segment(p, encoded, k, mode, op, c, paired)
                for p, c in zip(segment.parts, share)]
        dist, ids = merge_topk([e[0] for e in each], [e[1] for e in each], k)
        return dist, ids, np.sum([e[2] for e in each], axis=0)
    codes, payload, _ = encoded
    m, w, h = op if op is not None else (0, None, None)
    dist, ids, stats = search_hyperplanes(
        segment, codes, payload, k, mode=mode,
        n_permutations=min(m, segment.n_permutations_) if m else None, window=w, hamming_keep=h,
        candidates=candidates, paired=paired)
    return dist, ids, stats["reranked"]


# ------------------------------------------------------------------------------------- build


def plan_hyperplane_build(*, data: str, model: str, out: str, cfg: IndexConfig,
                          overwrite: bool = False) -> BuildPlan:
    """Check a hyperplane index build on the driver (no cluster)."""
    name = cfg.family
    if name is None:
        raise InputError("a hyperplane index needs --family h-hash or eh-hash")
    if cfg.baseline:
        raise InputError("--baseline (Charikar's family) and --family exclude each other")
    if cfg.eh_samples is not None and cfg.family != "eh-hash":
        raise InputError("--eh-samples applies to --family eh-hash only")
    if cfg.permutations is None and cfg.epsilon is None:
        cfg = dataclasses.replace(cfg, permutations=DEFAULT_PERMUTATIONS)
    plan = plan_build(data=data, model=model, out=out, cfg=cfg, overwrite=overwrite)
    hyperplane_family(name, d=plan.data.d, bits=cfg.bits, seed=cfg.seed,
                      samples=cfg.eh_samples)  # refuses odd bits for H-Hash, here
    plan.lists = cfg.permutations
    plan.manifest = dataclasses.replace(
        plan.manifest, learned=False, permutations=cfg.permutations, epsilon=cfg.epsilon,
        window=cfg.window or DEFAULT_WINDOW, hamming_keep=cfg.hamming_keep or 0,
    ).with_family(HashFamily(name, cfg.eh_samples,
                             EH_HASH_VERSION if name == "eh-hash" else None))
    return plan


def run_hyperplane_build(client: Any, plan: BuildPlan, *,
                         stall: float = ClusterConfig.stall_timeout) -> HyperplaneManifest:
    """Run a planned hyperplane build on ``client``; returns the manifest (written aside and
    renamed into place when complete, under the index lock)."""
    m = plan.manifest
    if not isinstance(m, HyperplaneManifest):
        raise InputError("not a hyperplane index build: plan it with plan_hyperplane_build")
    _check_worker_memory(client, plan.list_bytes)
    try:
        plan.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(exc, plan.out) from None
    with index_lock(plan.out, timeout=stall), atomic_dir(
            plan.out, overwrite=plan.overwrite, kind=FORMAT,
            inputs=(plan.data.path, plan.model)) as tmp:
        (tmp / "segments").mkdir(parents=True, exist_ok=True)
        fam = m.family
        family_f = client.submit(make_family, fam.name, plan.data.d, m.bits, m.seed,
                                 fam.samples, pure=False, retries=2)
        client.replicate([family_f])
        path = str(plan.data.path)
        names = [new_segment_name() for _ in plan.segments]
        fits = [client.submit(fit_segment, path, shards, family_f, plan.lists, m.epsilon,
                              m.seed, pure=False, retries=2) for shards in plan.segments]
        writes = [client.submit(tasks.write_fitted, fit, str(tmp), name, MAX_PERMUTATIONS, path,
                                shards, pure=False, retries=2)
                  for fit, name, shards in zip(fits, names, plan.segments)]
        held = [family_f, *fits, *writes]
        try:
            for _ in _progress(writes, "index", stall):
                pass
            entries = [f.result() for f in writes]
        except BaseException:
            client.cancel(held)
            _remove_segments(tmp, names)
            raise
        client.cancel(held)
        first = entries[0].rows if entries else 0
        M = m.permutations or (entries[0].permutations if entries else 1)
        point = Point(permutations=M, window=m.window, hamming_keep=m.hamming_keep,
                      recall=0.0, reranked=0.0, fraction_searched=0.0)
        cal = Calibration(k=plan.cfg.k, target=0.0, n_database=first, n_queries=0,
                          scan_seconds_per_query=0.0, points=(), mode="hash", chosen=point,
                          reason=f"not calibrated: hyperplane queries ({fam.name}) run at "
                                 "the M, W, H given; recall not measured")
        new = _with_segments(dataclasses.replace(m, calibration_json=cal.to_json()), entries)
        write_manifest(tmp, new)
    return new


# ------------------------------------------------------------------------------------- query


@dataclass
class HyperplaneQueryPlan:
    """A checked hyperplane query: everything `run_hyperplane_query` needs."""

    index: Path | ObjectPath
    source: str | np.ndarray  # a dataset path, or the normals (Q, d) of a .npy file
    n: int
    ids: np.ndarray | None  # query ids of an array source (its rows)
    out: Path | ObjectPath
    cfg: QueryConfig
    overwrite: bool
    manifest: HyperplaneManifest
    mode: str
    op: tuple[int, int, int]


def _load_normals(path: str, d: int) -> np.ndarray:
    try:
        W = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"hyperplanes {path!r} cannot be read as a .npy array ({exc})") from None
    if W.ndim != 2 or W.dtype.kind not in "biuf" or W.shape[1] != d:
        raise InputError(f"hyperplanes {path!r} are {W.dtype} {W.shape}; expected a numeric "
                         f"(Q, {d}) array, one normal w per row")
    W = np.ascontiguousarray(W, np.float64)
    if not np.isfinite(W).all():
        raise InputError(f"hyperplanes {path!r} hold NaN or infinite values")
    zero = np.flatnonzero(~W.any(axis=1))
    if len(zero):
        raise InputError(f"hyperplanes {path!r}: row {int(zero[0])} is a zero normal vector")
    return W


def plan_hyperplane_query(*, index: str, hyperplanes: str, out: str,
                          cfg: QueryConfig | None = None, overwrite: bool = False
                          ) -> HyperplaneQueryPlan:
    """Check a hyperplane query on the driver: the index is a hyperplane index, the normals
    (``.npy`` (Q, d) or a dataset) match its data, the output is writable."""
    cfg = cfg or QueryConfig()
    manifest = read_index_manifest(index)
    if not isinstance(manifest, HyperplaneManifest):
        raise InputError(f"index {index!r} was built for k-NN queries; --hyperplanes needs an "
                         "index built with --family h-hash or eh-hash (or use --queries)")
    if cfg.target_recall is not None and cfg.mode != "auto":
        raise InputError("--target-recall of a hyperplane query is the recall its check holds "
                         "the hashed search to (answering by the scan where it falls short): "
                         f"it needs --mode auto, not {cfg.mode}")
    model_meta = index_model_meta(index, manifest)
    sparse = bool(model_meta.get("sparse"))
    ids: np.ndarray | None = None
    source: str | np.ndarray
    if hyperplanes.endswith(".npy") and os.path.isfile(hyperplanes):
        if sparse:
            raise InputError(f"index {index!r} holds sparse rows; give the hyperplanes as a "
                             "sparse dataset (`lshdist ingest`), not a dense .npy array")
        source = _load_normals(hyperplanes, manifest.d)
        n, ids = len(source), np.arange(len(source), dtype=np.int64)
    else:
        ds = Dataset(hyperplanes)
        if (ds.kind == "sparse") != sparse or (not sparse and ds.d != manifest.d):
            raise InputError(f"hyperplanes {hyperplanes!r} are {ds.kind} with {ds.d} features; "
                             f"index {index!r} holds {'sparse' if sparse else 'dense'} rows "
                             f"of {manifest.d}")
        source, n = str(ds.path), ds.n
    check_output(out, overwrite, kind="lshdist-results", inputs=(index, hyperplanes))
    mode = cfg.mode if cfg.mode in ("scan", "rank") else "hash"
    if cfg.candidates is not None and mode != "rank":
        raise InputError("--candidates applies to --mode rank of a hyperplane query")
    op = manifest.operating_point
    return HyperplaneQueryPlan(as_path(index), source, n, ids, as_path(out), cfg, overwrite,
                               manifest, mode, op)


def run_hyperplane_query(client: Any, plan: HyperplaneQueryPlan, *,
                         stall: float = ClusterConfig.stall_timeout) -> dict[str, Any]:
    """Run a planned hyperplane query; returns ``{queries, segments, out, mode}``."""
    cfg, m = plan.cfg, plan.manifest
    fam = m.family
    family_f = client.submit(make_family, fam.name, m.d, m.bits, m.seed, fam.samples,
                             pure=False, retries=2)
    client.replicate([family_f])
    segs = load_segments(client, str(plan.index), m)
    held: list[Any] = [family_f, *segs]
    # mode rank: the hyperplane's candidates shared by the segments in proportion to rows
    shares = candidate_shares(cfg.candidates or RANK_CANDIDATES,
                              [e.rows for e in m.segments])
    recall: MeasuredRecall | None = None
    try:
        if cfg.check_recall:
            plan, recall = _checked_hyperplanes(client, plan, segs, family_f, shares, stall)
        with write_results(plan.out, k=cfg.k, overwrite=plan.overwrite, inputs=(plan.index,),
                           info={"mode": plan.mode, "hyperplanes": fam.name,
                                 "measured_recall": None if recall is None
                                 else recall.to_json(),
                                 "operating_point": dict(zip(("permutations", "window",
                                                              "hamming_keep"), plan.op)),
                                 **({"candidates": cfg.candidates or RANK_CANDIDATES}
                                    if plan.mode == "rank" else {})}
                           ) as tmp:
            writers = []
            array = isinstance(plan.source, np.ndarray)
            # a dataset's chunks never straddle its shards (`query_chunks`)
            bounds = ([0, plan.n] if array else [int(x) for x in
                                                 Dataset(str(plan.source)).shard_bounds])
            for c, (a, b) in enumerate(query_chunks(bounds,
                                                    chunk_rows(cfg.query_chunk, cfg.k))):
                enc = client.submit(encode_chunk, plan.source[a:b] if array else plan.source,
                                    a, b, None if plan.ids is None else plan.ids[a:b],
                                    family_f, pure=False, retries=2)
                parts = [client.submit(search_segment, s, enc, cfg.k, plan.mode, plan.op, c,
                                       fam.paired, pure=False, retries=2)
                         for s, c in zip(segs, shares)]
                w = client.submit(tasks.merge_and_write, enc, parts, cfg.k, str(tmp), c,
                                  pure=False, retries=2)
                writers.append(w)
                held += [enc, *parts, w]
            total = sum(int(f.result()) for f in _progress(writers, "query", stall))
    finally:
        client.cancel(held)
    return {"queries": total, "segments": len(segs), "out": str(plan.out), "mode": plan.mode,
            "measured_recall": None if recall is None else recall.to_json()}


def _checked_hyperplanes(client: Any, plan: HyperplaneQueryPlan, segs: list[Any],
                         family_f: Any, shares: list[int], stall: float
                         ) -> tuple[HyperplaneQueryPlan, MeasuredRecall]:
    """The recall check of a hyperplane query (`lshdist.index.recall_check`): a seeded sample
    of the normals answered by the exact scan (every row's margin) and as planned; with
    ``--mode auto`` and ``--target-recall``, a proven miss is answered by the scan (the index
    has no calibration curve to move along)."""
    cfg, m = plan.cfg, plan.manifest
    k, paired = cfg.k, m.family.paired
    rows = check_rows(plan.n, m.seed)
    truth: list[np.ndarray] = []

    def answer(mode: str) -> np.ndarray:
        enc = client.submit(encode_rows, plan.source, rows, plan.ids, family_f, pure=False,
                            retries=2)
        parts = [client.submit(search_segment, s, enc, k, mode, plan.op, c, paired,
                               pure=False, retries=2) for s, c in zip(segs, shares)]
        w = client.submit(tasks.merged_ids, enc, parts, k, pure=False, retries=2)
        try:
            for _ in _progress([w], "recall check", stall):
                pass
            return np.asarray(w.result())
        finally:
            client.cancel([enc, *parts, w])

    def measure(point: Any, estimate: float | None) -> MeasuredRecall:
        if not truth:
            truth.append(answer("scan"))
        return measured(answer(plan.mode), truth[0], k, plan.n, mode="hash",
                        target=cfg.target_recall, estimate=None)

    d = enforce(mode="scan" if plan.mode == "scan" else "hash", point=plan.op, estimate=None,
                target=cfg.target_recall, auto=cfg.mode == "auto", n_queries=plan.n, k=k,
                measure=measure, recalibrate=None)
    log.info("%s", d.recall.line())
    if d.mode == "scan" and plan.mode != "scan":
        log.warning("hyperplane query: %s", d.reason)
        return dataclasses.replace(plan, mode="scan"), d.recall
    return plan, d.recall
