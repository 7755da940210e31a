"""Distributed index builds and bulk queries (ARCHITECTURE.md sections 1 and 4).

Each job is planned on the driver first (`plan_build`, `plan_query`: every input checked, no
cluster needed) and then run on a Dask client (`run_build`, `run_query`), so bad input is
refused before any cluster starts.

The hash family is built once from the model and broadcast to the workers; one task per segment
(a run of whole dataset shards) encodes its rows and writes the segment; the manifest is swapped
in last.  Queries: segments are loaded once into worker memory, one task per (query chunk,
segment) runs where the segment lives, partial top-k lists are merged per query chunk by a task
that writes the Parquet parts.  The driver holds neither the database nor the results, and at
most a few query chunks are in flight, so memory does not grow with the number of queries.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from lshdist.cluster import tasks
from lshdist.config import KNN_MODES, ClusterConfig, IndexConfig, QueryConfig, check_mode
from lshdist.errors import ClusterError, InputError
from lshdist.index.calibrate import Calibration, MergedGrid
from lshdist.index.params import resolve_permutations
from lshdist.index.recall_check import MeasuredRecall, check_rows, enforce, measured
from lshdist.index.searcher import RECALIBRATE_QUERIES, calibrated_lists
from lshdist.limits import MAX_PERMUTATIONS
from lshdist.store.atomic import atomic_dir, check_not_input, check_output, os_error
from lshdist.store.dataset import Dataset
from lshdist.store.index import (
    FORMAT,
    IndexManifest,
    PermutationManifest,
    SegmentEntry,
    index_lock,
    manifest_tag,
    new_segment_name,
    read_index_manifest,
    read_manifest_tagged,
    read_permutation_manifest,
    remove_unnamed,
    require_permutation,
    segment_ids,
    write_manifest,
)
from lshdist.store.manifest import HyperplaneManifest
from lshdist.store.model import read_model_meta
from lshdist.store.objects import CommitConflict, ObjectPath, as_path, resolved
from lshdist.store.results import write_results

log = logging.getLogger(__name__)

#: `IndexConfig` field -> the manifest field that records it
_RECORDED = {"bits": "bits", "epsilon": "epsilon", "permutations": "permutations",
             "window": "window", "hamming_keep": "hamming_keep", "seed": "seed",
             "baseline": "learned"}


def segment_shards(bounds: Sequence[int], segment_rows: int) -> list[tuple[int, int]]:
    """Runs of whole shards ``(first, stop)`` of at most ``segment_rows`` rows each (at least
    one shard per segment); ``bounds`` are the dataset's shard boundaries (first rows, then N)."""
    out, first = [], 0
    n_shards = len(bounds) - 1
    for i in range(1, n_shards + 1):
        if i == n_shards or bounds[i + 1] - bounds[first] > segment_rows:
            out.append((first, i))
            first = i
    return out


#: the bytes of one segment's partial answer to one query chunk (float32 distances and int64
#: ids, k a query) that `chunk_rows` keeps a chunk under: at k = 1,000 a 10,000-query chunk's
#: partials took 120 MB a segment, and 20,000 queries peaked at 1.5-3x the memory of 2,000
PARTIAL_BYTES = 16 * 2**20


