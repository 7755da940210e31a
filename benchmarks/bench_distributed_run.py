"""The distributed job of ``lshdist run configs/fashion-mnist.yaml`` against FAISS flat on Gx.

Stages, all through the library (what ``lshdist run`` calls):

* ingest: `lshdist.jobs.run.ingest_split` with the config's ``data:`` sections (reused when the
  work directory already holds them);
* learn, once: `lshdist.jobs.learn.learn` with the config's own ``learn:`` section (defaults
  and metric selection), saved with `lshdist.store.model.save_model`;
* a 2-worker LocalCluster from the config's ``cluster:`` section (`client_from_config`, start-up
  timed and reported apart);
* per round: index = `plan_build` + `run_build` (holding the built segments in worker memory,
  as `lshdist run` does), queries = `plan_query` + `run_query` (given those segments) of all
  10,000 test rows, with the config's ``index:`` / ``query:`` sections: `IndexConfig` /
  `QueryConfig` defaults (target recall 0.9, M, W, H calibrated, mode auto) but for the
  layout keys the config sets (segment_rows 30,000, query_chunk 2,500, k 10); no search flag.

Peer, in the same rounds, alternated: FAISS ``IndexFlatL2`` (exact, 2 OpenMP threads) on the
same ``Gx`` vectors (`ExplicitMetric.transform` of the saved model), timed with and without
computing ``Gx``.  Ground truth: FAISS flat on Gx, once; recall@10 of lshdist's results
(read with `lshdist.store.results.read_results`) against it.

    cd /work/main && .venv/bin/python benchmarks/bench_distributed_run.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import contextlib
import dataclasses
import os
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
CONFIG = BENCH.parent / "configs" / "fashion-mnist.yaml"
WORK = BENCH.parent / "out" / "bench-distributed-run"
K = 10
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def main():
    import faiss

    from lshdist.cluster.pipeline import plan_build, plan_query, run_build, run_query
    from lshdist.config import load_run_config
    from lshdist.evaluation import recall_at_k
    from lshdist.jobs.common import client_from_config
    from lshdist.jobs.learn import learn
    from lshdist.jobs.run import ingest_split, prepare_workdir, run_index_config
    from lshdist.store.model import load_model, save_model
    from lshdist.store.results import read_results

    t_start = time.perf_counter()
    T = common.N_THREADS
    pinned = common.pin_threads(T)
    os.environ.setdefault("LSHDIST_DATA_DIR", str(common.data_dir()))
    cfg = dataclasses.replace(load_run_config(CONFIG), workdir=WORK)
    learn_cfg = cfg.learn  # the config's own learning section (defaults + metric selection)
    prepare_workdir(WORK, fresh=False)
    print(f"config {CONFIG.name}: index {cfg.index}, query {cfg.query}, cluster {cfg.cluster}; "
          f"threads {pinned}, load {common.loadavg()}", flush=True)

    t0 = time.perf_counter()
    train = ingest_split(cfg.train, WORK / "train", None)
    test = ingest_split(cfg.test, WORK / "test", WORK / "train")
    t_ingest = time.perf_counter() - t0
    model = WORK / "model"
    t0 = time.perf_counter()
    metric, params, t_fit = learn(train, learn_cfg)
    save_model(model, metric, params=params, seed=learn_cfg.seed, overwrite=model.exists())
    t_learn = time.perf_counter() - t0
    metric, _ = load_model(model)  # exactly what the workers hash and re-rank with
    Xtr = np.ascontiguousarray(train.read_all(), np.float32)
    Xte = np.ascontiguousarray(test.read_all(), np.float32)
    tr_ids, te_ids = train.ids(), test.ids()
    print(f"ingest {t_ingest:.1f} s, learn {t_learn:.1f} s (ITML fit {t_fit:.1f} s); "
          f"{train.n} x {test.n}", flush=True)

    def flat_job():
        t0 = time.perf_counter()
        Ztr, Zte = metric.transform(Xtr), metric.transform(Xte)
        t_tx = time.perf_counter() - t0
        ix = faiss.IndexFlatL2(Ztr.shape[1])
        ix.add(Ztr)
        t_add = time.perf_counter() - t0 - t_tx
        _, rows = ix.search(Zte, K)
        t_q = time.perf_counter() - t0 - t_tx - t_add
        return t_tx, t_add, t_q, tr_ids[rows]

    t_tx, t_add, t_q, truth = flat_job()
    print(f"ground truth: FAISS flat on Gx {t_tx + t_add + t_q:.2f} s (Gx {t_tx:.2f} s)",
          flush=True)

    def rec(ids):
        return recall_at_k(np.asarray(ids, np.int64), truth, K)

    index, results = WORK / "index", WORK / "results"

    with contextlib.ExitStack() as stack:
        t0 = time.perf_counter()
        client = stack.enter_context(client_from_config(cfg.cluster))
        t_cluster = time.perf_counter() - t0
        n_workers = len(client.scheduler_info()["workers"])
        print(f"cluster up: {n_workers} workers, {t_cluster:.1f} s (incl. numba warm-up on "
              "the workers)", flush=True)
        stall = cfg.cluster.stall_timeout

        def lsh_job():
            t0 = time.perf_counter()
            plan = plan_build(data=str(train.path), model=str(model), out=str(index),
                              cfg=run_index_config(cfg, test), overwrite=index.exists())
            held: list = []  # as `lshdist run`: the built segments stay in worker memory
            manifest = run_build(client, plan, stall=stall, hold=held)
            tb = time.perf_counter() - t0
            qp = plan_query(index=str(index), queries=str(test.path), out=str(results),
                            cfg=cfg.query, overwrite=results.exists())
            info = run_query(client, qp, stall=stall, segments=held)
            tq = time.perf_counter() - t0 - tb
            client.cancel(held)
            _, nb, _, cand = read_results(results, te_ids)
            cal = manifest.get("calibration") or {}
            op = info["operating_point"]
            return {"build s": tb, "query s": tq, "total s": tb + tq, "recall@10": rec(nb),
                    "mode": info["mode"],
                    "setting": (f"M={op[0]}, W={op[1]}, H={op[2]} per segment" if op
                                else "exact scan"),
                    "segments": len(manifest["segments"]),
                    "% searched": 100 * float(cand.mean()) / train.n,
                    "calibration s": cal.get("seconds"), "reason": cal.get("reason")}

        def flat_round():
            t_tx, t_add, t_q, ids = flat_job()
            return {"build s": t_add, "query s": t_q, "total s": t_add + t_q,
                    "transform s": t_tx, "recall@10": rec(ids)}

        print(f"paired rounds: 1 warm-up + {ROUNDS}", flush=True)
        paired = common.paired_rounds({"lshdist": lsh_job, "flat": flat_round}, "lshdist",
                                      ROUNDS, 1)
        t0 = time.perf_counter()
    t_close = time.perf_counter() - t0

    for r in [*paired["warmup"], *paired["runs"]]:
        f = r["flat"]
        r["flat_tx"] = {**f, "build s": f["build s"] + f["transform s"],
                        "total s": f["total s"] + f["transform s"]}
    summ = common.paired_summary(paired["runs"], "lshdist")
    lsh_runs = [r["lshdist"] for r in paired["runs"]]
    s_l, s_f, s_x = summ["lshdist"], summ["flat"], summ["flat_tx"]
    setting = "; ".join(sorted({f"{r['setting']} ({r['mode']})" for r in lsh_runs}))

    def row(system, s, setting):
        return {"system": system, "setting": setting, "recall@10": s["recall@10"],
                "build s": s["build s"], "query s": s["query s"], "total s": s["total s"],
                "peer / lshdist (median [min–max])": ("1" if s is s_l else common.fmt_ratio(s)),
                "runs total s": ", ".join(f"{v:.2f}" for v in s["runs total s"])}

    summary = [
        row(f"lshdist index + query, {n_workers}-worker LocalCluster", s_l,
            f"{lsh_runs[0]['segments']} segments; {setting}"),
        row("FAISS IndexFlatL2 on Gx (Gx given)", s_f, f"{T} threads"),
        row("FAISS IndexFlatL2, computing Gx first", s_x, f"{T} threads; Gx in build"),
    ]
    stages = [{"stage": "ingest (train + test, reused if present)", "s": t_ingest},
              {"stage": "learn (the config's section, metric selection) + save model",
               "s": t_learn},
              {"stage": "cluster start-up (2 workers, numba warm-up)", "s": t_cluster},
              {"stage": "cluster shut-down", "s": t_close},
              {"stage": "lshdist index (median)", "s": s_l["build s"]},
              {"stage": "lshdist 10,000 queries (median)", "s": s_l["query s"]},
              {"stage": "end to end: learn + index + query (median rounds)",
               "s": t_learn + s_l["total s"]},
              {"stage": "same with cluster start-up", "s": t_learn + t_cluster + s_l["total s"]}]
    lrows = [{"round": i + 1, **{k: r[k] for k in ("build s", "query s", "total s", "recall@10",
                                                   "mode", "setting", "% searched",
                                                   "calibration s", "load")}}
             for i, r in enumerate(lsh_runs)]
    print(common.md_table(summary))
    print(common.md_table(stages))
    notes = [
        f"Config {CONFIG.relative_to(BENCH.parent)} with workdir {WORK}: index section "
        f"{dataclasses.asdict(cfg.index)}, query section {dataclasses.asdict(cfg.query)} "
        "(defaults of IndexConfig/QueryConfig except the layout keys the config sets).",
        f"Paired rounds: 1 warm-up then {ROUNDS}; order alternated; ratio per round = FAISS "
        "total / lshdist total in that round; median [min–max].",
        "lshdist build = plan_build + run_build (fit segments on the workers, calibrate on the "
        "first, write); query = plan_query + run_query (mode auto) of 10,000 queries, results "
        "written as Parquet; reading them back for the recall is not timed.",
        "FAISS: IndexFlatL2 on Gx = ExplicitMetric.transform of the saved model (float64 "
        "product); 'Gx given' = add + search; 'computing Gx first' adds the transform of "
        "the 70,000 rows. Ground truth: that flat search, once.",
        f"Calibration on the first segment: {lsh_runs[0]['reason']}.",
    ]
    tables = {
        f"Summary (Fashion-MNIST 60,000 x 10,000, learned metric, k={K})": summary,
        "Stages (end to end)": stages,
        "lshdist rounds": lrows,
    }
    j, m = common.write_results(
        os.environ.get("BENCH_NAME", "distributed_run_fashion"), tables,
        title="lshdist run (fashion-mnist.yaml, 2 Dask workers) vs FAISS flat on Gx",
        notes=notes, peer_modules=("faiss", "distributed"),
        extra={"paired": paired, "summary": summ, "learn_params": params})
    print(f"wrote {j} and {m}; total {time.perf_counter() - t_start:.0f} s; load "
          f"{common.loadavg()}")


if __name__ == "__main__":
    main()
