"""The one cluster driver of every index kind (ARCHITECTURE.md sections 1 and 4).

An index kind (`IndexKind`: the permutation index of `lshdist.cluster.pipeline`, the hyperplane
index of `lshdist.cluster.hyperplane`, the subspace index of `lshdist.cluster.subspace`, or a
plug-in registered with `lshdist.cluster.kinds.register`) says *what* to compute: it plans a
job on the driver (every input checked, no cluster needed), fits and writes its segments,
calibrates, and gives, per query chunk, the task that encodes the chunk and the task that
searches one segment with it.  This module says *how* it runs, the same for every kind and
knowing none of them:

* a build (`build`) holds the index lock, writes a fresh index aside and swaps it in (on object
  storage: commits the manifest by a conditional write), or appends segments and commits the
  new manifest, merging into another job's commit and retrying where one landed first; the
  segments of a failed build are removed, never a segment a manifest names;
* a query (`query`) loads the segments spread over the workers by rows (`spread`), lets the
  kind calibrate and check its recall (`IndexKind.prepare`), then keeps at most a few query
  chunks in flight (`windowed`): each chunk encoded once per host and sent to its workers
  holding segments (or encoded on each of them, as its kind says), each segment searched where it
  lives, the partial answers merged on each worker and then for the chunk, whose Parquet
  parts are written by a task (`chunk_tasks`); results are written aside and renamed into
  place (`lshdist.store.results.write_results`);
* every wait is bounded: a job where no task finishes for ``stall`` seconds fails with a
  `ClusterError` that says why it may have stopped (`progress`, `windowed`).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from lshdist.cluster.answers import merge_and_write, merge_partials, merged_ids
from lshdist.config import ClusterConfig, IndexConfig, QueryConfig
from lshdist.errors import ClusterError, InputError
from lshdist.store.atomic import atomic_dir, os_error
from lshdist.store.dataset import Dataset
from lshdist.store.index import (
    FORMAT,
    IndexManifest,
    index_lock,
    manifest_tag,
    read_index_manifest,
    read_manifest_tagged,
    remove_unnamed,
    write_manifest,
)
from lshdist.store.objects import CommitConflict, ObjectPath
from lshdist.store.results import write_results

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ the protocol


@dataclass
class Built:
    """What an index kind's `IndexKind.build` wrote: the segment names (removed if the job
    fails before its manifest is committed) and how to make the manifest to commit from the
    index's current one (None for a fresh build; for an append, the manifest read just before
    the commit -- ``manifest`` checks it again and merges into it)."""

    names: list[str]
    manifest: Callable[[IndexManifest | None], IndexManifest]


@dataclass
class Chunk:
    """The tasks of one query chunk, each ``(function, *args)``: ``encode`` runs once per
    host and its result is sent to the host's workers holding segments (``encode_once``), or
    runs on each of them; ``search`` runs per segment as ``function(segment, encoded, *args)``
    (``per_segment``: arguments appended for each segment, in the segments' order) and
    returns a partial answer ``(dist (Q, k), ids (Q, k), candidates (Q,))``; the driver
    merges them (`lshdist.cluster.answers`)."""

    encode: tuple[Any, ...]
    search: tuple[Any, ...]
    per_segment: Sequence[tuple[Any, ...]] | None = None
    encode_once: bool = False


@dataclass
class Loaded:
    """A query's index in worker memory: the kind's futures shared by every task (``shared``,
    by name: a hash family, a metric, a router), the segments in the manifest's order and the
    worker each is on (``homes``)."""

    shared: dict[str, Any]
    segments: list[Any]
    homes: list[str | None]
    owned: bool = True  # the driver loaded the segments (and releases them at the end)


class Calibrated(Protocol):
    """`Run.calibrated`'s callback (``shared`` optional: a kind that finds nothing for the
    query calls it with three arguments)."""

    def __call__(self, manifest: Any, segments: list[Any], homes: list[str | None],
                 shared: dict[str, Any] | None = None) -> None: ...


@dataclass
class Run:
    """A job's settings every step of every kind reads: the stall timeout, and (a fresh build)
    the list that receives futures of the segments exactly as written, kept in worker memory
    for a query that follows in the same cluster."""

    stall: float = ClusterConfig.stall_timeout
    hold: list[Any] | None = None
    #: (a fresh build with ``hold``) called on the build's thread once its operating point is
    #: fixed, its segments' writes still running: ``calibrated(manifest, segments, homes,
    #: shared)`` with the manifest the build will commit (its segment entries' checksums not
    #: known yet: for planning a query, never written), the futures of the segments as they
    #: will be written, the worker of each, and futures the kind's query reads by name
    #: besides its own (`Loaded.shared`: what the build found for it) (`build_and_query`)
    calibrated: Calibrated | None = None


class BuildPlanLike(Protocol):
    """What the driver reads of a kind's planned build."""

    out: Path | ObjectPath
    overwrite: bool
    append: bool
    skipped: bool

    @property
    def inputs(self) -> tuple[Any, ...]: ...  # paths the job reads (never replaced by it)

    @property
    def memory_bytes(self) -> int: ...  # a segment's bytes in worker memory (0: not known)


