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

from lshdist.cluster import driver, tasks
from lshdist.cluster.answers import Partial
from lshdist.cluster.checks import index_model_meta
from lshdist.cluster.pipeline import BuildPlan, _with_segments, plan_build
from lshdist.config import IndexConfig, QueryConfig
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
from lshdist.store.atomic import check_output
from lshdist.store.dataset import Dataset
from lshdist.store.index import (
    EH_HASH_VERSION,
    new_segment_name,
    read_index_manifest,
    remove_unnamed,
)
from lshdist.store.manifest import HashFamily, HyperplaneManifest, IndexManifest
from lshdist.store.objects import ObjectPath, as_path

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
                   mode: str, op: tuple[int, int, int] | None, paired: bool = True,
                   candidates: int = 500) -> Partial:
    """Partial top-k of one chunk of normals against one segment at ``op`` = (M, W, H)
    (M = 0: the segment's own lists), or by mode "rank" (``candidates`` rows, ``paired``:
    H-Hash keys); a packed segment's parts are searched as the segments they were and merged
    by (margin, id)."""
    if isinstance(segment, PackedSegment):
        share = candidate_shares(candidates, [len(p) for p in segment.parts])
        each = [search_segment(p, encoded, k, mode, op, paired, c)
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
    # hyperplane families keep 512 bits by default (`default_key_bits`), whatever the metric
    bits = cfg.key_bits(False)
    cfg = dataclasses.replace(cfg, bits=bits)
    plan = plan_build(data=data, model=model, out=out, cfg=cfg, overwrite=overwrite)
    hyperplane_family(name, d=plan.data.d, bits=bits, seed=cfg.seed,
                      samples=cfg.eh_samples)  # refuses odd bits for H-Hash, here
    plan.lists = cfg.permutations
    plan.manifest = dataclasses.replace(
        plan.manifest, learned=False, permutations=cfg.permutations, epsilon=cfg.epsilon,
        window=cfg.window or DEFAULT_WINDOW, hamming_keep=cfg.hamming_keep or 0,
    ).with_family(HashFamily(name, cfg.eh_samples,
                             EH_HASH_VERSION if name == "eh-hash" else None))
    return plan


def _build(client: Any, plan: BuildPlan, index_dir: Path | ObjectPath, run: driver.Run
           ) -> driver.Built:
    """Fit and write every segment (no calibration); the manifest records that the queries
    run at the M, W, H given."""
    m = plan.manifest
    if not isinstance(m, HyperplaneManifest):
        raise InputError("not a hyperplane index build: plan it with plan_hyperplane_build")
    (index_dir / "segments").mkdir(parents=True, exist_ok=True)
    fam = m.family
    family_f = driver.share(client, make_family, fam.name, plan.data.d, m.bits, m.seed,
                            fam.samples)
    path = str(plan.data.path)
    names = [new_segment_name() for _ in plan.segments]
    bounds = plan.data.shard_bounds
    where = driver.spread([int(bounds[b] - bounds[a]) for a, b in plan.segments],
                          driver.workers_of(client))
    fits = [driver.submit_at(client, w, fit_segment, path, shards, family_f, plan.lists,
                             m.epsilon, m.seed) for shards, w in zip(plan.segments, where)]
    writes = [client.submit(tasks.write_fitted, fit, str(index_dir), name, MAX_PERMUTATIONS,
                            path, shards, pure=False, retries=2)
              for fit, name, shards in zip(fits, names, plan.segments)]
    try:
        entries = driver.wait_all(writes, "index", run.stall)
    except BaseException:
        remove_unnamed(index_dir, names)
        raise
    finally:
        client.cancel([family_f, *fits, *writes])
    first = entries[0].rows if entries else 0
    M = m.permutations or (entries[0].permutations if entries else 1)
    point = Point(permutations=M, window=m.window, hamming_keep=m.hamming_keep,
                  recall=0.0, reranked=0.0, fraction_searched=0.0)
    cal = Calibration(k=plan.cfg.k, target=0.0, n_database=first, n_queries=0,
                      scan_seconds_per_query=0.0, points=(), mode="hash", chosen=point,
                      reason=f"not calibrated: hyperplane queries ({fam.name}) run at "
                             "the M, W, H given; recall not measured")
    new = _with_segments(dataclasses.replace(m, calibration_json=cal.to_json()), entries)
    return driver.Built(names, lambda current: new)


# ------------------------------------------------------------------------------------- query


@dataclass
class HyperplaneQueryPlan:
    """A checked hyperplane query: everything `HyperplaneKind` needs to run it."""

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

    @property
    def inputs(self) -> tuple[Any, ...]:
        return (self.index, *((self.source,) if isinstance(self.source, str) else ()))

    @property
    def bounds(self) -> list[int]:
        """Chunks of a dataset never straddle its shards (`driver.query_chunks`)."""
        if isinstance(self.source, np.ndarray):
            return [0, self.n]
        return [int(x) for x in Dataset(self.source).shard_bounds]


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


def _prepare(client: Any, plan: HyperplaneQueryPlan, loaded: driver.Loaded, run: driver.Run
             ) -> tuple[HyperplaneQueryPlan, dict[str, Any]]:
    cfg, fam = plan.cfg, plan.manifest.family
    recall: MeasuredRecall | None = None
    if cfg.check_recall:
        plan, recall = _checked_hyperplanes(client, plan, loaded, run.stall)
    return plan, {"mode": plan.mode, "hyperplanes": fam.name,
                  "measured_recall": None if recall is None else recall.to_json(),
                  "operating_point": dict(zip(("permutations", "window", "hamming_keep"),
                                              plan.op)),
                  **({"candidates": cfg.candidates or RANK_CANDIDATES}
                     if plan.mode == "rank" else {})}


def _chunk(plan: HyperplaneQueryPlan, loaded: driver.Loaded, encode: tuple[Any, ...],
           mode: str | None = None) -> driver.Chunk:
    """The tasks of a chunk of normals: ``encode``, then every segment searched with its
    share of mode rank's candidates (in proportion to its rows)."""
    shares = candidate_shares(plan.cfg.candidates or RANK_CANDIDATES,
                              [e.rows for e in plan.manifest.segments])
    return driver.Chunk(encode, (search_segment, plan.cfg.k, mode or plan.mode, plan.op,
                                 plan.manifest.family.paired), [(c,) for c in shares])


def _checked_hyperplanes(client: Any, plan: HyperplaneQueryPlan, loaded: driver.Loaded,
                         stall: float) -> tuple[HyperplaneQueryPlan, MeasuredRecall]:
    """The recall check of a hyperplane query (`lshdist.index.recall_check`): a seeded sample
    of the normals answered by the exact scan (every row's margin) and as planned; with
    ``--mode auto`` and ``--target-recall``, a proven miss is answered by the scan (the index
    has no calibration curve to move along)."""
    cfg, m = plan.cfg, plan.manifest
    k = cfg.k
    rows = check_rows(plan.n, m.seed)
    truth: list[np.ndarray] = []
    encode = (encode_rows, plan.source, rows, plan.ids, loaded.shared["family"])

    def answer(mode: str) -> np.ndarray:
        return driver.sample_answer(client, loaded, k, _chunk(plan, loaded, encode, mode),
                                    stall)

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


# ------------------------------------------------------------------------------ the kind


class HyperplaneKind:
    """The hyperplane index (``--family``) as an index kind of `lshdist.cluster.driver`."""

    name = "hyperplane"

    def chooses(self, cfg: IndexConfig) -> bool:
        return cfg.family is not None

    def answers(self, manifest: IndexManifest) -> bool:
        return isinstance(manifest, HyperplaneManifest)

    def plan_build(self, *, data: str, model: str, out: str, cfg: IndexConfig,
                   append: bool = False, overwrite: bool = False, batch: str | None = None
                   ) -> BuildPlan:
        if append or batch:
            raise InputError("--append/--batch are not supported for hyperplane indexes "
                             "(--family); build the index again with --overwrite")
        return plan_hyperplane_build(data=data, model=model, out=out, cfg=cfg,
                                     overwrite=overwrite)

    def landed(self, plan: BuildPlan, manifest: IndexManifest) -> bool:
        return False

    def build(self, client: Any, plan: BuildPlan, index_dir: Path | ObjectPath,
              run: driver.Run) -> driver.Built:
        return _build(client, plan, index_dir, run)

    def plan_query(self, *, index: str, source: str, out: str, cfg: QueryConfig,
                   overwrite: bool = False, hyperplanes: bool = False) -> HyperplaneQueryPlan:
        if not hyperplanes:
            m = read_index_manifest(index)
            name = m.family.name if isinstance(m, HyperplaneManifest) else "--family"
            rank = ("; --mode rank ranks hyperplane keys, of --hyperplanes queries"
                    if cfg.mode == "rank" else "")
            raise InputError(f"index {index!r} was built for hyperplane queries ({name}); "
                             f"query it with --hyperplanes{rank}")
        return plan_hyperplane_query(index=index, hyperplanes=source, out=out, cfg=cfg,
                                     overwrite=overwrite)

    def load(self, client: Any, plan: HyperplaneQueryPlan
             ) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
        m = plan.manifest
        fam = m.family
        family_f = driver.share(client, make_family, fam.name, m.d, m.bits, m.seed,
                                fam.samples)
        return {"family": family_f}, [(e.rows, (tasks.load_segment, str(plan.index), e, m))
                                      for e in m.segments]

    def prepare(self, client: Any, plan: HyperplaneQueryPlan, loaded: driver.Loaded,
                run: driver.Run) -> tuple[HyperplaneQueryPlan, dict[str, Any]]:
        return _prepare(client, plan, loaded, run)

    def chunk(self, plan: HyperplaneQueryPlan, loaded: driver.Loaded, start: int, stop: int
              ) -> driver.Chunk:
        array = isinstance(plan.source, np.ndarray)
        return _chunk(plan, loaded, (encode_chunk, plan.source[start:stop] if array
                                     else plan.source, start, stop,
                                     None if plan.ids is None else plan.ids[start:stop],
                                     loaded.shared["family"]))

    def describe(self, manifest: IndexManifest) -> str:
        if not isinstance(manifest, HyperplaneManifest):
            raise InputError("not a hyperplane index")
        return (f"{manifest.rows} rows in {len(manifest.segments)} segments "
                f"({manifest.family.name}, b={manifest.bits}, M={manifest.permutations}, "
                f"W={manifest.window})")

    def summary(self, result: dict[str, Any]) -> str:
        return (f"{result['queries']} hyperplanes x {result['segments']} segments -> "
                f"{result['out']}")


HYPERPLANE = HyperplaneKind()
