"""The recall a query job measured on its own queries: sample, interval and verdict.

A calibration estimates recall@k on a sample of rows chosen before the real queries were seen
(the database's own rows, leave-one-out, or a query sample).  Where the real queries are unlike
that sample — a database of near-copies (augmented images, re-crawled pages) queried by rows
that have none — the estimate is optimistic.  So a query job answers a seeded random sample of
its *own* queries exactly as well, and reports the recall it measured with a 95 % interval
beside the estimate; `verdict` says whether the job may keep its operating point.

Pure functions over arrays (numpy only): the cluster driver and `MetricIndex` both call them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lshdist.errors import FormatError

#: the fewest queries a check answers exactly (all of them, for smaller jobs)
MIN_CHECK_QUERIES = 50
#: ... else this share of them ...
CHECK_SHARE = 0.02
#: ... and never more than this many (the interval is then ±0.01 or narrower)
MAX_CHECK_QUERIES = 500
#: the interval's level (two-sided)
LEVEL = 0.95
_Z = 1.959963984540054


def check_size(n_queries: int) -> int:
    """Queries answered exactly to measure a job's recall: `CHECK_SHARE` of them, within
    [`MIN_CHECK_QUERIES`, `MAX_CHECK_QUERIES`], all of them if fewer.  The check costs that
    share of an exact scan of the whole query set (50 of 1,000 queries: 5 %)."""
    if n_queries <= 0:
        return 0
    share = math.ceil(CHECK_SHARE * n_queries)
    return int(min(n_queries, max(MIN_CHECK_QUERIES, min(MAX_CHECK_QUERIES, share))))


def check_rows(n_queries: int, seed: int) -> np.ndarray:
    """The sorted row numbers (of the query set) of the recall check: `check_size` of them,
    drawn with their own stream of ``seed`` (not the calibration sample's)."""
    size = check_size(n_queries)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 41]))
    return np.sort(rng.choice(n_queries, size=size, replace=False)).astype(np.int64)


def per_query_recall(found: np.ndarray, truth: np.ndarray, k: int) -> np.ndarray:
    """``|found[i, :k] ∩ truth[i, :k]| / k'`` for each query (float64, shape (Q,)), where
    ``k'`` is the number of true neighbours (ids ≥ 0) in ``truth[i]``: a database smaller than
    k holds fewer, and finding all of them is recall 1.  Ids < 0 are padding."""
    found = np.asarray(found)
    truth = np.asarray(truth)
    if found.shape[0] != truth.shape[0]:
        raise ValueError(f"{found.shape[0]} answers for {truth.shape[0]} true neighbour lists")
    out = np.ones(found.shape[0], np.float64)
    for i in range(found.shape[0]):
        t = truth[i, :k]
        t = t[t >= 0]
        if len(t) == 0:
            continue
        f = found[i, :k]
        out[i] = len(np.intersect1d(f[f >= 0], t)) / len(t)
    return out