def chunk_rows(chunk: int, k: int) -> int:
    """Queries per task: ``chunk`` (``--query-chunk``), fewer where k is large enough that a
    segment's partial answer would exceed `PARTIAL_BYTES` (k >= 140 at the default chunk), so
    that the query memory does not grow with k x the chunk."""
    return int(max(1, min(chunk, PARTIAL_BYTES // (12 * max(int(k), 1)))))


def query_chunks(bounds: Sequence[int], chunk: int) -> list[tuple[int, int]]:
    """Row ranges ``(start, stop)`` of the query tasks: every shard (``bounds``: the first row
    of each shard, then N) split into the fewest nearly equal pieces of at most ``chunk`` rows.
    A piece never straddles two shards: a shard is one compressed chunk on disk, and a task
    reading part of it decompresses all of it (measured: 1,000 rows of a 20,000-row shard
    took 0.13 s to read against 0.012 s to encode, so 1,000-row tasks spent 10x more reading
    the shards than all of them needed)."""
    out: list[tuple[int, int]] = []
    for a, b in itertools.pairwise(int(x) for x in bounds):
        pieces = -(-(b - a) // chunk)
        edges = np.linspace(a, b, pieces + 1).round().astype(np.int64)
        out += [(int(x), int(y)) for x, y in itertools.pairwise(edges) if y > x]
    return out


def check_data_for_model(ds: Dataset, meta: dict[str, Any], what: str) -> None:
    """The dataset's kind and d against the model's (from model.json, no arrays loaded)."""
    emb = meta.get("embedding")
    if emb is not None or ds.stored_kind == "pointsets":
        check_sets_for_model(ds, emb, what)
        return
    sparse_model = bool(meta.get("sparse"))
    if (ds.kind == "sparse") != sparse_model:
        raise InputError(f"{what} {str(ds.path)!r} is {ds.kind}, but the model was learned on "
                         f"{'sparse' if sparse_model else 'dense'} data")
    if ds.d != meta["d"]:
        raise InputError(f"{what} {str(ds.path)!r} has {ds.d} features, but the model was "
                         f"learned on {meta['d']}")


def index_model_meta(index: str, manifest: IndexManifest) -> dict[str, Any]:
    """model.json of the model an index was built with, checked against the index's record."""
    try:
        meta = read_model_meta(manifest.model)
    except InputError as exc:
        raise InputError(f"the model of index {index!r} cannot be read: {exc}") from None
    if meta["checksum"] != manifest.model_checksum:
        raise InputError(f"the model at {manifest.model!r} does not match index {index!r} "
                         "(checksums differ); rebuild the index or restore the model")
    return meta


def check_query_inputs(index: str, manifest: IndexManifest, queries: str, out: str,
                       overwrite: bool) -> tuple[dict[str, Any], Dataset]:
    """The checks every k-NN query job makes before a cluster starts: the index's model
    (`index_model_meta`), the queries against it, the results directory; returns
    ``(model meta, queries dataset)``."""
    meta = index_model_meta(index, manifest)
    qds = Dataset(queries)
    check_data_for_model(qds, meta, "queries dataset")
    check_output(out, overwrite, kind="lshdist-results",
                 inputs=(index, queries, manifest.model))
    return meta, qds


def check_sets_for_model(ds: Dataset, emb: dict[str, Any] | None, what: str) -> None:
    """A point-set dataset against a model's set embedding (model.json's ``embedding``)."""
    if emb is None:
        raise InputError(f"{what} {str(ds.path)!r} holds sets of local features, but the model "
                         "was learned on vectors: learn one on point sets with "
                         "`lshdist learn --kernel pmk|pdk`")
    if ds.stored_kind != "pointsets":
        raise InputError(f"{what} {str(ds.path)!r} holds {ds.stored_kind} vectors, but the "
                         f"model embeds sets of local features ({emb['kernel']}); give a "
                         "point-set dataset (`lshdist ingest --features`)")
    if int(ds.attrs["d"]) != emb["d"]:
        raise InputError(f"{what} {str(ds.path)!r} has points of {ds.attrs['d']} features, "
                         f"but the model's {emb['kernel']} embedding was fitted on {emb['d']}; "
                         "ingest it with the same --features")
    if emb["kernel"] == "pdk" and not ds.has_coords:
        raise InputError(f"{what} {str(ds.path)!r} has no image coordinates, which the PDK "
                         "needs; ingest the images with --features (coordinates are kept)")


def broadcast_family(client: Any, model: str, *, bits: int, seed: int, learned: bool) -> Any:
    """The hash family on every worker, built once; returns its future.

    One task loads the model (checksums verified) and builds the family on a worker; the result
    is replicated to the others.  Not ``client.scatter(..., broadcast=True)``: scattered data
    has no recipe, so a worker lost at the wrong moment cancels every task that needs it ("lost
    dependencies", seen in testing); and not the object itself in the graph (10 MB for a
    784-d explicit metric, sent with the graph).  This future is recomputed if every copy is
    lost.
    """
    fut = client.submit(tasks.load_family, resolved(model), bits, seed, learned,
                        pure=False, retries=2)
    client.replicate([fut])
    return fut


def stalled_reason(futures: Any) -> str:
    """Why a job may have stopped, for a stall's error: workers Dask has paused (their memory
    past its pause threshold: lshdist's clusters do not spill to disk, so a worker whose
    segments do not fit stays paused), from the client's last view of the scheduler (no call
    that could itself wait on a frozen scheduler); else the generic advice."""
    generic = ("the scheduler or the workers are stalled — check them, or raise "
               "--stall-timeout")
    try:
        client = next(iter(futures)).client
        workers = dict(getattr(client, "_scheduler_identity", {}).get("workers", {}))
    except Exception:  # no future, or a client without that view: the generic advice
        return generic
    paused = sorted(a for a, w in workers.items() if w.get("status") == "paused")
    if not paused:
        return generic
    return (f"worker(s) {', '.join(paused)} paused: their memory passed Dask's pause "
            "threshold (distributed.worker.memory.pause of the memory limit), and lshdist does "
            "not spill to disk — what they hold does not fit; run more workers (--workers), "
            "give them more memory, or build smaller segments (--segment-rows)")


def _progress(futures: Sequence[Any], what: str, stall: float) -> Iterator[Any]:
    """Yield futures as they finish, logging a progress bar; a job where no task finishes for
    ``stall`` seconds (a frozen scheduler or worker) fails with a `ClusterError`."""
    from distributed import wait

    pending, t0, n = set(futures), time.perf_counter(), len(futures)
    while pending:
        try:
            done, pending = wait(pending, timeout=stall, return_when="FIRST_COMPLETED")
        except TimeoutError:
            raise ClusterError(f"{what}: no task finished for {stall:.0f}s ({len(pending)} of "
                               f"{n} waiting); {stalled_reason(pending)}") from None
        for f in done:
            k = n - len(pending)
            log.info("%-6s [%-20s] %d/%d tasks, %.1fs", what, "#" * (20 * k // n), k, n,
                     time.perf_counter() - t0)
            yield f


# ---------------------------------------------------------------------------------- build


@dataclass
class BuildPlan:
    """A checked index build: everything `run_build` needs, nothing started."""

    data: Dataset
    model: Path | ObjectPath
    out: Path | ObjectPath
    cfg: IndexConfig
    append: bool
    overwrite: bool
    model_meta: dict[str, Any]
    #: the index's (an append), or the one planned (a fresh build: no segments, not
    #: calibrated yet)
    manifest: PermutationManifest
    segments: list[tuple[int, int]] = field(default_factory=list)
    lists: int | None = None  # lists fitted per segment (None: from epsilon, per segment)
    list_bytes: int = 0  # permutation lists of the largest segment
    batch: str | None = None  # the append's label, recorded in the manifest's batches
    skipped: bool = False  # the batch had landed already: nothing was (or will be) built


def _recorded(cfg: IndexConfig) -> dict[str, Any]:
    return {key: (not cfg.baseline) if name == "baseline" else getattr(cfg, name)
            for name, key in _RECORDED.items()}


def _check_append(out: str, cfg: IndexConfig, manifest: PermutationManifest) -> IndexConfig:
    """The index's own parameters; an explicitly given one that differs is an error."""
    wanted = _recorded(cfg)
    has = {key: getattr(manifest, key) for key in _RECORDED.values()}
    conflicts = [f"--{name.replace('_', '-')} {getattr(cfg, name)!r} (the index has "
                 f"{has[key] if name != 'baseline' else not has[key]!r})"
                 for name, key in _RECORDED.items()
                 if name in cfg.given_ and wanted[key] != has[key]]
    if conflicts:
        raise InputError(f"index {out!r} was built with other parameters: "
                         f"{'; '.join(conflicts)}; drop these options to append with the "
                         "index's own, or build a new index")
    return IndexConfig(bits=manifest.bits, epsilon=manifest.epsilon,
                       permutations=manifest.permutations, window=manifest.window,
                       hamming_keep=manifest.hamming_keep, seed=manifest.seed,
                       baseline=not manifest.learned, segment_rows=cfg.segment_rows,
                       target_recall=cfg.target_recall, k=cfg.k)


def plan_build(*, data: str, model: str, out: str, cfg: IndexConfig | None = None,
               append: bool = False, overwrite: bool = False,
               batch: str | None = None) -> BuildPlan:
    """Check an index build on the driver (no cluster): inputs, output, parameters.

    ``batch`` labels the data (e.g. a day): it is recorded in the manifest with the new
    segments, and an append whose label is there already adds nothing (``plan.skipped``)."""
    cfg = cfg or IndexConfig()
    if cfg.method != "permutation":
        raise InputError(f"method {cfg.method!r}: this job builds permutation indexes only; "
                         "build a subspace index with `lshdist index --method subspace`")
    if append and overwrite:
        raise InputError("--append adds to an index and --overwrite replaces it; give one")
    ds = Dataset(data)
    model_meta = read_model_meta(model)
    check_data_for_model(ds, model_meta, "dataset")
    check_not_input(out, (data, model))
    if append:
        manifest = read_permutation_manifest(out, "--append")
        if isinstance(manifest, HyperplaneManifest):
            raise InputError(f"index {out!r} is a hyperplane index ({manifest.family.name}"
                             "); --append is not supported for it: rebuild it with --overwrite")
        if manifest.model_checksum != model_meta["checksum"]:
            raise InputError(f"index {out!r} was built with another model "
                             f"({manifest.model!r}); append needs the same model")
        cfg = _check_append(out, cfg, manifest)
        skipped = manifest.has_batch(batch)
        if not skipped:
            _check_new_ids(out, manifest, ds)
    else:
        check_output(out, overwrite, kind=FORMAT)
        if cfg.calibration_queries is not None:
            check_data_for_model(Dataset(cfg.calibration_queries), model_meta,
                                 "calibration queries")
        manifest = PermutationManifest(
            model=resolved(model), model_checksum=model_meta["checksum"],
            kind=model_meta["kind"], d=model_meta["d"], **_recorded(cfg), segments=(), rows=0)
    segments = segment_shards(ds.shard_bounds.tolist(), cfg.segment_rows)
    bounds = ds.shard_bounds
    rows = max((int(bounds[b] - bounds[a]) for a, b in segments), default=0)
    plan = BuildPlan(ds, as_path(model), as_path(out), cfg, append, overwrite, model_meta, manifest,
                     segments, batch=batch, skipped=append and skipped)
    if append:
        plan.lists = manifest.permutations
    elif rows:
        plan.lists = calibrated_lists(rows, n_permutations=cfg.permutations, epsilon=cfg.epsilon)
    plan.list_bytes = _list_bytes(cfg, rows, plan.lists)
    return plan


def _list_bytes(cfg: IndexConfig, rows: int, lists: int | None) -> int:
    """Bytes of the permutation lists of the largest segment (int32 rows + uint64 prefixes);
    refuses an M beyond `MAX_PERMUTATIONS` (a tiny epsilon asks for millions of lists)."""
    if rows == 0:
        return 0
    m = lists or resolve_permutations(rows, epsilon=cfg.epsilon, permutations=cfg.permutations)
    if m > MAX_PERMUTATIONS:
        raise InputError(f"epsilon={cfg.epsilon} asks for M={m:,} permutation lists for "
                         f"segments of {rows:,} rows (at most {MAX_PERMUTATIONS:,}, "
                         f"{12 * m * rows / 2**30:.0f} GiB of lists); give a larger --epsilon "
                         "or --permutations")
    return 12 * m * rows


def _check_new_ids(out: str, manifest: PermutationManifest, ds: Dataset) -> None:
    """Refuse a dataset whose ids are already in the index (ids must name one row)."""
    import numpy as np

    new = ds.ids()
    for entry in manifest.segments:
        clash = np.intersect1d(segment_ids(out, entry), new)
        if len(clash):
            raise InputError(
                f"dataset {str(ds.path)!r} has ids already in index {out!r} (e.g. id "
                f"{int(clash[0])}, {len(clash)} in segment {entry.name!r}); ingest it with "
                "`--id-offset` past the index's largest id, or with an id column")


def run_build(client: Any, plan: BuildPlan, *, stall: float = ClusterConfig.stall_timeout,
              hold: list[Any] | None = None) -> PermutationManifest:
    """Run a planned build on ``client``; returns the new manifest.

    A fresh build is written beside ``out`` and renamed into place when complete; an append
    writes new segments into the index and swaps the manifest.  Both hold the index lock
    throughout (a concurrent append waits up to ``stall`` seconds, then both land).

    ``hold`` (a fresh build): receives futures of the segments exactly as written, in the
    manifest's order, kept in worker memory — a query that follows in the same cluster passes
    them to `run_query` instead of reading the index back; the caller releases them.
    """
    _check_worker_memory(client, plan.list_bytes)
    try:
        plan.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(exc, plan.out) from None
    # the whole build holds the index lock: a concurrent append waits for it (then both
    # land), and `lshdist gc` never mistakes a running build's segments for orphans.  On object
    # storage there is no lock: the manifest is committed by a conditional write, and a job
    # that loses the race merges its segments into the winner's manifest and tries again
    with index_lock(plan.out, timeout=stall):
        if plan.append:
            # another append may have landed meanwhile
            manifest = read_permutation_manifest(plan.out, "--append")
            if manifest.has_batch(plan.batch):
                log.info("batch %r is in index %s already: nothing to append", plan.batch,
                         plan.out)
                plan.skipped = True
                return manifest
            entries, _ = _build_segments(client, plan, plan.out, stall, None)
            try:
                return _commit_append(plan, entries)
            except BaseException:
                _remove_segments(plan.out, [e.name for e in entries])
                raise
        with atomic_dir(plan.out, overwrite=plan.overwrite, kind=FORMAT,
                        inputs=(plan.data.path, plan.model)) as tmp:
            tag = manifest_tag(tmp)  # object storage: the index this build replaces, if any
            old = read_index_manifest(tmp).segment_names if tag else []
            entries, op = _build_segments(client, plan, tmp, stall, hold)
            new = _with_segments(replace(plan.manifest, **op), entries, plan.batch)
            try:
                write_manifest(tmp, new, expect=tag)
            except CommitConflict:
                _remove_segments(tmp, [e.name for e in entries])
                raise InputError(f"index {str(plan.out)!r} was written by another job while "
                                 "this one built it; nothing of this build was kept: run it "
                                 "again (with --overwrite to replace that index)") from None
            if old:  # the replaced index's segments, once no manifest names them
                _remove_segments(tmp, old)
        return new


#: how many times an append on object storage merges into a newer manifest and retries
COMMIT_RETRIES = 20


def _commit_append(plan: BuildPlan, entries: list[SegmentEntry]) -> PermutationManifest:
    """Swap in the manifest with the appended ``entries``: readers see the old or the new
    index.  On object storage the write is conditional on the manifest read just before; when
    another append or a compaction committed meanwhile, the entries are merged into that newer
    manifest (its ids checked again) and the write retried."""
    for attempt in range(COMMIT_RETRIES + 1):
        read, tag = read_manifest_tagged(plan.out)
        manifest = require_permutation(read, plan.out, "--append")
        if manifest.model_checksum != plan.manifest.model_checksum:
            raise InputError(f"index {str(plan.out)!r} changed model during the append")
        if manifest.has_batch(plan.batch):
            raise InputError(f"batch {plan.batch!r} was appended to index {str(plan.out)!r} by "
                             "another job meanwhile; this append was dropped")
        _check_new_ids(str(plan.out), manifest, plan.data)
        new = _with_segments(manifest, entries, plan.batch)
        try:
            write_manifest(plan.out, new, expect=tag)
            return new
        except CommitConflict:
            log.info("index %s: another job committed first; merging and retrying (%d)",
                     plan.out, attempt + 1)
            time.sleep(min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
    raise InputError(f"index {str(plan.out)!r}: {COMMIT_RETRIES} other commits landed during "
                     "this append's commit; nothing was appended, run it again")


def _remove_segments(index_dir: Path | ObjectPath, names: list[str]) -> None:
    remove_unnamed(index_dir, names)  # the manifest never named them: what the tasks wrote


def _check_worker_memory(client: Any, list_bytes: int) -> None:
    """Refuse a build whose largest segment's lists would not fit in half a worker's memory."""
    limits = [w.get("memory_limit") or 0 for w in client.scheduler_info()["workers"].values()]
    limit = min((m for m in limits if m), default=0)
    if limit and list_bytes > limit // 2:
        raise InputError(f"a segment's permutation lists need {list_bytes / 2**30:.1f} GiB, "
                         f"more than half a worker's memory ({limit / 2**30:.1f} GiB); lower "
                         "--segment-rows or --permutations, or give the workers more memory")


_M = TypeVar("_M", bound=PermutationManifest)


def _with_segments(manifest: _M, entries: Sequence[SegmentEntry], batch: str | None = None
                   ) -> _M:
    segments = (*manifest.segments, *entries)
    batches = manifest.batches if batch is None else (*(manifest.batches or ()), batch)
    return replace(manifest, segments=segments, batches=batches,
                   rows=int(sum(e.rows for e in segments)))


def _build_segments(client: Any, plan: BuildPlan, index_dir: Path | ObjectPath, stall: float,
                    hold: list[Any] | None) -> tuple[list[SegmentEntry], dict[str, Any]]:
    """Fit every segment (in worker memory), calibrate on the first (fresh builds), then write
    each with the chosen number of lists; returns the entries and the manifest's operating
    point fields (``permutations``, ``window``, ``hamming_keep``, ``calibration_json``)."""
    cfg = plan.cfg
    (index_dir / "segments").mkdir(parents=True, exist_ok=True)
    family_f = broadcast_family(client, str(plan.model), bits=cfg.bits, seed=cfg.seed,
                                learned=not cfg.baseline)
    path = str(plan.data.path)
    lists = plan.lists
    # spread over the workers as a query loads them (`spread`): segments kept in memory for a
    # query (``hold``) are searched where they were fitted
    bounds = plan.data.shard_bounds
    where = spread([int(bounds[b] - bounds[a]) for a, b in plan.segments],
                   sorted(client.scheduler_info().get("workers", {})))
    fits = [client.submit(tasks.fit_segment, path, shards, family_f, lists,
                          None if lists else cfg.epsilon, cfg.seed, pure=False, retries=2,
                          workers=None if w is None else [w], allow_other_workers=w is not None)
            for shards, w in zip(plan.segments, where)]
    names = [new_segment_name() for _ in plan.segments]
    held = [*fits, family_f]
    try:
        if plan.append:
            op: dict[str, Any] = {}
            keep, window, hkeep = lists, plan.manifest.window, plan.manifest.hamming_keep
        else:
            fixed = {"permutations": lists if (cfg.permutations or cfg.epsilon) else None,
                     "window": cfg.window, "hamming_keep": cfg.hamming_keep}
            t_cal = time.perf_counter()
            pooled = _merged_grid(client, fits, family_f, cfg.k, cfg.target_recall, fixed,
                                  stall, data=path, shards=plan.segments[0],
                                  queries=cfg.calibration_queries, seed=cfg.seed, held=held,
                                  n_parts=len(fits), n_rows=plan.data.n)
            cal_f = client.submit(tasks.calibrate_segment, fits[0], path, plan.segments[0],
                                  family_f, cfg.k, cfg.target_recall, fixed, cfg.seed,
                                  cfg.calibration_queries, pooled, pure=False, retries=2)
            held.append(cal_f)
            for _ in _progress([cal_f], "calibrate", stall):
                pass
            # the whole calibration's wall time (the segments' scans and grids too)
            cal = replace(Calibration.from_json(cal_f.result()),
                          seconds=time.perf_counter() - t_cal)
            ref = cal.reference
            keep = ref.permutations if ref else min(p.permutations for p in cal.points)
            window = ref.window if ref else (cfg.window or 8)
            hkeep = ref.hamming_keep if ref else (cfg.hamming_keep or 0)
            op = {"calibration_json": cal.to_json()}
            log.info("calibration (%.1fs on %d rows, %d queries): %s — %s", cal.seconds,
                     cal.n_database, cal.n_queries, cal.mode, cal.reason)
        writes = [client.submit(tasks.write_fitted, fit, str(index_dir), name, keep, path,
                                shards, pure=False, retries=2)
                  for fit, name, shards in zip(fits, names, plan.segments)]
        held += writes
        for _ in _progress(writes, "index", stall):
            pass
        entries = [f.result() for f in writes]
        if hold is not None:  # computed where each fit lives, before the fits are released
            kept = [client.submit(tasks.truncated, fit, keep, pure=False) for fit in fits]
            try:
                for _ in _progress(kept, "keep", stall):
                    pass
            except BaseException:
                client.cancel(kept)
                raise
            hold += kept
    except BaseException:
        client.cancel(held)
        _remove_segments(index_dir, names)
        raise
    if hold is None:
        client.cancel(held)
    # else: cancelling a future also cancels what depends on it (the kept segments); the
    # futures are released instead when they go out of scope here
    return entries, {**op, "permutations": keep, "epsilon": None if keep else cfg.epsilon,
                     "window": window, "hamming_keep": hkeep}


def _merged_grid(client: Any, segments: Sequence[Any], family_f: Any, k: int, target: float,
                 fixed: dict[str, Any], stall: float, *, data: str | None,
                 shards: tuple[int, int] | None, queries: str | None, seed: int,
                 held: list[Any], n_parts: int, n_rows: int
                 ) -> MergedGrid | None:
    """The calibration grid of the merged answer of several segments, measured over all of
    them; None for a single searched part (its own recall@k is the answer's).

    One scan task per segment finds the calibration sample's exact neighbours in each part
    (`query_sample_size`: about 2 % of a full scan of the queries); the driver merges them to
    the true top-k and marks, per part, its rows that are true neighbours (`merged_relevance`);
    one grid task per segment counts, for every (M', W', H), how many of its marked rows it re-ranks
    (`grid_counts`); the sums give each point's recall of the merged answer and its rows
    re-ranked per query over all segments (`pooled_points`) — exactly, for the sample, with
    no assumption that the segments are alike.  A true neighbour is usually among the first
    few of its own segment, so every segment searches less than for its own recall@k.
    Windows widen while no point reaches the target (`widen_windows`, as in `calibrate`)."""
    from lshdist.index.calibrate import (
        grid_axes,
        merged_relevance,
        pooled_points,
        recall_margin,
        widen_windows,
    )

    if n_parts < 2:
        return None
    sample_f = client.submit(tasks.calibration_sample, data, shards, queries, seed,
                             family_f, pure=False, retries=2)
    nbr = [client.submit(tasks.segment_neighbours, seg, sample_f, family_f, k, pure=False,
                         retries=2) for seg in segments]
    held += [sample_f, *nbr]
    for _ in _progress(nbr, "neighbours", stall):
        pass
    parts = [f.result() for f in nbr]
    flat = [p for seg in parts for p in seg]
    if len(flat) < 2:
        return None
    _, own = sample_f.result()
    weights, masks = merged_relevance([p[0] for p in flat], [p[1] for p in flat], k, own)
    log.info("true neighbours by rank within their segment (%d searched): %s", len(flat),
             " ".join(f"{w:.2f}" for w in weights))
    m_max = min(p[2] for p in flat)
    m, w, h = (fixed.get(key) for key in ("permutations", "window", "hamming_keep"))
    ms, ws, hs = grid_axes(m_max, k, None if not m else [min(int(m), m_max)],
                           None if not w else [int(w)], None if h is None else [int(h)])
    counts = np.sum([m.sum(axis=0) for m in masks], axis=0).astype(np.float64)
    Q = flat[0][0].shape[0]
    per_seg, i = [], 0
    for seg in parts:
        per_seg.append(masks[i: i + len(seg)])
        i += len(seg)

    def measure(ws: list[int]) -> list[Any]:
        grids = [client.submit(tasks.segment_grid, seg, sample_f, family_f, k,
                               [p[1] for p in seg_parts], seg_masks, ms, ws, hs, pure=False,
                               retries=2)
                 for seg, seg_parts, seg_masks in zip(segments, parts, per_seg)]
        held.extend(grids)
        for _ in _progress(grids, "calibrate", stall):
            pass
        return pooled_points([f.result() for f in grids], counts, Q, n_rows, ms, ws, hs,
                             parts=len(flat))

    points, _ = widen_windows(measure, ws, target, recall_margin(target, Q),
                              fixed=bool(fixed.get("window")))
    # the first segment is the one calibrated (timed): its scan was timed above
    scan = next((p[3] for p in parts[0] if p[3] is not None), None)
    return points, int(counts.sum()), [float(w) for w in weights], scan


def build_index(client: Any, *, data: str, model: str, out: str,
                cfg: IndexConfig | None = None, append: bool = False,
                overwrite: bool = False) -> PermutationManifest:
    """Index dataset ``data`` under ``model`` into directory ``out``; returns the manifest."""
    return run_build(client, plan_build(data=data, model=model, out=out, cfg=cfg,
                                        append=append, overwrite=overwrite))


# ---------------------------------------------------------------------------------- query


@dataclass
class QueryPlan:
    """A checked bulk query: everything `run_query` needs, nothing started."""

    index: Path | ObjectPath
    queries: Dataset
    out: Path | ObjectPath
    cfg: QueryConfig
    overwrite: bool
    manifest: PermutationManifest
    mode: str = "hash"  # the mode the search runs in ("auto" resolved)
    op: tuple[int, int, int] | None = None  # (M, W, H) of a hashed search
    reason: str = ""
    recalibrate: bool = False  # calibrate again on a sample of the queries first
    estimate: float | None = None  # the recall the calibration predicts at ``op``


def plan_query(*, index: str, queries: str, out: str, cfg: QueryConfig | None = None,
               overwrite: bool = False) -> QueryPlan:
    """Check a bulk query on the driver (no cluster): index, model, queries, output."""
    cfg = cfg or QueryConfig()
    if cfg.mode == "rank":
        raise InputError("--mode rank ranks hyperplane keys; it answers --hyperplanes queries "
                         "of an index built with --family h-hash or eh-hash, not k-NN queries "
                         "(use auto, hash or scan)")
    check_mode(cfg.mode, KNN_MODES)
    manifest = read_permutation_manifest(index, "this query job (use `lshdist query`)")
    given = sorted({"probe", "candidates"} & cfg.given_)
    if given:
        raise InputError(f"--{given[0]}: only for a subspace index, and {index!r} is a "
                         "permutation index; drop it")
    if isinstance(manifest, HyperplaneManifest):
        raise InputError(f"index {index!r} was built for hyperplane queries "
                         f"({manifest.family.name}); query it with --hyperplanes")
    _, qds = check_query_inputs(index, manifest, queries, out, overwrite)
    if cfg.k > manifest.rows:
        log.warning("k=%d is larger than the index's %d rows: every query gets at most %d "
                    "neighbours", cfg.k, manifest.rows, manifest.rows)
    mode, op, reason = operating_point(manifest, cfg, where=f"index {index!r}")
    recal = _recalibrates(manifest, cfg, qds)
    log.info("query mode %s: %s%s", mode, reason,
             "; to be calibrated again on a sample of these queries" if recal else "")
    return QueryPlan(as_path(index), qds, as_path(out), cfg, overwrite, manifest, mode, op, reason,
                     recal, _estimate(manifest, op))


def _estimate(manifest: PermutationManifest, op: tuple[int, int, int] | None) -> float | None:
    """The recall the index's calibration measured at operating point ``op`` (None without
    a calibration, or for a point not on its curve)."""
    cal = manifest.calibration
    if cal is None or op is None:
        return None
    for p in cal.points:
        if (p.permutations, p.window, p.hamming_keep) == tuple(op):
            return float(p.recall)
    return None


def _recalibrates(manifest: PermutationManifest, cfg: QueryConfig, qds: Dataset) -> bool:
    """A bulk ``--mode auto`` query (at least `RECALIBRATE_QUERIES` rows) of an index
    calibrated on other rows (its own, or another query sample) is calibrated again on a
    sample of its own queries before it runs, as `MetricIndex.query` does: a database's own
    rows can be easier queries than the real ones."""
    cal = manifest.calibration
    if cfg.mode != "auto" or cal is None or qds.n < RECALIBRATE_QUERIES:
        return False
    sampled = (cal.extra or {}).get("queries")
    return not (isinstance(sampled, str) and resolved(sampled) == resolved(qds.path))


def operating_point(manifest: PermutationManifest, cfg: QueryConfig, *, where: str
                    ) -> tuple[str, tuple[int, int, int] | None, str]:
    """The mode and (M, W, H) a query runs with: ``--mode scan|hash`` as asked (hash at the
    index's point, or at ``--target-recall``'s point of its calibration curve); ``auto``: the
    calibration's choice (hash for an index built without calibration)."""
    own = manifest.operating_point
    cal = manifest.calibration
    if cfg.mode == "scan":
        return "scan", None, "asked for (--mode scan)"
    if cal is None:
        if cfg.target_recall is not None:
            raise InputError(f"{where} was built without calibration; --target-recall needs "
                             "an index built by this version (rebuild it)")
        return "hash", None if not own[0] else own, "the index's own parameters (no calibration)"
    built = manifest.permutations or max(p.permutations for p in cal.points)
    if cfg.target_recall is None:
        point, reason = cal.chosen, cal.reason
    else:
        _, point, reason = cal.point_for(cfg.target_recall, built)
    if cfg.mode == "hash" and point is None:
        return "hash", own, f"asked for (--mode hash) at the index's own parameters; {reason}"
    if point is None:
        return "scan", None, reason
    return "hash", (point.permutations, point.window, point.hamming_keep), reason


def run_query(client: Any, plan: QueryPlan, *, stall: float = ClusterConfig.stall_timeout,
              in_flight: int | None = None, segments: list[Any] | None = None
              ) -> dict[str, Any]:
    """Run a planned bulk query on ``client``; returns ``{queries, segments, out}``.

    At most ``in_flight`` query chunks (default: two per worker) are submitted at a time; a
    chunk's intermediate results are released once its Parquet parts are written.
    ``segments``: the index's segments already in worker memory (`run_build`'s ``hold``, in
    the manifest's order; the caller releases them), else they are read from the index.
    """
    cfg, manifest, qds = plan.cfg, plan.manifest, plan.queries
    if segments is not None and len(segments) != len(manifest.segments):
        raise InputError(f"{len(segments)} segments in memory for an index of "
                         f"{len(manifest.segments)}: pass the ones its build held")
    family_f = broadcast_family(client, manifest.model, bits=manifest.bits,
                                seed=manifest.seed, learned=manifest.learned)
    if segments is None:
        homes = placement(client, manifest)
        segs = load_segments(client, str(plan.index), manifest, homes)
    else:
        segs = list(segments)
        homes = holders(client, segs)
    if plan.recalibrate:
        plan = _calibrated_on_queries(client, plan, segs, family_f, stall)
    recall: MeasuredRecall | None = None
    if cfg.check_recall:
        plan, recall = _checked(client, plan, segs, homes, family_f, stall)
    n_workers = max(1, len(client.scheduler_info().get("workers", {})))
    window = in_flight or 2 * n_workers
    chunks = query_chunks(qds.shard_bounds.tolist(), chunk_rows(cfg.query_chunk, cfg.k))
    try:
        op = None if plan.op is None else dict(zip(("permutations", "window", "hamming_keep"),
                                                   plan.op))
        with write_results(plan.out, k=cfg.k, overwrite=plan.overwrite,
                           inputs=(plan.index, qds.path, manifest.model),
                           info={"mode": plan.mode, "operating_point": op,
                                 "reason": plan.reason,
                                 "measured_recall": None if recall is None
                                 else recall.to_json()}) as tmp:
            n = _query_chunks(client, chunks, plan, family_f, segs, homes, str(tmp), window,
                              stall)
    finally:
        client.cancel([family_f] if segments is not None else [*segs, family_f])
    return {"queries": n, "segments": len(segs), "out": str(plan.out), "mode": plan.mode,
            "operating_point": plan.op,
            "measured_recall": None if recall is None else recall.to_json()}


def sample_answer(client: Any, homes: Sequence[str | None], segs: Sequence[Any], k: int,
                  encode: tuple[Any, ...], search: tuple[Any, ...], stall: float
                  ) -> np.ndarray:
    """The merged top-``k`` ids of one sample of queries (a recall check's): `chunk_tasks`
    with ``encode`` and ``search``, merged on a worker and returned instead of written."""
    held = chunk_tasks(client, 0, homes, segs, k, encode, search, (tasks.merged_ids, k))
    ((w, rest),) = held.items()
    try:
        for _ in _progress([w], "recall check", stall):
            pass
        return np.asarray(w.result())
    finally:
        client.cancel([w, *rest])


def _checked(client: Any, plan: QueryPlan, segs: Sequence[Any], homes: Sequence[str | None],
             family_f: Any, stall: float) -> tuple[QueryPlan, MeasuredRecall]:
    """Measure the recall of the planned search on a seeded sample of its own queries
    (`lshdist.index.recall_check.check_rows`), answered by the exact scan and at the planned
    point on every segment, and keep the promise (`enforce`): re-calibrate on the queries or
    answer by the scan where the point falls short of the target.  Returns the plan the
    queries are answered with and the record for ``results.json``."""
    cfg, qds = plan.cfg, plan.queries
    cal = plan.manifest.calibration
    target = cfg.target_recall
    if target is None and cal is not None:
        target = cal.target
    rows = check_rows(qds.n, plan.manifest.seed)
    truth: list[np.ndarray] = []
    t0 = time.perf_counter()

    def answer(mode: str, op: tuple[int, int, int] | None) -> np.ndarray:
        return sample_answer(client, homes, segs, cfg.k,
                             (tasks.encode_query_rows, str(qds.path), rows, family_f,
                              mode != "scan"),
                             (tasks.search_segment, cfg.k, mode, op), stall)

    def measure(op: tuple[int, int, int] | None, estimate: float | None) -> MeasuredRecall:
        if not truth:
            truth.append(answer("scan", None))
        m = measured(answer("hash", op), truth[0], cfg.k, qds.n, mode="hash", target=target,
                     estimate=estimate)
        log.info("recall check at %s: %s", "the index's parameters" if op is None
                 else "M={}, W={}, H={}".format(*op), m.line())
        return m

    replanned: list[QueryPlan] = []

    def recalibrate() -> tuple[str, Any, str, float | None]:
        p = _calibrated_on_queries(client, plan, segs, family_f, stall)
        replanned.append(p)
        return p.mode, p.op, p.reason, p.estimate

    d = enforce(mode=plan.mode, point=plan.op, estimate=plan.estimate, target=target,
                auto=cfg.mode == "auto", n_queries=qds.n, k=cfg.k, measure=measure,
                recalibrate=None if plan.recalibrate or cal is None else recalibrate)
    if d.recall.sampled:
        log.info("recall check: %d of the %d queries answered exactly too (%.1fs, %.1f %% of "
                 "an exact scan of the queries)", d.recall.sampled, qds.n,
                 time.perf_counter() - t0, 100 * d.recall.sampled / qds.n)
    log.info("%s", d.recall.line())
    if d.reason:
        log.warning("query mode %s: %s", d.mode, d.reason)
    elif d.recall.action == "reported" and target is not None and d.recall.value < target:
        log.warning("%s", d.recall.line())
    base = replanned[-1] if replanned else plan
    return replace(base, mode=d.mode, op=d.point, reason=d.reason or base.reason), d.recall


def spread(sizes: Sequence[int], workers: Sequence[str]) -> list[str | None]:
    """A worker for each segment: largest first onto the least loaded (by rows), so that every
    worker holds about the same share of the index (a query chunk's searches run where their
    segment is; left to the scheduler, two 500,000-row segments of a 2-worker cluster were
    loaded by one worker, which then did all the searching).  None without workers."""
    if not workers:
        return [None] * len(sizes)
    load = dict.fromkeys(workers, 0)
    out: list[str | None] = [None] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        w = min(workers, key=lambda w: (load[w], workers.index(w)))
        out[i] = w
        load[w] += int(sizes[i])
    return out


def placement(client: Any, manifest: PermutationManifest) -> list[str | None]:
    """The worker each of an index's segments is loaded on (`spread` by rows)."""
    return spread([e.rows for e in manifest.segments],
                  sorted(client.scheduler_info().get("workers", {})))


def holders(client: Any, futures: Sequence[Any]) -> list[str | None]:
    """The worker holding each finished future (None where none does yet)."""
    who = client.who_has(list(futures))
    return [min(who.get(f.key) or [None], key=str) for f in futures]


def load_segments(client: Any, index: str, manifest: PermutationManifest,
                  where: Sequence[str | None] | None = None) -> list[Any]:
    """Futures of an index's segments, loaded spread over the workers (``where``, default
    `placement`; a worker that leaves is replaced by any other: the placement is a
    preference)."""
    where = placement(client, manifest) if where is None else where
    return [client.submit(tasks.load_segment, index, e, manifest, pure=False, retries=2,
                          workers=None if w is None else [w], allow_other_workers=w is not None)
            for e, w in zip(manifest.segments, where)]


def _calibrated_on_queries(client: Any, plan: QueryPlan, segs: Sequence[Any], family_f: Any,
                           stall: float) -> QueryPlan:
    """The plan with the operating point of a calibration on a sample of its queries (against
    the first segment, as a build calibrates, for the merged answer of all ``segs``;
    per-segment parameters from it)."""
    t0 = time.perf_counter()
    old = plan.manifest.calibration
    if old is None:
        raise InputError(f"index {str(plan.index)!r} was built without calibration; it cannot "
                         "be calibrated again on the queries (rebuild it)")
    target = plan.cfg.target_recall if plan.cfg.target_recall is not None else old.target
    fixed = old.extra.get("fixed") or {}
    held: list[Any] = []
    try:
        pooled = _merged_grid(client, segs, family_f, plan.cfg.k, target, fixed, stall,
                              data=None, shards=None, queries=str(plan.queries.path),
                              seed=plan.manifest.seed, held=held,
                              n_parts=sum(e.n_parts for e in plan.manifest.segments),
                              n_rows=plan.manifest.rows)
    finally:
        client.cancel(held)
    f = client.submit(tasks.calibrate_on_queries, segs[0], str(plan.queries.path), family_f,
                      plan.cfg.k, target, fixed, plan.manifest.seed, pooled,
                      pure=False, retries=2)
    for _ in _progress([f], "calibrate", stall):
        pass
    # the whole calibration's wall time (the segments' scans and grids too), not only the
    # timing task's
    cal = replace(Calibration.from_json(f.result()), seconds=time.perf_counter() - t0)
    log.info("calibration on %d of the %d queries (%.1fs): %s — %s", cal.n_queries,
             plan.queries.n, cal.seconds, cal.mode, cal.reason)
    if cal.chosen is None:
        return replace(plan, mode="scan", op=None, estimate=None,
                       reason=f"calibrated on the queries: {cal.reason}")
    p = cal.chosen
    return replace(plan, mode="hash", op=(p.permutations, p.window, p.hamming_keep),
                   reason=f"calibrated on the queries: {cal.reason}", estimate=p.recall)


def _query_chunks(client: Any, chunks: list[tuple[int, int]], plan: QueryPlan, family_f: Any,
                  segs: list[Any], homes: Sequence[str | None], tmp: str, window: int,
                  stall: float) -> int:
    """Answer the chunks (`chunk_tasks`: each encoded on every worker holding segments)."""
    cfg, qds = plan.cfg, plan.queries
    held: dict[Any, list[Any]] = {}  # writer future -> the chunk's intermediate futures
    total, t0, done_chunks = 0, time.perf_counter(), 0

    def submit(c: int) -> None:
        a, b = chunks[c]
        held.update(chunk_tasks(client, c, homes, segs, cfg.k,
                                (tasks.encode_queries, str(qds.path), a, b, family_f,
                                 plan.mode != "scan"),
                                (tasks.search_segment, cfg.k, plan.mode, plan.op),
                                (tasks.merge_and_write, cfg.k, tmp, c)))

    def done(w: Any) -> None:
        nonlocal total, done_chunks
        total += int(w.result())
        done_chunks += 1
        log.info("query  [%-20s] %d/%d chunks, %.1fs", "#" * (20 * done_chunks
                 // len(chunks)), done_chunks, len(chunks), time.perf_counter() - t0)

    try:
        windowed(client, held, len(chunks), submit, done, window, stall)
    except BaseException:
        for w, rest in held.items():
            client.cancel([w, *rest])
        raise
    return total


def chunk_tasks(client: Any, c: int, homes: Sequence[str | None], segs: Sequence[Any],
                k: int, encode: tuple[Any, ...], search: tuple[Any, ...],
                merge: tuple[Any, ...]) -> dict[Any, list[Any]]:
    """Submit query chunk ``c``: ``encode`` = (function, *args) once on every worker holding
    segments (``homes``: where each of ``segs`` is), ``search`` = (function, *args after the
    segment and the encoding) per segment beside its worker's encoding, each worker's partial
    answers merged there into one (`tasks.merge_partials`, top ``k``), and ``merge`` =
    (function, *args after the encoding and the partials) on the workers in turn.  Returns
    {merge future: [the chunk's other futures]} for `windowed`.

    No search waits for another worker's encoded queries, and one partial answer per worker
    travels.  Sent between two workers, the 31 MB of a 10,000 x 784 chunk kept both workers'
    event loops copying while their searches waited (measured:
    the 1 M query stage 89 -> 76 s on 2 workers).  The placements are preferences: a task
    whose worker leaves runs elsewhere, with the same answers (lshdist's clusters run without
    work stealing, `lshdist.cluster.client.SCHEDULER_PLACEMENT`, which moved segments)."""
    if not segs:
        raise InputError("a query chunk needs at least one segment to search")
    where = list(dict.fromkeys(homes))  # distinct, in the segments' order
    fn, *args = encode
    encs = {w: client.submit(fn, *args, pure=False, retries=2,
                             workers=None if w is None else [w], allow_other_workers=w is not None)
            for w in where}
    fn, *args = search
    parts = [client.submit(fn, s, encs[h], *args, pure=False, retries=2)
             for s, h in zip(segs, homes)]
    mine = {w: [p for p, h in zip(parts, homes) if h == w] for w in where}
    local = [ps[0] if len(ps) == 1 else
             client.submit(tasks.merge_partials, ps, k, pure=False, retries=2,
                           workers=None if w is None else [w], allow_other_workers=w is not None)
             for w, ps in mine.items()]
    at = where[c % len(where)]  # merges take turns on the workers, beside an encoding
    fn, *args = merge
    w = client.submit(fn, encs[at], local, *args, pure=False, retries=2,
                      workers=None if at is None else [at], allow_other_workers=at is not None)
    return {w: [*encs.values(), *parts, *local]}


def windowed(client: Any, held: dict[Any, list[Any]], n: int, submit: Callable[[int], None],
             done: Callable[[Any], None], window: int, stall: float) -> None:
    """Run chunks ``0..n-1`` with at most ``window`` in flight: ``submit(c)`` puts chunk c's
    final future in ``held`` (with its intermediate futures), ``done(future)`` takes each
    result; a finished chunk's futures are released before the next is submitted.  A chunk
    that does not finish for ``stall`` seconds fails the job with a `ClusterError`."""
    from distributed import wait

    nxt = 0
    while nxt < n and len(held) < window:
        submit(nxt)
        nxt += 1
    while held:
        try:
            finished, _ = wait(list(held), timeout=stall, return_when="FIRST_COMPLETED")
        except TimeoutError:
            raise ClusterError(f"query: no chunk finished for {stall:.0f}s; "
                               f"{stalled_reason(held)}") from None
        for w in finished:
            done(w)
            client.cancel(held.pop(w))  # release the chunk's encoded queries and partials
            if nxt < n:
                submit(nxt)
                nxt += 1


def query_index(client: Any, *, index: str, queries: str, out: str,
                cfg: QueryConfig | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Bulk k-NN of every row of ``queries``; Parquet parts under ``out``."""
    return run_query(client, plan_query(index=index, queries=queries, out=out, cfg=cfg,
                                        overwrite=overwrite))
