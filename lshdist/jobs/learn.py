"""``lshdist learn``: ITML on the driver, the model written to disk (model.json + Zarr)."""

from __future__ import annotations

import argparse
import logging
import time

from lshdist.blocks import SparseBlock
from lshdist.errors import InputError
from lshdist.jobs.common import add_learner_options
from lshdist.metric.itml import ITML, KernelITML
from lshdist.store.atomic import check_output
from lshdist.store.dataset import Dataset
from lshdist.store.model import save_model

log = logging.getLogger(__name__)


def learner_from_args(args: argparse.Namespace, *, sparse: bool):
    """The estimator and its parameters as recorded in model.json."""
    kind = args.kind or ("implicit" if sparse else "explicit")
    if sparse and kind == "explicit":
        raise InputError("sparse data needs --kind implicit (an explicit d x d matrix over "
                         "hashed 64-bit features cannot exist)")
    common = dict(gamma=args.gamma, tol=args.tol, constraints=args.strategy,
                  n_neighbors=args.neighbors, percentiles=args.percentiles, seed=args.seed)
    if args.constraints:
        common["n_constraints"] = args.constraints
    if args.max_iter:
        common["max_iter"] = args.max_iter
    if kind == "explicit":
        est = ITML(prior=args.prior, **common)
    else:
        est = KernelITML(n_basis=args.basis, route=args.route, **common)
    params = {k: v for k, v in vars(est).items() if not k.endswith("_") and k != "basis"}
    params["kind"] = kind
    return est, params


def learn(data: Dataset, args: argparse.Namespace):
    """Fit the metric on a dataset; returns ``(metric, params, seconds)``."""
    y = data.labels()
    if y is None:
        raise InputError(f"dataset {str(data.path)!r} has no labels; ITML draws its "
                         "constraints from labels (ingest with labels)")
    X = data.read_all()
    est, params = learner_from_args(args, sparse=isinstance(X, SparseBlock))
    t0 = time.perf_counter()
    est.fit(X, y)
    secs = time.perf_counter() - t0
    params.update(n_iter=int(est.n_iter_), conv=float(est.conv_), bounds=list(est.bounds_),
                  n_pairs=int(len(est.pairs_)), seconds=round(secs, 3))
    return est.metric(d=data.d) if params["kind"] == "implicit" else est.metric(), params, secs


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("learn", help="learn a Mahalanobis metric with ITML",
                              description="Learn a metric from a labelled dataset; write MODEL.")
    p.add_argument("--data", required=True, metavar="DATASET", help="labelled dataset")
    p.add_argument("--out", required=True, metavar="MODEL", help="model directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing model")
    add_learner_options(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    check_output(args.out, args.overwrite)
    data = Dataset(args.data)
    metric, params, secs = learn(data, args)
    checksum = save_model(args.out, metric, params=params, seed=args.seed, overwrite=args.overwrite)
    print(f"learned a {params['kind']} metric on {data.n} points ({params['n_pairs']} pairs, "
          f"{params['n_iter']} passes, {secs:.1f}s) -> {args.out} (checksum {checksum[:12]})")
    return 0
