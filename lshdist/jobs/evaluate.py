"""``lshdist evaluate``: the paper's four settings on a train/test split, with plots."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from lshdist.config import IndexConfig, LearnConfig, add_options, from_args
from lshdist.errors import InputError
from lshdist.jobs.common import int_list, positive_int
from lshdist.jobs.learn import learn, validation_line
from lshdist.store.atomic import atomic_dir, check_output
from lshdist.store.objects import require_local

log = logging.getLogger(__name__)
KIND = "lshdist-evaluation"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "evaluate", help="L2/ML x scan/hash: k-NN accuracy, recall, %% searched, speed-up",
        description="Learn a metric on TRAIN (or load --model), index TRAIN, query with TEST, "
                    "and write DIR/summary.json plus PNG plots.")
    p.add_argument("--train", required=True, metavar="DATASET", help="labelled database")
    p.add_argument("--test", required=True, metavar="DATASET", help="labelled queries")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--model", metavar="MODEL", help="a learned model (default: learn one)")
    add_options(p, IndexConfig, title="hashing and search",
                skip=("segment_rows", "baseline", "k"))
    p.add_argument("--k", type=int_list, default=[1, 4], metavar="K[,K...]",
                   help="k of the k-NN accuracies (default 1,4)")
    p.add_argument("--recall-k", type=positive_int, metavar="K",
                   help="recall@K (default: each k)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="threads of the one-process search (default 1)")
    p.add_argument("--sweep-bits", type=int_list, default=[16, 32, 64, 128, 256], metavar="B,..",
                   help="b values of the accuracy/cost plot, each calibrated for the target "
                        "(default 16,32,64,128,256)")
    p.add_argument("--no-plots", action="store_true", help="skip the sweeps and plots")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing evaluation at DIR (only an lshdist evaluation)")
    add_options(p, LearnConfig, title="metric learning (ITML), when no --model is given",
                skip=("seed",))
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from lshdist.evaluation import HashSettings, baseline_metric, evaluate
    from lshdist.plots import write_plots
    from lshdist.store.dataset import Dataset
    from lshdist.store.embedded import open_data
    from lshdist.store.model import load_model
    from lshdist.tradeoff import measure_tradeoff

    index_cfg, learn_cfg = from_args(IndexConfig, args), from_args(LearnConfig, args)
    require_local(args.out, "evaluate --out (a report with plots)")
    check_output(args.out, args.overwrite, kind=KIND, inputs=(args.train, args.test, args.model))
    train, test = Dataset(args.train), Dataset(args.test)
    if train.kind != test.kind:
        raise InputError(f"train is {train.kind} but test is {test.kind}; ingest both alike")
    if train.kind == "dense" and train.d != test.d:
        raise InputError(f"test has {test.d} features, train has {train.d}")
    y_train, y_test = train.labels(), test.labels()
    if y_train is None or y_test is None:
        raise InputError("evaluate needs labelled train and test datasets")
    if train.classes != test.classes:
        raise InputError("train and test have different class lists; ingest them with the "
                         "same labels")
    if args.model:
        ml, meta = load_model(args.model)
        learn_info = {"model": args.model, **meta.get("params", {})}
    else:
        ml, learn_info, _ = learn(train, learn_cfg)
    # a model over sets of local features reads the point sets through its embedding
    train, test = open_data(args.train, ml.embedding), open_data(args.test, ml.embedding)
    X_train, X_test = train.read_all(), test.read_all()
    l2 = baseline_metric(ml, X_train)
    bits = index_cfg.key_bits(ml.kind == "explicit")
    settings = HashSettings(bits=bits, epsilon=index_cfg.epsilon,
                            n_permutations=index_cfg.permutations, window=index_cfg.window,
                            hamming_keep=index_cfg.hamming_keep, seed=index_cfg.seed,
                            n_threads=args.threads, target_recall=index_cfg.target_recall,
                            calibration_queries=None if index_cfg.calibration_queries is None
                            else open_data(index_cfg.calibration_queries,
                                           ml.embedding).read_all())
    n_classes = len(train.classes) if train.classes else None
    records = evaluate(X_train, y_train, X_test, y_test, l2_metric=l2, ml_metric=ml, ks=args.k,
                       settings=settings, n_classes=n_classes, recall_k=args.recall_k)
    with atomic_dir(args.out, overwrite=args.overwrite, kind=KIND,
                    inputs=(args.train, args.test, args.model)) as tmp:
        (tmp / ".lshdist.json").write_text(json.dumps({"format": KIND}))
        (tmp / "summary.json").write_text(json.dumps(records, indent=2))
        (tmp / "learning.json").write_text(json.dumps(learn_info, indent=2, default=str))
        if not args.no_plots:
            data = measure_tradeoff(  # the trade-off curves and the b sweep, measured
                X_train, y_train, X_test, y_test, metrics=(("L2", l2, False), ("ML", ml, True)),
                bits=bits, bits_values=args.sweep_bits, k=min(args.k),
                target=index_cfg.target_recall, recall_k=args.recall_k or 10,
                seed=settings.seed, n_classes=n_classes, n_threads=args.threads)
            (tmp / "tradeoff.json").write_text(json.dumps(data, indent=2))
            write_plots(data, tmp)
    _print_table(records)
    print(validation_line(learn_info))
    return 0


def _print_table(records: list[dict[str, Any]]) -> None:
    print(f"{'setting':<8} {'k':>3} {'accuracy':>9} {'recall':>7} {'%searched':>10} "
          f"{'speedup':>8} {'seconds':>8}  operating point")
    for r in records:
        point = ""
        if r["setting"].endswith("hash"):
            point = (f"  M={r['permutations']} W={r['window']} H={r['hamming_keep']}; "
                     f"auto: {r['auto_mode']}")
        print(f"{r['setting']:<8} {r['k']:>3} {100 * r['knn_accuracy']:>8.2f}% "
              f"{r['recall_at_k']:>7.3f} {100 * r['fraction_searched']:>9.2f}% "
              f"{r['speedup']:>8.2f} {r['seconds']:>8.2f}{point}")
    shown = set()
    for r in records:
        if r["setting"].endswith("hash") and r.get("calibration") and r["setting"] not in shown:
            shown.add(r["setting"])
            print(f"{r['setting'][:2]} calibration on {r['calibrated_on']} "
                  f"({r['calibration_seconds']:.1f}s): "
                  f"{r['auto_mode']} — {r['calibration']}")
