"""Operating points from a recall target: calibration of a `PermutationIndex`.

A fitted index with M_max lists is a family of indexes: its first M' lists are an M'-list
build (nested permutations), and any window W' <= W_max and Hamming cut H are query-time
choices.  Calibration measures, on a sample of the database's own rows used as queries
(leave-one-out: a query's own row counts neither as a neighbour nor as a hit):

* for every (M', W', H) of a grid, recall@k against the exact scan and the fraction of the
  database re-ranked — exactly, from one candidate array of the largest window: the candidates
  of (M', W') are a slice of it, and the real candidate collection kernel applies H;
* the time per query of the real search at the point chosen, and of the exact scan over the
  same database, in the same process.

`choose_point` (pure, deterministic) picks the cheapest point at the target by an operation
count (`Point.cost`); `decide_mode` keeps the scan when no point reaches the target or the scan
is no slower than the chosen point's measured time.  The result is a `Calibration`, stored in
the index manifest and printed by ``lshdist info``.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from lshdist._kernels.search import candidate_hamming, candidate_recall_grid
from lshdist.blocks import on_row_ranges
from lshdist.config import SEARCH_MODES
from lshdist.errors import FormatError, InputError
from lshdist.index.permutation import PermutationIndex
from lshdist.index.scan import scan_topk, will_prune

if TYPE_CHECKING:
    from lshdist.protocols import RerankPayload

log = logging.getLogger(__name__)

#: the hashed search must be at least this much faster than the scan to be chosen (timing
#: noise on a shared machine; a user is never handed a search slower than the scan)
SCAN_MARGIN = 0.9
#: queries of the calibration sample (recall's standard error ~ sqrt(r(1-r)/(k*n)): 0.007
#: at r=0.9, k=10; the exact truth costs n/N of a full scan)
SAMPLE_QUERIES = 200
#: a calibration on a sample of the queries themselves draws ``QUERY_SAMPLE_SHARE`` of them
#: (at least `SAMPLE_QUERIES`, at most `MAX_SAMPLE_QUERIES`): their exact truth costs that
#: share of the queries' exact scan.  A larger sample narrows the margin and makes a lucky
#: sample rarer (`benchmarks/bench_calibration_bias.py`, shifted Fashion-MNIST 240,000 rows,
#: 1,000 random samples each: with 200 queries 0.8 % of the chosen points missed the target on
#: 2,000 other queries; with 400 and 1,000 none did, at 8 % and 16 % lower search cost)
QUERY_SAMPLE_SHARE = 0.02
MAX_SAMPLE_QUERIES = 1000
#: queries of the timed searches (the chosen point and the scan; at most the sample's)
TIMED_QUERIES = 200
#: queries of the chosen point's first, quick timing (`timed_search`'s ``quick``): a hashed
#: search of 50 queries takes ~7 ms on Fashion-MNIST and is kept when decisively faster than
#: the scan (100 took a tenth of a 0.2 s calibration).  Not alone: on a small database the
#: batch's fixed costs dominate — Letter's L2 point timed 0.103 ms/query on 50 queries, against
#: a scan of 0.053 and 0.012 in the bulk search, and `auto` kept the scan
TIMED_SEARCH_QUERIES = 50
#: a calibration that knows how many queries its point will answer (`calibrate`'s
#: ``answered``: a bulk query calibrated on a sample of itself) starts on this many of its
#: sample and doubles them only while that pays (`extend_sample`)
FIRST_STAGE_QUERIES = 100
#: what one sample query costs the calibration, in `Point.cost`'s units (one number read by
#: the exact re-rank, ~0.39 ns): its exact truth per number of the database (a BLAS product:
#: 0.27 core-s for 200 x 60,000 x 784 on this EPYC VM, 0.093 units a number) and its grid
#: per entry of the largest window (candidates, Hamming distances and the counting over
#: every window: 0.17 core-s for 200 queries x 128 lists x 64 entries, ~270 units an entry)
TRUTH_UNITS_PER_NUMBER = 0.093
GRID_UNITS_PER_ENTRY = 270.0
#: window half-widths tried: powers of two and the steps between them (1.5x).  The grid's
#: cost hardly grows with its size (one candidate array of the largest window serves every
#: point), and the finer steps find cheaper points at the target: on Fashion-MNIST (M=128,
#: W=12, H=160) where powers of two gave (128, 16, 160), 7-14 % less search time, recall 0.919
#: on the 10,000 test queries.
WINDOWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
#: windows are doubled beyond the grid, up to this, while no point reaches the target
MAX_WINDOW = 256
HAMMING_FACTORS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # H = factor * k; 0 (all) too


#: a grid measured over every segment of a merged answer (`lshdist.cluster.pipeline`): its
#: points (`pooled_points`), the true neighbours counted, where they rank within their segment
#: (`merged_relevance`), and the exact scan's seconds per query on the calibrated segment as its
#: neighbour task measured it (None: time it again)
MergedGrid = tuple[Sequence["Point"], int, Sequence[float], float | None]


@dataclass(frozen=True)
class Point:
    """One operating point: parameters and what calibration measured there."""

    permutations: int
    window: int
    hamming_keep: int
    recall: float
    reranked: float  # rows whose exact distance is computed, mean per query
    fraction_searched: float
    seconds_per_query: float | None = None  # measured with the real search (None: not timed)
    #: the fraction of the true neighbours that rank j-th within their own segment
    #: (j = 1..k) that the point re-ranks (one segment: of the sample's j-th neighbours)
    rank_recall: tuple[float, ...] | None = None
    #: the parts (segments) every query searches, each walking its own M lists; ``reranked``
    #: is already their sum
    parts: int = 1

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.rank_recall is not None:
            d["rank_recall"] = list(self.rank_recall)
        return d

    def cost(self, width: float) -> float:
        """A deterministic proxy of the search time per query, in units of one number read by
        the exact re-rank: per list of every part the permuted prefix and the query's place in
        the list (50 units) and the window's 2W entries (a gather, the de-duplication and a
        Hamming distance each: 45 units), then the exact distance of every re-ranked row
        (``width`` numbers and 8 for its top-k).  Weights from a profile on Fashion-MNIST
        (10,000 queries, one thread, b = 512: 18 ns per window entry, 0.31 us per re-ranked
        784-float row, 0.39 ns per number).  It orders the points; timing decides only hash
        against scan, so that the same seed always gives the same choice.  (A first cost model
        counted the lists once for a merged answer of several segments while the rows
        re-ranked were summed over them: at 1 M rows in 11 segments that priced list walks 11x
        too low, and the finer grid then found (96, 32, 60) "cheaper" than (128, 16, 80).)"""
        return (self.parts * self.permutations * (50 + 90 * self.window)
                + self.reranked * (width + 8))


@dataclass(frozen=True)
class Calibration:
    """The calibration curve of an index and the operating point chosen from it."""

    k: int
    target: float
    n_database: int
    n_queries: int
    scan_seconds_per_query: float
    points: tuple[Point, ...]
    mode: str  # "hash" or "scan"
    chosen: Point | None
    reason: str
    width: float = 1.0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # field by field: `asdict(self)` would copy every point twice (the grid holds ~1,000;
        # this runs on the build's critical path)
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["points"] = [p.to_json() for p in self.points]
        d["chosen"] = None if self.chosen is None else self.chosen.to_json()
        d["extra"] = copy.deepcopy(self.extra)
        return d

    @classmethod
    def from_json(cls, d: Any, *, where: str = "calibration") -> Calibration:
        try:
            points = tuple(_point(p) for p in d["points"])
            chosen = None if d["chosen"] is None else _point(d["chosen"])
            cal = cls(k=int(d["k"]), target=float(d["target"]), n_database=int(d["n_database"]),
                      n_queries=int(d["n_queries"]),
                      scan_seconds_per_query=float(d["scan_seconds_per_query"]),
                      points=points, mode=str(d["mode"]), chosen=chosen, reason=str(d["reason"]),
                      width=float(d.get("width", 1.0)), seconds=float(d.get("seconds", 0.0)),
                      extra=dict(d.get("extra", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{where} is malformed ({type(exc).__name__}: {exc}); rebuild "
                              "the index") from None
        if cal.mode not in SEARCH_MODES or (cal.mode == "hash") != (chosen is not None):
            raise FormatError(f"{where}: mode {cal.mode!r} with chosen point {chosen!r}; "
                              "rebuild the index")
        return cal

    @property
    def reference(self) -> Point | None:
        """The point a hashed search runs at: the chosen one, or — where the scan was chosen —
        the best point that was timed (``mode="hash"`` still searches there); None if none."""
        if self.chosen is not None:
            return self.chosen
        timed = self.extra.get("timed")
        return _point(timed) if isinstance(timed, dict) else None

    def point_for(self, target: float, max_permutations: int) -> tuple[str, Point | None, str]:
        """Another operating point of the same curve (a query-time target): the cheapest that
        reaches it among those the index's lists allow; its time is estimated from the
        chosen point's measured time in proportion to `Point.cost`.  That time may be one
        run (`DECISIVE`: an upper estimate, not the fastest of repeats), so the estimate errs
        towards the scan by one run's noise: a point within that noise of the scan may get
        the scan where repeats would have said hash — never a hashed search slower than
        the scan."""
        pts = [p for p in self.points if p.permutations <= max_permutations]
        margin = recall_margin(target, self.n_queries)
        p = choose_point(pts, target, self.width, margin)
        if p is None:
            return "scan", None, _no_point(pts, target)
        ref = self.reference
        if ref is None or ref.seconds_per_query is None:
            return "hash", p, "no timing recorded; hashed search"
        est = ref.seconds_per_query * p.cost(self.width) / max(ref.cost(self.width), 1.0)
        p = replace(p, seconds_per_query=est)
        return decide_mode(p, self.scan_seconds_per_query)


_POINT_FIELDS = frozenset(f.name for f in fields(Point))
_POINT_DEFAULTS = {f.name: f.default for f in fields(Point) if f.default is not MISSING}
_POINT_REQUIRED = _POINT_FIELDS - _POINT_DEFAULTS.keys()


def _point(d: dict[str, Any]) -> Point:
    """A point from its JSON (`Point.to_json`), keys checked as ``Point(**d)`` checks them
    (unknown or missing: TypeError), the fields filled in one step: a frozen dataclass's
    ``__init__`` sets each through ``object.__setattr__``, and a grid of ~900 points took
    12 ms a parse -- read three or four times between a build's last task and its query's
    first, on the driver while the workers wait (3 ms now)."""
    if not isinstance(d, dict):
        raise TypeError(f"a point is a JSON object, not {type(d).__name__}")
    keys = d.keys()
    if not (keys >= _POINT_REQUIRED and keys <= _POINT_FIELDS):
        raise TypeError(f"a point needs {sorted(_POINT_REQUIRED)} (of {sorted(_POINT_FIELDS)}),"
                        f" got {sorted(keys)}")
    rr = d.get("rank_recall")
    p = object.__new__(Point)
    p.__dict__.update(_POINT_DEFAULTS)
    p.__dict__.update(d)
    p.__dict__["rank_recall"] = None if rr is None else tuple(map(float, rr))
    return p


def merged_relevance(dists: Sequence[np.ndarray], ids: Sequence[np.ndarray], k: int,
                     own: np.ndarray | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Which true neighbours of a merged answer each part must find, by rank within it.

    An index of S parts (segments, or a packed segment's parts) answers a query with the best
    k of each part's candidates, so a true top-k neighbour is found if its own part re-ranks
    it — and there it usually ranks first or second, which a cheaper operating point finds.
    ``dists[s]``, ``ids[s]`` (Q, m): the exact nearest rows of a sample of queries within
    part s, ascending (padding: id -1); ``own`` (Q,): each query's own row id, left out
    (leave-one-out calibration), or None.

    Returns ``(w, masks)``: w (k,) the fraction of the merged true top-k that ranks j-th
    within its part (reported); ``masks[s]`` (Q, k) bool marking the rows of part s (by rank
    within it, own row left out) that are true neighbours of the merged answer — each true
    neighbour is marked in exactly one part (`grid_counts` counts their hits)."""
    if not dists:
        raise InputError("rank weights need at least one segment")
    Q = dists[0].shape[0]
    all_d, all_r, all_s = [], [], []
    for s, (D, I) in enumerate(zip(dists, ids)):
        D = np.where(I >= 0, np.asarray(D, np.float64), np.inf)
        if own is not None:
            D = np.where(np.asarray(own, np.int64)[:, None] == I, np.inf, D)
        # ranks within the segment once the left-out rows are gone (D ascending per row)
        valid = np.isfinite(D)
        all_r.append(np.where(valid, np.cumsum(valid, axis=1) - 1, k))
        all_d.append(D)
        all_s.append(np.full(D.shape, s))
    D = np.concatenate(all_d, axis=1)
    R = np.concatenate(all_r, axis=1)
    seg = np.concatenate(all_s, axis=1)
    order = np.argsort(D, axis=1, kind="stable")[:, :k]
    top_d = np.take_along_axis(D, order, axis=1)
    top_r = np.take_along_axis(R, order, axis=1)
    top_s = np.take_along_axis(seg, order, axis=1)
    good = np.isfinite(top_d) & (top_r < k)
    masks = []
    for s in range(len(dists)):
        relevant = np.zeros((Q, k), dtype=bool)
        q_idx = np.nonzero(good & (top_s == s))
        relevant[q_idx[0], top_r[q_idx]] = True
        masks.append(relevant)
    counts = np.bincount(top_r[good], minlength=k)[:k].astype(np.float64)
    if counts.sum() == 0:
        return np.full(k, 1.0 / k), masks
    return counts / counts.sum(), masks