def interval(values: np.ndarray, population: int, level: float = LEVEL
             ) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of per-query recalls ``values`` (a random sample,
    without replacement, of ``population`` queries) and a two-sided ``level`` interval for the
    mean over the whole population.

    Student's t on the sample's own variance, with the finite-population correction (a check of
    every query is exact: a zero-width interval).  Where the sample shows no spread (every
    sampled query at the same recall) the t interval would be zero-wide; the Wilson score
    interval of the mean as a proportion over the sampled queries is used instead, which is
    never narrower than the variance of a [0, 1] variable allows."""
    values = np.asarray(values, np.float64)
    n = len(values)
    if n == 0:
        raise ValueError("no queries were checked")
    if level != LEVEL:
        raise ValueError(f"level={level}: only {LEVEL} is offered")
    mean = float(values.mean())
    if n >= population:
        return mean, mean, mean
    fpc = math.sqrt((population - n) / max(population - 1, 1))
    sd = float(values.std(ddof=1)) if n > 1 else 0.0
    if sd > 0:
        half = _t975(n - 1) * sd / math.sqrt(n) * fpc
        return mean, max(0.0, mean - half), min(1.0, mean + half)
    z2 = _Z * _Z
    centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
    half = _Z / (1 + z2 / n) * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n)) * fpc
    return mean, max(0.0, min(mean, centre - half)), min(1.0, max(mean, centre + half))


def _t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (scipy.special's
    inverse of its distribution function, what ``scipy.stats.t.ppf`` computes: importing
    scipy.stats took 0.7 s of a query job's wall time, the first time a recall was checked)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, 0.975))


@dataclass(frozen=True)
class MeasuredRecall:
    """What a query job measured on its own queries (the ``measured_recall`` record).

    ``value``, ``low``, ``high``: recall@``k`` against the exact answer on ``sampled`` of the
    job's ``queries`` and its 95 % interval for all of them; ``estimate``: what the calibration
    predicted for the point checked (None without one); ``target``: the recall asked for;
    ``action``: what the job did about it — ``"kept"`` (the point answered), ``"recalibrated"``
    (calibrated again on the queries, then checked again: these figures are the new point's),
    ``"scan"`` (answered by the exact scan: recall 1 for every query), ``"reported"`` (below
    the target, but the mode was asked for explicitly); ``"superseded"`` (an earlier check,
    in ``checks``, of a point the job then left); ``note``: the reason, for the log."""

    value: float
    low: float
    high: float
    sampled: int
    queries: int
    k: int
    target: float | None
    estimate: float | None
    mode: str
    action: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"value": round(self.value, 6), "interval": [round(self.low, 6),
                                                            round(self.high, 6)],
                "level": LEVEL, "queries_sampled": self.sampled, "queries": self.queries,
                "k": self.k, "target": self.target, "estimate": self.estimate,
                "mode": self.mode, "action": self.action, "checks": self.checks,
                "note": self.note}

    @classmethod
    def from_json(cls, d: Any, *, where: str = "measured_recall") -> MeasuredRecall:
        try:
            return cls(float(d["value"]), float(d["interval"][0]), float(d["interval"][1]),
                       int(d["queries_sampled"]), int(d["queries"]), int(d["k"]),
                       None if d.get("target") is None else float(d["target"]),
                       None if d.get("estimate") is None else float(d["estimate"]),
                       str(d["mode"]), str(d["action"]), list(d.get("checks", [])),
                       str(d.get("note", "")))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise FormatError(f"{where} is malformed ({type(exc).__name__}: {exc})") from None

    def line(self) -> str:
        """One line for the log and ``lshdist info``."""
        est = "" if self.estimate is None else f", calibration estimated {self.estimate:.3f}"
        if self.sampled >= self.queries or self.mode == "scan":
            how = f"on all {self.queries} queries" if self.mode != "scan" else "exact scan"
            return (f"measured recall@{self.k} {self.value:.3f} ({how}{est}); "
                    f"{self.action}: {self.note}").rstrip(": ")
        return (f"measured recall@{self.k} {self.value:.3f} [{self.low:.3f}, {self.high:.3f}] "
                f"on {self.sampled} of {self.queries} queries{est}; {self.action}"
                + (f": {self.note}" if self.note else ""))


def line_of(record: dict[str, Any]) -> str:
    """`MeasuredRecall.line` of a ``measured_recall`` record."""
    return MeasuredRecall.from_json(record).line()


def measured(found: np.ndarray, truth: np.ndarray, k: int, n_queries: int, *, mode: str,
             target: float | None, estimate: float | None, action: str = "kept",
             note: str = "") -> MeasuredRecall:
    """The `MeasuredRecall` of answers ``found`` against the exact ``truth`` (ids, (S, ≥k))
    for a check of S of ``n_queries`` queries."""
    values = per_query_recall(found, truth, k)
    mean, low, high = interval(values, n_queries)
    return MeasuredRecall(mean, low, high, len(values), n_queries, k, target, estimate, mode,
                          action, note=note)


def exact(n_queries: int, k: int, target: float | None, estimate: float | None, *,
          action: str = "scan", note: str = "", checks: list[dict[str, Any]] | None = None
          ) -> MeasuredRecall:
    """The record of a job answered by the exact scan: recall 1 by construction."""
    return MeasuredRecall(1.0, 1.0, 1.0, 0, n_queries, k, target, estimate, "scan", action,
                          checks or [], note)


def verdict(m: MeasuredRecall, target: float) -> str:
    """``"ok"``: the measured mean reaches the target; ``"low"``: it does not, but the interval
    still holds the target (re-calibrating may help, the miss is not proven); ``"miss"``: the
    whole interval lies below the target."""
    if m.value >= target:
        return "ok"
    return "miss" if m.high < target else "low"


@dataclass(frozen=True)
class Decision:
    """How a query job answers after its recall check: ``mode`` and ``point`` (opaque to this
    module: the caller's operating point), ``reason`` (why, when the check changed them; ""
    when it did not), and the ``recall`` record."""

    mode: str
    point: Any
    reason: str
    recall: MeasuredRecall


def enforce(*, mode: str, point: Any, estimate: float | None, target: float | None,
            auto: bool, n_queries: int, k: int,
            measure: Callable[[Any, float | None], MeasuredRecall],
            recalibrate: Callable[[], tuple[str, Any, str, float | None]] | None
            ) -> Decision:
    """The recall promise, kept: measure the recall of a hashed search at ``point`` on the
    job's own queries (``measure(point, estimate)``); where it falls short of ``target``:

    - with ``auto`` (the job chooses its mode) and ``recalibrate`` (the point came from a
      calibration on other rows): calibrate again on the queries themselves
      (``recalibrate() -> (mode, point, reason, estimate)``) and check the new point; kept
      unless its whole interval lies below the target;
    - a miss proven (the whole interval below the target) that re-calibrating did not mend, or
      could not (the point already came from these queries): answer by the exact scan;
    - the mean below the target but the interval holding it, with nothing left to try: the
      point stands, and the record says so;
    - without ``auto`` (a mode asked for explicitly) or without a target: measured and
      reported, never changed.

    Never a silent miss: every outcome is in the returned record (``action``, ``note``)."""
    if mode == "scan":
        return Decision(mode, point, "", exact(n_queries, k, target, None, action="kept",
                                               note="answered by the exact scan"))
    m = measure(point, estimate)
    if target is None:
        return Decision(mode, point, "", replace(m, action="reported",
                                                 note="no target recall to hold it to"))
    if verdict(m, target) == "ok":
        return Decision(mode, point, "", m)
    if not auto:
        return Decision(mode, point, "", replace(
            m, action="reported",
            note=f"below the target {target:g}; the hashed mode was asked for, so the point "
                 "stands (mode auto lets the job correct it)"))
    checks = [replace(m, action="superseded").to_json()]
    if recalibrate is not None:
        mode2, point2, reason2, est2 = recalibrate()
        if mode2 == "scan":
            return Decision("scan", None, f"calibrated again on the queries: {reason2}",
                            exact(n_queries, k, target, m.estimate, checks=checks,
                                  note=f"the first point measured {m.value:.3f} below the "
                                       f"target {target:g}; calibrated again on the queries, "
                                       f"which chose the scan ({reason2})"))
        m2 = measure(point2, est2)
        if verdict(m2, target) != "miss":
            return Decision("hash", point2, f"calibrated again on the queries: {reason2}",
                            replace(m2, action="recalibrated", checks=checks,
                                    note=f"the first point measured {m.value:.3f} below the "
                                         f"target {target:g}; calibrated again on the queries"))
        checks.append(replace(m2, action="superseded").to_json())
        m = m2
    elif verdict(m, target) == "low":
        return Decision(mode, point, "", replace(
            m, note=f"mean below the target {target:g}, interval holding it; the point, "
                    "already calibrated on these queries, stands"))
    return Decision("scan", None,
                    f"measured recall {m.value:.3f} [{m.low:.3f}, {m.high:.3f}] below the "
                    f"target {target:g}: answered by the exact scan",
                    exact(n_queries, k, target, m.estimate, checks=checks,
                          note=f"the hashed point measured {m.value:.3f} [{m.low:.3f}, "
                               f"{m.high:.3f}], below the target {target:g}: answered by "
                               "the exact scan instead"))
