"""``lshdist learn``: ITML on the driver, the model written to disk (model.json + Zarr)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from lshdist.config import LearnConfig, add_options, from_args
from lshdist.errors import InputError
from lshdist.limits import available_cores
from lshdist.store.atomic import check_output

if TYPE_CHECKING:  # the rest is imported where it runs: `lshdist --help` stays light
    from lshdist.blocks import Block
    from lshdist.embed.model import SetEmbedding
    from lshdist.metric.itml import ITML, KernelITML
    from lshdist.store.dataset import Dataset

log = logging.getLogger(__name__)


def learner_from_config(cfg: LearnConfig, *, sparse: bool) -> tuple[ITML | KernelITML,
                                                                     dict[str, Any]]:
    """The estimator and its parameters as recorded in model.json."""
    from lshdist.metric.itml import ITML, KernelITML

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
    """Choose and fit the metric on a dataset (`lshdist.metric.selection`); returns
    ``(metric, params, seconds)``.  Reads at most ``cfg.sample`` rows, shard by shard."""
    import numpy as np

    from lshdist.blocks import SparseBlock
    from lshdist.index.payload import checked_centred_norms
    from lshdist.metric.selection import replace_params, sample_rows_stratified, select_metric
    from lshdist.store.dataset import HASHED_D

    y_all = data.labels()
    if y_all is None:
        raise InputError(f"dataset {str(data.path)!r} has no labels; ITML draws its "
                         "constraints from labels (ingest with labels)")
    rows = sample_rows_stratified(y_all, cfg.sample, cfg.seed)
    embedding = set_embedding(data, cfg)
    d = data.d
    if embedding is not None:
        sets = data.read_set_rows(rows)
        E = embedding.fit_transform(sets)
        d = HASHED_D
        log.info("embedded %d sets (%d points) with the %s kernel: %d unary entries",
                 len(sets), len(sets.values), cfg.kernel, E.nnz)
        X: Block = E
    else:
        X = data.read_row_set(rows, threads=available_cores())
        if not isinstance(X, SparseBlock):  # before ITML, not where the first scan runs
            checked_centred_norms(np.ascontiguousarray(X, np.float32), data.ids()[rows])
    y = y_all[rows]
    if len(rows) < data.n:
        log.info("learning from a stratified sample of %d of %d rows", len(rows), data.n)
    est, params = learner_from_config(cfg, sparse=isinstance(X, SparseBlock))
    t0 = time.perf_counter()
    metric, fitted, sel = select_metric(
        lambda changes: replace_params(est, changes), params["kind"], X, y, d=d,
        ks=[cfg.validation_k], validation=cfg.validation, budget=cfg.budget,
        force_learned=cfg.force_learned, search=not cfg.no_search, seed=cfg.seed,
        n_classes=int(y_all.max()) + 1, n_threads=cfg.grid_threads or available_cores())
    secs = time.perf_counter() - t0
    metric.embedding = embedding
    chosen = next(t.changes for t in sel.trials if t.name == sel.setting)
    params.update(chosen)
    if fitted is not None:
        params.update(n_iter=int(fitted.n_iter_), conv=float(fitted.conv_),
                      bounds=list(fitted.bounds_), n_pairs=len(fitted.pairs_))
    params.update(selected=sel.selected, selection=sel.to_json(), sample_rows=len(rows),
                  seconds=round(secs, 3))
    return metric, params, secs


def set_embedding(data: Dataset, cfg: LearnConfig) -> SetEmbedding | None:
    """The (unfitted) set embedding ``cfg`` asks for, checked against the dataset's kind."""
    from lshdist.embed.model import SetEmbedding

    if data.kind != "pointsets":
        if cfg.kernel is not None:
            raise InputError(f"--kernel {cfg.kernel} is a kernel over sets of local features, "
                             f"but dataset {str(data.path)!r} holds {data.kind} vectors; ingest "
                             "images with --features to get point sets")
        return None
    if cfg.kernel is None:
        raise InputError(f"dataset {str(data.path)!r} holds sets of local features: choose the "
                         "set kernel to learn over with --kernel pmk or --kernel pdk")
    if cfg.kind == "explicit":
        raise InputError("a set kernel needs --kind implicit (the sets' embedding has hashed "
                         "64-bit coordinates: no d x d matrix exists)")
    if cfg.kernel == "pdk" and not data.has_coords:
        raise InputError(f"dataset {str(data.path)!r} has no image coordinates, which the PDK "
                         "needs; ingest the images with --features (coordinates are kept)")
    return SetEmbedding(cfg.kernel, levels=cfg.levels, finest_side=cfg.finest_side,
                        words=cfg.codebook, neighbors=cfg.spatial_neighbors, spatial=cfg.spatial,
                        pca=cfg.pca,
                        normalize=not cfg.unnormalized, seed=cfg.seed)


def validation_line(params: dict[str, Any]) -> str:
    """One line: which metric was kept and the held-out accuracies behind the choice."""
    sel = params.get("selection")
    if not isinstance(sel, dict):
        return "validation: none recorded (a model from an older lshdist, or given by --model)"
    acc = ", ".join(f"{k}-NN prior {100 * p:.2f}% / learned "
                    f"{100 * sel['learned_accuracy'][k]:.2f}%"
                    for k, p in sel["prior_accuracy"].items())
    which = (f"learned ({sel['setting']})" if sel["selected"] == "learned"
             else f"prior (best learned setting: {sel['setting']})")
    return f"validation ({sel['n_validation']} held-out rows): {acc}; selected {which}"


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
    from lshdist.store.dataset import Dataset
    from lshdist.store.model import save_model

    cfg = from_args(LearnConfig, args)
    check_output(args.out, args.overwrite, kind="lshdist-model", inputs=(args.data,))
    data = Dataset(args.data)
    metric, params, secs = learn(data, cfg)
    checksum = save_model(args.out, metric, params=params, seed=cfg.seed,
                          overwrite=args.overwrite)
    sel = params["selection"]
    what = (f"learned a {params['kind']} metric ({sel['setting']}, {params['n_pairs']} pairs, "
            f"{params['n_iter']} passes)" if params["selected"] == "learned"
            else f"kept the {params['kind']} prior (no learned metric helps)")
    sys.stdout.write(f"{what} from {params['sample_rows']} of {data.n} rows in {secs:.1f}s; "
                     f"held-out 1-NN: prior {100 * sel['prior_accuracy']['1']:.2f}%, learned "
                     f"{100 * sel['learned_accuracy']['1']:.2f}% -> {args.out} "
                     f"(checksum {checksum[:12]})\n")
    return 0