def part_truth(nbr_ids: np.ndarray, part_ids: np.ndarray, own: np.ndarray | None, k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """A part's exact neighbours of the sample as local rows: ``(truth (Q, k), qself (Q,))``
    — ``nbr_ids`` (Q, m) the part's nearest ids ascending (-1 padding), the query's own row
    (``own``) left out as `merged_relevance` does; qself: the local row of that own row, or
    -1."""
    order = np.argsort(part_ids, kind="stable")
    sorted_ids = part_ids[order]

    def local(ids: np.ndarray) -> np.ndarray:
        pos = np.clip(np.searchsorted(sorted_ids, ids), 0, len(sorted_ids) - 1)
        return np.where((ids >= 0) & (sorted_ids[pos] == ids), order[pos], -1).astype(np.int64)

    Q = nbr_ids.shape[0]
    truth = np.full((Q, k), -1, dtype=np.int64)
    qself = np.full(Q, -1, dtype=np.int64) if own is None else local(np.asarray(own, np.int64))
    for q in range(Q):
        row = nbr_ids[q][(nbr_ids[q] >= 0) & (own is None or nbr_ids[q] != own[q])][:k]
        truth[q, : len(row)] = local(row)
    return truth, qself


def grid_counts(index: PermutationIndex, qcodes: np.ndarray, truth: np.ndarray,
                qself: np.ndarray, relevant: np.ndarray, ms: Sequence[int], ws: Sequence[int],
                hs: Sequence[int], n_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One part's share of a merged calibration: hits of its ``relevant`` true neighbours by
    rank, (len(ms), len(ws), len(hs), k), and rows re-ranked, (len(ms), len(ws), len(hs)),
    summed over the sample (`candidate_recall_grid`; ``n_threads`` > 1: the sample in as many
    parts, counted in parallel — the counts are sums over queries, so the same)."""
    Q = len(qcodes)
    m_max, w_max = max(ms), max(ws)
    kt = np.where(relevant[:, : truth.shape[1]], truth, -1)
    axes = (np.asarray(ms, np.int64), np.asarray(ws, np.int64), np.asarray(hs, np.int64))

    def part(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        rows = slice(start, stop)
        qc = qcodes[rows]
        full = index.candidates(qc, n_permutations=m_max, window=w_max).reshape(
            len(qc), m_max, 2 * w_max)
        ham = candidate_hamming(full, index.codes_, qc)
        found: tuple[np.ndarray, np.ndarray] = candidate_recall_grid(
            full, ham, index.bits_, kt[rows], qself[rows], *axes)
        return found

    parts = on_row_ranges(part, Q, min(int(n_threads), Q // 16))
    if len(parts) == 1:
        return parts[0]
    return np.sum([p[0] for p in parts], axis=0), np.sum([p[1] for p in parts], axis=0)


def pooled_points(stats: Sequence[tuple[np.ndarray, np.ndarray]], counts: np.ndarray, Q: int,
                  N: int, ms: Sequence[int], ws: Sequence[int], hs: Sequence[int],
                  parts: int = 1) -> list[Point]:
    """The grid points of a merged answer from every part's `grid_counts`: recall = hits of
    true neighbours over all of them (``counts``: true neighbours by rank, summed over parts),
    rows re-ranked per query summed over the parts (``N``: rows of all parts); ``parts``: the
    parts a query searches, each walking its own lists (`Point.cost`)."""
    hits = np.sum([h for h, _ in stats], axis=0)
    reranked = np.sum([r for _, r in stats], axis=0)
    total = max(float(counts.sum()), 1.0)
    # whole-grid arrays first, then plain Python lists: the same values as per-point numpy
    # scalars (integer sums, one IEEE division each), 8x less time for ~900 points (0.022 s
    # of a 0.29 s Fashion-MNIST calibration was this loop's numpy scalar overhead)
    kept_l = reranked.tolist()
    found_l = hits.sum(axis=-1).tolist()
    by_rank = hits / np.maximum(counts, 1.0)
    by_rank_l = by_rank.tolist()
    n = max(N, 1)
    # round(x, 6) once per distinct value (hits over counts: a few hundred of the grid's
    # ~12,600), then looked up: the same function, 5.3 -> ~1 ms for a Fashion-MNIST grid
    six = {v: round(v, 6) for v in np.unique(by_rank).tolist()}.__getitem__
    points: list[Point] = []
    for a, m in enumerate(ms):
        for b, w in enumerate(ws):
            seen: set[float] = set()
            for j, h in enumerate(hs):
                kept = float(kept_l[a][b][j]) / Q
                if kept in seen:
                    continue
                seen.add(kept)
                points.append(Point(int(m), int(w), int(h), float(found_l[a][b][j]) / total,
                                    kept, kept / n,
                                    rank_recall=tuple(map(six, by_rank_l[a][b][j])),
                                    parts=int(parts)))
    return points


def recall_margin(target: float, n_queries: int) -> float:
    """The largest standard error of a recall averaged over ``n_queries`` queries at
    ``target``: ``sqrt(r (1 - r) / n)`` (a query's recall lies in [0, 1], so with mean r its
    variance is at most r (1 - r)); 0.021 at 0.9 and 200 queries.  A point is chosen only if
    its calibrated recall reaches the target by this much, so that a sample's luck does not
    pick a point whose recall on all queries falls below the target.  (The binomial error over
    the sample's n·k neighbours, 0.0067, used before, treats a query's k neighbours as found
    independently; they are not — they share the query's lists — and at 240,000 rows a point
    calibrated at 0.920 answered the other queries at 0.881.)"""
    return float(np.sqrt(target * (1.0 - target) / max(n_queries, 1)))


def widen_windows(measure: Callable[[list[int]], list[Point]], ws: Sequence[int],
                  target: float, margin: float, *, fixed: bool,
                  points: list[Point] | None = None) -> tuple[list[Point], list[int]]:
    """The grid measured over windows ``ws`` (``measure(ws)``: its points), the largest window
    doubled and the grid measured again while no point reaches ``target + margin`` (capped at
    1), up to `MAX_WINDOW`; ``fixed``: the user gave W, which is never widened.  ``points``:
    the grid already measured over ``ws`` (not measured again).  Returns the last grid and
    its windows.  A larger database needs wider windows for the same recall (its lists hold
    more rows between a query and its neighbours); the grid alone cannot say how wide, so
    every calibration (`calibrate`, the merged grid of a segmented index) widens here."""
    _check_target(target)
    ws = list(ws)
    if points is None:
        points = measure(ws)
    while not fixed and max(ws) < MAX_WINDOW and not reaches(points, target, margin):
        ws = [*ws, 2 * max(ws)]
        points = measure(ws)
    return points, ws


def _check_target(target: float) -> None:
    if not 0 < target <= 1:
        raise InputError(f"target recall {target}: must be in (0, 1]")


def reaches(points: Sequence[Point], target: float, margin: float = 0.0) -> bool:
    """Whether any point's recall reaches ``target + margin`` (capped at 1): the condition
    under which `choose_point` chooses one."""
    need = min(target + margin, 1.0)
    return any(p.recall >= need for p in points)


def choose_point(points: Sequence[Point], target: float, width: float,
                 margin: float = 0.0) -> Point | None:
    """The cheapest point (`Point.cost`; ties to fewer lists, smaller W and H) whose recall
    reaches ``target + margin`` (capped at 1); None if none does.  Pure and deterministic."""
    _check_target(target)
    need = min(target + margin, 1.0)
    ok = [p for p in points if p.recall >= need]
    if not ok:
        return None
    return min(ok, key=lambda p: (p.cost(width), p.permutations, p.window, p.hamming_keep))


def reference_point(points: Sequence[Point], target: float, width: float,
                    margin: float) -> Point | None:
    """The point a calibration's hashed search runs at (`Calibration.reference`), from its
    grid alone: the one `select` chooses when one reaches the target plus the margin, else
    the cheapest of the best recall there is (without the margin there, the cheapest of the
    many points just at the target would be chosen by the sample's luck); None without
    points.  The timing decides only hash or scan, never this point: a build writes its
    lists (`kept_lists`) while the chosen point is still being timed."""
    p = choose_point(points, target, width, margin)
    if p is not None:
        return p
    top = max((q.recall for q in points), default=1.0)
    return choose_point(points, min(target + margin, top), width)


def kept_lists(points: Sequence[Point], target: float, width: float, margin: float) -> int:
    """The lists a calibrated build keeps: its reference point's (`reference_point`), else
    the fewest of the grid."""
    ref = reference_point(points, target, width, margin)
    return ref.permutations if ref is not None else min(q.permutations for q in points)


def extend_sample(points: Sequence[Point], target: float, width: float, n: int, n_next: int,
                  answered: int, n_database: int, grid_entries: int) -> tuple[float, str]:
    """What calibrating on ``n_next`` sample queries instead of ``n`` gains, net (positive:
    it pays for itself; +inf where it is needed), and why.  A larger sample narrows the
    recall margin (`recall_margin`), so a cheaper point may qualify: the saving is what the
    ``answered`` queries would search less — the cost of the point chosen at ``n``'s margin
    less the one chosen at ``n_next``'s, both read off this sample's curve — less what the
    ``n_next - n`` queries cost the calibration (their truth over ``n_database`` rows of
    ``width`` numbers, their grid over ``grid_entries`` window entries;
    `TRUTH_UNITS_PER_NUMBER`, `GRID_UNITS_PER_ENTRY`).  All in `Point.cost`'s units, so the
    decision is deterministic (same sample, same curve, same answer).  Where no point reaches
    the target by ``n``'s margin but one does by ``n_next``'s, the sample must grow (else the
    scan would be chosen for the sample's size alone): +inf.  Pure."""
    now = choose_point(points, target, width, recall_margin(target, n))
    nxt = choose_point(points, target, width, recall_margin(target, n_next))
    extra = (n_next - n) * (n_database * width * TRUTH_UNITS_PER_NUMBER
                            + grid_entries * GRID_UNITS_PER_ENTRY)
    if nxt is None:
        return -extra, f"no point reaches the target with {n_next} queries' margin either"
    if now is None:
        return float("inf"), (f"no point reaches the target with {n} queries' margin; one "
                              f"does with {n_next}'s")
    saving = answered * (now.cost(width) - nxt.cost(width))
    return saving - extra, (f"{n_next} queries' margin would save {saving:.3g} units over "
                            f"{answered} queries against {extra:.3g} for their calibration")


def _no_point(points: Sequence[Point], target: float) -> str:
    best = max((p.recall for p in points), default=0.0)
    return (f"no hashed operating point reaches recall {target:g} (best {best:.3f}); the "
            "exact scan is used")


def decide_mode(point: Point, scan_seconds: float) -> tuple[str, Point | None, str]:
    """Hash at ``point`` unless the scan is no slower than its measured time / `SCAN_MARGIN`."""
    t = point.seconds_per_query
    if t is None:
        raise InputError("the operating point has no measured time")
    if t >= SCAN_MARGIN * scan_seconds:
        return "scan", None, (f"the exact scan ({1e3 * scan_seconds:.3f} ms/query) is no slower "
                              f"than the hashed search at recall {point.recall:.3f} "
                              f"({1e3 * t:.3f} ms/query)")
    return "hash", point, (f"M={point.permutations}, W={point.window}, H={point.hamming_keep} "
                           f"reaches recall {point.recall:.3f} searching "
                           f"{100 * point.fraction_searched:.2f}%, {scan_seconds / t:.1f}x "
                           "faster than the scan")


def select(points: Sequence[Point], target: float, scan_seconds: float, width: float,
           time_point: Callable[[Point], float], margin: float = 0.0
           ) -> tuple[str, Point | None, str]:
    """``(mode, point, reason)``: `choose_point`, timed with ``time_point`` (seconds per
    query), then `decide_mode`; the scan when no point reaches the target."""
    p = choose_point(points, target, width, margin)
    if p is None:
        return "scan", None, _no_point(points, target)
    p = replace(p, seconds_per_query=time_point(p))
    return decide_mode(p, scan_seconds)


def grid_permutations(m_max: int) -> list[int]:
    """Nested list counts to try: powers of two from 8 and the steps between them (1.5x)
    below ``m_max``, and ``m_max``."""
    out, m = [], 8
    while m < m_max:
        out.append(m)
        if m + m // 2 < m_max:
            out.append(m + m // 2)
        m *= 2
    return [*out, m_max]


def grid_axes(m_max: int, k: int, permutations: Sequence[int] | None = None,
              windows: Sequence[int] | None = None, hamming_keeps: Sequence[int] | None = None
              ) -> tuple[list[int], list[int], list[int]]:
    """The (M', W, H) values a calibration tries: the given ones (a parameter the user fixed),
    else nested list counts up to ``m_max``, `WINDOWS`, and H = 0 (all) or factor x k."""
    ms = sorted(set(permutations or grid_permutations(m_max)))
    ws = sorted(set(windows or WINDOWS))
    hs = sorted(set(hamming_keeps if hamming_keeps is not None
                    else (0, *[f * k for f in HAMMING_FACTORS])))
    return ms, ws, hs


def calibrate(index: PermutationIndex, qrows: np.ndarray, qcodes: np.ndarray, qpayload: Any,
              *, k: int, target: float, permutations: Sequence[int] | None = None,
              windows: Sequence[int] | None = None, hamming_keeps: Sequence[int] | None = None,
              hash_overhead: float = 0.0,
              merged: MergedGrid | None = None,
              timer: Callable[[], float] = time.perf_counter, n_threads: int = 1,
              answered: int | None = None) -> Calibration:
    """Calibrate ``index`` with its own rows ``qrows`` as queries (encoded: ``qcodes``,
    ``qpayload``).  ``permutations``/``windows``/``hamming_keeps`` fix a parameter the user
    gave (default: the grids above); ``hash_overhead`` (seconds per query) is added to the
    hashed search's time (hashing the query, which the scan does not need).  ``merged``:
    the index is one of several segments whose answers are merged — (the grid measured over
    every segment, `pooled_points`; the true neighbours it counted; where they rank within
    their segment, `merged_relevance`): this index is then only timed against its scan.
    ``n_threads``: the grid is counted on that many threads (the timed searches stay on one,
    as the scan they are compared with).  ``answered``: how many queries the chosen point
    will answer (a bulk query calibrated on a sample of itself): the sample is then used in
    stages — `FIRST_STAGE_QUERIES` of it (a seeded random subset), doubled while the
    narrower margin saves the answered queries more search than the added queries cost
    (`extend_sample`); the grid's counts are sums over queries, so the stages add up to the
    grid of the queries used.  None: the whole sample at once."""
    t_start = timer()
    N = len(index)
    Q = len(qrows)
    if Q == 0 or N < 2:
        raise InputError(f"calibration needs at least 2 database rows and 1 query (got {N}, "
                         f"{Q})")
    ks = min(k, N - 1)
    if answered is not None and (isinstance(answered, bool) or not isinstance(
            answered, (int, np.integer)) or answered < 1):
        raise InputError(f"answered={answered!r}: the queries the calibrated point will "
                         "answer must be a positive integer (or None: not known)")
    # compile (or load) the kernels before anything is timed — with a batch of the timed size,
    # which takes the bulk (merge) path a single query does not (measured: timing a kernel's
    # first use in the process made a 200-query hashed search look 8x slower per query than
    # the bulk search, and `auto` keep the scan on Letter)
    # (the scan's kernels on a few rows: a scan of the whole database for one query read every
    # row and, taking the re-rank's wide path, made its uint8 copy -- 0.16 s of a 0.37 s
    # Fashion-MNIST calibration; the copy is made by `prepare` below, on the threads given)
    scan_topk(index.payload_.take(slice(0, min(N, 64))), qpayload.take(slice(0, 1)), 1)
    nw = min(Q, TIMED_QUERIES)
    index.search(qcodes[:nw], qpayload.take(slice(0, nw)), 1, n_permutations=1, window=1)
    index.payload_.prepare(n_threads)  # what the search keeps in memory, made before any timing
    truth = np.full((Q, ks), -1, dtype=np.int64)
    staged = merged is None and answered is not None and Q > FIRST_STAGE_QUERIES
    # the order the sample is used in: a seeded random one when staged (the caller's sample is
    # sorted by row, and its first rows would be the data's first)
    order = (np.random.default_rng(np.random.SeedSequence([Q, 4])).permutation(Q) if staged
             else np.arange(Q))
    n = min(Q, FIRST_STAGE_QUERIES) if staged else Q

    def queries(idx: np.ndarray) -> Any:
        return qpayload if len(idx) == Q and not staged else qpayload.take(idx)

    def exact(idx: np.ndarray, timed: bool = True) -> float:
        """The exact truth of the sample queries ``idx`` (leave-one-out: k+1 nearest, the
        query's own row removed) into ``truth``; the scan's seconds per query (``timed``:
        the later stages' truth is not timed again)."""
        ids = np.arange(N, dtype=np.int64)
        if timed:
            _, truth_ids, secs = exact_truth(index.payload_, queries(idx), ks + 1, ids=ids,
                                             timer=timer,
                                             batch=min(answered or BULK_QUERIES, BULK_QUERIES))
        else:
            _, truth_ids = scan_topk(index.payload_, queries(idx), ks + 1, ids=ids, prune=True)
            secs = 0.0
        for j, q in enumerate(idx.tolist()):
            t = truth_ids[j][truth_ids[j] != qrows[q]][:ks]
            truth[q, : len(t)] = t
        return secs

    if merged is not None and merged[3] is not None:
        scan_s = float(merged[3])  # the grid is given and the scan was timed with it
    else:
        scan_s = exact(order[:n])
    ms, ws, hs = grid_axes(index.n_permutations_, k, permutations, windows, hamming_keeps)
    if max(ms) > index.n_permutations_:
        raise InputError(f"calibration asks for {max(ms)} lists, the index has "
                         f"{index.n_permutations_}")
    width = float(getattr(qpayload, "width", 1))
    if merged is not None:
        points: list[Point] = list(merged[0])
        w_rank = [float(x) for x in merged[2]]
    else:
        w_rank = [1.0 / ks] * ks

    def counted(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return grid_counts(index, qcodes[idx], truth[idx], qrows[idx],
                           np.ones((len(idx), ks), bool), ms, ws, hs, n_threads)

    stats: list[tuple[np.ndarray, np.ndarray]] = []  # the grid counts of the stages used

    def measure(widths: list[int]) -> list[Point]:
        """The grid of the first ``n`` queries of the sample over windows ``widths``."""
        nonlocal ws
        ws = widths
        stats[:] = [counted(order[:n])]
        return pooled_points(stats, np.full(ks, float(n)), n, N, ms, ws, hs)

    if merged is None:
        # by the margin of the whole sample: a staged sample may still grow
        points, ws = widen_windows(measure, ws, target, recall_margin(target, Q),
                                   fixed=windows is not None)
    stages, why = [n], ""
    while staged and n < Q:
        # every larger size the sample could take (doubling, up to all of it), the one of
        # largest net gain if any gains: a margin halved pays where one step may not
        sizes = sorted({min(Q, n * 2 ** i) for i in range(1, 12)})
        gains = [extend_sample(points, target, width, n, m, int(answered or 1), N,
                               max(ms) * 2 * max(ws)) for m in sizes]
        pick = max(range(len(sizes)), key=lambda i: gains[i][0])
        why = gains[pick][1]
        if not gains[pick][0] > 0:
            break
        n_next = sizes[pick]
        exact(order[n:n_next], timed=False)
        stats.append(counted(order[n:n_next]))
        n = n_next
        points = pooled_points(stats, np.full(ks, float(n)), n, N, ms, ws, hs)
        stages.append(n)
    # pooled over the stages, the sample's recalls may fall short of the target by the
    # margin of the queries used: the windows are widened as for the first stage
    if merged is None and n > stages[0]:
        points, ws = widen_windows(measure, ws, target, recall_margin(target, n),
                                   fixed=windows is not None, points=points)
    measured = int(merged[1]) if merged is not None else n * ks
    used = order[:n]
    # one standard error (at most) of the recall averaged over the sample's queries
    margin = recall_margin(target, n)
    nt, nq = min(n, TIMED_QUERIES), min(n, TIMED_SEARCH_QUERIES)
    timed_q = {m: (qcodes[used[:m]], queries(used[:m])) for m in {nt, nq}}

    def time_point(p: Point) -> float:
        def run(m: int) -> Callable[[], None]:
            def go() -> None:
                index.search(*timed_q[m], ks, n_permutations=p.permutations, window=p.window,
                             hamming_keep=p.hamming_keep)
            return go

        return timed_search(run(nt), timer, nt, hash_overhead, scan_s,
                            quick=(run(nq), nq) if nq < nt else None)

    mode, chosen, reason = select(points, target, scan_s, width, time_point, margin)
    extra: dict[str, Any] = {"rank_weights": [round(x, 6) for x in w_rank],
                             "rows_measured": measured, "margin": margin}
    if staged:
        extra["sample"] = {"drawn": Q, "used": n, "stages": stages, "answered": answered,
                           "why": why}
        log.info("calibration sample: %d of the %d drawn (stages %s): %s", n, Q, stages, why)
    if chosen is None and mode == "scan":
        best = reference_point(points, target, width, margin)
        if best is not None:  # keep a timed reference for query-time targets
            best = replace(best, seconds_per_query=time_point(best))
            extra["timed"] = {**asdict(best), "rank_recall": None if best.rank_recall is None
                              else list(best.rank_recall)}
    return Calibration(k=ks, target=target, n_database=N, n_queries=n,
                       scan_seconds_per_query=scan_s, points=tuple(points), mode=mode,
                       chosen=chosen, reason=reason, width=width, seconds=timer() - t_start,
                       extra=extra)


#: a timed hashed search whose first run is under this share of the time that would still
#: choose it (`SCAN_MARGIN` x the scan's) is not repeated: timing noise only lengthens a run,
#: so repeats could only lower the time and the verdict stays; its one run is its measured
#: time (an upper estimate; `Calibration.point_for` scales other points' times from it, and
#: so errs towards the scan for them by that run's noise).  Repeating it anyway cost
#: 0.01-0.02 s of a 0.2 s Fashion-MNIST calibration (a 100-query search of ~11 ms is under
#: `MIN_TIMED_SECONDS`)
DECISIVE = 0.5
#: a timed run shorter than this is repeated (up to `MAX_REPEATS` runs, the fastest kept): one
#: run of a few microseconds measures the machine's noise, not the search (a 60-row database
#: once timed its scan 10x slow and `auto` chose the hashed search)
MIN_TIMED_SECONDS = 0.02
MAX_REPEATS = 7


def exact_truth(payload: RerankPayload, qpayload: RerankPayload, m: int, *,
                ids: np.ndarray | None = None,
                timer: Callable[[], float] = time.perf_counter,
                batch: int | None = None
                ) -> tuple[np.ndarray, np.ndarray, float]:
    """The queries' exact top ``m`` (`scan_topk`) and the seconds per query of the exact scan
    a search in "scan" mode runs (the full product, not pruned), each query scanned once.

    The first queries' truth is the scan a "scan" search runs, timed (the fastest of repeats,
    `_best_of`): `TIMED_QUERIES` of them; with ``batch`` (the queries a bulk scan will take
    at once) two runs on disjoint slices — the first third and the rest of up to 1.5
    `TIMED_QUERIES` — whose times give the time per query of a scan of ``batch`` queries
    (`bulk_seconds`).  The other queries' truth is the scan pruned where that pays
    (`will_prune`), untimed, run first (it makes what a scan makes once per payload: the
    centred norms, the uint8 copy; with no such rest a one-query scan does, so no timed run
    pays for it).  A payload held on its grid makes its float32 rows a block at a time in
    every scan: a cost per scan, not per query, which ``batch``'s two runs tell apart.
    Where the rest would not prune, every query is in the timed runs.  (Timing the scan
    apart from the truth, on the sample's first 200 and 100 queries again, cost 1.3-1.5
    times the sample's scans: 0.4 of 2.1 core-s per 100,000-row segment of the 480,000-row
    set, 1,000 calibration queries.)"""
    Q = len(qpayload)
    n = min(Q, TIMED_QUERIES + (TIMED_QUERIES // 2 if batch is not None else 0))
    if n < Q and not will_prune(payload, Q - n, m):
        n = Q  # the rest would be the same full scan: time it all
    small = n // 3 if batch is not None else 0
    bulk = small >= MIN_BULK_TIMED and batch is not None and batch > n - small
    runs = [(0, small), (small, n)] if bulk else [(0, n)]
    rest = None
    if n < Q:
        rest = scan_topk(payload, qpayload.take(slice(n, Q)), m, ids=ids, prune=True)
    else:
        scan_topk(payload, qpayload.take(slice(0, min(Q, 1))), m)
    parts, seconds = [], []
    for a, b in runs:
        part = qpayload.take(slice(a, b))

        def run(part: RerankPayload = part) -> tuple[np.ndarray, np.ndarray]:
            return scan_topk(payload, part, m, ids=ids)

        t0 = timer()
        parts.append(run())
        seconds.append(_best_of(timer() - t0, run, timer))
    if rest is not None:
        parts.append(rest)
    D = np.concatenate([p[0] for p in parts])
    I = np.concatenate([p[1] for p in parts])
    if not bulk:
        return D, I, seconds[0] / max(n, 1)
    return D, I, bulk_seconds(seconds[1], n - small, seconds[0], small, int(batch or n))


#: the fewest queries of the smaller of the two timed scans of `bulk_seconds`
MIN_BULK_TIMED = 20
#: the queries a bulk job's scan takes at once where the job's size is not known (a query
#: chunk's default, `QueryConfig.query_chunk`)
BULK_QUERIES = 10_000


def bulk_seconds(t_full: float, n_full: int, t_half: float, n_half: int, batch: int) -> float:
    """Seconds per query of a scan of ``batch`` queries, from scans of ``n_full`` and
    ``n_half`` queries that took ``t_full`` and ``t_half`` seconds: a fixed cost per scan plus
    a cost per query, fitted through the two (the sparse scan's per-call work — the database
    turned for the product, its norms — cost a 100-query 20 Newsgroups scan 2.5x the time
    per query of a 2,500-query one, and a hashed search timed against it looked faster than
    a bulk scan it lost to).  Bounded to [1/4, 1] of the full timing's per-query time:
    never slower than measured, and one noisy run cannot make the scan look free."""
    per_query = t_full / n_full
    marginal = (t_full - t_half) / max(n_full - n_half, 1)
    fixed = max(t_full - marginal * n_full, 0.0)
    est = max(marginal, 0.0) + fixed / batch
    return float(min(per_query, max(0.25 * per_query, est)))


def timed_search(run: Callable[[], Any], timer: Callable[[], float], n_queries: int,
                 overhead: float, scan_seconds: float,
                 quick: tuple[Callable[[], Any], int] | None = None) -> float:
    """Seconds per query of a hashed search ``run`` over ``n_queries`` (plus ``overhead``
    per query): one run when it is decisively faster than the scan (`DECISIVE`), else the
    fastest of repeats (`_best_of`).  ``quick`` = (a run over fewer queries, their number):
    tried first, and its time kept when decisive (a small batch's fixed costs weigh more per
    query, so it errs towards the scan; when it is not decisive, ``run`` decides as above)."""
    first = 0.0
    for go, n in [*([quick] if quick is not None else []), (run, n_queries)]:
        t0 = timer()
        go()
        first = timer() - t0
        if first / n + overhead < DECISIVE * SCAN_MARGIN * scan_seconds:
            return first / n + overhead  # repeats could only lower it: the same verdict
    return _best_of(first, run, timer) / n_queries + overhead


def _best_of(first: float, run: Callable[[], Any], timer: Callable[[], float]) -> float:
    """The fastest of ``first`` (a run already timed) and repeats of ``run`` while the total
    stays under `MIN_TIMED_SECONDS` (at most `MAX_REPEATS` runs in all)."""
    best, total, n = first, first, 1
    while total < MIN_TIMED_SECONDS and n < MAX_REPEATS:
        t0 = timer()
        run()
        dt = timer() - t0
        best, total, n = min(best, dt), total + dt, n + 1
    return best


def query_sample_size(n_queries: int) -> int:
    """Queries to calibrate on when sampling ``n_queries`` real queries: `QUERY_SAMPLE_SHARE`
    of them, within [`SAMPLE_QUERIES`, `MAX_SAMPLE_QUERIES`] (all of them if fewer)."""
    share = int(QUERY_SAMPLE_SHARE * n_queries)
    return int(min(n_queries, max(SAMPLE_QUERIES, min(MAX_SAMPLE_QUERIES, share))))


def sample_rows(n: int, size: int, seed: int) -> np.ndarray:
    """A sorted random sample of ``min(size, n)`` row numbers (the calibration queries)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 2]))
    return np.sort(rng.choice(n, size=min(size, n), replace=False)).astype(np.int64)
