"""Task functions run on Dask workers: module-level, picklable, over paths and arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from lshdist.blocks import SparseBlock, n_rows, vstack_sparse
from lshdist.cluster.answers import Partial
from lshdist.errors import InputError
from lshdist.hashing.families import HashFamily
from lshdist.index.payload import DensePayload
from lshdist.index.permutation import PackedSegment, PermutationIndex
from lshdist.index.searcher import (
    answer,
    calibrate_index,
    encode,
    payload_is_rows,
    permutation_seed,
)
from lshdist.store.dataset import Dataset
from lshdist.store.embedded import open_data
from lshdist.store.index import (
    PermutationManifest,
    SegmentEntry,
    contiguous_span,
    read_segment,
    write_segment,
)

if TYPE_CHECKING:
    from lshdist.index.calibrate import MergedGrid
    from lshdist.protocols import Metric

#: one query chunk encoded: (codes, re-rank payload, query ids)
Encoded = tuple[np.ndarray, Any, np.ndarray]


def load_family(model_path: str, bits: int, seed: int, learned: bool,
                checksum: str | None = None) -> HashFamily:
    """The hash family of a model (learned, or Charikar's baseline carrying the metric);
    ``checksum``: the model's, as the job planned with it (a model replaced since is refused)."""
    from lshdist.hashing.families import family_for
    from lshdist.store.model import load_model

    metric, meta = load_model(model_path)
    if checksum is not None and meta["checksum"] != checksum:
        raise InputError(f"model {model_path!r} was replaced while the job ran (checksum "
                         f"{str(meta['checksum'])[:12]}..., the job was planned with "
                         f"{checksum[:12]}...); run the job again")
    return family_for(metric, bits=bits, seed=seed, learned=learned)


def fit_segment(data_path: str, shards: tuple[int, int], family: HashFamily,
                lists: int | None, epsilon: float | None, seed: int) -> PermutationIndex:
    """Encode dataset shards ``shards[0]:shards[1]`` with the broadcast hash family and fit
    their permutation lists (kept in worker memory until `write_fitted`)."""
    ds = open_data(data_path, _metric(family).embedding)
    start, stop = (int(ds.shard_bounds[i]) for i in shards)
    codes, payload = encode(_metric(family), family, _rows(ds, family, start, stop))
    index = PermutationIndex(n_permutations=lists, epsilon=epsilon, seed=permutation_seed(seed))
    index.fit(codes, family.bits, payload, ds.ids()[start:stop])
    return index


def _rows(ds: Dataset, family: HashFamily, start: int, stop: int) -> Any:
    """Rows ``start:stop`` to encode: as stored (uint8) when they are bytes whose payload is
    the rows themselves (`encode` then makes no float32 copy of them: a fitted segment of
    30,000 x 784 pixel rows holds 24 MB of rows instead of 94, until it is written), else
    `Dataset.read_rows`'."""
    if ds.byte_valued and payload_is_rows(_metric(family)):
        return ds.read_byte_rows(start, stop)
    return ds.read_rows(start, stop)


def _metric(family: HashFamily) -> Metric:
    if family.metric is None:  # `load_family` gives every family its metric
        raise InputError("a hash family without its metric reached a worker task")
    return family.metric


def calibrate_segment(index: PermutationIndex, data_path: str, shards: tuple[int, int],
                      family: HashFamily, k: int, target: float,
                      fixed: dict[str, int | None], seed: int,
                      queries_path: str | None = None,
                      merged: MergedGrid | None = None,
                      sample: tuple[Any, Any] | None = None
                      ) -> dict[str, Any]:
    """Calibrate a fitted segment on a sample of the dataset ``queries_path``
    (`calibrate_on_queries`), or of its own rows (leave-one-out); ``merged``: the grid
    measured over every segment (`lshdist.cluster.pipeline._merged_grid`; None: one segment),
    then only timed here; ``sample``: that grid's `calibration_sample` (not read again).
    Returns the calibration as JSON (it goes into the index manifest)."""
    if queries_path is not None:
        return calibrate_on_queries(index, queries_path, family, k, target, fixed, seed,
                                    merged, sample)
    if sample is not None:  # the first segment's own rows, drawn by `calibration_sample`
        X: Any = None
    else:
        ds = open_data(data_path, _metric(family).embedding)
        start, stop = (int(ds.shard_bounds[i]) for i in shards)
        X = ds.read_rows(start, stop)
    cal = calibrate_index(index, _metric(family), family, X, k=k, target=target, seed=seed,
                          fixed=fixed, merged=merged,
                          drawn=None if sample is None else sample[0])
    out = cal.to_json()
    out["extra"].update(fixed=fixed, queries=None)  # what the user fixed; the rows sampled
    return out


def calibrate_on_queries(segment: PermutationIndex | PackedSegment, queries_path: str,
                         family: HashFamily, k: int, target: float,
                         fixed: dict[str, int | None], seed: int,
                         merged: MergedGrid | None = None,
                         sample: tuple[Any, Any] | None = None
                         ) -> dict[str, Any]:
    """Calibrate a segment (its largest part, if packed) on a sample of the dataset
    ``queries_path`` — at build time (``--calibration-queries``, `lshdist run`) or before a
    bulk query; ``sample``: the `calibration_sample` already read (the merged grid's); returns
    the calibration as JSON, naming the dataset sampled."""
    part = parts_of(segment)[calibrated_part(segment)]
    if sample is None:
        sample = calibration_sample(None, None, queries_path, seed, family)
    m = fixed.get("permutations")
    fixed = {**fixed, "permutations": None if m is None else min(int(m), part.n_permutations_)}
    cal = calibrate_index(part, _metric(family), family, None, k=k, target=target,
                          seed=seed, fixed=fixed, queries=sample[0], merged=merged,
                          drawn=sample[0])
    out = cal.to_json()
    out["extra"].update(fixed=fixed, queries=queries_path)
    return out


def calibration_sample(data_path: str | None, shards: tuple[int, int] | None,
                       queries_path: str | None, seed: int,
                       family: HashFamily | None = None) -> tuple[Any, np.ndarray | None]:
    """The rows a calibration queries with — the sample `calibrate_index` takes: of the
    dataset ``queries_path``, or (leave-one-out) of the first segment's rows ``shards`` of
    ``data_path``; returns them and, leave-one-out, their ids (left out of their answers)."""
    from lshdist.index.calibrate import SAMPLE_QUERIES, query_sample_size, sample_rows

    if queries_path is not None:
        embedding = None if family is None else _metric(family).embedding
        qds = open_data(queries_path, embedding)
        return qds.read_row_set(sample_rows(qds.n, query_sample_size(qds.n), seed)), None
    if data_path is None or shards is None:
        raise InputError("a calibration sample needs the queries or the first segment's rows")
    ds = open_data(data_path, None if family is None else _metric(family).embedding)
    start, stop = (int(ds.shard_bounds[i]) for i in shards)
    rows = start + sample_rows(stop - start, SAMPLE_QUERIES, seed)
    return ds.read_row_set(rows), np.asarray(ds.ids()[rows], np.int64)


#: one part's exact neighbours of the calibration sample (`segment_neighbours`): distances,
#: ids, the part's list count, its scan's seconds per query (the timed part only), the
#: sample's payload width
PartNeighbours = tuple[np.ndarray, np.ndarray, int, float | None, float]


class Neighbours(NamedTuple):
    """`segment_neighbours`' answer: per searched part of the segment, the calibration
    sample's exact neighbours (`PartNeighbours`); and the recall check's sample's exact
    top-k in the segment (`check_truth`'s answer), when the task was given that sample."""

    parts: list[PartNeighbours]
    check: Partial | None = None


def segment_neighbours(segment: PermutationIndex | PackedSegment, sample: tuple[Any, Any],
                       family: HashFamily, k: int, time_scan: bool = True,
                       check: tuple[Any, np.ndarray] | None = None, check_k: int = 0
                       ) -> Neighbours:
    """The exact ``k + 1`` nearest rows (distances, ids; ids -1 past a small part's end) of
    the calibration sample (`calibration_sample`) within each searched part of a segment, the
    part's list count, for the part calibration times (`calibrated_part`; None for the
    others) the scan's seconds per query — the scan `calibrate` would otherwise run again —
    and the sample's payload width (`Calibration.width`): the input of
    `lshdist.index.calibrate.merged_relevance`.

    ``time_scan=False``: no part is timed (every seconds entry None; the same neighbours) —
    for the segments whose scan the calibration does not time: the timed share of the truth
    runs unpruned, ~0.4 of 2.1 core-s per 100,000-row segment at 1,000 sample queries.

    ``check``: a recall check's sample (`read_query_rows`, of the query that follows a
    build), whose exact top-``check_k`` in the segment (a fitted one: one part) comes with
    the neighbours — `check_truth`'s answer, found in the same task: on a part not timed in
    the same scan as the calibration sample (the scan's per-call work, the rows' projection
    for the bound, done once), on the timed part in a scan of its own (the timing stays the
    calibration sample's).  One task where two ran: a separate check task that started
    while another segment's scan still ran held up the calibration's grid behind it
    (Fashion-MNIST, two fresh workers: 0.14 s)."""
    from lshdist.index.calibrate import BULK_QUERIES, exact_truth
    from lshdist.index.scan import scan_topk

    rows, _ = sample
    metric = _metric(family)
    n_cal = n_rows(rows)
    both = None if check is None else _stacked(rows, check[0])
    # (the codes are not used: the scan reads the re-rank payload only)
    _, qpayload = encode(metric, family, rows if both is None else both, query=True,
                         hashed=False)
    cal_payload = qpayload if both is None else qpayload.take(slice(0, n_cal))
    out: list[PartNeighbours] = []
    width = float(getattr(cal_payload, "width", 1))
    timed = calibrated_part(segment) if time_scan else -1
    parts = parts_of(segment)
    if check is not None and len(parts) != 1:
        raise RuntimeError("internal error: a recall check's truth is found on a fitted "
                           f"segment (one part), not on one of {len(parts)} parts")
    found: Partial | None = None
    for i, part in enumerate(parts):
        m = min(k + 1, len(part))
        spq = None
        if i == timed:  # the truth, and the scan timed as a "scan" search runs it
            D, I, spq = exact_truth(part.payload_, cal_payload, m, ids=part.ids_,
                                    batch=BULK_QUERIES)
            if check is not None:
                found = check_truth(part, check, family, check_k)
        elif check is not None and both is not None:
            # (a top-m answer's first columns are its top k: ascending, ties by id)
            D, I = scan_topk(part.payload_, qpayload, max(m, check_k), ids=part.ids_,
                             prune=True)
            found = (D[n_cal:, :check_k], I[n_cal:, :check_k],
                     np.full(len(D) - n_cal, len(part), np.int64))
            D, I = D[:n_cal, :m], I[:n_cal, :m]
        else:
            D, I = scan_topk(part.payload_, cal_payload, m, ids=part.ids_, prune=True)
        pad = k + 1 - m
        out.append((np.pad(D, ((0, 0), (0, pad)), constant_values=np.inf),
                    np.pad(I, ((0, 0), (0, pad)), constant_values=-1),
                    int(part.n_permutations_), spq, width))
    if check is not None and found is None:  # (a check sample of another kind of rows)
        found = check_truth(parts[0], check, family, check_k)
    return Neighbours(out, found)


def _stacked(a: Any, b: Any) -> Any:
    """Rows ``a`` then rows ``b``, where both are dense of one dtype and width or both
    sparse (one encode, one scan for both); None otherwise."""
    if isinstance(a, SparseBlock) and isinstance(b, SparseBlock):
        return vstack_sparse([a, b])
    if (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.ndim == b.ndim == 2
            and a.dtype == b.dtype and a.shape[1] == b.shape[1]):
        return np.concatenate([a, b])
    return None


def segment_grid(segment: PermutationIndex | PackedSegment, sample: tuple[Any, Any],
                 family: HashFamily, k: int, nbr_ids: Sequence[np.ndarray],
                 masks: Sequence[np.ndarray], ms: Sequence[int], ws: Sequence[int],
                 hs: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """A segment's share of a merged calibration (`lshdist.index.calibrate.grid_counts`,
    summed over its parts): ``nbr_ids``/``masks`` per part, from `segment_neighbours` and
    `merged_relevance`."""
    from lshdist.index.calibrate import grid_counts, part_truth

    rows, own = sample
    qcodes, _ = encode(_metric(family), family, rows, query=True)
    total: tuple[np.ndarray, np.ndarray] | None = None
    for part, ids, mask in zip(parts_of(segment), nbr_ids, masks):
        truth, qself = part_truth(ids, part.ids_, own, k)
        hits, rr = grid_counts(part, qcodes, truth, qself, mask, ms, ws, hs)
        total = (hits, rr) if total is None else (total[0] + hits, total[1] + rr)
    if total is None:
        raise InputError("a segment without parts reached a calibration task")
    return total


def calibrated_part(segment: PermutationIndex | PackedSegment) -> int:
    """The part of a segment that calibration measures: its largest (the first of those)."""
    sizes = [len(p) for p in parts_of(segment)]
    return sizes.index(max(sizes))


def write_fitted(index: PermutationIndex, index_dir: str, name: str, lists: int,
                 data_path: str, shards: tuple[int, int]) -> SegmentEntry:
    """Write a fitted segment with its first ``lists`` lists; returns its manifest entry."""
    ds = Dataset(data_path)
    start, stop = (int(ds.shard_bounds[i]) for i in shards)
    entry = write_segment(index_dir, name, index.truncated(min(lists, index.n_permutations_)))
    return replace(entry, source=str(data_path), start=start, stop=stop)


def truncated(index: PermutationIndex, lists: int) -> PermutationIndex:
    """The fitted segment with its first ``lists`` lists — what `write_fitted` stores — kept in
    worker memory (views of the fitted arrays, no copy; rows on an exact uint8 grid are kept
    on it alone, `DensePayload.compact`: float32 rows, if the fit made them, are freed with
    the fitted segment)."""
    out = index.truncated(min(lists, index.n_permutations_))
    if isinstance(out.payload_, DensePayload):
        out.payload_ = out.payload_.compact()
    return out


def load_segment(index_dir: str, entry: SegmentEntry, manifest: PermutationManifest
                 ) -> PermutationIndex | PackedSegment:
    return read_segment(index_dir, entry, manifest)


def parts_of(segment: PermutationIndex | PackedSegment) -> list[PermutationIndex]:
    """The stored segments a loaded segment is made of (itself, or a packed one's parts)."""
    return segment.parts if isinstance(segment, PackedSegment) else [segment]


def encode_queries(queries_path: str, start: int, stop: int, family: HashFamily,
                   hashed: bool = True) -> Encoded:
    """Query rows ``start:stop`` encoded (``hashed=False``: for the exact scan, which reads
    the re-rank payload only)."""
    ds = open_data(queries_path, _metric(family).embedding)
    codes, payload = encode(_metric(family), family, _rows(ds, family, start, stop),
                            query=True, hashed=hashed)
    if isinstance(payload, DensePayload):  # held in worker memory until every segment has
        payload = payload.compact()        # searched it: on its uint8 grid where exact
    return codes, payload, ds.ids()[start:stop]


def read_query_rows(queries_path: str, rows: np.ndarray, family: HashFamily
                    ) -> tuple[Any, np.ndarray]:
    """Rows ``rows`` (sorted row numbers) of the query dataset and their ids: the sample a
    query job answers exactly too, to measure its own recall — read once (scattered rows
    decompress whole shards) and encoded on each worker (`encode_query_rows`)."""
    ds = open_data(queries_path, _metric(family).embedding)
    rows = np.asarray(rows, np.int64)
    return ds.read_row_set(rows), np.asarray(ds.ids()[rows], np.int64)


def encode_query_rows(sample: tuple[Any, np.ndarray], family: HashFamily,
                      hashed: bool = True) -> Encoded:
    """`encode_queries` of the rows `read_query_rows` read."""
    X, ids = sample
    codes, payload = encode(_metric(family), family, X, query=True, hashed=hashed)
    return codes, payload, ids


def check_truth(segment: PermutationIndex, sample: tuple[Any, np.ndarray],
                family: HashFamily, k: int) -> Partial:
    """The exact top-``k`` of a recall check's sample (`read_query_rows`) in a segment, as
    `search_segment` answers it by the scan (the same rows and distances, ties by id: the
    scan's answer, pruned where that pays) — found by a build for the query that follows it,
    on the fitted segment (rows held on their uint8 grid are made float32 a block at a time,
    `DensePayload._row_block`, never kept whole)."""
    from lshdist.index.scan import scan_topk

    X, _ = sample
    _, qpayload = encode(_metric(family), family, X, query=True, hashed=False)
    dist, ids = scan_topk(segment.payload_, qpayload, k, ids=segment.ids_, prune=True)
    return dist, ids, np.full(len(ids), len(segment), np.int64)


def check_answer(rows: np.ndarray, parts: Sequence[Partial | Neighbours], k: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, ids)``: the recall check's sample rows and their exact top-``k`` ids over every
    segment (`check_truth`'s answers, or those `segment_neighbours` found with the
    calibration's, merged by distance and id, as a query merges them)."""
    from lshdist.index.permutation import merge_topk

    found: list[Partial] = []
    for p in parts:
        if isinstance(p, Neighbours):
            if p.check is None:
                raise RuntimeError("internal error: a segment's neighbours came without "
                                   "the recall check's")
            found.append(p.check)
        else:
            found.append(p)
    return np.asarray(rows, np.int64), merge_topk([p[0] for p in found],
                                                  [p[1] for p in found], k)[1]


def search_segment(segment: PermutationIndex | PackedSegment, encoded: Encoded, k: int, mode: str,
                   op: tuple[int, int, int] | None = None) -> Partial:
    """Partial top-k of one query chunk against one segment (hashed at operating point
    ``op`` = (M, W, H), default the segment's own, or by exact scan)."""
    codes, payload, _ = encoded
    m, w, h = op if op is not None else (None, None, None)
    if m is not None:
        m = min(m, segment.n_permutations_)
    dist, ids, stats = answer(segment, codes, payload, k, mode=mode, n_permutations=m,
                              window=w, hamming_keep=h)
    return dist, ids, stats["reranked"]


def recalibrate_stored(index_dir: str, entry: SegmentEntry, manifest: PermutationManifest,
                       ) -> dict[str, Any] | None:
    """Calibrate a stored segment again (after compaction changed the segment sizes), on a
    sample of its own rows taken from its stored keys and re-rank payload, for the target and k
    of the index's calibration; None where the payload cannot serve as queries (kernel
    payloads: their query side holds other arrays)."""
    from lshdist.index.calibrate import SAMPLE_QUERIES, calibrate, sample_rows

    old = manifest.calibration
    if old is None:
        return None
    seg = max(parts_of(read_segment(index_dir, entry, manifest)), key=len)
    if not isinstance(seg.payload_, DensePayload):
        return None
    qrows = sample_rows(len(seg), SAMPLE_QUERIES, manifest.seed)
    fixed = old.extra.get("fixed") or {}
    m, w, h = (fixed.get(key) for key in ("permutations", "window", "hamming_keep"))
    cal = calibrate(seg, qrows, np.ascontiguousarray(seg.codes_[qrows]),
                    DensePayload(seg.payload_.take(qrows).Z), k=old.k, target=old.target,
                    permutations=None if m is None else [min(int(m), seg.n_permutations_)],
                    windows=None if w is None else [int(w)],
                    hamming_keeps=None if h is None else [int(h)])
    out = cal.to_json()
    out["extra"]["fixed"] = fixed
    return out


def merge_segments(index_dir: str, entries: Sequence[SegmentEntry],
                   manifest: PermutationManifest, name: str) -> SegmentEntry:
    """Merge stored segments into one new segment ``name`` (compaction); returns its entry.

    The lists are re-fitted from the stored keys and re-rank payloads, concatenated in the
    order of ``entries``, with the index's permutation seed: the segment is the one a fresh
    build of those rows in that order writes (the same keys, lists, payload and ids)."""
    segs = [p for e in entries for p in parts_of(read_segment(index_dir, e, manifest))]
    codes = np.concatenate([s.codes_ for s in segs])
    ids = np.concatenate([s.ids_ for s in segs])
    # rows held on an exact uint8 grid are merged as their float32 rows: each segment's grid
    # has its own column minima and unit, and the merged rows' grid is found again when the
    # segment is written, as a fresh build of them finds it (concatenated, the grids' ``lo``
    # and ``step`` were 2d long and the merge was refused)
    arrays = [{"Z": s.payload_.Z} if isinstance(s.payload_, DensePayload)
              else s.payload_.arrays() for s in segs]
    merged: dict[str, np.ndarray] = {}
    for key in arrays[0]:
        if key == "indptr":  # CSR rows: shift each part's offsets past the previous parts
            ends = np.cumsum([0] + [int(a[key][-1]) for a in arrays[:-1]])
            merged[key] = np.concatenate(
                [arrays[0][key][:1], *(a[key][1:] + e for a, e in zip(arrays, ends))])
        else:
            merged[key] = np.concatenate([a[key] for a in arrays])
    # the stored payload's own class reads the merged arrays (every payload kind has
    # `from_arrays`; the protocol does not name it)
    payload_cls: Any = type(segs[0].payload_)
    payload = payload_cls.from_arrays(merged)
    m = manifest.permutations
    index = PermutationIndex(n_permutations=m, epsilon=None if m else manifest.epsilon,
                             seed=permutation_seed(manifest.seed))
    index.fit(codes, manifest.bits, payload, ids)
    return replace(write_segment(index_dir, name, index), **contiguous_span(entries))
