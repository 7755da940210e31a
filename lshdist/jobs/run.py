"""``lshdist run CONFIG``: ingest (if needed) -> learn -> index -> query -> evaluate, from YAML.

A config (see ``configs/``)::

    name: letter
    workdir: out/letter                  # datasets, model, index and results go here
    cluster: {workers: 2}                # or {scheduler: tcp://HOST:PORT}
    data:
      train: {inputs: [${LSHDIST_DATA_DIR}/letter/letter-recognition.data], format: letter,
              rows: [0, 16000]}
      test:  {inputs: [...], format: letter, rows: [16000, 20000]}
                                         # or {builtin: digits} for scikit-learn's digits
    learn: {kind: explicit, constraints: 10000}          # any `lshdist learn` option
    index: {bits: 64, permutations: 40, window: 4, segment_rows: 4000}
    query: {k: 10, query_chunk: 2000}
    evaluate: {ks: [1, 4], recall_k: 10, plots: true}
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import yaml

from lshdist.cluster.client import dask_client
from lshdist.cluster.pipeline import build_index, query_index
from lshdist.errors import InputError
from lshdist.evaluation import knn_predict
from lshdist.jobs.common import add_learner_options
from lshdist.store.dataset import Dataset, write_dataset
from lshdist.store.model import save_model
from lshdist.store.results import iter_parts

log = logging.getLogger(__name__)
_SECTIONS = {"name", "workdir", "cluster", "data", "learn", "index", "query", "evaluate"}


def load_config(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"config {path!r} does not exist")
    try:
        cfg = yaml.safe_load(os.path.expandvars(p.read_text()))
    except yaml.YAMLError as exc:
        raise InputError(f"config {path!r} is not valid YAML: {exc}") from None
    if not isinstance(cfg, dict):
        raise InputError(f"config {path!r} must be a mapping of sections")
    unknown = set(cfg) - _SECTIONS
    if unknown:
        raise InputError(f"config {path!r}: unknown sections {sorted(unknown)}; "
                         f"known: {sorted(_SECTIONS)}")
    for key in ("workdir", "data"):
        if key not in cfg:
            raise InputError(f"config {path!r} needs a {key!r} section")
    for split in ("train", "test"):
        if split not in cfg["data"]:
            raise InputError(f"config {path!r}: data needs {split!r}")
    if "${" in json.dumps(cfg["data"]):
        raise InputError(f"config {path!r} uses an unset environment variable in data "
                         "(is LSHDIST_DATA_DIR set? `make demo` sets it)")
    return cfg


def ingest_split(spec: dict, out: Path, idf_from: Path | None) -> Dataset:
    if out.exists():
        return Dataset(out)
    if spec.get("builtin") == "digits":
        from lshdist.datasets import load_digits

        s = load_digits()
        X, y = (s.X_train, s.y_train) if out.name == "train" else (s.X_test, s.y_test)
        return write_dataset(out, X, y, classes=s.classes, shard_rows=spec.get("shard_rows", 500))
    from lshdist.store.inputs import read_inputs

    data = read_inputs(spec["inputs"], format=spec.get("format"),
                       idf_from=idf_from if spec.get("text") else None)
    if "rows" in spec:
        data = data.rows(*spec["rows"])
    return data.write(out, shard_rows=spec.get("shard_rows", 10_000))


def _learn_args(opts: dict) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_learner_options(p)
    args = p.parse_args([])
    for key, value in opts.items():
        if not hasattr(args, key):
            raise InputError(f"learn: unknown option {key!r}")
        setattr(args, key, value)
    return args


def evaluate_results(results: Path, train: Dataset, test: Dataset, k: int, ks, truth=None):
    """k-NN accuracy, recall against ``truth`` (another result dir), mean candidates."""
    ytr, yte = train.labels(), test.labels()
    tr_ids, te_ids = train.ids(), test.ids()
    n_classes = len(train.classes)
    correct = {kk: 0 for kk in ks}
    hits, n, cand = 0, 0, 0.0
    truth_parts = iter_parts(truth, k) if truth else None
    for qids, nb, _, c in iter_parts(results, k):
        lab = np.where(nb >= 0, ytr[np.searchsorted(tr_ids, np.maximum(nb, 0))], -1)
        true = yte[np.searchsorted(te_ids, qids)]
        for kk in ks:
            correct[kk] += int((knn_predict(lab, kk, n_classes) == true).sum())
        if truth_parts is not None:
            tq, tnb, _, _ = next(truth_parts)
            hits += sum(len(np.intersect1d(a[a >= 0], b)) for a, b in zip(nb, tnb))
        n += len(qids)
        cand += float(c.sum())
    return {"knn_accuracy": {kk: correct[kk] / n for kk in ks},
            "recall_at_k": hits / (n * k) if truth else 1.0,
            "fraction_searched": cand / n / train.n}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("run", help="the whole pipeline from one YAML config",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("config", metavar="CONFIG")
    p.add_argument("--fresh", action="store_true",
                   help="redo every stage (default: reuse datasets and model in workdir)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    work = Path(cfg["workdir"])
    if args.fresh and work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t = time.perf_counter()
    train = ingest_split(cfg["data"]["train"], work / "train", None)
    test = ingest_split(cfg["data"]["test"], work / "test", work / "train")
    times["ingest"] = time.perf_counter() - t
    model = work / "model"
    t = time.perf_counter()
    if not model.exists():
        from lshdist.jobs.learn import learn

        metric, params, _ = learn(train, _learn_args(cfg.get("learn", {})))
        save_model(model, metric, params=params, seed=params.get("seed", 0))
    times["learn"] = time.perf_counter() - t
    icfg = {"bits": 256, "window": 8, "segment_rows": 100_000, **cfg.get("index", {})}
    qcfg = {"k": 10, "query_chunk": 5_000, **cfg.get("query", {})}
    ecfg = {"ks": [1, 4], "plots": False, **cfg.get("evaluate", {})}
    cl = {"workers": 2, **cfg.get("cluster", {})}
    with dask_client(cl.get("scheduler"), workers=cl["workers"]) as client:
        t = time.perf_counter()
        build_index(client, data=str(train.path), model=str(model), out=str(work / "index"),
                    overwrite=True, **icfg)
        times["index"] = time.perf_counter() - t
        for mode in ("hash", "scan"):
            t = time.perf_counter()
            query_index(client, index=str(work / "index"), queries=str(test.path), k=qcfg["k"],
                        out=str(work / f"results-{mode}"), mode=mode,
                        query_chunk=qcfg["query_chunk"], overwrite=True)
            times[f"query-{mode}"] = time.perf_counter() - t
    t = time.perf_counter()
    ks = [kk for kk in ecfg["ks"] if kk <= qcfg["k"]]
    scan = evaluate_results(work / "results-scan", train, test, qcfg["k"], ks)
    hashed = evaluate_results(work / "results-hash", train, test, qcfg["k"], ks,
                              truth=work / "results-scan")
    times["evaluate"] = time.perf_counter() - t
    report = {"name": cfg.get("name"), "scan": scan, "hash": hashed,
              "seconds": {k: round(v, 3) for k, v in times.items()},
              "speedup_query": times["query-scan"] / times["query-hash"]}
    (work / "report.json").write_text(json.dumps(report, indent=2))
    if ecfg["plots"]:
        _plots(train, test, model, icfg, ecfg, work)
    print(f"{cfg.get('name', '')}: {train.n} database x {test.n} queries, k={qcfg['k']}")
    print(f"{'mode':<6} " + " ".join(f"{f'{kk}-NN acc':>10}" for kk in ks)
          + f" {'recall@' + str(qcfg['k']):>10} {'%searched':>10} {'seconds':>8}")
    for mode, r in (("scan", scan), ("hash", hashed)):
        print(f"{mode:<6} " + " ".join(f"{100 * r['knn_accuracy'][kk]:>9.2f}%" for kk in ks)
              + f" {r['recall_at_k']:>10.3f} {100 * r['fraction_searched']:>9.2f}%"
              + f" {times['query-' + mode]:>8.2f}")
    print("stage seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    return 0


def _plots(train, test, model, icfg, ecfg, work: Path) -> None:
    """The evaluation plots (accuracy / % searched vs b, recall vs % searched), one process."""
    from lshdist.evaluation import HashSettings, baseline_metric, sweep
    from lshdist.plots import plot_bits, plot_recall
    from lshdist.store.model import load_model

    ml, _ = load_model(model)
    Xtr, Xte = train.read_all(), test.read_all()
    l2 = baseline_metric(ml, Xtr)
    s = HashSettings(bits=icfg["bits"], n_permutations=icfg.get("permutations"),
                     epsilon=icfg.get("epsilon"), window=icfg["window"],
                     hamming_keep=icfg.get("hamming_keep", 0), seed=icfg.get("seed", 0))
    common = dict(l2_metric=l2, ml_metric=ml, settings=s, k=min(ecfg["ks"]),
                  recall_k=ecfg.get("recall_k", 10), n_classes=len(train.classes))
    yb = (train.labels(), test.labels())
    bits = sweep(Xtr, yb[0], Xte, yb[1], param="bits", values=[16, 32, 64, 128, 256], **common)
    wins = sweep(Xtr, yb[0], Xte, yb[1], param="window", values=[1, 2, 4, 8, 16], **common)
    plot_bits(bits, [], work / "accuracy_vs_bits.png")
    plot_recall(wins, work / "recall_vs_searched.png")
