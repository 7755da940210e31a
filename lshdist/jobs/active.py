"""``lshdist active``: pool-based active learning with hashed hyperplane queries, in one
process or (``--distributed``) with the pool hashed and searched on the cluster.

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

from lshdist.config import ActiveConfig, ClusterConfig, add_options, from_args
from lshdist.errors import InputError
from lshdist.jobs.common import add_cluster_options, client_from_config

log = logging.getLogger(__name__)
FORMAT = "lshdist-active"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "active", help="active learning with hashed hyperplane queries",
        description="One binary linear SVM per class (one-vs-all) from a few labelled pool "
                    "points; each round selects the unlabelled pool point nearest its "
                    "hyperplane (H-Hash, EH-Hash, exhaustively, or at random), reveals its "
                    "label and retrains.")
    p.add_argument("--pool", required=True, metavar="DATASET",
                   help="the unlabelled pool (its labels are the oracle)")
    p.add_argument("--test", required=True, metavar="DATASET", help="labelled test rows")
    p.add_argument("--out", required=True, metavar="DIR", help="the output directory")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT if it is the output of an earlier `lshdist active`")
    add_options(p, ActiveConfig, title="active learning")
    add_cluster_options(p)
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
    cfg = from_args(ActiveConfig, args)
    cluster = from_args(ClusterConfig, args)
    active_job(args.pool, args.test, args.out, cfg, cluster, overwrite=args.overwrite)
    return 0


def active_job(pool_path: str, test_path: str, out: Any, cfg: ActiveConfig,
               cluster: ClusterConfig, *, overwrite: bool = False) -> dict[str, Any]:
    """Run the active-learning experiment of ``cfg`` (`lshdist active`, and `lshdist run` with
    an ``active:`` section), write OUT (``summary.json`` and the plots, atomically) and report
    one line per method.  Returns the summary."""
    from lshdist.active import check_active, plot, run_active, summarize
    from lshdist.blocks import SparseBlock
    from lshdist.store.atomic import atomic_dir, check_output
    from lshdist.store.objects import require_local

    require_local(out, "active --out (curves and plots)")
    check_output(out, overwrite, kind=FORMAT, inputs=(pool_path, test_path))  # before any work
    test, y_test = _load(test_path, "test")
    with atomic_dir(out, overwrite=overwrite, kind=FORMAT, inputs=(pool_path, test_path)) as tmp:
        if cfg.distributed:
            result = _run_distributed(pool_path, cfg, cluster, test, y_test)
        else:
            pool, y_pool = _load(pool_path, "pool")
            check_active(y_pool, None if isinstance(pool, SparseBlock) else pool.shape[1], test,
                         cfg)
            result = run_active(pool, y_pool, test, y_test, settings=cfg, progress=log.info)
        summary = {"format": FORMAT, "settings": {k: getattr(cfg, k) for k in (
            "methods", "rounds", "runs", "initial", "bits", "search", "candidates", "permutations",
            "window", "eh_samples", "eh_terms", "C", "svm_scale", "class_weight", "classes",
            "eval_every", "center", "seed")}, "distributed": bool(cfg.distributed),
            **summarize(result)}
        if "bytes_per_pool_row" in result:
            summary["bytes_per_pool_row"] = result["bytes_per_pool_row"]
        summary["plots"] = plot(summary, tmp)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2))
    for m, v in summary["methods"].items():
        sys.stdout.write(f"{m:>10}: AUROC +{v['final_auroc_improvement']:.4f} "
                         f"± {v['final_auroc_improvement_std']:.4f}, accuracy "
                         f"{v['final_accuracy']:.4f}, selection "
                         f"{1e3 * v['selection_seconds_per_round']:.2f} ms/round (median "
                         f"{1e3 * v['selection_seconds_per_round_median']:.2f}), margin "
                         f"{v['selected_margin_mean']:.4f} (median "
                         f"{v['selected_margin_median']:.4f}), scanned "
                         f"{100 * v['fraction_scanned']:.1f}%"
                         + (f", SVM fits unconverged {100 * v['svm_unconverged']:.1f}%"
                            if v["svm_unconverged"] else "") + "\n")
    return summary


def _run_distributed(pool_path: str, cfg: ActiveConfig, cluster: ClusterConfig,
                     test: Any, y_test: Any) -> dict[str, Any]:
    """The pool checked on the driver (dense, ids = rows, labelled), then hashed and searched
    on the cluster; the driver reads only its labels."""
    from lshdist.active import DistributedPool, check_active, run_active
    from lshdist.cluster.active import check_pool
    from lshdist.store.dataset import Dataset

    y_pool = check_pool(pool_path)
    check_active(y_pool, Dataset(pool_path).d, test, cfg)
    with client_from_config(cluster) as client:
        dp = DistributedPool(client, pool_path, cfg)
        try:
            result = run_active(None, y_pool, test, y_test, settings=cfg, progress=log.info,
                                distributed=dp)
            if dp.pools:
                result["bytes_per_pool_row"] = next(iter(dp.pools.values())).nbytes_per_row()
        finally:
            dp.close()
    return result