class QueryPlanLike(Protocol):
    """What the driver reads of a kind's planned query."""

    index: Path | ObjectPath
    out: Path | ObjectPath
    cfg: QueryConfig
    overwrite: bool

    @property
    def inputs(self) -> tuple[Any, ...]: ...  # paths the job reads

    @property
    def bounds(self) -> list[int]: ...  # the queries' shard boundaries (first rows, then Q)


class DatasetQuery:
    """What the driver reads of a planned k-NN query over a query dataset (a kind's plan class
    derives from it): the inputs are the index, the queries and the model; the chunks follow the
    queries' shards."""

    index: Path | ObjectPath
    queries: Dataset
    manifest: IndexManifest

    @property
    def inputs(self) -> tuple[Any, ...]:
        return (self.index, self.queries.path, self.manifest.model)

    @property
    def bounds(self) -> list[int]:
        return [int(x) for x in self.queries.shard_bounds]


class IndexKind(Protocol):
    """An index kind: what `build` and `query` need to know of it.  A new kind is one module
    with a class that has these methods (and a `lshdist.store.manifest.KindManifest` subclass
    for its manifest), registered with `lshdist.cluster.kinds.register`."""

    #: the kind's name (``index.json``'s ``method``; ``--method``)
    name: str

    def chooses(self, cfg: IndexConfig) -> bool:
        """Whether an index build with ``cfg`` is of this kind."""
        ...

    def answers(self, manifest: IndexManifest) -> bool:
        """Whether this kind reads (answers queries of) an index with ``manifest``."""
        ...

    def plan_build(self, *, data: str, model: str, out: str, cfg: IndexConfig,
                   append: bool = False, overwrite: bool = False, batch: str | None = None
                   ) -> Any:
        """Check a build on the driver, no cluster: a plan (`BuildPlanLike`)."""
        ...

    def landed(self, plan: Any, manifest: IndexManifest) -> bool:
        """An append whose data is in ``manifest`` already (its batch label): nothing to do."""
        ...

    def build(self, client: Any, plan: Any, index_dir: Path | ObjectPath, run: Run) -> Built:
        """Fit, calibrate and write the segments into ``index_dir``."""
        ...

    def plan_query(self, *, index: str, source: str, out: str, cfg: QueryConfig,
                   overwrite: bool = False, hyperplanes: bool = False) -> Any:
        """Check a query on the driver, no cluster: a plan (`QueryPlanLike`).  ``source``:
        the query dataset (``hyperplanes``: the hyperplanes, a dataset or a ``.npy`` file)."""
        ...

    def load(self, client: Any, plan: Any) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
        """The futures every task shares (`share`: computed once, copied where needed) and, per
        segment, ``(rows, (function, *args))`` that loads it on a worker."""
        ...

    def prepare(self, client: Any, plan: Any, loaded: Loaded, run: Run
                ) -> tuple[Any, dict[str, Any]]:
        """Before the chunks: calibrate, measure the recall; returns the plan the chunks run
        with and what ``results.json`` records of it."""
        ...

    def chunk(self, plan: Any, loaded: Loaded, start: int, stop: int) -> Chunk:
        """The tasks of query rows ``start:stop``."""
        ...

    # Optional (`query` looks them up): ``speculative(plan)`` -- the plan whose answers the
    # chunks may start with while `prepare` runs (None: wait for it); ``same_answers(a, b)``
    # -- whether two plans answer every query alike (the speculative chunks are kept).

    def describe(self, manifest: IndexManifest) -> str:
        """One line on a built index (after ``index PATH: ``)."""
        ...

    def summary(self, result: dict[str, Any]) -> str:
        """One line on a finished query (`query`'s result)."""
        ...


