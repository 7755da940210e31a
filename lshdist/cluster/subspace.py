"""Building the subspace-partition index on Dask: ``lshdist index --method subspace``
(`lshdist.index.subspace.SubspaceIndex` in one process).

Build.  The dataset is a tall dask array (one chunk a shard); ``Z = G x`` (or ``x`` for an
identity model) and its centred copy ``Zc`` are computed per shard and kept in worker memory.
Each round of the partition runs `block_krylov` on the rows not captured yet (each shard's
kept on its worker): every product is a dask.array expression over the shards (one task per
shard, then a sum), and only d x k and (q+1)k-square matrices reach the driver.  The
residuals of the remaining rows to the round's subspace are computed per shard and stay
there; α's median is found by an exact distributed selection (`masked_kth`: counts per shard,
then the few values of the last bracket); the captured rows are marked per shard.  Then
every shard splits its rows by group (on its worker), one task per group gathers its members,
orders them by id and makes the group with `lshdist.index.subspace.make_group` — the function
the one-process index uses, so the same data and seed give the same groups, codes and answers —
and writes it as a segment (`lshdist.store.subspace`).  The driver writes the subspaces (the
router) and the manifest, last, in the index's temporary directory, renamed into place under
the index lock.

The queries of such an index: `lshdist.cluster.subspace_query`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lshdist.cluster import driver
from lshdist.cluster.checks import check_data_for_model
from lshdist.config import IndexConfig
from lshdist.errors import InputError
from lshdist.index.krylov import block_krylov, subspace_residuals
from lshdist.index.subspace import (
    Round,
    SubspaceIndex,
    group_seed,
    make_group,
)
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.atomic import check_not_input, check_output
from lshdist.store.dataset import Dataset
from lshdist.store.index import (
    FORMAT,
    SubspaceManifest,
    new_segment_name,
    remove_unnamed,
)
from lshdist.store.manifest import GroupEntry, SubspaceRecord
from lshdist.store.model import read_model_meta
from lshdist.store.objects import ObjectPath, as_path, resolved
from lshdist.store.subspace import (
    SUBSPACE_VERSION,
    write_group,
    write_subspaces,
)

log = logging.getLogger(__name__)

#: bins per step of the distributed selection (`masked_kth`)
SELECT_BINS = 256
#: values of the last bracket gathered to the driver to pick the k-th one exactly
SELECT_GATHER = 8192



# ------------------------------------------------------------------------------ worker tasks


def load_metric(model_path: str) -> ExplicitMetric:
    """The explicit metric of a model (checksums verified)."""
    from lshdist.store.model import load_model

    metric, _ = load_model(model_path)
    if not isinstance(metric, ExplicitMetric):
        raise InputError(f"model {model_path!r} is {type(metric).__name__}; a subspace index "
                         "needs an explicit (d x d) metric")
    return metric


def transform_block(X: np.ndarray, metric: ExplicitMetric) -> np.ndarray:
    """``G x`` of a shard's rows: float32 (n, d)."""
    return metric.transform(X)


def centre_block(Z: np.ndarray, center: np.ndarray) -> np.ndarray:
    """``Z − center`` in float32, as `SubspaceIndex.fit` centres."""
    out: np.ndarray = (Z - center).astype(np.float32)
    return out


