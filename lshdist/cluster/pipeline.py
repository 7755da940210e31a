"""The permutation index as an index kind of the cluster driver (ARCHITECTURE.md sections 1
and 4; `PermutationKind`, run by `lshdist.cluster.driver`).

Each job is planned on the driver first (`plan_build`, `plan_query`: every input checked, no
cluster needed) and then run on a Dask client (`run_build`, `run_query`), so bad input is
refused before any cluster starts.

The hash family is built once from the model and broadcast to the workers; one task per segment
(a run of whole dataset shards) fits its permutation lists in worker memory, the calibration
measures the merged answer of all of them, then each is written with the chosen number of lists.
Queries: the hash family is shared, each chunk is encoded on the workers and searched per
segment where the segment lives (`lshdist.cluster.driver.chunk_tasks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from lshdist.cluster import driver, tasks
from lshdist.cluster.checks import check_data_for_model, check_query_inputs
from lshdist.config import (
    KNN_MODES,
    ClusterConfig,
    IndexConfig,
    QueryConfig,
    check_mode,
    default_key_bits,
)
from lshdist.errors import InputError
from lshdist.index.calibrate import Calibration, MergedGrid
from lshdist.index.params import resolve_permutations
from lshdist.index.recall_check import MeasuredRecall, check_rows, enforce, line_of, measured
from lshdist.index.searcher import RECALIBRATE_QUERIES, calibrated_lists
from lshdist.limits import MAX_PERMUTATIONS
from lshdist.store.atomic import check_not_input, check_output
from lshdist.store.dataset import Dataset
from lshdist.store.index import (
    FORMAT,
    IndexManifest,
    PermutationManifest,
    SegmentEntry,
    new_segment_name,
    read_permutation_manifest,
    remove_unnamed,
    require_permutation,
    segment_ids,
)
from lshdist.store.manifest import HyperplaneManifest
from lshdist.store.model import read_model_meta
from lshdist.store.objects import ObjectPath, as_path, resolved

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


def broadcast_family(client: Any, model: str, *, bits: int, seed: int, learned: bool,
                     checksum: str) -> Any:
    """The hash family on every worker, built once (`lshdist.cluster.driver.share`: one task
    loads the model, checksums verified -- the model's must be ``checksum`` --, and builds the
    family); returns its future.  A later job in the same client with the same model and
    parameters takes the same family (a query after its build)."""
    return driver.share(client, tasks.load_family, resolved(model), bits, seed, learned,
                        checksum, reuse=True)


# ---------------------------------------------------------------------------------- build


@dataclass(frozen=True)
class CheckSample:
    """The recall check of the query planned with a build (`build_and_query`): the query
    set, its sample's rows (`check_rows`) and k.  The build finds their exact neighbours on
    the fitted segments (`tasks.check_truth`), still in worker memory."""

    queries: str
    rows: np.ndarray
    k: int


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
    check: CheckSample | None = None  # (a fresh build with a following query) its recall check
    #: b was given (a fresh build without it: `build_and_query` may choose it again, knowing
    #: the queries, `lshdist.config.default_key_bits`)
    bits_given: bool = True

    @property
    def inputs(self) -> tuple[Any, ...]:
        return (self.data.path, self.model)

    @property
    def memory_bytes(self) -> int:
        return self.list_bytes


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
    bits_given = True
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
        # b not given: `default_key_bits` of a build whose queries are not known yet (a
        # following query may change it: `build_and_query`), recorded in the manifest
        bits_given = cfg.bits is not None
        cfg = replace(cfg, bits=cfg.key_bits(model_meta["kind"] == "explicit"))
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
                     segments, batch=batch, skipped=append and skipped,
                     bits_given=bits_given)
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
    """Run a planned build on ``client`` (`lshdist.cluster.driver.build`); returns the new
    manifest.

    ``hold`` (a fresh build): receives futures of the segments exactly as written, in the
    manifest's order, kept in worker memory — a query that follows in the same cluster passes
    them to `run_query` instead of reading the index back; the caller releases them.
    """
    m = driver.build(client, PERMUTATION, plan, stall=stall, hold=hold)
    return require_permutation(m, plan.out, "this build")

def _appended(plan: BuildPlan, current: IndexManifest, entries: Sequence[SegmentEntry]
              ) -> PermutationManifest:
    """The manifest of an append: ``entries`` added to the index's ``current`` manifest (read
    just before the commit; another append or a compaction may have committed since the
    build began), checked again -- same model, the batch not landed meanwhile, no id twice."""
    manifest = require_permutation(current, plan.out, "--append")
    if manifest.model_checksum != plan.manifest.model_checksum:
        raise InputError(f"index {str(plan.out)!r} changed model during the append")
    if manifest.has_batch(plan.batch):
        raise InputError(f"batch {plan.batch!r} was appended to index {str(plan.out)!r} by "
                         "another job meanwhile; this append was dropped")
    _check_new_ids(str(plan.out), manifest, plan.data)
    return _with_segments(manifest, entries, plan.batch)


_M = TypeVar("_M", bound=PermutationManifest)


def _with_segments(manifest: _M, entries: Sequence[SegmentEntry], batch: str | None = None
                   ) -> _M:
    segments = (*manifest.segments, *entries)
    batches = manifest.batches if batch is None else (*(manifest.batches or ()), batch)
    return replace(manifest, segments=segments, batches=batches,
                   rows=int(sum(e.rows for e in segments)))


def _build_segments(client: Any, plan: BuildPlan, index_dir: Path | ObjectPath, run: driver.Run
                    ) -> tuple[list[SegmentEntry], dict[str, Any]]:
    """Fit every segment (in worker memory), calibrate on the first (fresh builds), then write
    each with the chosen number of lists; returns the entries and the manifest's operating
    point fields (``permutations``, ``window``, ``hamming_keep``, ``calibration_json``).
    ``run.hold``: receives the segments as written, kept in worker memory (made ahead of the
    writes: a following query searches them while the writes run, `run.calibrated`)."""
    cfg, stall, hold = plan.cfg, run.stall, run.hold
    (index_dir / "segments").mkdir(parents=True, exist_ok=True)
    family_f = broadcast_family(client, str(plan.model),
                                bits=cfg.key_bits(plan.model_meta["kind"] == "explicit"),
                                seed=cfg.seed, learned=not cfg.baseline,
                                checksum=plan.model_meta["checksum"])
    path = str(plan.data.path)
    lists = plan.lists
    # spread over the workers as a query loads them (`spread`): segments kept in memory for a
    # query (``hold``) are searched where they were fitted
    bounds = plan.data.shard_bounds
    sizes = [int(bounds[b] - bounds[a]) for a, b in plan.segments]
    where = driver.spread(sizes, driver.workers_of(client))
    # a fresh build of several segments calibrates on a sample read first: it runs while the
    # fits do (ahead of them on one worker, which the uneven fits leave waiting anyway), so
    # the segments' scans of it start as soon as each fit ends
    # (a check only for a query that searches these segments as fitted: ``hold``)
    truths = _CheckTruths(client, None if hold is None or plan.append else plan.check,
                          where, family_f)
    sample_f = None
    if not plan.append and len(plan.segments) > 1:
        sample_f = _sample(client, path, plan.segments[0], cfg.calibration_queries, cfg.seed,
                           family_f, priority=1)
        truths.read(priority=1)  # (its truth is found by the calibration's scans)
    fits = [driver.submit_at(client, w, tasks.fit_segment, path, shards, family_f, lists,
                             None if lists else cfg.epsilon, cfg.seed)
            for shards, w in zip(plan.segments, where)]
    names = [new_segment_name() for _ in plan.segments]
    held = [*fits, family_f, *([sample_f] if sample_f is not None else [])]
    shared: dict[str, Any] = {}
    writes: list[Any] = []
    kept: list[Any] = []

    def write(lists_kept: int | None) -> None:
        # the segments kept in memory first (submitted ahead of the writes, so run before
        # them on their workers; after the calibration's timing task, submitted before):
        # a query that follows need not wait for the writes
        if hold is not None:
            kept.extend(client.submit(tasks.truncated, fit, lists_kept, pure=False)
                        for fit in fits)
            held.extend(kept)
        writes.extend(_write_segments(client, fits, index_dir, names, lists_kept, path,
                                      plan.segments))
        held.extend(writes)

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
                                  n_parts=len(fits), n_rows=plan.data.n, sample_f=sample_f,
                                  truths=truths)
            # the timing task decides hash or scan; the grid alone fixes the lists kept
            cal_f = client.submit(tasks.calibrate_segment, fits[0], path, plan.segments[0],
                                  family_f, cfg.k, cfg.target_recall, fixed, cfg.seed,
                                  cfg.calibration_queries,
                                  None if pooled is None else pooled.grid,
                                  None if pooled is None else pooled.sample,
                                  pure=False, retries=2)
            held.append(cal_f)
            shared = truths.futures(fits)  # (behind the timing task on its worker)
            held += shared.values()
            written = None if pooled is None else pooled.kept(cfg.target_recall)
            if written is not None:
                write(written)
            for _ in driver.progress([cal_f], "calibrate", stall):
                pass
            # the whole calibration's wall time (the segments' scans and grids too)
            cal = replace(Calibration.from_json(cal_f.result()),
                          seconds=time.perf_counter() - t_cal)
            ref = cal.reference
            keep = ref.permutations if ref else min(p.permutations for p in cal.points)
            if written is not None and keep != written:
                raise RuntimeError(  # one function decides both (`calibrate.kept_lists`)
                    f"internal error: the calibration kept {keep} lists, the segments were "
                    f"written with {written}")
            window = ref.window if ref else (cfg.window or 8)
            hkeep = ref.hamming_keep if ref else (cfg.hamming_keep or 0)
            op = {"calibration_json": cal.to_json()}
            log.info("calibration (%.1fs on %d rows, %d queries): %s — %s", cal.seconds,
                     cal.n_database, cal.n_queries, cal.mode, cal.reason)
        if not writes:  # (else written while the calibration timed its point)
            write(keep)
        op = {**op, "permutations": keep, "epsilon": None if keep else cfg.epsilon,
              "window": window, "hamming_keep": hkeep}
        if run.calibrated is not None and hold is not None and not plan.append:
            # the manifest to be committed, for the query's plan: its entries' checksums
            # come with the writes
            run.calibrated(_with_segments(replace(plan.manifest, **op), [
                SegmentEntry(name=n, rows=r, permutations=keep or 0, checksum="")
                for n, r in zip(names, sizes)]), list(kept), driver.holders(client, fits),
                shared)
        for _ in driver.progress(writes, "index", stall):
            pass
        entries = [f.result() for f in writes]
        for _ in driver.progress(kept, "keep", stall):
            pass
        if hold is not None:
            hold += kept
    except BaseException:
        driver.cancel_unshared(client, [*held, *truths.pending()])
        remove_unnamed(index_dir, names)
        raise
    if hold is None:
        driver.cancel_unshared(client, held)
    # else: cancelling a future also cancels what depends on it (the kept segments); the
    # futures are released instead when they go out of scope here
    return entries, op


def _write_segments(client: Any, fits: Sequence[Any], index_dir: Path | ObjectPath,
                    names: Sequence[str], keep: int | None, path: str,
                    segments: Sequence[tuple[int, int]]) -> list[Any]:
    """One `write_fitted` task per fitted segment, each with its first ``keep`` lists."""
    return [client.submit(tasks.write_fitted, fit, str(index_dir), name, keep, path, shards,
                          pure=False, retries=2)
            for fit, name, shards in zip(fits, names, segments)]


class _CheckTruths:
    """For the query that follows a fresh build (``check``): its recall check's sample,
    read once, and that sample's exact top-k in each fitted segment, merged over the segments.

    A build that calibrates on a merged grid finds them in its scans of the calibration
    sample (`fold`: `tasks.segment_neighbours` given the check's sample, read ahead of the
    fits with the calibration's, `read`); else one `tasks.check_truth` task per segment, on
    the segment the fit still holds, submitted after the calibration's tasks (`futures`),
    behind them on the worker (lower priority): the check adds no time to the calibration,
    which the writes and the query wait for."""

    def __init__(self, client: Any, check: CheckSample | None, where: Sequence[str | None],
                 family_f: Any) -> None:
        self.client, self.check, self.where = client, check, where
        self.family_f = family_f
        self.sample: Any = None
        self.parts: list[Any] = [None] * len(where)

    def read(self, priority: int = -1) -> Any:
        """The check's sample (a future, submitted once; None without a check)."""
        check = self.check
        if check is not None and self.sample is None:
            self.sample = self.client.submit(tasks.read_query_rows, check.queries, check.rows,
                                             self.family_f, pure=False, retries=2,
                                             priority=priority)
        return self.sample

    def fold(self, neighbours: Sequence[Any]) -> None:
        """Every segment's truth found by its `tasks.segment_neighbours` task ``neighbours``
        (submitted with `read`'s sample and the check's k)."""
        self.parts = list(neighbours)

    def pending(self) -> list[Any]:
        """The futures submitted so far (what a failed build cancels)."""
        return [f for f in (self.sample, *self.parts) if f is not None]

    def futures(self, fits: Sequence[Any]) -> dict[str, Any]:
        """Every segment's truth submitted (on the fitted segments ``fits``, where not found
        by the calibration's scans), and the query's shared futures: ``check_sample`` and
        ``check_truth`` (``(rows, ids)``, `tasks.check_answer`); empty without a check."""
        check = self.check
        if check is None:
            return {}
        for j, fit in enumerate(fits):
            if self.parts[j] is None:
                self.parts[j] = driver.submit_at(self.client, self.where[j], tasks.check_truth,
                                                 fit, self.read(), self.family_f, check.k,
                                                 priority=-1)
        truth_f = self.client.submit(tasks.check_answer, check.rows, self.parts, check.k,
                                     pure=False, retries=2, priority=-1)
        return {"check_sample": self.sample, "check_truth": truth_f}


@dataclass(frozen=True)
class Pooled:
    """A merged calibration grid (`_merged_grid`) and what the timing task reuses: the
    calibration sample (a future: read and encoded once), the query payload's width and the
    sample's size (the lists kept follow from the grid: `kept`)."""

    grid: MergedGrid
    sample: Any
    width: float
    n_queries: int

    def kept(self, target: float) -> int:
        from lshdist.index.calibrate import kept_lists, recall_margin

        return kept_lists(self.grid[0], target, self.width,
                          recall_margin(target, self.n_queries))


def _merged_grid(client: Any, segments: Sequence[Any], family_f: Any, k: int, target: float,
                 fixed: dict[str, Any], stall: float, *, data: str | None,
                 shards: tuple[int, int] | None, queries: str | None, seed: int,
                 held: list[Any], n_parts: int, n_rows: int, sample_f: Any = None,
                 truths: _CheckTruths | None = None) -> Pooled | None:
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
    Windows widen while no point reaches the target (`widen_windows`, as in `calibrate`).
    ``sample_f``: the `calibration_sample` of these arguments, submitted already.
    ``truths``: a recall check whose exact neighbours the scans find too (`_CheckTruths.fold`;
    the segments are fitted ones)."""
    from lshdist.index.calibrate import (
        grid_axes,
        merged_relevance,
        pooled_points,
        recall_margin,
        widen_windows,
    )

    if n_parts < 2:
        return None
    if sample_f is None:
        sample_f = _sample(client, data, shards, queries, seed, family_f)
    check: tuple[Any, ...] = ()
    if truths is not None and truths.check is not None:
        check = (truths.read(), truths.check.k)
    # only the first segment's scan is timed (its seconds are the calibration's, below)
    nbr = [client.submit(tasks.segment_neighbours, seg, sample_f, family_f, k, j == 0, *check,
                         pure=False, retries=2) for j, seg in enumerate(segments)]
    held += [sample_f, *nbr]  # (sample_f twice when the build submitted it: harmless)
    if check and truths is not None:
        truths.fold(nbr)
    for _ in driver.progress(nbr, "neighbours", stall):
        pass
    parts = [f.result().parts for f in nbr]
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
        for _ in driver.progress(grids, "calibrate", stall):
            pass
        return pooled_points([f.result() for f in grids], counts, Q, n_rows, ms, ws, hs,
                             parts=len(flat))

    points, _ = widen_windows(measure, ws, target, recall_margin(target, Q),
                              fixed=bool(fixed.get("window")))
    # the first segment is the one calibrated (timed): its scan was timed above
    scan = next((p[3] for p in parts[0] if p[3] is not None), None)
    return Pooled((points, int(counts.sum()), [float(w) for w in weights], scan), sample_f,
                  float(flat[0][4]), Q)


def _sample(client: Any, data: str | None, shards: tuple[int, int] | None,
            queries: str | None, seed: int, family_f: Any, priority: int = 0) -> Any:
    """The future of a calibration's `tasks.calibration_sample` (read once, reused by the
    segments' scans and grids and the timing task)."""
    return client.submit(tasks.calibration_sample, data, shards, queries, seed, family_f,
                         pure=False, retries=2, priority=priority)


def build_index(client: Any, *, data: str, model: str, out: str,
                cfg: IndexConfig | None = None, append: bool = False,
                overwrite: bool = False) -> PermutationManifest:
    """Index dataset ``data`` under ``model`` into directory ``out``; returns the manifest."""
    return run_build(client, plan_build(data=data, model=model, out=out, cfg=cfg,
                                        append=append, overwrite=overwrite))


# ---------------------------------------------------------------------------------- query


@dataclass
class QueryPlan(driver.DatasetQuery):
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
    cfg = _query_config(cfg, index)
    manifest = read_permutation_manifest(index, "this query job (use `lshdist query`)")
    if isinstance(manifest, HyperplaneManifest):
        raise InputError(f"index {index!r} was built for hyperplane queries "
                         f"({manifest.family.name}); query it with --hyperplanes")
    _, qds = check_query_inputs(index, manifest, queries, out, overwrite)
    return _planned(manifest, as_path(index), qds, as_path(out), cfg, overwrite)


def _query_config(cfg: QueryConfig | None, index: str) -> QueryConfig:
    """The query's settings, refusing those a k-NN query of a permutation index has not."""
    cfg = cfg or QueryConfig()
    if cfg.mode == "rank":
        raise InputError("--mode rank ranks hyperplane keys; it answers --hyperplanes queries "
                         "of an index built with --family h-hash or eh-hash, not k-NN queries "
                         "(use auto, hash or scan)")
    check_mode(cfg.mode, KNN_MODES)
    given = sorted({"probe", "candidates"} & cfg.given_)
    if given:
        raise InputError(f"--{given[0]}: only for a subspace index, and {index!r} is a "
                         "permutation index; drop it")
    return cfg


def _planned(manifest: PermutationManifest, index: Path | ObjectPath, qds: Dataset,
             out: Path | ObjectPath, cfg: QueryConfig, overwrite: bool) -> QueryPlan:
    """The plan of a checked query of the index of ``manifest``: its mode and operating point."""
    if cfg.k > manifest.rows:
        log.warning("k=%d is larger than the index's %d rows: every query gets at most %d "
                    "neighbours", cfg.k, manifest.rows, manifest.rows)
    mode, op, reason = operating_point(manifest, cfg, where=f"index {str(index)!r}")
    recal = _recalibrates(manifest, cfg, qds)
    log.info("query mode %s: %s%s", mode, reason,
             "; to be calibrated again on a sample of these queries" if recal else "")
    return QueryPlan(index, qds, out, cfg, overwrite, manifest, mode, op, reason, recal,
                     _estimate(manifest, op))


@dataclass(frozen=True)
class FollowingQuery:
    """A bulk query of the index a planned build will make, checked with the build
    (`plan_following_query`); its mode and operating point come from the build's
    calibration (`build_and_query`)."""

    queries: Dataset
    out: Path | ObjectPath
    cfg: QueryConfig
    overwrite: bool


def plan_following_query(build: BuildPlan, *, queries: str, out: str,
                         cfg: QueryConfig | None = None, overwrite: bool = False
                         ) -> FollowingQuery:
    """Check, before any cluster starts, a bulk query of the index that the fresh build
    ``build`` will make: the queries against its model, the results directory (not the index,
    the data or the model)."""
    if build.append:
        raise InputError("a query planned with its build needs a fresh build, not --append "
                         "(append, then query the index)")
    cfg = _query_config(cfg, str(build.out))
    _, qds = check_query_inputs(str(build.out), build.manifest, queries, out, overwrite)
    return FollowingQuery(qds, as_path(out), cfg, overwrite)


def build_and_query(client: Any, build: BuildPlan, query: FollowingQuery, *,
                    stall: float = ClusterConfig.stall_timeout, in_flight: int | None = None,
                    hold: list[Any] | None = None
                    ) -> tuple[PermutationManifest, dict[str, Any], dict[str, float]]:
    """Run a planned fresh build and the query planned with it (`plan_following_query`) as
    one job (`lshdist.cluster.driver.build_and_query`): the query starts once the build's
    operating point is fixed, searching the segments in worker memory while they are written,
    and its results are committed after the index.  ``hold``: see `run_build`.  Returns the
    manifest, the query's result (`run_query`'s) and the seconds (``index``, ``query`` --
    they overlap -- and ``total``)."""
    def plan_of(manifest: IndexManifest) -> QueryPlan:
        m = require_permutation(manifest, build.out, "this build")
        return _planned(m, build.out, query.queries, query.out, query.cfg, query.overwrite)

    if not build.bits_given:  # b for this build and the queries that follow it
        bits = default_key_bits(build.model_meta["kind"] == "explicit", rows=build.data.n,
                                queries=query.queries.n, segments=len(build.segments))
        build = replace(build, cfg=replace(build.cfg, bits=bits),
                        manifest=replace(build.manifest, bits=bits))
    if query.cfg.check_recall and query.cfg.mode != "scan" and not build.append:
        build = replace(build, check=CheckSample(str(query.queries.path), check_rows(
            query.queries.n, build.manifest.seed), query.cfg.k))

    m, r, seconds = driver.build_and_query(client, PERMUTATION, build, plan_of, stall=stall,
                                           in_flight=in_flight, hold=hold)
    return require_permutation(m, build.out, "this build"), _query_result(r), seconds


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
    """Run a planned bulk query on ``client`` (`lshdist.cluster.driver.query`); returns
    ``{queries, segments, out, mode, operating_point, measured_recall}``.

    At most ``in_flight`` query chunks (default: two per worker) are submitted at a time.
    ``segments``: the index's segments already in worker memory (`run_build`'s ``hold``, in
    the manifest's order; the caller releases them), else they are read from the index.
    """
    return _query_result(driver.query(client, PERMUTATION, plan, stall=stall,
                                      in_flight=in_flight, segments=segments))


def _query_result(r: dict[str, Any]) -> dict[str, Any]:
    op = r["operating_point"]
    return {"queries": r["queries"], "segments": r["segments"], "out": r["out"],
            "mode": r["mode"], "operating_point": None if op is None else tuple(op.values()),
            "measured_recall": r["measured_recall"]}


def _checked(client: Any, plan: QueryPlan, loaded: driver.Loaded, stall: float
             ) -> tuple[QueryPlan, MeasuredRecall]:
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
    family_f, segs = loaded.shared["family"], loaded.segments
    sample: list[Any] = []  # the sample's rows, read once at the first answer (a scan-mode
    #                         job measures nothing and reads nothing)

    # the build this query follows read the sample and found its exact neighbours already
    # (`_check_truth`): used when they are this check's rows and k
    found = loaded.shared.get("check_truth")
    read = loaded.shared.get("check_sample")

    def answer(mode: str, op: tuple[int, int, int] | None) -> np.ndarray:
        if not sample:
            sample.append(read if read is not None else client.submit(
                tasks.read_query_rows, str(qds.path), rows, family_f, pure=False, retries=2))
        return driver.sample_answer(
            client, loaded, cfg.k,
            driver.Chunk((tasks.encode_query_rows, sample[0], family_f, mode != "scan"),
                         (tasks.search_segment, cfg.k, mode, op), encode_once=True), stall)

    def exact() -> np.ndarray:
        if found is not None:
            for _ in driver.progress([found], "recall check", stall):
                pass
            got_rows, ids = found.result()
            if np.array_equal(got_rows, rows) and ids.shape == (len(rows), cfg.k):
                return np.asarray(ids)
            log.debug("recall check: the build's exact neighbours are of another sample; "
                      "scanning")
        return answer("scan", None)

    def measure(op: tuple[int, int, int] | None, estimate: float | None) -> MeasuredRecall:
        if not truth:
            truth.append(exact())
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

    try:
        d = enforce(mode=plan.mode, point=plan.op, estimate=plan.estimate, target=target,
                    auto=cfg.mode == "auto", n_queries=qds.n, k=cfg.k, measure=measure,
                    recalibrate=None if plan.recalibrate or cal is None else recalibrate)
    finally:
        client.cancel([f for f in sample if f is not read])  # (the build's: the job's)
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
        f = client.submit(tasks.calibrate_on_queries, segs[0], str(plan.queries.path),
                          family_f, plan.cfg.k, target, fixed, plan.manifest.seed,
                          None if pooled is None else pooled.grid,
                          None if pooled is None else pooled.sample, pure=False, retries=2)
        held.append(f)
        for _ in driver.progress([f], "calibrate", stall):
            pass
        result = f.result()
    finally:
        client.cancel(held)
    # the whole calibration's wall time (the segments' scans and grids too), not only the
    # timing task's
    cal = replace(Calibration.from_json(result), seconds=time.perf_counter() - t0)
    log.info("calibration on %d of the %d queries (%.1fs): %s — %s", cal.n_queries,
             plan.queries.n, cal.seconds, cal.mode, cal.reason)
    if cal.chosen is None:
        return replace(plan, mode="scan", op=None, estimate=None,
                       reason=f"calibrated on the queries: {cal.reason}")
    p = cal.chosen
    return replace(plan, mode="hash", op=(p.permutations, p.window, p.hamming_keep),
                   reason=f"calibrated on the queries: {cal.reason}", estimate=p.recall)


def query_index(client: Any, *, index: str, queries: str, out: str,
                cfg: QueryConfig | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Bulk k-NN of every row of ``queries``; Parquet parts under ``out``."""
    return run_query(client, plan_query(index=index, queries=queries, out=out, cfg=cfg,
                                        overwrite=overwrite))


# ------------------------------------------------------------------------------ the kind


class PermutationKind:
    """The permutation index as an index kind of `lshdist.cluster.driver`: segments of whole
    dataset shards hashed with the model's learned hash family, the first calibrated for the
    merged answer of all of them, appends with batch labels; queries calibrated again on a
    sample of their own rows where the index was calibrated on others, and their recall
    checked (`_checked`)."""

    name = "permutation"

    def chooses(self, cfg: IndexConfig) -> bool:
        return cfg.method == self.name and cfg.family is None

    def answers(self, manifest: IndexManifest) -> bool:
        return (isinstance(manifest, PermutationManifest)
                and not isinstance(manifest, HyperplaneManifest))

    def plan_build(self, *, data: str, model: str, out: str, cfg: IndexConfig,
                   append: bool = False, overwrite: bool = False, batch: str | None = None
                   ) -> BuildPlan:
        return plan_build(data=data, model=model, out=out, cfg=cfg, append=append,
                          overwrite=overwrite, batch=batch)

    def landed(self, plan: BuildPlan, manifest: IndexManifest) -> bool:
        return require_permutation(manifest, plan.out, "--append").has_batch(plan.batch)

    def build(self, client: Any, plan: BuildPlan, index_dir: Path | ObjectPath,
              run: driver.Run) -> driver.Built:
        entries, op = _build_segments(client, plan, index_dir, run)

        def manifest(current: IndexManifest | None) -> IndexManifest:
            if current is None:
                return _with_segments(replace(plan.manifest, **op), entries, plan.batch)
            return _appended(plan, current, entries)

        return driver.Built([e.name for e in entries], manifest)

    def plan_query(self, *, index: str, source: str, out: str, cfg: QueryConfig,
                   overwrite: bool = False, hyperplanes: bool = False) -> QueryPlan:
        if hyperplanes:
            raise InputError(f"index {index!r} was built for k-NN queries; --hyperplanes needs "
                             "an index built with --family h-hash or eh-hash (or use --queries)")
        return plan_query(index=index, queries=source, out=out, cfg=cfg, overwrite=overwrite)

    def load(self, client: Any, plan: QueryPlan
             ) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
        m = plan.manifest
        family_f = broadcast_family(client, m.model, bits=m.bits, seed=m.seed,
                                    learned=m.learned, checksum=m.model_checksum)
        return {"family": family_f}, [(e.rows, (tasks.load_segment, str(plan.index), e, m))
                                      for e in m.segments]

    def prepare(self, client: Any, plan: QueryPlan, loaded: driver.Loaded, run: driver.Run
                ) -> tuple[QueryPlan, dict[str, Any]]:
        family_f = loaded.shared["family"]
        if plan.recalibrate:
            plan = _calibrated_on_queries(client, plan, loaded.segments, family_f, run.stall)
        recall: MeasuredRecall | None = None
        if plan.cfg.check_recall:
            plan, recall = _checked(client, plan, loaded, run.stall)
        op = None if plan.op is None else dict(zip(("permutations", "window", "hamming_keep"),
                                                   plan.op))
        return plan, {"mode": plan.mode, "operating_point": op, "reason": plan.reason,
                      "measured_recall": None if recall is None else recall.to_json()}

    def speculative(self, plan: QueryPlan) -> QueryPlan | None:
        """A hashed query whose recall is checked (and not calibrated again first) starts its
        chunks at the planned point while the check runs: the check keeps that point unless
        it falls short of the target."""
        if plan.mode != "hash" or plan.recalibrate or not plan.cfg.check_recall:
            return None
        return plan

    def same_answers(self, a: QueryPlan, b: QueryPlan) -> bool:
        return (a.mode, a.op) == (b.mode, b.op)

    def chunk(self, plan: QueryPlan, loaded: driver.Loaded, start: int, stop: int
              ) -> driver.Chunk:
        # encoded once and sent (`driver.chunk_tasks`: measured faster than on each worker)
        return driver.Chunk((tasks.encode_queries, str(plan.queries.path), start, stop,
                             loaded.shared["family"], plan.mode != "scan"),
                            (tasks.search_segment, plan.cfg.k, plan.mode, plan.op),
                            encode_once=True)

    def describe(self, manifest: IndexManifest) -> str:
        m = require_permutation(manifest, "", "")
        return f"{m.rows} rows in {len(m.segments)} segments (b={m.bits}, W={m.window})"

    def summary(self, result: dict[str, Any]) -> str:
        line = f"{result['queries']} queries x {result['segments']} segments -> {result['out']}"
        if result.get("measured_recall"):
            line += "\n" + line_of(result["measured_recall"])
        return line


PERMUTATION = PermutationKind()
