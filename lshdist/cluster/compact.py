"""Compaction: merge an index's small segments into larger ones (``lshdist compact``).

Appends add one or more small segments each (a day of data); every query visits every segment,
so many small segments cost a segment load and a task per query chunk each.  Compaction merges
runs of small segments into segments of at most ``segment_rows`` rows, in one of two ways:

* **packing** (the default, `lshdist.store.index.pack_segments`): the small segments are
  copied, file for file, as the parts of one new segment (`PackedSegment`); each part is
  searched as the segment it was and the answers merged by (distance, id), exactly as separate
  segments' answers are — so every query, hashed or exact, answers **identically** before and
  after (tested bit for bit), with one segment to load and one task per chunk instead of many.
  The operating point (calibration) is unchanged: nothing it measured has changed.
* **re-fitting** (``--refit``, `lshdist.cluster.tasks.merge_segments`): the lists are fitted
  again over the merged rows from the stored keys and payloads, on Dask workers — the segment a
  fresh build with larger segments writes.  A hashed search then gathers candidates from fewer,
  longer lists (fewer per query at the same W and H), so its answers change; the operating
  point is calibrated again on the largest segment.

Atomicity: everything happens under the index lock (no append, build or gc meanwhile); the new
segments are written first under new names, the manifest is swapped in one rename, and only
then are the old segments removed.  A kill before the swap leaves the old index answering (the
new segments are orphans that `lshdist gc` removes); a kill after it leaves the new index
answering (the old segments are the orphans).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lshdist.cluster import tasks
from lshdist.cluster.driver import COMMIT_RETRIES
from lshdist.cluster.driver import progress as _progress
from lshdist.config import ClusterConfig
from lshdist.errors import InputError
from lshdist.store.index import (
    PermutationManifest,
    SegmentEntry,
    index_lock,
    new_segment_name,
    pack_segments,
    read_manifest_tagged,
    read_permutation_manifest,
    remove_unnamed,
    require_permutation,
    write_manifest,
)
from lshdist.store.manifest import HyperplaneManifest
from lshdist.store.objects import CommitConflict, ObjectPath, as_path

log = logging.getLogger(__name__)


def compaction_groups(entries: Sequence[SegmentEntry] | Sequence[Mapping[str, Any]], *,
                      min_segments: int, segment_rows: int) -> list[list[int]]:
    """Which segments to merge: positions (in manifest order) of the runs of small segments.

    A segment is small below ``segment_rows`` rows.  Nothing is merged while fewer than
    ``min_segments`` are small; otherwise the small segments, in manifest order, are cut into
    groups of at most ``segment_rows`` rows (and of one number of lists: segments sized by
    --epsilon may differ), and every group of two or more is merged.  ``entries``: the
    manifest's, or their ``rows`` and ``permutations`` as JSON.
    """
    if min_segments < 1 or segment_rows < 1:
        raise InputError(f"min_segments={min_segments}, segment_rows={segment_rows}: both must "
                         "be >= 1")
    sizes = [(e.rows, e.permutations) if isinstance(e, SegmentEntry)
             else (int(e["rows"]), e.get("permutations")) for e in entries]
    small = [i for i, (r, _) in enumerate(sizes) if r < segment_rows]
    if len(small) < max(2, min_segments):
        return []
    groups: list[list[int]] = []
    cur: list[int] = []
    rows = 0
    for i in small:
        r = sizes[i][0]
        if cur and (rows + r > segment_rows or sizes[i][1] != sizes[cur[0]][1]):
            groups.append(cur)
            cur, rows = [], 0
        cur.append(i)
        rows += r
    groups.append(cur)
    return [g for g in groups if len(g) > 1]


@dataclass
class CompactPlan:
    """A checked compaction (the groups are planned again under the lock when it runs)."""

    index: Path | ObjectPath
    min_segments: int
    segment_rows: int
    groups: list[list[int]]
    segments: int  # segments in the index when planned
    refit: bool = False  # re-fit the lists (answers change) instead of packing (identical)


def plan_compact(index: str, *, min_segments: int, segment_rows: int,
                 refit: bool = False) -> CompactPlan:
    """Check a compaction on the driver (no cluster): the index and what would be merged."""
    manifest = read_permutation_manifest(index, "`lshdist compact`")
    if refit and isinstance(manifest, HyperplaneManifest):
        raise InputError(f"index {index!r} answers hyperplane queries "
                         f"({manifest.family.name}); re-fitting such an index is not "
                         "built — compact it without --refit (packing), or rebuild it with "
                         "larger --segment-rows")
    groups = compaction_groups(manifest.segments, min_segments=min_segments,
                               segment_rows=segment_rows)
    return CompactPlan(as_path(index), min_segments, segment_rows, groups,
                       len(manifest.segments), refit)


def _recalibrated(client: Any, plan: CompactPlan, manifest: PermutationManifest,
                  entries: list[SegmentEntry], stall: float) -> dict[str, Any]:
    """The operating point again for the new segment sizes (every segment contributes its own
    candidates, so fewer larger segments need wider windows or cuts for the same recall):
    calibrated on the largest segment; the manifest's own point where that cannot be done.
    Returns the manifest fields to change."""
    from lshdist.index.calibrate import Calibration

    largest = max(entries, key=lambda e: e.rows)
    f = client.submit(tasks.recalibrate_stored, str(plan.index), largest, manifest, pure=False)
    for _ in _progress([f], "calibrate", stall):
        pass
    raw = f.result()
    if raw is None:
        log.warning("compaction kept the index's operating point: its payload cannot be "
                    "re-calibrated from the stored segments (recall may drop; rebuild the "
                    "index to calibrate it again)")
        return {}
    cal = Calibration.from_json(raw)
    ref = cal.reference
    log.info("compaction re-calibrated on %d rows: %s — %s", largest.rows, cal.mode,
             cal.reason)
    op: dict[str, Any] = {"calibration_json": raw}
    if ref is not None:
        op.update(window=ref.window, hamming_keep=ref.hamming_keep)
    return op


def _swap(plan: CompactPlan, manifest: PermutationManifest, tag: str | None,
          op: dict[str, Any], new_entries: list[SegmentEntry], merged: dict[str, SegmentEntry],
          replaced: set[str]) -> list[SegmentEntry]:
    """Commit the compacted manifest; returns its segments.  On object storage, when an append
    committed meanwhile, the merged segments replace theirs in that newer manifest (the
    appended ones kept) and the commit is tried again; a compaction that raced another
    compaction of the same segments is refused."""
    for _ in range(COMMIT_RETRIES + 1):
        try:
            write_manifest(plan.index, replace(manifest, **op, segments=tuple(new_entries)),
                           expect=tag)
            return new_entries
        except CommitConflict:
            read, tag = read_manifest_tagged(plan.index)
            manifest = require_permutation(read, plan.index, "`lshdist compact`")
            if not replaced <= set(manifest.segment_names):
                raise InputError(f"index {str(plan.index)!r} was compacted by another job "
                                 "meanwhile; this compaction was dropped (the index is whole)"
                                 ) from None
            new_entries = [merged.get(e.name, e) for e in manifest.segments
                           if e.name in merged or e.name not in replaced]
            if sum(e.rows for e in new_entries) != manifest.rows:
                raise InputError("compaction lost rows; the index is unchanged") from None
            log.info("index %s: an append landed during the compaction; merged, committing "
                     "again", plan.index)
    raise InputError(f"index {str(plan.index)!r}: too many commits during the compaction; "
                     "nothing was changed, run it again")


def run_compact(client: Any, plan: CompactPlan, *, lock_timeout: float = 30.0,
                stall: float = ClusterConfig.stall_timeout) -> dict[str, Any]:
    """Merge the planned groups on ``client`` under the index lock; returns ``{before, after,
    merged}`` (segment counts and the number of segments merged away)."""
    with index_lock(plan.index, timeout=lock_timeout):
        # an append may have landed since planning; on object storage one may land during the
        # compaction too (no lock): the swap is conditional on this read (`_swap`)
        read, tag = read_manifest_tagged(plan.index)
        manifest = require_permutation(read, plan.index, "`lshdist compact`")
        entries = manifest.segments
        groups = compaction_groups(entries, min_segments=plan.min_segments,
                                   segment_rows=plan.segment_rows)
        if not groups:
            return {"before": len(entries), "after": len(entries), "merged": 0}
        names = [new_segment_name() for _ in groups]
        if plan.refit:
            futures = [client.submit(tasks.merge_segments, str(plan.index),
                                     [entries[i] for i in g], manifest, name, pure=False,
                                     retries=2) for g, name in zip(groups, names)]
        else:  # file copies: one task per new segment, no arrays through the scheduler
            futures = [client.submit(pack_segments, str(plan.index), [entries[i] for i in g],
                                     name, pure=False, retries=0)
                       for g, name in zip(groups, names)]
        try:
            for _ in _progress(futures, "compact", stall):
                pass
            merged = [f.result() for f in futures]
            first = {g[0]: e for g, e in zip(groups, merged)}
            gone = {i for g in groups for i in g}
            new_entries = [first.get(i, e) for i, e in enumerate(entries)
                           if i in first or i not in gone]
            if sum(e.rows for e in new_entries) != manifest.rows:
                raise InputError("compaction lost rows; the index is unchanged")
            op = _recalibrated(client, plan, manifest, new_entries, stall) if plan.refit else {}
            new_entries = _swap(plan, manifest, tag, op, new_entries,
                                {entries[g[0]].name: e for g, e in zip(groups, merged)},
                                {entries[i].name for i in gone})
        except BaseException:
            client.cancel(futures)
            # not named by any manifest: what the tasks wrote goes
            remove_unnamed(plan.index, names)
            raise
        # after the swap: nobody refers to them any more
        remove_unnamed(plan.index, [entries[i].name for i in sorted(gone)])
    log.info("compacted %s: %d -> %d segments", plan.index, len(entries), len(new_entries))
    return {"before": len(entries), "after": len(new_entries),
            "merged": len(entries) - len(new_entries)}