def residual_block(Zc: np.ndarray, remaining: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Distances of a shard's remaining rows to the subspace ``V`` (inf for the others)."""
    mask = remaining[:, 0]
    out = np.full(len(Zc), np.inf)
    out[mask] = subspace_residuals(Zc[mask], V)
    return out


def sorted_masked(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.sort(values[mask])


def count_below(sorted_values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """How many of a shard's (sorted) values lie below each edge: int64 (len(edges),)."""
    return np.searchsorted(sorted_values, edges, side="left").astype(np.int64)


def values_between(sorted_values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """A shard's values in ``[lo, hi)``."""
    a, b = np.searchsorted(sorted_values, [lo, hi], side="left")
    return sorted_values[a:b]


def shard_members(Zc: np.ndarray, Z: np.ndarray, group_of: np.ndarray, data_path: str,
                  start: int, stop: int) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A shard's rows split by group: group -> (ids, centred rows, re-rank rows)."""
    ids = np.asarray(Dataset(data_path).ids()[start:stop], np.int64)
    return {int(g): (ids[group_of == g], Zc[group_of == g], Z[group_of == g])
            for g in np.unique(group_of)}


def group_piece(members: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]], g: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    return members.get(g)


def write_group_task(pieces: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray] | None],
                     number: int, V: np.ndarray, bits: int, seed: int, final: bool,
                     index_dir: str, name: str) -> GroupEntry:
    """Gather group ``number``'s members from the shards, order them by id, make the group
    (`make_group`, as in one process) and write it as segment ``name``; returns its entry."""
    got = [p for p in pieces if p is not None]
    ids = np.concatenate([p[0] for p in got])
    order = np.argsort(ids, kind="stable")
    Zc = np.concatenate([p[1] for p in got])[order]
    Z = np.concatenate([p[2] for p in got])[order]
    group = make_group(Zc, np.arange(len(ids), dtype=np.int64), V, number=number, bits=bits,
                       seed=seed, final=final)
    return write_group(index_dir, name, number, group, ids[order], Z)


# --------------------------------------------------------------------------- the selection


def masked_kth(client: Any, sorted_f: Sequence[Any], rank: int, lo: float, hi: float) -> float:
    """The ``rank``-th smallest (0-based) of the values held per shard as sorted arrays
    (futures ``sorted_f``), all in ``[lo, hi]``, found exactly without gathering them: the
    shards count their values below `SELECT_BINS` edges, the bracket holding the rank is
    narrowed, and once it holds at most `SELECT_GATHER` values those are gathered and sorted."""
    hi = float(np.nextafter(hi, np.inf))  # the bracket [lo, hi) holds every value
    below = 0  # values < lo
    while True:
        if np.nextafter(lo, np.inf) >= hi:  # one representable value left
            return lo
        edges = np.linspace(lo, hi, SELECT_BINS + 1)
        edges[0], edges[-1] = lo, hi
        counts = np.sum(client.gather([client.submit(count_below, f, edges, pure=False)
                                       for f in sorted_f]), axis=0)
        j = int(np.searchsorted(counts, rank, side="right")) - 1
        lo, hi, below = float(edges[j]), float(edges[j + 1]), int(counts[j])
        if counts[j + 1] - counts[j] <= SELECT_GATHER:
            vals = np.sort(np.concatenate(client.gather([
                client.submit(values_between, f, lo, hi, pure=False) for f in sorted_f])))
            return float(vals[rank - below])


def masked_median(client: Any, res: Any, mask: Any, n: int) -> float:
    """``np.median`` of the ``n`` entries of the dask array ``res`` where ``mask`` holds, exactly
    (the mean of the two middle values for even n), computed per shard."""
    import dask.array as da
    from dask.delayed import delayed

    sorted_f = client.compute([delayed(sorted_masked)(r, m) for r, m in
                               zip(res.to_delayed().ravel(), mask.to_delayed().ravel())])
    lo, hi = client.gather(client.compute([da.where(mask, res, np.inf).min(),
                                           da.where(mask, res, -np.inf).max()]))
    try:
        a = masked_kth(client, sorted_f, (n - 1) // 2, float(lo), float(hi))
        b = a if n % 2 else masked_kth(client, sorted_f, n // 2, float(lo), float(hi))
    finally:
        client.cancel(sorted_f)
    return a if n % 2 else float(np.mean(np.array([a, b])))


# ------------------------------------------------------------------------------------- build


@dataclass
class SubspaceBuildPlan:
    """A checked subspace index build: everything `build_groups` needs."""

    data: Dataset
    model: Path | ObjectPath
    out: Path | ObjectPath
    cfg: IndexConfig
    overwrite: bool
    #: the manifest's head: model, model_checksum, kind, d and seed
    head: dict[str, Any]
    min_group: int
    append: bool = False  # (refused by `plan_subspace_build`)
    skipped: bool = False

    @property
    def inputs(self) -> tuple[Any, ...]:
        return (self.data.path, self.model)

    @property
    def memory_bytes(self) -> int:
        return 0


def refuse_sparse(ds: Dataset, meta: dict[str, Any], model: str) -> None:
    """A subspace index needs dense rows and an explicit metric (L2 is its identity)."""
    if ds.kind == "sparse" or meta.get("sparse") or meta["kind"] != "explicit":
        what = (f"dataset {str(ds.path)!r} is sparse" if ds.kind == "sparse"
                else f"model {model!r} is {meta['kind']} (learned on "
                     f"{'sparse' if meta.get('sparse') else 'dense'} data)")
        raise InputError(f"--method subspace needs dense rows and an explicit d x d metric "
                         f"(an identity model is L2), but {what}; learn an explicit model on "
                         "dense data (`lshdist learn --kind explicit`), or index with "
                         "--method permutation")


def plan_subspace_build(*, data: str, model: str, out: str, cfg: IndexConfig,
                        overwrite: bool = False, append: bool = False,
                        batch: str | None = None) -> SubspaceBuildPlan:
    """Check a subspace index build on the driver (no cluster): dense data, an explicit model,
    the parameters, the output."""
    if append or batch is not None:
        raise InputError("--append/--batch are not supported for --method subspace (the "
                         "partition is fitted on all rows at once); build the index again "
                         "with --overwrite")
    ds = Dataset(data)
    meta = read_model_meta(model)
    refuse_sparse(ds, meta, model)
    check_data_for_model(ds, meta, "dataset")
    check_not_input(out, (data, model))
    check_output(out, overwrite, kind=FORMAT)
    probe = SubspaceIndex(rank=cfg.rank, bits=cfg.code_bits, eta=cfg.eta, alpha=cfg.alpha,
                          max_rounds=cfg.max_rounds, krylov_iters=cfg.krylov_iters,
                          n_probe=cfg.probe, n_candidates=cfg.candidates, seed=cfg.seed)
    min_group = probe.check_params(ds.d)  # the one-process index's own checks
    head = {"model": resolved(model), "model_checksum": meta["checksum"], "kind": meta["kind"],
            "d": ds.d, "seed": cfg.seed}
    return SubspaceBuildPlan(ds, as_path(model), as_path(out), cfg, overwrite, head, min_group)


@dataclass
class Partition:
    """The distributed partition: subspaces, rounds, and per shard the group of every row."""

    bases: list[np.ndarray]
    rounds: list[Round]
    final: bool
    center: np.ndarray
    Z: Any  # dask arrays, persisted: rows in the learned space, centred rows, group numbers
    Zc: Any
    group_of: Any


def partition(client: Any, data: Dataset, model: str, cfg: IndexConfig, min_group: int
              ) -> Partition:
    """The rounds of `SubspaceIndex.fit` over the dataset's shards (see the module notes)."""
    import dask.array as da
    from dask.delayed import delayed

    metric = delayed(load_metric, pure=True)(resolved(model))
    X = data.to_dask()
    Z = client.persist(X.map_blocks(transform_block, metric, dtype=np.float32,
                                      meta=np.empty((0, 0), np.float32)))
    center = np.asarray(Z.mean(axis=0, dtype=np.float64).compute(), np.float64)
    Zc = client.persist(Z.map_blocks(centre_block, center, dtype=np.float32,
                                    meta=np.empty((0, 0), np.float32)))
    rows = Z.chunks[0]
    remaining = client.persist(da.ones(data.n, dtype=bool, chunks=(rows,)))
    group_of = client.persist(da.full(data.n, -1, dtype=np.int32,  # type: ignore[no-untyped-call]
                                      chunks=(rows,)))
    k, q = int(cfg.rank), int(cfg.krylov_iters)
    scale = float(np.sqrt(2.0)) * (1.0 + float(cfg.eta))
    bases: list[np.ndarray] = []
    rounds: list[Round] = []
    n_rem = data.n
    for t in range(int(cfg.max_rounds)):
        if n_rem < min_group:
            break
        t0 = time.perf_counter()
        V = block_krylov(_remaining_rows(client, Zc, remaining, t), k, q,
                         seed=group_seed(cfg.seed, 0, t))
        t1 = time.perf_counter()
        res = client.persist(da.map_blocks(  # type: ignore[no-untyped-call]
            residual_block, Zc, remaining[:, None], V, drop_axis=1, dtype=np.float64,
            meta=np.empty(0, np.float64)))
        alpha = (float(cfg.alpha) if cfg.alpha is not None
                 else masked_median(client, res, remaining, n_rem) / float(np.sqrt(2.0)))
        log.debug("round %d: block Krylov %.2fs, residuals and alpha %.2fs", t, t1 - t0,
                  time.perf_counter() - t1)
        threshold = scale * alpha
        inside = client.persist((res <= threshold) & remaining)
        captured = int(inside.sum().compute())
        rounds.append(Round(t, n_rem, alpha, threshold, captured))
        log.info("round %d: %d remaining, alpha %.4g, threshold %.4g, captured %d",
                 t, n_rem, alpha, threshold, captured)
        if not captured:
            break
        group_of = client.persist(da.where(inside, len(bases), group_of))
        remaining = client.persist(remaining & ~inside)
        bases.append(V)
        n_rem -= captured
    final = n_rem > 0
    if final:
        V = block_krylov(_remaining_rows(client, Zc, remaining, len(rounds)), k, q,
                         seed=group_seed(cfg.seed, 0, len(rounds)))
        group_of = client.persist(da.where(remaining, len(bases), group_of))
        bases.append(V)
    return Partition(bases, rounds, final, center, Z, Zc, group_of)


def _remaining_rows(client: Any, Zc: Any, remaining: Any, t: int) -> Any:
    """The rows not captured yet, each shard's kept where it is (persisted, with their row
    counts known): round t's Krylov passes read only these, as `SubspaceIndex.fit` does."""
    if t == 0:
        return Zc
    out = client.persist(Zc[remaining])
    out.compute_chunk_sizes()  # `block_krylov` checks the shape
    return out


def build_groups(client: Any, plan: SubspaceBuildPlan, index_dir: Path | ObjectPath,
                 run: driver.Run) -> driver.Built:
    """Partition the rows (`partition`), split every shard's rows by group and write one
    segment per group and the subspaces into ``index_dir`` (`lshdist.cluster.driver.build`
    commits the manifest)."""
    from dask.delayed import delayed

    cfg, stall = plan.cfg, run.stall
    t0 = time.perf_counter()
    (index_dir / "segments").mkdir(parents=True, exist_ok=True)
    part = partition(client, plan.data, str(plan.model), cfg, plan.min_group)
    log.info("partition: %d groups in %d rounds, %.1fs", len(part.bases), len(part.rounds),
             time.perf_counter() - t0)
    bounds = np.concatenate([[0], np.cumsum(part.Z.chunks[0])]).astype(int)
    path = str(plan.data.path)
    members = client.compute([
        delayed(shard_members)(zc, z, g, path, int(a), int(b))
        for zc, z, g, a, b in zip(part.Zc.to_delayed().ravel(), part.Z.to_delayed().ravel(),
                                  part.group_of.to_delayed().ravel(), bounds[:-1],
                                  bounds[1:])])
    held: list[Any] = list(members)
    try:
        for _ in driver.progress(members, "split", stall):
            pass
    except BaseException:
        client.cancel(held)
        raise
    # the shards' rows now live in `members` only: release the persisted arrays (the
    # build would otherwise hold the data four times at once)
    part.Z = part.Zc = part.group_of = None
    names = [new_segment_name() for _ in part.bases]
    writes = []
    for g, (V, name) in enumerate(zip(part.bases, names)):
        pieces = [client.submit(group_piece, m, g, pure=False) for m in members]
        final = part.final and g == len(part.bases) - 1
        writes.append(client.submit(write_group_task, pieces, g, V, cfg.code_bits,
                                    cfg.seed, final, str(index_dir), name, pure=False,
                                    retries=2))
        held += pieces
    held += writes
    router = new_segment_name()
    try:
        entries = driver.wait_all(writes, "groups", stall)
        checksum = write_subspaces(index_dir, np.stack(part.bases), part.center, router)
    except BaseException:
        remove_unnamed(index_dir, [*names, router])
        raise
    finally:
        client.cancel(held)
    sizes = [e.rows for e in entries]
    record = SubspaceRecord(
        version=SUBSPACE_VERSION, rank=cfg.rank, bits=cfg.code_bits, eta=cfg.eta,
        alpha=cfg.alpha, max_rounds=cfg.max_rounds, min_group=plan.min_group,
        krylov_iters=cfg.krylov_iters, n_probe=cfg.probe, n_candidates=cfg.candidates,
        # the recall a query calibrates --probe and --candidates for on a sample of its
        # queries (None: they were fixed here)
        target_recall=None if {"probe", "candidates"} & cfg.given_ else cfg.target_recall,
        rounds=tuple(part.rounds), group_sizes=tuple(sizes), subspaces_checksum=checksum,
        router=router)
    manifest = SubspaceManifest(**plan.head, rows=int(sum(sizes)), segments=tuple(entries),
                                subspace=record)
    log.info("subspace index %s: %d rows in %d groups, %.1fs", plan.out, sum(sizes), len(sizes),
             time.perf_counter() - t0)
    return driver.Built([*names, router], lambda current: manifest)