# ---------------------------------------------------------------------------------- build


#: how many times an append on object storage merges into a newer manifest and retries
COMMIT_RETRIES = 20


def build(client: Any, kind: IndexKind, plan: BuildPlanLike, *,
          stall: float = ClusterConfig.stall_timeout,
          hold: list[Any] | None = None,
          calibrated: Calibrated | None = None
          ) -> IndexManifest:
    """Run a kind's planned build on ``client``; returns the committed manifest.

    A fresh build is written aside and swapped into place when complete (on object storage:
    the manifest committed by a conditional write; an index replaced meanwhile by another job
    fails this one, nothing kept); an append writes its segments into the index and commits the
    new manifest.  Both hold the index lock throughout on a local disk (a concurrent append
    waits up to ``stall`` seconds, then both land; `lshdist gc` never mistakes a running build's
    segments for orphans).  ``hold``, ``calibrated``: see `Run`."""
    check_worker_memory(client, plan.memory_bytes)
    try:
        plan.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(exc, plan.out) from None
    run = Run(stall=stall, hold=hold, calibrated=calibrated)
    with index_lock(plan.out, timeout=stall):
        if plan.append:
            # another append may have landed meanwhile
            current = read_index_manifest(plan.out)
            if kind.landed(plan, current):
                log.info("index %s: this batch is in it already, nothing to append", plan.out)
                plan.skipped = True
                return current
            built = kind.build(client, plan, plan.out, run)
            try:
                return _commit_append(plan.out, built)
            except BaseException:
                remove_unnamed(plan.out, built.names)
                raise
        with atomic_dir(plan.out, overwrite=plan.overwrite, kind=FORMAT,
                        inputs=plan.inputs) as tmp:
            tag = manifest_tag(tmp)  # object storage: the index this build replaces, if any
            old = read_index_manifest(tmp).segment_names if tag else []
            built = kind.build(client, plan, tmp, run)
            try:
                new = built.manifest(None)
                write_manifest(tmp, new, expect=tag)
            except CommitConflict:
                remove_unnamed(tmp, built.names)
                raise InputError(f"index {str(plan.out)!r} was written by another job while "
                                 "this one built it; nothing of this build was kept: run it "
                                 "again (with --overwrite to replace that index)") from None
            except BaseException:
                remove_unnamed(tmp, built.names)
                raise
            if old:  # the replaced index's segments, once no manifest names them
                remove_unnamed(tmp, old)
        return new


