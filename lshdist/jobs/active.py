"""``lshdist active``: pool-based active learning with hashed hyperplane queries (one process).

Learning curves, selection time, the margins of the selected points and the fraction of the
pool scanned, per method (`lshdist.active`), written to OUT: ``summary.json``,
``learning_curves.png`` and ``selection.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from lshdist.config import ActiveConfig, add_options, from_args
from lshdist.errors import InputError

log = logging.getLogger(__name__)
FORMAT = "lshdist-active"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "active", help="active learning with hashed hyperplane queries (one process)",
        description="One binary linear SVM per class (one-vs-all) from a few labelled pool "
                    "points; each round selects the unlabelled pool point nearest its "
                    "hyperplane (H-Hash, EH-Hash, exhaustively, or at random), reveals its "
                    "label and retrains.")
    p.add_argument("--pool", required=True, metavar="DATASET",
                   help="the unlabelled pool (its labels are the oracle)")
    p.add_argument("--test", required=True, metavar="DATASET", help="labelled test rows")
    p.add_argument("--out", required=True, metavar="DIR", help="the output directory")
    add_options(p, ActiveConfig, title="active learning")
    p.set_defaults(func=run)
    return p


def _load(path: str, what: str) -> tuple[Any, Any]:
    from lshdist.store.dataset import Dataset

    ds = Dataset(path)
    y = ds.labels()
    if y is None:
        raise InputError(f"{what} dataset {path!r} has no labels; active learning needs them "
                         "(the pool's act as the oracle)")
    return ds.read_rows(0, ds.n), y


def run(args: argparse.Namespace) -> int:
    from lshdist.active import plot, run_active, summarize
    from lshdist.store.atomic import atomic_dir

    cfg = from_args(ActiveConfig, args)
    pool, y_pool = _load(args.pool, "pool")
    test, y_test = _load(args.test, "test")
    with atomic_dir(args.out, inputs=(args.pool, args.test)) as tmp:
        result = run_active(pool, y_pool, test, y_test, settings=cfg, progress=log.info)
        summary = {"format": FORMAT, "settings": {k: getattr(cfg, k) for k in (
            "methods", "rounds", "runs", "initial", "bits", "search", "candidates", "permutations",
            "window", "eh_samples", "C", "class_weight", "classes", "eval_every", "center",
            "seed")},
            **summarize(result)}
        summary["plots"] = plot(summary, tmp)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2))
    for m, v in summary["methods"].items():
        sys.stdout.write(f"{m:>10}: AUROC +{v['final_auroc_improvement']:.4f} "
                         f"± {v['final_auroc_improvement_std']:.4f}, accuracy "
                         f"{v['final_accuracy']:.4f}, selection "
                         f"{1e3 * v['selection_seconds_per_round']:.2f} ms/round, margin "
                         f"{v['selected_margin_mean']:.4f}, scanned "
                         f"{100 * v['fraction_scanned']:.1f}%\n")
    return 0
