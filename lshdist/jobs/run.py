"""``lshdist run CONFIG``: ingest (if needed) -> learn -> index -> query -> evaluate, from YAML
(or, with an ``active:`` section, ingest -> `lshdist active`; `configs/active-*.yaml`).

A config (see ``configs/``; every key is checked, see `lshdist.config`)::

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
                                         # (calibration_queries: default the test data)
    query: {k: 10, query_chunk: 2000}
    evaluate: {ks: [1, 4], recall_k: 10, plots: true}

The stages call the functions the subcommands call (`lshdist.jobs.learn.learn`,
`lshdist.cluster.pipeline`), with the same typed configuration.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lshdist.config import DataSpec, IndexConfig, QueryConfig, RunConfig, load_run_config
from lshdist.errors import InputError
from lshdist.jobs.common import client_from_config
from lshdist.jobs.learn import learn, validation_line
from lshdist.store.atomic import artefact_kind, atomic_write_text

if TYPE_CHECKING:  # the rest is imported where it runs: `lshdist --help` stays light
    from lshdist.store.dataset import Dataset

log = logging.getLogger(__name__)
WORKDIR_KIND = "lshdist-workdir"
WORKDIR_MARKER = ".lshdist.json"


def ingest_split(spec: DataSpec, out: Path, idf_from: Path | None) -> Dataset:
    """The dataset of one split, ingested into ``out`` unless it is already there."""
    from lshdist.store.dataset import Dataset, write_dataset

    if out.exists():
        return Dataset(out)
    if spec.builtin == "digits":
        from lshdist.datasets import load_digits

        s = load_digits()
        X, y = (s.X_train, s.y_train) if out.name == "train" else (s.X_test, s.y_test)
        return write_dataset(out, X, y, classes=s.classes, shard_rows=spec.shard_rows)
    from lshdist.inputs import read_inputs

    assert spec.inputs is not None  # DataSpec guarantees inputs or builtin
    data = read_inputs(list(spec.inputs), format=spec.format,
                       idf_from=idf_from if spec.text else None)
    if spec.rows is not None:
        data = data.rows(*spec.rows)
    return data.write(out, shard_rows=spec.shard_rows)


def evaluate_results(results: Path, train: Dataset, test: Dataset, ks: list[int],
                     truth: Path | None = None) -> dict[str, Any]:
    """k-NN accuracy, recall@k against ``truth`` (another results directory, same k) and the
    fraction of the database searched per query.  Rows are matched by id, never by order."""
    import numpy as np

    from lshdist.metric.knn import knn_predict
    from lshdist.store.results import read_results, rows_of

    ytr, yte = train.labels(), test.labels()
    if ytr is None or yte is None:
        raise InputError("run evaluates k-NN accuracy and needs labelled train and test data")
    te_ids = test.ids()
    qids, nb, _, cand = read_results(results, te_ids)
    k = nb.shape[1]
    lab = np.full(nb.shape, -1, np.int64)
    found = nb >= 0
    lab[found] = ytr[rows_of(train.ids(), nb[found], what=f"train dataset {str(train.path)!r}")]
    n_classes = len(train.classes or [])
    acc = {kk: float(np.mean(knn_predict(lab, kk, n_classes) == yte)) for kk in ks}
    recall = 1.0
    if truth is not None:
        _, tnb, _, _ = read_results(truth, te_ids)
        hits = sum(len(np.intersect1d(a[a >= 0], b[b >= 0])) for a, b in zip(nb, tnb))
        recall = hits / (len(qids) * k)
    return {"knn_accuracy": acc, "recall_at_k": recall,
            "fraction_searched": float(cand.mean()) / train.n}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "run", help="the whole pipeline from one YAML config",
        description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("config", metavar="CONFIG", help="a YAML job file (examples in configs/)")
    p.add_argument("--fresh", action="store_true",
                   help="redo every stage (default: reuse datasets and model in workdir); "
                        "clears workdir only if it is an lshdist workdir")
    p.set_defaults(func=run)
    return p


def run_index_config(cfg: RunConfig, test: Dataset) -> IndexConfig:
    """The index section of a run: the queries of the run are known before the index is
    built, so unless the config names calibration queries the calibration samples the test
    data (rows like the real queries by construction, not the database's own rows)."""
    if cfg.index.calibration_queries is not None:
        return cfg.index
    return replace(cfg.index, calibration_queries=str(test.path))


def prepare_workdir(work: Path, fresh: bool) -> None:
    """Create (or with ``fresh`` clear) the workdir; only a directory marked as an lshdist
    workdir, or an empty one, is ever used or cleared."""
    if work.exists():
        kind = artefact_kind(work) if work.is_dir() else None
        if kind != WORKDIR_KIND and (not work.is_dir() or any(work.iterdir())):
            raise InputError(f"workdir {str(work)!r} exists and is not an lshdist workdir "
                             f"(no {WORKDIR_MARKER}); choose an empty or new directory")
        if fresh and kind == WORKDIR_KIND:
            shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if artefact_kind(work) != WORKDIR_KIND:
        atomic_write_text(work / WORKDIR_MARKER, json.dumps({"format": WORKDIR_KIND}))


def run(args: argparse.Namespace) -> int:
    from lshdist.cluster.pipeline import (
        build_and_query,
        plan_build,
        plan_following_query,
        plan_query,
        run_query,
    )
    from lshdist.store.model import read_model_meta, save_model

    cfg = load_run_config(args.config)
    if cfg.active is not None:
        return run_active_config(cfg, args.fresh)
    if cfg.index.family is not None:
        raise InputError(f"{args.config}: index.family ({cfg.index.family}) builds an index for "
                         "hyperplane queries, which `lshdist run` does not evaluate; use "
                         "`lshdist index --family` and `lshdist query --hyperplanes`")
    if cfg.index.method != "permutation":
        raise InputError(f"{args.config}: index.method ({cfg.index.method}) is not evaluated by "
                         "`lshdist run`; use `lshdist index --method subspace` and "
                         "`lshdist query`")
    work = cfg.workdir
    prepare_workdir(work, args.fresh)
    times: dict[str, float] = {}
    t = time.perf_counter()
    train = ingest_split(cfg.train, work / "train", None)
    test = ingest_split(cfg.test, work / "test", work / "train")
    times["ingest"] = time.perf_counter() - t
    if train.labels() is None or test.labels() is None:
        raise InputError("run evaluates k-NN accuracy and needs labelled train and test data")
    model = work / "model"
    t = time.perf_counter()
    if not model.exists():
        metric, params, _ = learn(train, cfg.learn)
        save_model(model, metric, params=params, seed=cfg.learn.seed)
    times["learn"] = time.perf_counter() - t
    learned = read_model_meta(model).get("params", {})
    index = work / "index"
    build = plan_build(data=str(train.path), model=str(model), out=str(index),
                       cfg=run_index_config(cfg, test), overwrite=index.exists())
    searched = work / "results-search"
    search = plan_following_query(build, queries=str(test.path), out=str(searched),
                                  cfg=cfg.query, overwrite=searched.exists())
    with client_from_config(cfg.cluster) as client:
        held: list[Any] = []  # the segments just built stay in worker memory for the queries
        # the search as configured (default: auto), started once the build is calibrated
        ran: dict[str, str] = {}
        _, r, seconds = build_and_query(client, build, search,
                                        stall=cfg.cluster.stall_timeout, hold=held)
        ran["search"] = r["mode"]
        times.update({"index": seconds["index"], "query-search": seconds["query"],
                      "index-and-search": seconds["total"]})
        # then the exact scan, the ground truth
        out = work / "results-scan"
        q = plan_query(index=str(index), queries=str(test.path), out=str(out),
                       cfg=QueryConfig(k=cfg.query.k, mode="scan",
                                       query_chunk=cfg.query.query_chunk),
                       overwrite=out.exists())
        t = time.perf_counter()
        ran["scan"] = run_query(client, q, stall=cfg.cluster.stall_timeout,
                                segments=held)["mode"]
        times["query-scan"] = time.perf_counter() - t
        client.cancel(held)
    t = time.perf_counter()
    ks = [kk for kk in cfg.evaluate.ks if kk <= cfg.query.k]
    scan = evaluate_results(work / "results-scan", train, test, ks)
    found = evaluate_results(work / "results-search", train, test, ks,
                             truth=work / "results-scan")
    found["mode"] = ran["search"]
    found["operating_point"] = q_point(index)
    times["evaluate"] = time.perf_counter() - t
    report = {"name": cfg.name, "scan": scan, "search": found,
              "validation": learned.get("selection"),
              "seconds": {k: round(v, 3) for k, v in times.items()},
              "speedup_query": times["query-scan"] / times["query-search"]}
    atomic_write_text(work / "report.json", json.dumps(report, indent=2))
    if cfg.evaluate.plots:
        _plots(train, test, model, cfg, work)
    _print_report(cfg, train, test, ks, scan, found, times)
    sys.stdout.write(validation_line(learned) + "\n")
    return 0


def run_active_config(cfg: RunConfig, fresh: bool) -> int:
    """An ``active:`` run: the train split ingested as the pool (its labels the oracle), the
    test split as the test rows, then `lshdist active` into ``workdir/active``."""
    from lshdist.jobs.active import FORMAT as ACTIVE_FORMAT
    from lshdist.jobs.active import active_job
    from lshdist.store.atomic import check_output

    assert cfg.active is not None
    work = cfg.workdir
    out = work / "active"
    prepare_workdir(work, fresh)
    # an earlier run's output is replaced; anything else there is refused, before the ingest
    check_output(out, out.exists(), kind=ACTIVE_FORMAT)
    if cfg.cluster.given_ and not cfg.active.distributed:
        log.info("the cluster section is not used: active.distributed is false (the pool is "
                 "searched in this process)")
    t = time.perf_counter()
    train = ingest_split(cfg.train, work / "train", None)
    test = ingest_split(cfg.test, work / "test", work / "train")
    log.info("ingest: %.1fs", time.perf_counter() - t)
    active_job(str(train.path), str(test.path), out, cfg.active, cfg.cluster,
               overwrite=out.exists())
    return 0


def q_point(index: Path) -> dict[str, Any]:
    """The index's operating point and calibration summary (from its manifest)."""
    from lshdist.store.index import read_permutation_manifest

    m = read_permutation_manifest(index, "a run's query")
    cal = m.calibration
    return {"permutations": m.permutations, "window": m.window,
            "hamming_keep": m.hamming_keep, "calibration_mode": cal and cal.mode,
            "calibration": cal and cal.reason, "calibration_seconds": cal and cal.seconds}


def _print_report(cfg: RunConfig, train: Dataset, test: Dataset, ks: list[int],
                  scan: dict[str, Any], found: dict[str, Any], times: dict[str, float]) -> None:
    w = sys.stdout.write
    w(f"{cfg.name}: {train.n} database x {test.n} queries, k={cfg.query.k}\n")
    w(f"{'mode':<6} " + " ".join(f"{f'{kk}-NN acc':>10}" for kk in ks)
      + f" {'recall@' + str(cfg.query.k):>10} {'%searched':>10} {'seconds':>8}\n")
    for name, r in (("scan", scan), ("search", found)):
        label = "scan" if name == "scan" else found["mode"]
        w(f"{label:<6} " + " ".join(f"{100 * r['knn_accuracy'][kk]:>9.2f}%" for kk in ks)
          + f" {r['recall_at_k']:>10.3f} {100 * r['fraction_searched']:>9.2f}%"
          + f" {times['query-' + name]:>8.2f}\n")
    op = found["operating_point"]
    if op.get("calibration"):
        w(f"calibration ({op['calibration_seconds']:.1f}s): {op['calibration_mode']} — "
          f"{op['calibration']}\n")
    w("stage seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items())
      + " (the search starts while the index is written: index-and-search is both)\n")


def _plots(train: Dataset, test: Dataset, model: Path, cfg: RunConfig, work: Path) -> None:
    """The trade-off plots (`lshdist.plots.write_plots`: recall against cost, accuracy and
    cost against b), measured in one process, and the calibration curve of the run's index
    (``calibration.png``)."""
    from lshdist.evaluation import baseline_metric
    from lshdist.plots import plot_calibration, save, write_plots
    from lshdist.store.embedded import open_data
    from lshdist.store.index import read_permutation_manifest
    from lshdist.store.model import load_model
    from lshdist.tradeoff import measure_tradeoff

    ml, _ = load_model(model)
    Xtr = open_data(train.path, ml.embedding).read_all()
    Xte = open_data(test.path, ml.embedding).read_all()
    l2 = baseline_metric(ml, Xtr)
    ytr, yte = train.labels(), test.labels()
    assert ytr is not None and yte is not None  # `run` refuses unlabelled data before this
    built = read_permutation_manifest(work / "index", "a run's plots")
    data = measure_tradeoff(Xtr, ytr, Xte, yte, metrics=(("L2", l2, False), ("ML", ml, True)),
                            bits=built.bits,  # the b the run's index chose
                            bits_values=[16, 32, 64, 128, 256],
                            target=cfg.index.target_recall, k=min(cfg.evaluate.ks),
                            recall_k=cfg.evaluate.recall_k, seed=cfg.index.seed,
                            n_classes=len(train.classes or []))
    data["name"] = cfg.name
    atomic_write_text(work / "tradeoff.json", json.dumps(data, indent=2))
    write_plots(data, work)
    if built.calibration is not None:
        save(plot_calibration(built.calibration, name=f"{cfg.name} index", rows=built.rows),
             work / "calibration.png")
