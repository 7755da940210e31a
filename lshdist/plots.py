"""PNG plots of the search's trade-off: recall against cost, and cost against b.

Drawn from `lshdist.tradeoff.measure_tradeoff`'s output (``evaluate``, ``run``) or from an
index's `Calibration` (``lshdist info INDEX --plot FILE``).  Each function returns the
matplotlib `Figure`; `save` writes it.  Data lines carry ``gid="series"`` and reference lines
(the scan, the target) ``gid="reference"``, so that `figure_problems` can check what a reader
would see: a series that does not vary along its axis, or two series drawn on top of each
other, without a note on the figure saying so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from lshdist.errors import InputError
from lshdist.index.calibrate import Calibration, Point

log = logging.getLogger(__name__)

#: one record of `lshdist.tradeoff.measure_tradeoff`
Record = dict[str, Any]

#: L2 and ML told apart by colour, marker and line: ML's hollow squares on a dashed line stay
#: visible where they lie on L2's dots
STYLE: dict[str, dict[str, Any]] = {
    "L2": {"color": "tab:blue", "marker": "o", "linestyle": "-", "markersize": 6},
    "ML": {"color": "tab:red", "marker": "s", "linestyle": "--", "markersize": 8,
           "markerfacecolor": "none", "markeredgewidth": 1.5},
}
SCAN_STYLE = {"L2": ":", "ML": "-."}
NOTE_GID = "note"  # a figure text that explains a coincidence or a constant series


def _plt() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (for plots drawn with pyplot elsewhere)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Figure, path: str | Path) -> None:
    """Write ``fig`` as a PNG; a problem `figure_problems` finds is logged as a warning."""
    for problem in figure_problems(fig):
        log.warning("%s: %s", Path(path).name, problem)
    fig.savefig(path, dpi=100)


def _series(ax: Axes, x: Sequence[float], y: Sequence[float], name: str,
            label: str, **style: Any) -> Line2D:
    line: Line2D = ax.plot(x, y, label=label, **{**STYLE.get(name, {}), **style})[0]
    line.set_gid("series")
    return line


def _log(ax: Axes, axis: str = "x") -> None:
    """A log axis (set once its data are drawn) labelled in plain numbers: at 1, 2 and 5
    times the powers of ten over less than two decades, 1 and 3 over less than four, else
    at the powers of ten."""
    which = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    span = np.log10(max(hi, 1e-300) / max(lo, 1e-300))
    subs = (1.0, 2.0, 5.0) if span < 2 else (1.0, 3.0) if span < 4 else (1.0,)
    which.set_major_locator(LogLocator(base=10, subs=subs))
    which.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.6g}"))
    which.set_minor_formatter(NullFormatter())


def _reference(line: Any) -> None:
    line.set_gid("reference")


def _note(fig: Figure, lines: list[str]) -> None:
    """Notes under the panels (what coincides, what cannot vary, and why)."""
    if lines:
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=9, va="bottom", ha="left",
                 gid=NOTE_GID, wrap=True)


def _axes_note(ax: Axes, text: str) -> None:
    """A note inside a panel (why a series of it does not vary)."""
    below = sum(t.get_gid() == NOTE_GID for t in ax.texts)
    ax.text(0.02, 0.02 + 0.07 * below, text, transform=ax.transAxes, fontsize=7,
            va="bottom", ha="left", gid=NOTE_GID, wrap=True)


def _finish(fig: Figure, notes: list[str]) -> Figure:
    _note(fig, notes)
    fig.tight_layout(rect=(0, 0.035 * (len(notes) + 0.5) if notes else 0, 1, 1))
    return fig


def _point_label(r: Record | Point | None) -> str:
    if r is None:
        return ""
    if isinstance(r, Point):
        return f"M={r.permutations} W={r.window} H={r.hamming_keep}"
    return f"M={r['permutations']} W={r['window']} H={r['hamming_keep']}"


def _coincide(a: Sequence[Record], b: Sequence[Record], keys: Sequence[str]) -> bool:
    return len(a) == len(b) and all(
        np.allclose([r[k] for r in a], [r[k] for r in b], rtol=1e-9, atol=0) for k in keys)


def _metric_notes(data: Record, names: Sequence[str], coincide: bool, what: str) -> list[str]:
    """What a reader must know to compare the two metrics' series: that they coincide (and
    why), or that the learned metric is the identity and only the hash functions differ."""
    if len(names) != 2:
        return []
    a, b = names
    identity = bool(data.get("identity", {}).get(b))
    if coincide:
        why = (f"the learned metric is the identity here (model selection kept the unlearned "
               f"prior), so {b} hashes and ranks exactly as {a}" if identity
               else "the two metrics find the same candidates here")
        return [f"{b} and {a} {what} coincide: {why}; {b} is drawn as hollow squares on a "
                f"dashed line over {a}'s dots."]
    if identity:
        return [f"The learned metric is the identity here (model selection kept the unlearned "
                f"prior): {b} ranks as {a} does and differs only by its own random hash "
                f"functions, so the gap between their {what} is the spread of the hashing, not "
                "a gain of the metric."]
    return []


def plot_tradeoff(data: Record, title: str = "") -> Figure:
    """Recall@k against the cost per query over the calibration grid's Pareto front, one
    point per measured operating point, L2 and ML: time per query, rows re-ranked (exact
    distances computed) and keys compared (Hamming distances).  The chosen point is a star,
    the exact scan's cost a vertical line, the recall target a horizontal one."""
    fig = Figure(figsize=(15, 5.2))
    axes = fig.subplots(1, 3, sharey=True)
    names = list(data["front"])
    N, rk = data["n_database"], data["recall_k"]
    xs = (("cpu_seconds_per_query", 1e3, "CPU time per query (ms; hashing the query "
                                         "included)"),
          ("reranked", 1.0, "rows re-ranked per query (exact distances computed)"),
          ("keys_compared", 1.0, "keys compared per query (Hamming distances)"))
    for ax, (key, scale, xlabel) in zip(axes, xs):
        for name in names:
            front = data["front"][name]
            _series(ax, [scale * r[key] for r in front], [r["recall"] for r in front], name,
                    f"{name} hash")
            chosen, mode = data["chosen"].get(name), data["mode"].get(name)
            if chosen is not None:
                why = "chosen" if mode == "hash" else "best timed; auto answers by the scan"
                ax.plot([scale * chosen[key]], [chosen["recall"]], marker="*", markersize=17,
                        color=STYLE.get(name, {}).get("color"), markeredgecolor="black",
                        linestyle="none", label=f"{name} {why}: {_point_label(chosen)}")
        if key == "cpu_seconds_per_query":
            for name in names:
                t = 1e3 * data["scan"][name][key]
                _reference(ax.axvline(t, color=STYLE.get(name, {}).get("color"),
                                      linestyle=SCAN_STYLE.get(name, "--"),
                                      label=f"{name} exact scan ({t:.3g} ms)"))
        elif key == "reranked":
            _reference(ax.axvline(N, color="black", linestyle=":",
                                  label=f"exact scan ({N:,} rows)"))
        else:
            ax.text(0.98, 0.04, f"the exact scan compares no keys:\nit computes all {N:,} "
                    "distances", transform=ax.transAxes, ha="right", va="bottom", fontsize=8)
        _reference(ax.axhline(data["target"], color="gray", linestyle=":", linewidth=1,
                              label=f"target recall {data['target']:g}"))
        _log(ax)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right" if key != "keys_compared" else "center right")
    axes[0].set_ylabel(f"recall@{rk} (share of the exact top {rk} found)")
    fig.suptitle(title or _title(data, "recall against cost: the calibration grid's Pareto "
                                       "front, each point searched again on the test queries"),
                 fontsize=10)
    notes = _metric_notes(data, names, len(names) == 2 and _coincide(
        data["front"][names[0]], data["front"][names[1]], ("recall", "reranked",
                                                            "keys_compared")), "curves")
    return _finish(fig, notes)


