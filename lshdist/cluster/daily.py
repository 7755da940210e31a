"""The scheduled append (``jobs/daily_append.py``): one day's input files into an index.

A day is appended at most once: the day is the append's batch label, recorded in the index
manifest in the same swap as its segments (`lshdist.cluster.pipeline.run_build`), so a re-run,
or a second run racing the first, adds nothing.  Runs of the same job serialise on a job lock
beside the index (a second run waits ``lock_timeout`` seconds, then exits 2 naming the holder).
Ids are made unique per day without reading the index: day D's rows get ids
``(D - epoch) * id_stride + row``, the same on every re-run.  After the append the index is
compacted when enough small segments have piled up (`lshdist.cluster.compact`).
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import logging
from collections.abc import Callable
from typing import Any

from lshdist.cluster.compact import plan_compact, run_compact
from lshdist.cluster.pipeline import plan_build, run_build
from lshdist.config import ClusterConfig, DailyConfig, JobConfig
from lshdist.errors import InputError
from lshdist.inputs import read_inputs
from lshdist.store.index import MANIFEST, index_lock, read_permutation_manifest

log = logging.getLogger(__name__)

ClientFactory = Callable[[ClusterConfig], contextlib.AbstractContextManager[Any]]


def day_id_offset(day: str, cfg: DailyConfig) -> int:
    """The first id of ``day``'s rows: ``(day - epoch) * id_stride``."""
    days = (datetime.date.fromisoformat(day) - datetime.date.fromisoformat(cfg.epoch)).days
    if days < 0:
        raise InputError(f"day {day} is before the id epoch {cfg.epoch} (daily.epoch); ids "
                         "would be negative")
    return days * cfg.id_stride


def day_inputs(day: str, cfg: DailyConfig, job: JobConfig) -> list[str]:
    """The input files of ``day`` (``daily.input`` with ``{day}`` filled in, a glob)."""
    if not cfg.input:
        raise InputError(f"config {str(job.path)!r}: the daily job needs daily.input (a path or "
                         "glob with {day})")
    pattern = str(job.workdir / cfg.input.format(day=day))
    files = sorted(glob.glob(pattern))
    if not files:
        raise InputError(f"no input for day {day}: nothing matches {pattern!r} (daily.input); "
                         "check the upstream export, then re-run this day")
    return files


def daily_append(job: JobConfig, day: str, client_for: ClientFactory) -> dict[str, Any]:
    """Append ``day``'s input to the index of ``job`` (building it on the first day), then
    compact; returns ``{day, appended, rows, segments, compacted}``.

    Raises
    ------
    InputError
        For a bad day or config, missing input, a day with more rows than ``id_stride``, or
        when another run holds the job lock for longer than ``daily.lock_timeout``.
    """
    cfg = job.daily
    try:
        datetime.date.fromisoformat(day)
    except ValueError:
        raise InputError(f"day {day!r}: expected YYYY-MM-DD") from None
    index = job.output("index")
    offset = day_id_offset(day, cfg)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(index_lock(f"{index}.daily", timeout=cfg.lock_timeout))
        except InputError as exc:
            raise InputError(f"another daily append of this index is running; {exc}") from None
        return _append_day(job, day, offset, client_for)
    raise AssertionError("unreachable")  # pragma: no cover (mypy: ExitStack may swallow)


def _append_day(job: JobConfig, day: str, offset: int, client_for: ClientFactory
                ) -> dict[str, Any]:
    cfg = job.daily
    index, model = job.output("index"), job.input("model")
    exists = (index / MANIFEST).is_file()
    landed = read_permutation_manifest(index, "a daily append") if exists else None
    if landed is not None and landed.has_batch(day):
        log.info("day %s is in index %s already", day, index)
        return {"day": day, "appended": False, "rows": 0,
                "segments": len(landed.segments), "compacted": 0}
    data = read_inputs(day_inputs(day, cfg, job), format=cfg.format, id_offset=offset)
    if data.n > cfg.id_stride:
        raise InputError(f"day {day} has {data.n} rows, more than daily.id_stride="
                         f"{cfg.id_stride}: its ids would reach the next day's; raise "
                         "id_stride (for new indexes only)")
    day_ds = job.inside(f"days/{day}", "the day's dataset")
    # under the job lock: a dataset left by an interrupted run of this day is replaced
    data.write(day_ds, shard_rows=cfg.shard_rows, overwrite=True)
    plan = plan_build(data=str(day_ds), model=str(model), out=str(index), cfg=job.index,
                      append=exists, batch=day)
    result: dict[str, Any] = {"day": day, "appended": False, "rows": data.n, "compacted": 0}
    with client_for(job.cluster) as client:
        if not plan.skipped:
            run_build(client, plan, stall=job.cluster.stall_timeout)
            result["appended"] = not plan.skipped
        if cfg.compact_min_segments:
            cplan = plan_compact(str(index), min_segments=cfg.compact_min_segments,
                                 segment_rows=cfg.compact_segment_rows)
            if cplan.groups:
                out = run_compact(client, cplan, lock_timeout=cfg.lock_timeout,
                                  stall=job.cluster.stall_timeout)
                result["compacted"] = out["merged"]
    result["segments"] = len(read_permutation_manifest(index, "a daily append").segments)
    return result