def _commit_append(out: Path | ObjectPath, built: Built) -> IndexManifest:
    """Swap in the manifest with the appended segments: readers see the old or the new index.
    On object storage the write is conditional on the manifest read just before; when another
    job committed meanwhile, the kind merges the segments into that newer manifest (checking
    it again) and the write is retried."""
    for attempt in range(COMMIT_RETRIES + 1):
        current, tag = read_manifest_tagged(out)
        new = built.manifest(current)
        try:
            write_manifest(out, new, expect=tag)
            return new
        except CommitConflict:
            log.info("index %s: another job committed first; merging and retrying (%d)",
                     out, attempt + 1)
            time.sleep(min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
    raise InputError(f"index {str(out)!r}: {COMMIT_RETRIES} other commits landed during "
                     "this append's commit; nothing was appended, run it again")


def check_worker_memory(client: Any, segment_bytes: int) -> None:
    """Refuse a build whose largest segment would not fit in half a worker's memory."""
    limits = [w.get("memory_limit") or 0 for w in client.scheduler_info()["workers"].values()]
    limit = min((m for m in limits if m), default=0)
    if limit and segment_bytes > limit // 2:
        raise InputError(f"a segment's permutation lists need {segment_bytes / 2**30:.1f} GiB, "
                         f"more than half a worker's memory ({limit / 2**30:.1f} GiB); lower "
                         "--segment-rows or --permutations, or give the workers more memory")


def workers_of(client: Any) -> list[str]:
    """The cluster's workers, sorted (the order `spread` places by)."""
    return sorted(client.scheduler_info().get("workers", {}))


def submit_at(client: Any, where: str | None, fn: Any, *args: Any, **kw: Any) -> Any:
    """``client.submit`` preferring worker ``where`` (an address, or a host: any of its
    workers; any other when none is left; None: any)."""
    return client.submit(fn, *args, pure=False, retries=2,
                         workers=None if where is None else [where],
                         allow_other_workers=where is not None, **kw)


#: the results `share` keeps for later jobs in the same client, by call (at most
#: `SHARED_KEPT`, the oldest dropped first)
_SHARED: dict[tuple[Any, ...], Any] = {}
SHARED_KEPT = 4


def share(client: Any, fn: Any, *args: Any, reuse: bool = False) -> Any:
    """The result of ``fn(*args)``, computed once for every worker; returns its future (each
    worker fetches a copy when its first task that needs it is ready to run).

    Not ``client.scatter(..., broadcast=True)``: scattered data has no recipe, so a worker lost
    at the wrong moment cancels every task that needs it ("lost dependencies", seen in testing);
    and not the object itself in the graph (10 MB for a 784-d explicit metric, sent with the
    graph).  The future is recomputed if every copy is lost.  Not ``client.replicate`` either:
    it blocks the driver until the result is computed and copied (0.08 s on Fashion-MNIST's
    model), so no task that needs it was submitted before; its dependents copy it anyway.

    ``reuse``: the result is kept for a later job in the same client that makes the same call
    (a query after its build: the hash family, 0.06 s of one worker while the other waits) --
    only for calls whose arguments name their input's content (a model's checksum, checked by
    the task); jobs release such a future with `cancel_unshared`, which leaves it alone."""
    key = (client.id, fn.__module__, fn.__qualname__, *args) if reuse else None
    if key is not None:
        fut = _SHARED.get(key)
        if fut is not None and fut.status in ("pending", "finished"):
            return fut
    fut = client.submit(fn, *args, pure=False, retries=2)
    if key is not None:
        _SHARED.pop(key, None)
        _SHARED[key] = fut
        while len(_SHARED) > SHARED_KEPT:
            _SHARED.pop(next(iter(_SHARED)))
    return fut


def cancel_unshared(client: Any, futures: Sequence[Any]) -> None:
    """Cancel ``futures``, except the results `share` keeps for later jobs (another job may be
    using them: they are dropped here, not cancelled)."""
    kept = {f.key for f in _SHARED.values()}
    client.cancel([f for f in futures if f.key not in kept])


# ---------------------------------------------------------------------------------- query


def query(client: Any, kind: IndexKind, plan: QueryPlanLike, *,
          stall: float = ClusterConfig.stall_timeout, in_flight: int | None = None,
          segments: list[Any] | None = None, homes: list[str | None] | None = None,
          gate: Callable[[], Any] | None = None, shared: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    """Run a kind's planned query on ``client``; returns ``{queries, segments, out}`` and what
    the kind's `IndexKind.prepare` recorded.

    At most ``in_flight`` query chunks (default: two per worker) are submitted at a time; a
    chunk's intermediate results are released once its Parquet parts are written.
    ``segments``: the index's segments already in worker memory (`build`'s ``hold``, in the
    manifest's order; the caller releases them), else they are loaded by the kind's loaders;
    ``homes``: the worker of each (default: where each is now).  ``gate``: called once every
    chunk is answered, before the results are committed (what it raises fails the query,
    nothing of its results kept): `build_and_query` waits there for its build's commit.
    ``shared``: futures added to the kind's own (`Loaded.shared`; the caller's to release).
    """
    cfg = plan.cfg
    run = Run(stall=stall)
    own, loads = kind.load(client, plan)
    shared = {**own, **(shared or {})}
    if segments is not None and len(segments) != len(loads):
        cancel_unshared(client, list(own.values()))
        raise InputError(f"{len(segments)} segments in memory for an index of {len(loads)}: "
                         "pass the ones its build held")
    if segments is None:
        homes = spread([rows for rows, _ in loads], workers_of(client))
        segs = [submit_at(client, w, *fn) for (_, fn), w in zip(loads, homes)]
        loaded = Loaded(shared, segs, homes)
    else:
        loaded = Loaded(shared, list(segments),
                        holders(client, segments) if homes is None else list(homes),
                        owned=False)
    # (the caller's shared futures are dropped, not cancelled: a cancel also cancels what
    # depends on them, which the caller may have let go of already)
    release = [*own.values(), *(loaded.segments if loaded.owned else [])]
    window = in_flight or 2 * max(1, len(workers_of(client)))
    chunks = query_chunks(plan.bounds, chunk_rows(cfg.query_chunk, cfg.k))
    ahead = getattr(kind, "speculative", lambda p: None)(plan)
    try:
        if ahead is None:
            plan, info = kind.prepare(client, plan, loaded, run)
            with write_results(plan.out, k=cfg.k, overwrite=plan.overwrite,
                               inputs=plan.inputs, info=info) as tmp:
                n = _answer_chunks(client, kind, plan, loaded, chunks, str(tmp), window, stall)
                if gate is not None:
                    gate()
        else:
            plan, info, n = _speculated(client, kind, plan, ahead, loaded, run, chunks, window,
                                        gate)
    finally:
        cancel_unshared(client, release)
    return {**info, "queries": n, "segments": len(loaded.segments), "out": str(plan.out)}


def build_and_query(client: Any, kind: IndexKind, build_plan: BuildPlanLike,
                    plan_query: Callable[[Any], Any], *,
                    stall: float = ClusterConfig.stall_timeout, in_flight: int | None = None,
                    hold: list[Any] | None = None
                    ) -> tuple[IndexManifest, dict[str, Any], dict[str, float]]:
    """A fresh build and a query of the index it makes, in one cluster: the query starts as
    soon as the build has fixed its operating point (`Run.calibrated`), on the segments kept
    in worker memory, while their writes still run -- its planning, recall check and chunks
    fill the time the workers spent waiting for the last write, the commit and the query's
    planning (Fashion-MNIST, 2 workers: 0.14-0.18 s a job, both workers) -- and its results are
    committed only after the index is: a build that fails fails the query, none of its
    results kept.  ``plan_query(manifest)``: the kind's query plan for the index's manifest
    (the one `Run.calibrated` gives; a kind that never calls it is queried once its build
    has committed).  ``hold``: receives the segments (see `Run`; the caller releases them).

    Returns the committed manifest, the query's result (`query`) and the seconds:
    ``index`` (the build, to its commit), ``query`` (from the query's start to its results'
    commit: it overlaps the build's writes) and ``total`` (both, start to end)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    held: list[Any] = [] if hold is None else hold
    ready = threading.Event()
    got: dict[str, Any] = {}
    seconds: dict[str, float] = {}

    def calibrated(manifest: Any, segments: list[Any], homes: list[str | None],
                   shared: dict[str, Any] | None = None) -> None:
        got.update(manifest=manifest, segments=segments, homes=homes, shared=shared or {})
        ready.set()

    def build_job() -> IndexManifest:
        try:
            return build(client, kind, build_plan, stall=stall, hold=held,
                         calibrated=calibrated)
        finally:
            seconds["index"] = time.perf_counter() - t0
            ready.set()  # failed, or a kind that does not call back: the main thread goes on

    t0 = time.perf_counter()
    pool = ThreadPoolExecutor(1, thread_name_prefix="lshdist-build")
    built = pool.submit(build_job)
    interrupted = False
    try:
        ready.wait()
        if got:
            plan, segments, homes = plan_query(got["manifest"]), got["segments"], got["homes"]
        else:
            # (segments the kind held, else read from the index)
            plan, segments, homes = plan_query(built.result()), held or None, None
        t1 = time.perf_counter()
        result = query(client, kind, plan, stall=stall, in_flight=in_flight,
                       segments=segments, homes=homes, gate=built.result,
                       shared=got.get("shared"))
        seconds["query"] = time.perf_counter() - t1
    except Exception:
        failed = built.exception()  # (waits for the build: its own waits are bounded)
        if failed is not None:  # the build's error is the cause
            raise failed from None
        raise
    except BaseException:
        # Ctrl-C: not held up by the build, which ends as any build does -- committed, or
        # failed and cleaned up when the caller closes the client under it
        interrupted = True
        raise
    finally:
        pool.shutdown(wait=not interrupted)
        if hold is None and not interrupted:
            client.cancel(held)
    seconds["total"] = time.perf_counter() - t0
    return built.result(), result, seconds


def _speculated(client: Any, kind: IndexKind, plan: Any, ahead: Any, loaded: Loaded, run: Run,
                chunks: list[tuple[int, int]], window: int,
                gate: Callable[[], Any] | None = None) -> tuple[Any, dict[str, Any], int]:
    """Answer the chunks with the kind's speculative plan ``ahead`` while `IndexKind.prepare`
    (a recall check: a sample answered exactly and at the planned point) runs on a driver
    thread, its tasks ahead of the chunks' on the workers; no worker waits for the check's
    steps.  When the check answers with another plan (a point short of the target: the
    queries calibrated again, or the scan), no further chunk starts, the ones running finish
    (none still writes afterwards), their parts are removed and every chunk runs again with
    that plan.  Returns ``(plan, info, queries)``."""
    from concurrent.futures import ThreadPoolExecutor

    cfg = plan.cfg
    info: dict[str, Any] = {}  # filled in before the results' manifest is written
    pool = ThreadPoolExecutor(1, thread_name_prefix="lshdist-prepare")
    prep = pool.submit(kind.prepare, client, plan, loaded, run)

    def changed() -> bool:
        return prep.done() and (prep.exception() is not None
                                or not kind.same_answers(ahead, prep.result()[0]))  # type: ignore[attr-defined]

    try:
        with write_results(plan.out, k=cfg.k, overwrite=plan.overwrite, inputs=plan.inputs,
                           info=info) as tmp:
            n = _answer_chunks(client, kind, ahead, loaded, chunks, str(tmp), window,
                               run.stall, stop=changed, priority=-1)
            final, recorded = prep.result()  # raises what the check raised
            info.update(recorded)
            if not kind.same_answers(ahead, final):  # type: ignore[attr-defined]
                log.info("query: the recall check changed the plan; the chunks answered "
                         "before it are answered again")
                for sub in ("neighbors", "stats"):
                    for part in (tmp / sub).glob("part-*.parquet"):
                        part.unlink()
                n = _answer_chunks(client, kind, final, loaded, chunks, str(tmp), window,
                                   run.stall)
            if gate is not None:
                gate()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return final, info, n


def _answer_chunks(client: Any, kind: IndexKind, plan: QueryPlanLike, loaded: Loaded,
                   chunks: list[tuple[int, int]], tmp: str, window: int, stall: float, *,
                   stop: Callable[[], bool] | None = None, priority: int = 0) -> int:
    """Answer ``chunks`` into the results directory ``tmp``; returns the queries answered.
    ``stop``: no chunk starts once it says so (the running ones finish)."""
    k = plan.cfg.k
    held: dict[Any, list[Any]] = {}  # writer future -> the chunk's intermediate futures
    total, t0, finished = 0, time.perf_counter(), 0

    def submit(c: int) -> None:
        a, b = chunks[c]
        held.update(chunk_tasks(client, c, loaded, k, kind.chunk(plan, loaded, a, b),
                                (merge_and_write, k, tmp, c), priority=priority))

    def done(w: Any) -> None:
        nonlocal total, finished
        total += int(w.result())
        finished += 1
        log.info("query  [%-20s] %d/%d chunks, %.1fs", "#" * (20 * finished // len(chunks)),
                 finished, len(chunks), time.perf_counter() - t0)

    try:
        windowed(client, held, len(chunks), submit, done, window, stall, stop=stop)
    except BaseException:
        for w, rest in held.items():
            client.cancel([w, *rest])
        raise
    return total


def sample_answer(client: Any, loaded: Loaded, k: int, chunk: Chunk, stall: float
                  ) -> np.ndarray:
    """The merged top-``k`` ids of one sample of queries (a recall check's): `chunk_tasks`
    of ``chunk``, merged on a worker and returned instead of written."""
    held = chunk_tasks(client, 0, loaded, k, chunk, (merged_ids, k))
    ((w, rest),) = held.items()
    try:
        for _ in progress([w], "recall check", stall):
            pass
        return np.asarray(w.result())
    finally:
        client.cancel([w, *rest])


def chunk_tasks(client: Any, c: int, loaded: Loaded, k: int, chunk: Chunk,
                merge: tuple[Any, ...], *, priority: int = 0) -> dict[Any, list[Any]]:
    """Submit query chunk ``c``: ``chunk.encode`` once per host, on its workers in turn (chunk
    c on the (c mod n)-th of its n workers that hold segments; `Chunk.encode_once`), else once
    on every worker holding segments; ``chunk.search`` per segment where the segment lives,
    each worker's partial answers merged there into one (`merge_partials`, top ``k``), and
    ``merge`` = (function, *args after the encoding and the partials) beside an encoding.
    Returns {merge future: [the chunk's other futures]} for `windowed`.

    Encoded once per host, a chunk travels to the host's other workers that hold segments
    (never between hosts, where a chunk sent to every other worker would load one network
    link with all of them): the hashed search's keys and re-rank payload, on its uint8 grid
    where that is exact (`DensePayload.compact`: 8.5 MB for 10,000 x 784 pixel rows, a
    quarter of their float32).  The hashed search encoded every chunk on each such worker
    before, because two workers on one host sending each other the 31 MB of a float32 chunk
    spent their event loops copying while their searches waited; encoding once is now faster
    on two workers (paired, alternated runs: 1,020,000 x 100,000 shifted Fashion-MNIST
    1.05-1.13x, Fashion-MNIST 60,000 x 10,000 1.15x end to end, and 1.11x with rows off the
    grid, sent as float32).  The encodings take turns rather than go where the scheduler
    finds a worker least busy: asked at once for every chunk in flight, it put them all on
    one worker, the other waiting for each (Fashion-MNIST, 2 workers: 0.1 s idle a chunk).
    The other kinds encode on each worker (their encodings not measured sent).  One partial
    answer per worker travels.  The placements are preferences: a task whose worker leaves
    runs elsewhere, with the same answers (lshdist's clusters run without work stealing,
    `lshdist.cluster.client.SCHEDULER_PLACEMENT`, which moved segments).
    ``priority``: Dask's (a worker runs its ready tasks of higher priority first)."""
    segs, homes = loaded.segments, loaded.homes
    if not segs:
        raise InputError("a query chunk needs at least one segment to search")
    where = list(dict.fromkeys(homes))  # distinct, in the segments' order
    if chunk.encode_once:  # once per host, its workers in turn
        hosts = hosts_of(where)
        per_host = {h: submit_at(client, ws[c % len(ws)], *chunk.encode, priority=priority)
                    for h, ws in hosts.items()}
        encs = {w: per_host[h] for h, ws in hosts.items() for w in ws}
        encoded = list(per_host.values())
        at = None
    else:  # merges take turns on the workers, beside an encoding
        encs = {w: submit_at(client, w, *chunk.encode, priority=priority) for w in where}
        at = where[c % len(where)]
        encoded = list(encs.values())
    fn, *args = chunk.search
    extra = chunk.per_segment or [()] * len(segs)
    parts = [submit_at(client, h, fn, s, encs[h], *args, *more, priority=priority)
             for s, h, more in zip(segs, homes, extra)]
    mine = {w: [p for p, h in zip(parts, homes) if h == w] for w in where}
    local = [ps[0] if len(ps) == 1 else submit_at(client, w, merge_partials, ps, k,
                                                  priority=priority)
             for w, ps in mine.items()]
    fn, *args = merge
    w = submit_at(client, at, fn, encs[at] if at is not None else encoded[c % len(encoded)],
                  local, *args, priority=priority)
    return {w: [*encoded, *parts, *local]}


def hosts_of(workers: Sequence[str | None]) -> dict[str | None, list[str | None]]:
    """The workers by host (Dask's host of each address, the key its placements accept for
    "any worker on this host"), in their order; None (no worker known) is a host of its own."""
    from distributed.comm.addressing import get_address_host

    out: dict[str | None, list[str | None]] = {}
    for w in workers:
        out.setdefault(None if w is None else get_address_host(w), []).append(w)
    return out


# ------------------------------------------------------------------------ chunks and placement


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


def holders(client: Any, futures: Sequence[Any]) -> list[str | None]:
    """The worker holding each finished future (None where none does yet)."""
    who = client.who_has(list(futures))
    return [min(who.get(f.key) or [None], key=str) for f in futures]


# ---------------------------------------------------------------------------- bounded waits


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


def progress(futures: Sequence[Any], what: str, stall: float) -> Iterator[Any]:
    """Yield futures as they finish, logging a progress bar; a job where no task finishes for
    ``stall`` seconds (a frozen scheduler or worker) fails with a `ClusterError`."""
    from distributed import wait

    pending, t0, n, k = set(futures), time.perf_counter(), len(futures), 0
    while pending:
        try:
            done, pending = wait(pending, timeout=stall, return_when="FIRST_COMPLETED")
        except TimeoutError:
            raise ClusterError(f"{what}: no task finished for {stall:.0f}s ({len(pending)} of "
                               f"{n} waiting); {stalled_reason(pending)}") from None
        for f in done:
            k += 1
            log.info("%-6s [%-20s] %d/%d tasks, %.1fs", what, "#" * (20 * k // n), k, n,
                     time.perf_counter() - t0)
            yield f


def wait_all(futures: Sequence[Any], what: str, stall: float) -> list[Any]:
    """The results of ``futures`` in their order, waited for by `progress`."""
    for _ in progress(futures, what, stall):
        pass
    return [f.result() for f in futures]


def windowed(client: Any, held: dict[Any, list[Any]], n: int, submit: Callable[[int], None],
             done: Callable[[Any], None], window: int, stall: float, *,
             stop: Callable[[], bool] | None = None) -> None:
    """Run chunks ``0..n-1`` with at most ``window`` in flight: ``submit(c)`` puts chunk c's
    final future in ``held`` (with its intermediate futures), ``done(future)`` takes each
    result; a finished chunk's futures are released before the next is submitted.  A chunk
    that does not finish for ``stall`` seconds fails the job with a `ClusterError`.
    ``stop``: asked before each submit; once true, the chunks in flight finish and no other
    starts."""
    from distributed import wait

    nxt = 0
    while nxt < n and len(held) < window and not (stop and stop()):
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
            if nxt < n and not (stop and stop()):
                submit(nxt)
                nxt += 1

