"""``lshdist info PATH``: what a dataset, a model or an index holds."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lshdist.errors import FormatError, InputError
from lshdist.store.objects import ObjectPath, as_path

if TYPE_CHECKING:
    from lshdist.store.manifest import PermutationManifest, SubspaceManifest

_MAX_CLASS_NAMES = 30


def describe_dataset(path: Path | ObjectPath) -> dict[str, Any]:
    from lshdist.store.dataset import FORMAT as DATASET_FORMAT
    from lshdist.store.dataset import Dataset

    ds = Dataset(path)
    info = {"format": f"{DATASET_FORMAT} v{ds.attrs['version']}", **ds.summary()}
    info["class_names"] = ds.classes
    if "text" in ds.attrs:
        info["text"] = ds.attrs["text"]
    if "source" in ds.attrs:
        info["source"] = ds.attrs["source"]
    return info


def describe_model(path: Path | ObjectPath) -> dict[str, Any]:
    from lshdist.store.model import read_model_meta

    meta = read_model_meta(path)
    params = dict(meta.get("params", {}))
    sel = params.pop("selection", None)
    out = {"format": f"{meta['format']} v{meta['version']}", "path": str(path),
           "kind": meta["kind"], "kernel": meta.get("kernel"), "d": meta["d"], "c": meta.get("c"),
           "seed": meta["seed"], "checksum": meta["checksum"], "params": params}
    if isinstance(sel, dict):
        def acc(a: dict[str, float]) -> str:
            return ", ".join(f"{k}-NN {100 * v:.2f}%" for k, v in a.items())

        out["selected"] = f"{sel['selected']} — {sel['reason']}"
        folds = sel.get("folds")
        how = (f"{folds} folds, the grid ranked on {sel.get('ranking_rows')} rows" if folds
               else f"grid fitted on the other {sel['n_train']}")
        out["validation"] = (f"held-out {sel['n_validation']} rows ({how}): prior "
                             f"{acc(sel['prior_accuracy'])}; learned "
                             f"'{sel['setting']}' {acc(sel['learned_accuracy'])}")
        out["selection_grid"] = [f"{t['name']:<14} {acc(t['accuracy'])}  ({t['seconds']:.1f}s)"
                                 for t in sel.get("trials", [])]
    return out


def describe_index(path: Path | ObjectPath) -> dict[str, Any]:
    from lshdist.store.index import (
        KindManifest,
        SubspaceManifest,
        list_orphans,
        read_index_manifest,
    )

    m = read_index_manifest(path)
    orphans = [str(p) for p in list_orphans(path)]
    if isinstance(m, SubspaceManifest):
        return _describe_subspace(path, m, orphans)
    if isinstance(m, KindManifest):  # a plug-in kind's index
        return {"format": f"{m.format} v{m.version}", "path": str(path), "rows": m.rows,
                "model": m.model, "model_checksum": m.model_checksum, "kind": m.kind,
                "method": m.method, "params": dict(m.params), "n_segments": len(m.segments),
                "segments": [f"{e.name} ({e.rows} rows)" for e in m.segments],
                "orphans": orphans or None}

    def known(v: Any) -> Any:
        return "?" if v is None else v

    segs = [f"{e.name} ({e.rows} rows, M={e.permutations}, from {known(e.source)}"
            f" rows {known(e.start)}:{known(e.stop)})" for e in m.segments]
    return {"format": f"{m.format} v{m.version}", "path": str(path), "rows": m.rows,
            "model": m.model, "model_checksum": m.model_checksum, "kind": m.kind,
            "bits": m.bits, "window": m.window, "hamming_keep": m.hamming_keep,
            "permutations": m.permutations,
            "learned_hash": m.learned, "n_segments": len(segs), "segments": segs,
            **_calibration(m),
            # a running build's segments, or a failed one's leftovers (`lshdist gc`)
            "orphans": orphans or None}


def _describe_subspace(path: Path | ObjectPath, m: SubspaceManifest, orphans: list[str]
                       ) -> dict[str, Any]:
    """A subspace index (`lshdist.store.subspace`): its parameters, rounds and groups."""
    rec = m.subspace
    rounds = [f"round {r.round}: {r.remaining} remaining, alpha {r.alpha:.4g}, "
              f"threshold {r.threshold:.4g}, captured {r.captured}" for r in rec.rounds]
    segs = [f"{e.name} (group {e.group}{', final' if e.final else ''}, {e.rows} "
            "rows)" for e in m.segments]
    return {"format": f"{m.format} v{m.version} (subspace v{rec.version})",
            "path": str(path), "rows": m.rows, "model": m.model,
            "model_checksum": m.model_checksum, "kind": m.kind, "method": "subspace",
            "rank": rec.rank, "bits": rec.bits, "eta": rec.eta, "alpha": rec.alpha,
            "krylov_iters": rec.krylov_iters, "n_probe": rec.n_probe,
            "n_candidates": rec.n_candidates, "rounds": rounds, "n_segments": len(segs),
            "segments": segs, "orphans": orphans or None}


def _calibration(m: PermutationManifest) -> dict[str, Any]:
    """The calibration's choice and its curve: the points no cheaper point beats in recall
    (the trade-off frontier, by `Point.cost`), as lines ``M W H recall %searched [ms/query]``."""
    from lshdist.tradeoff import pareto_front

    cal = m.calibration
    if cal is None:
        return {}
    frontier = pareto_front(cal.points, cal.width)
    curve = [f"M={p.permutations:<4} W={p.window:<3} H={p.hamming_keep:<5} recall "
             f"{p.recall:.3f}  searched {100 * p.fraction_searched:6.2f}%"
             + (f"  {1e3 * p.seconds_per_query:.3f} ms/query" if p.seconds_per_query else "")
             for p in frontier]
    return {"calibration": f"{cal.mode} at target recall@{cal.k} {cal.target:g}: {cal.reason} "
                           f"({cal.n_queries} sample queries on {cal.n_database} rows, "
                           f"{cal.seconds:.1f}s; scan {1e3 * cal.scan_seconds_per_query:.3f} "
                           "ms/query)",
            "calibration_curve": curve}


def describe_results(path: Path | ObjectPath) -> dict[str, Any]:
    """A results directory: its size, how its queries were answered and the recall the job
    measured on a sample of them (``measured_recall``) beside the calibration's estimate."""
    from lshdist.index.recall_check import MeasuredRecall
    from lshdist.store.results import read_meta

    meta = read_meta(path)
    info = meta.info
    op = info.get("operating_point")
    out: dict[str, Any] = {"format": "lshdist-results", "path": str(path), "k": meta.k,
                           "queries": meta.queries, "parts": len(meta.parts),
                           "mode": info.get("mode"),
                           "operating_point": None if not isinstance(op, dict) else
                           ", ".join(f"{key}={v}" for key, v in op.items()),
                           "reason": info.get("reason")}
    rec = info.get("measured_recall")
    if isinstance(rec, dict):
        m = MeasuredRecall.from_json(rec, where=f"{str(path)!r}: measured_recall")
        out["measured_recall"] = m.line()
    else:
        out["measured_recall"] = "not measured (--no-check-recall, or an older lshdist)"
    return out