def _title(data: Record, what: str) -> str:
    name = f"{data['name']}: " if data.get("name") else ""
    return (f"{name}{what}\n{data['n_database']:,} database rows, {data['n_queries']:,} test "
            f"queries, b={data['bits']}, {_machine(data)}")


def _machine(data: Record) -> str:
    load = f", load average {data['load']:.1f}" if data.get("load") else ""
    return f"{data['threads']} search thread(s){load}"


def plot_bits(data: Record, title: str = "") -> Figure:
    """Accuracy and cost against b: every b calibrated for the same recall target on the
    test queries, its chosen point measured (k-NN accuracy, time, rows re-ranked, keys
    compared per query); the exact scan's accuracy and cost as lines."""
    fig = Figure(figsize=(15, 5.2))
    a1, a2, a3 = fig.subplots(1, 3)
    names = list(data["bits_sweep"])
    N, k, rk, target = data["n_database"], data["k"], data["recall_k"], data["target"]
    notes: list[str] = []
    for name in names:
        rs = [r for r in data["bits_sweep"][name] if r["point"] is not None]
        b = [r["bits"] for r in rs]
        pts = [r["point"] for r in rs]
        col = STYLE.get(name, {}).get("color")
        _series(a1, b, [100 * p["knn_accuracy"] for p in pts], name, f"{name} hash")
        for bb, p in zip(b, pts):
            a1.annotate(f"{p['recall']:.2f}", (bb, 100 * p["knn_accuracy"]), fontsize=7,
                        color=col, textcoords="offset points",
                        xytext=(4, -11 if name == names[-1] else 5))
        scan = data["scan"][name]
        _reference(a1.axhline(100 * scan["knn_accuracy"], color=col,
                              linestyle=SCAN_STYLE.get(name, "--"),
                              label=f"{name} exact scan {100 * scan['knn_accuracy']:.2f}%"))
        _series(a2, b, [1e3 * p["cpu_seconds_per_query"] for p in pts], name, f"{name} hash")
        _reference(a2.axhline(1e3 * scan["cpu_seconds_per_query"], color=col,
                              linestyle=SCAN_STYLE.get(name, "--"),
                              label=f"{name} exact scan"))
        _series(a3, b, [p["keys_compared"] for p in pts], name, f"{name} keys compared")
        rr = [p["reranked"] for p in pts]
        _series(a3, b, rr, name, f"{name} rows re-ranked", linestyle=":")
        acc = [100 * p["knn_accuracy"] for p in pts]
        if not _varies(np.asarray(acc)):  # the recall target holds the neighbours found
            _axes_note(a1, f"{name} hash: the same accuracy at several b — each b is held at "
                           f"recall {target:g}, so the neighbours found, and their votes, "
                           "hardly change")
        if not _varies(np.asarray(rr)):
            _axes_note(a3, f"{name} rows re-ranked: {rr[0]:g} at every b, the Hamming cut "
                           f"H={pts[0]['hamming_keep']}")
        for ax, ys in ((a1, [100 * p["knn_accuracy"] for p in pts]),
                       (a2, [1e3 * p["cpu_seconds_per_query"] for p in pts]),
                       (a3, [p["keys_compared"] for p in pts])):
            miss = [(bb, y) for bb, y, r in zip(b, ys, rs) if not r["reached"]]
            scans = [(bb, y) for bb, y, r in zip(b, ys, rs) if r["mode"] == "scan"]
            first = ax is a1  # the markers' legend once, in the first panel
            if miss:
                ax.plot(*zip(*miss), marker="X", markersize=11, color=col, linestyle="none",
                        label=f"{name}: no point reaches {target:g}" if first else "_")
            if scans:
                ax.plot(*zip(*scans), marker="o", markersize=15, markerfacecolor="none",
                        color="black", linestyle="none",
                        label=f"{name}: auto answers by the scan" if first else "_")
    _reference(a3.axhline(N, color="black", linestyle=":", linewidth=1,
                          label=f"exact scan: {N:,} distances"))
    lo, hi = a1.get_ylim()  # a few points wide at least: the target holds the recall, and
    mid = (lo + hi) / 2  # a 0.2-point wobble is noise, not a trend
    a1.set_ylim(min(lo, mid - 2), max(hi, mid + 2))
    a1.set_ylabel(f"{k}-NN accuracy (%)  [numbers: recall@{rk}]")
    a2.set_ylabel("CPU time per query (ms; hashing the query included)")
    a3.set_ylabel("keys compared (- / --) and rows re-ranked (:) per query")
    for ax in (a1, a2, a3):
        ax.set_xscale("log", base=2)
        bits = sorted({r["bits"] for n in names for r in data["bits_sweep"][n]})
        ax.set_xticks(bits, [str(x) for x in bits])
        ax.set_xlabel("bits per key b")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    _log(a2, "y")
    _log(a3, "y")
    notes += _metric_notes(data, names, len(names) == 2 and _coincide(
        [r["point"] or {} for r in data["bits_sweep"][names[0]]],
        [r["point"] or {} for r in data["bits_sweep"][names[1]]],
        ("recall", "reranked", "keys_compared", "knn_accuracy")), "points")
    fig.suptitle(title or _title(data, f"k-NN accuracy and cost against b: each b calibrated "
                                       f"for recall@{rk} >= {target:g} on the test queries, "
                                       "its chosen point searched again").replace(
                                           f", b={data['bits']}", ""), fontsize=10)
    return _finish(fig, notes)


