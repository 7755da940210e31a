"""``lshdist learn``: ITML on the driver, the model written to disk (model.json + Zarr)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from lshdist.blocks import SparseBlock
from lshdist.config import LearnConfig, add_options, from_args
from lshdist.errors import InputError
from lshdist.metric.itml import ITML, KernelITML
from lshdist.store.atomic import check_output
from lshdist.store.dataset import Dataset
from lshdist.store.model import save_model

log = logging.getLogger(__name__)


def learner_from_config(cfg: LearnConfig, *, sparse: bool) -> tuple[ITML | KernelITML,
                                                                     dict[str, Any]]:
    """The estimator and its parameters as recorded in model.json."""
    kind = cfg.kind or ("implicit" if sparse else "explicit")
    if sparse and kind == "explicit":
        raise InputError("sparse data needs --kind implicit (an explicit d x d matrix over "
                         "hashed 64-bit features cannot exist)")
    common: dict[str, Any] = dict(gamma=cfg.gamma, tol=cfg.tol, constraints=cfg.strategy,
                                  n_neighbors=cfg.neighbors, percentiles=cfg.percentiles,
                                  seed=cfg.seed)
    if cfg.constraints:
        common["n_constraints"] = cfg.constraints
    if cfg.max_iter:
        common["max_iter"] = cfg.max_iter
    est: ITML | KernelITML
    if kind == "explicit":
        est = ITML(prior=cfg.prior, **common)
    else:
        est = KernelITML(n_basis=cfg.basis, route=cfg.route, **common)
    params = {k: v for k, v in vars(est).items() if not k.endswith("_") and k != "basis"}
    params["kind"] = kind
    return est, params


def learn(data: Dataset, cfg: LearnConfig) -> tuple[Any, dict[str, Any], float]:
    """Fit the metric on a dataset; returns ``(metric, params, seconds)``."""
    y = data.labels()
    if y is None:
        raise InputError(f"dataset {str(data.path)!r} has no labels; ITML draws its "
                         "constraints from labels (ingest with labels)")
    X = data.read_all()
    est, params = learner_from_config(cfg, sparse=isinstance(X, SparseBlock))
    t0 = time.perf_counter()
    est.fit(X, y)
    secs = time.perf_counter() - t0
    params.update(n_iter=int(est.n_iter_), conv=float(est.conv_), bounds=list(est.bounds_),
                  n_pairs=len(est.pairs_), seconds=round(secs, 3))
    metric = est.metric(d=data.d) if isinstance(est, KernelITML) else est.metric()
    return metric, params, secs


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "learn", help="learn a Mahalanobis metric with ITML",
        description="Learn a metric from a labelled dataset; write MODEL.")
    p.add_argument("--data", required=True, metavar="DATASET", help="labelled dataset")
    p.add_argument("--out", required=True, metavar="MODEL", help="model directory to write")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing model at MODEL (only an lshdist model)")
    add_options(p, LearnConfig, title="metric learning (ITML)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    cfg = from_args(LearnConfig, args)
    check_output(args.out, args.overwrite, kind="lshdist-model", inputs=(args.data,))
    data = Dataset(args.data)
    metric, params, secs = learn(data, cfg)
    checksum = save_model(args.out, metric, params=params, seed=cfg.seed,
                          overwrite=args.overwrite)
    sys.stdout.write(f"learned a {params['kind']} metric on {data.n} points "
                     f"({params['n_pairs']} pairs, {params['n_iter']} passes, {secs:.1f}s) -> "
                     f"{args.out} (checksum {checksum[:12]})\n")
    return 0