def describers() -> dict[str, Callable[[Path | ObjectPath], dict[str, Any]]]:
    """Directory kinds by the ``format`` they declare (the store modules, imported here
    rather than with the module, keep `lshdist --help` light)."""
    from lshdist.store.dataset import FORMAT as DATASET_FORMAT
    from lshdist.store.index import FORMAT as INDEX_FORMAT
    from lshdist.store.model import FORMAT as MODEL_FORMAT
    from lshdist.store.results import FORMAT as RESULTS_FORMAT

    return {DATASET_FORMAT: describe_dataset, MODEL_FORMAT: describe_model,
            INDEX_FORMAT: describe_index, RESULTS_FORMAT: describe_results}


#: where each directory kind keeps its ``format``: Zarr group attributes or a JSON manifest
_MANIFESTS = ("zarr.json", "model.json", "index.json", "results.json")
_REDO = "write it again (a dataset with `lshdist ingest`)"


def directory_format(path: Path | ObjectPath) -> str | None:
    """The ``format`` a directory declares (None if it has a manifest without one)."""
    if not path.exists():
        raise InputError(f"{str(path)!r} does not exist")
    for name in _MANIFESTS:
        manifest = path / name
        if manifest.is_file():
            from lshdist.store.files import load_json

            try:  # bounded: a huge or deeply nested file is refused, not parsed
                meta = load_json(manifest, f"{str(path)!r}: {name}", _REDO, path)
            except OSError as exc:
                raise FormatError(f"{str(path)!r}: {name} is corrupted ({exc}); {_REDO}") from None
            if not isinstance(meta, dict):
                raise FormatError(
                    f"{str(path)!r}: {name} is corrupted (not a JSON object); {_REDO}"
                )
            attrs = meta.get("attributes", {}) if name == "zarr.json" else meta
            return attrs.get("format") if isinstance(attrs, dict) else None
    raise FormatError(
        f"{str(path)!r} is not an lshdist dataset, model, index or results directory (none of "
        f"{', '.join(_MANIFESTS)} found)"
    )


def describe(path: str | Path | ObjectPath) -> dict[str, Any]:
    from lshdist.store.dataset import Dataset

    path = as_path(path)
    fmt = directory_format(path)
    known = describers()
    if fmt not in known and (path / "zarr.json").is_file():
        Dataset(path)  # raises the dataset reader's own message for a foreign Zarr group
    if fmt not in known:
        raise FormatError(
            f"{str(path)!r} declares format {fmt!r}; lshdist info knows "
            f"{', '.join(sorted(known))}: was it written by another program?"
        )
    return known[fmt](path)


def _text(info: dict[str, Any]) -> str:
    rows = []
    for key, value in info.items():
        if key == "d" and value == 2**64:
            value = f"{value} (hashed 64-bit feature ids)"
        elif key == "class_names" and value is not None:
            shown = value[:_MAX_CLASS_NAMES]
            more = f" ... (+{len(value) - len(shown)})" if len(value) > len(shown) else ""
            value = " ".join(shown) + more
        elif isinstance(value, dict):
            value = json.dumps(value)
        elif isinstance(value, list):
            value = "\n".join(map(str, value))
        elif value is None:
            value = "-"
        rows.append((key, str(value)))
    width = max(len(k) for k, _ in rows)
    pad = "\n" + " " * (width + 2)
    return "\n".join(f"{k:<{width}}  {v.replace(chr(10), pad)}" for k, v in rows)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "info", help="describe a dataset, model or index")
    p.add_argument("path", metavar="PATH", help="a dataset, model or index directory")
    p.add_argument("--json", action="store_true",
                   help="print JSON instead of aligned text (default: text)")
    p.add_argument("--plot", metavar="FILE",
                   help="an index: draw its calibration curve (recall against cost) into FILE")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    info = describe(args.path)
    if args.plot:
        from lshdist.plots import plot_index

        plot_index(args.path, args.plot)
    print(json.dumps(info, indent=2) if args.json else _text(info))
    return 0