def plot_calibration(cal: Calibration, title: str = "", name: str = "",
                     rows: int | None = None) -> Figure:
    """An index's calibration curve (``lshdist info INDEX --plot``): recall on the
    calibration sample against the cost per query of every (M, W, H) point tried (grey), the
    Pareto front (line), the chosen point (star) and the exact scan's cost.  Only the
    chosen (or best timed) point's time was measured; the others' is scaled from it by the
    operation count `Point.cost`, as ``query --target-recall`` estimates it.  ``name``
    starts the default title; ``rows``: the index's rows (default: the calibrated
    database's — of an index in several segments, one segment's, which is also what the
    time and the scan's time are of, while the rows re-ranked count every segment's)."""
    fig = Figure(figsize=(15, 5.2))
    axes = fig.subplots(1, 3, sharey=True)
    ref = cal.reference
    t_ref = None if ref is None else ref.seconds_per_query
    unit = None if t_ref is None or ref is None else t_ref / max(ref.cost(cal.width), 1.0)
    N = cal.n_database if rows is None else rows
    parts = max((p.parts for p in cal.points), default=1)
    one = f", one segment of {parts}" if parts > 1 else ""

    def entries(p: Point) -> float:
        return float(2 * p.permutations * p.window * p.parts)

    panels: list[tuple[str, Any]] = []
    if unit is not None:
        panels.append((f"time per query{one} (ms; estimated, see below)",
                       lambda p: 1e3 * unit * p.cost(cal.width)))
    panels += [("rows re-ranked per query (exact distances computed)", lambda p: p.reranked),
               ("list entries read per query (2 x M x W, every segment)", entries)]
    for ax, (xlabel, fx) in zip(axes, panels):
        ax.scatter([fx(p) for p in cal.points], [p.recall for p in cal.points], s=6,
                   color="0.75", label=f"every (M, W, H) tried ({len(cal.points)})")
        front = _front_by(cal.points, fx)
        _series(ax, [fx(p) for p in front], [p.recall for p in front], "",
                "Pareto front (no cheaper point on this axis has more recall)",
                color="tab:purple", marker="o", markersize=4)
        if ref is not None:
            why = "chosen" if cal.mode == "hash" else "best timed; auto answers by the scan"
            ax.plot([fx(ref)], [ref.recall], marker="*", markersize=17, color="tab:purple",
                    markeredgecolor="black", linestyle="none",
                    label=f"{why}: {_point_label(ref)}")
        _reference(ax.axhline(cal.target, color="gray", linestyle=":", linewidth=1,
                              label=f"target recall {cal.target:g}"))
        if xlabel.startswith("time"):
            t = 1e3 * cal.scan_seconds_per_query
            _reference(ax.axvline(t, color="black", linestyle=":",
                                  label=f"exact scan{' of that segment' if one else ''} "
                                        f"({t:.3g} ms)"))
        elif xlabel.startswith("rows"):
            _reference(ax.axvline(N, color="black", linestyle=":",
                                  label=f"exact scan ({N:,} rows)"))
        _log(ax)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes[0].set_ylabel(f"recall@{cal.k} on the calibration sample")
    answer = (f"hashed search at {_point_label(ref)}" if cal.mode == "hash"
              else "the exact scan")
    where = f" in {parts} segments" if parts > 1 else ""
    fig.suptitle(title or (f"{name + ': ' if name else ''}calibration curve: {N:,} database "
                           f"rows{where}, {cal.n_queries} sample queries, target "
                           f"recall@{cal.k} >= {cal.target:g}; chosen: {answer}"), fontsize=10)
    notes = [("Time per query: the star's was measured when the index was built; every other "
              "point's is scaled from it by its operation count (M, W and the rows re-ranked), "
              "as `lshdist query --target-recall` estimates it.") if unit is not None else
             "No point was timed (none reaches the target): time per query is not drawn."]
    return _finish(fig, notes)


def _front_by(points: Sequence[Point], cost: Any) -> list[Point]:
    """The points no point of lower or equal ``cost(p)`` beats or equals in recall."""
    front, top = [], -1.0
    for p in sorted(points, key=lambda p: (cost(p), -p.recall)):
        if p.recall > top:
            front.append(p)
            top = p.recall
    return front


def _distinct(v: np.ndarray) -> int:
    """Distinct values, to 4 significant digits (what a plot can tell apart)."""
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return 0
    return len({float(f"{x:.4g}") for x in v.tolist()})


def _varies(v: np.ndarray) -> bool:
    """At least half as many distinct values as points, and two (one point: nothing to
    vary)."""
    return len(v) < 2 or _distinct(v) >= max(2, (len(v) + 1) // 2)


def figure_problems(fig: Figure) -> list[str]:
    """What a reader could not see in ``fig``: a data series (``gid="series"``) of two or
    more points whose x or y takes fewer than half as many distinct values as it has points
    (at least two) — a line drawn as if it varied along an axis where it stays put — unless
    a note (a text of the figure or of its panel with ``gid`` `NOTE_GID`) names it by its
    label; or two series of one panel that lie on each other (same points to 0.1 %), unless
    a note says that the two (named by their labels' first words: the metrics) coincide."""
    notes = " ".join(t.get_text() for t in fig.texts if t.get_gid() == NOTE_GID)
    out: list[str] = []
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        lines = [ln for ln in ax.get_lines() if ln.get_gid() == "series"]
        where = f"panel {i + 1} ({ax.get_xlabel() or 'no x label'})"
        here = notes + " ".join(t.get_text() for t in ax.texts if t.get_gid() == NOTE_GID)
        for ln in lines:
            x = np.asarray(ln.get_xdata(), dtype=float)
            y = np.asarray(ln.get_ydata(), dtype=float)
            if len(x) < 2:
                continue
            for axis, v in (("x", x), ("y", y)):
                if not _varies(v) and str(ln.get_label()) not in here:
                    out.append(f"{where}: {ln.get_label()!r} takes {_distinct(v)} distinct "
                               f"{axis} values over {len(v)} points")
        for a in range(len(lines)):
            for b in range(a + 1, len(lines)):
                pa = np.column_stack([lines[a].get_xdata(), lines[a].get_ydata()]).astype(float)
                pb = np.column_stack([lines[b].get_xdata(), lines[b].get_ydata()]).astype(float)
                if pa.shape == pb.shape and np.allclose(pa, pb, rtol=1e-3, atol=0):
                    la, lb = lines[a].get_label(), lines[b].get_label()
                    if not (str(la).split()[0] in notes and str(lb).split()[0] in notes
                            and "coincide" in notes):
                        out.append(f"{where}: {la!r} and {lb!r} lie on each other")
    return out


#: the files `write_plots` writes
TRADEOFF_PNG = "recall_vs_cost.png"
BITS_PNG = "cost_vs_bits.png"


def write_plots(data: Record, out_dir: str | Path) -> list[str]:
    """`plot_tradeoff` and `plot_bits` of `lshdist.tradeoff.measure_tradeoff`'s ``data``
    into ``out_dir``; returns the file names."""
    save(plot_tradeoff(data), Path(out_dir) / TRADEOFF_PNG)
    save(plot_bits(data), Path(out_dir) / BITS_PNG)
    return [TRADEOFF_PNG, BITS_PNG]


def plot_index(path: str | Path, out: str | Path) -> None:
    """``lshdist info INDEX --plot FILE``: `plot_calibration` of the index at ``path``
    into ``out`` (.png, .svg or .pdf)."""
    from lshdist.store.index import PermutationManifest, read_index_manifest

    path, out = Path(path), Path(out)
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise InputError(f"--plot {str(out)!r}: give a file name ending in .png, .svg or .pdf")
    if not out.parent.is_dir():
        raise InputError(f"--plot {str(out)!r}: the directory {str(out.parent)!r} does not "
                         "exist")
    if not (path / "index.json").is_file():
        raise InputError(f"--plot draws an index's calibration curve; {str(path)!r} is not an "
                         "index")
    m = read_index_manifest(path)
    cal = m.calibration if isinstance(m, PermutationManifest) else None
    if cal is None or not cal.points:
        raise InputError(f"index {str(path)!r} has no calibration curve (a subspace index, or "
                         "one whose calibration tried no point): nothing to plot")
    save(plot_calibration(cal, name=f"index {path.name}", rows=m.rows), out)
