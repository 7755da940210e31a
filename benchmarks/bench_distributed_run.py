"""The distributed job against its peers, in one run: lshdist index + query on 2 Dask workers,
``lshdist run`` (the CLI), FAISS flat, FAISS IVFFlat (nlist, nprobe swept) and hnswlib, all on
the same vectors, paired and alternated.

Data (``BENCH_DATA``): ``fashion`` (default; `configs/fashion-mnist.yaml`, 60,000 x 10,000) or
``shifted`` (the 240,000 shifted training images of `make_shifted.py` x the 10,000 unshifted
test images, with the same config's learn / index / query sections).

Stages, all through the library (what ``lshdist run`` calls):

* ingest: `lshdist.jobs.run.ingest_split` with the config's ``data:`` sections (reused when the
  work directory already holds them; for ``shifted`` the work directory's ``train`` / ``test``
  are links to the `make_shifted.py` output);
* learn, once: `lshdist.jobs.learn.learn` with the config's own ``learn:`` section (defaults
  and metric selection), saved with `lshdist.store.model.save_model`;
* a 2-worker LocalCluster from the config's ``cluster:`` section (`client_from_config`, start-up
  timed and reported apart).

Systems, each run once per round (1 warm-up round, then ``BENCH_ROUNDS``, order alternated):

* ``lshdist``: `plan_build` + `plan_following_query` + `build_and_query`, as `lshdist run`
  does: the build (the segments held in worker memory), and the query of all test rows started
  once the build is calibrated, while the segments are written (total: both, start to end),
  with the config's ``index:`` / ``query:`` sections: `IndexConfig` / `QueryConfig`
  defaults (target recall 0.9, M, W, H calibrated, mode auto) but for the layout keys the
  config sets (segment_rows 30,000, k 10); no search flag.  On the bench's LocalCluster.
* ``lshdist run``: the command ``lshdist run CONFIG`` in a subprocess (a copy of the config
  with the bench's work directory, so that it reuses the same datasets and model): its total
  is the index-and-search seconds of its ``report.json``; its own cluster start-up, the
  exact-scan query it runs for its report, evaluation and plots are in the wall time only.
* FAISS ``IndexFlatL2`` (exact, 2 OpenMP threads) on the same ``Gx`` vectors
  (`ExplicitMetric.transform` of the saved model); also the ground truth, computed once.
* FAISS ``IVFFlat`` on ``Gx``: nlist in {1, 2, 4} x sqrt(N) (trained on 40 rows a list) x nprobe
  in {1, 2, 4, 8, 16} swept once; the ``IVF_CANDIDATES`` cheapest settings at recall@10 >= 0.9
  each run in every round, and the round's IVF total is the cheapest of them that reached 0.9
  (the peer's best total, not one lucky setting).
* hnswlib (M=16, ef_construction=200) on ``Gx``: ef swept on one build; the first ef reaching
  0.9 runs build + query in every round (``BENCH_HNSW=0``: left out of the rounds).

``BENCH_RUN_PLOTS=0``: the config copy that ``lshdist run`` gets says ``plots: false`` (its
trade-off plots index the data in one process at 5 key lengths x 2 metrics: 2-4 minutes at
60,000 rows on a loaded machine, outside the totals but inside each round's wall time).

Recall@10 of every system against the flat ground truth; the ratio peer total / lshdist total
per round, median [min–max].

    cd /work/main && .venv/bin/python benchmarks/bench_distributed_run.py
    cd /work/main && BENCH_DATA=shifted BENCH_HNSW=0 BENCH_RUN_PLOTS=0 BENCH_IVF_CANDIDATES=1 \\
        .venv/bin/python benchmarks/bench_distributed_run.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CONFIG = ROOT / "configs" / "fashion-mnist.yaml"
DATA = os.environ.get("BENCH_DATA", "fashion")
WORK = ROOT / "out" / ("bench-distributed-run" if DATA == "fashion"
                       else f"bench-distributed-run-{DATA}")
K = 10
TARGET = 0.9
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
NPROBES = [1, 2, 4, 8, 16]
IVF_FACTORS = (1, 2, 4)
IVF_TRAIN_PER_LIST = 40
IVF_CANDIDATES = int(os.environ.get("BENCH_IVF_CANDIDATES", "2"))
HNSW_M, HNSW_EFC = 16, 200
HNSW_EFS = [10, 12, 16, 20, 24, 32, 48, 64]
WITH_HNSW = os.environ.get("BENCH_HNSW", "1") != "0"
RUN_PLOTS = os.environ.get("BENCH_RUN_PLOTS", "1") != "0"


def link_shifted(work: Path) -> None:
    """The work directory's train / test as links to `make_shifted.py`'s output."""
    import make_shifted

    ds, qs = make_shifted.make()
    for name, src in (("train", ds.path), ("test", qs.path)):
        dst = work / name
        if not dst.exists():
            dst.symlink_to(Path(src).resolve(), target_is_directory=True)


def cli_config(cfg_path: Path, work: Path) -> Path:
    """A copy of the config with the bench's work directory (same datasets, same model)."""
    text = cfg_path.read_text().splitlines()
    out = [f"workdir: {work}" if ln.startswith("workdir:") else ln for ln in text]
    if not RUN_PLOTS:  # the trade-off plots: minutes of one-process indexes, outside the totals
        out = [ln.replace("plots: true", "plots: false") if ln.startswith("evaluate:") else ln
               for ln in out]
    p = work.parent / f"{work.name}.yaml"
    p.write_text("\n".join(out) + "\n")
    return p


def main():
    import faiss
    import hnswlib

    from lshdist.cluster.pipeline import build_and_query, plan_build, plan_following_query
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
    if DATA == "shifted":
        link_shifted(WORK)
    elif DATA != "fashion":
        raise SystemExit(f"BENCH_DATA={DATA!r}: fashion or shifted")
    run_cfg = cli_config(CONFIG, WORK)
    print(f"data {DATA}; config {CONFIG.name}: index {cfg.index}, query {cfg.query}, cluster "
          f"{cfg.cluster}; threads {pinned}, load {common.loadavg()}", flush=True)

    t0 = time.perf_counter()
    train = ingest_split(cfg.train, WORK / "train", None)
    test = ingest_split(cfg.test, WORK / "test", WORK / "train")
    t_ingest = time.perf_counter() - t0
    model = WORK / "model"
    t0 = time.perf_counter()
    if not model.exists():
        metric, params, t_fit = learn(train, learn_cfg)
        save_model(model, metric, params=params, seed=learn_cfg.seed)
    else:
        t_fit = None
    t_learn = time.perf_counter() - t0
    metric, _ = load_model(model)  # exactly what the workers hash and re-rank with
    Xtr = np.ascontiguousarray(train.read_all(), np.float32)
    Xte = np.ascontiguousarray(test.read_all(), np.float32)
    tr_ids, te_ids = train.ids(), test.ids()
    N, Q = len(Xtr), len(Xte)
    print(f"ingest {t_ingest:.1f} s, learn {t_learn:.1f} s (ITML fit "
          f"{'reused' if t_fit is None else f'{t_fit:.1f} s'}); {N} x {Q}", flush=True)
    t0 = time.perf_counter()
    Ztr = np.ascontiguousarray(metric.transform(Xtr), np.float32)
    Zte = np.ascontiguousarray(metric.transform(Xte), np.float32)
    t_tx = time.perf_counter() - t0
    del Xtr, Xte
    d = Ztr.shape[1]

    def flat_job():
        t0 = time.perf_counter()
        ix = faiss.IndexFlatL2(d)
        ix.add(Ztr)
        t_add = time.perf_counter() - t0
        _, rows = ix.search(Zte, K)
        return t_add, time.perf_counter() - t0 - t_add, tr_ids[rows]

    t_add, t_q, truth = flat_job()
    print(f"ground truth: FAISS flat on Gx {t_add + t_q:.2f} s (Gx {t_tx:.2f} s)", flush=True)

    def rec(ids):
        return recall_at_k(np.asarray(ids, np.int64), truth, K)

    # ------------------------------------------------ IVFFlat sweep (selection, once)
    train_order = np.random.default_rng(0).permutation(N)

    def ivf_build(nlist):
        return common.ivf_flat(faiss, Ztr, nlist, train_order, IVF_TRAIN_PER_LIST)

    ivf_rows = []
    for f in IVF_FACTORS:
        nlist = int(f * math.sqrt(N))
        t0 = time.perf_counter()
        ix = ivf_build(nlist)
        t_b = time.perf_counter() - t0
        for nprobe in NPROBES:
            ix.nprobe = nprobe
            t0 = time.perf_counter()
            _, rows = ix.search(Zte, K)
            t_s = time.perf_counter() - t0
            r = rec(tr_ids[rows])
            ivf_rows.append({"nlist": nlist, "nprobe": nprobe, "recall@10": r,
                             "train+add s": t_b, "search s": t_s, "total s": t_b + t_s,
                             "load": common.loadavg()[0]})
            print(f"IVFFlat nlist={nlist} nprobe={nprobe}: recall {r:.4f}, train+add "
                  f"{t_b:.2f} s, search {t_s:.2f} s", flush=True)
            if r >= 0.995:
                break  # a larger nprobe only costs more
        del ix
    ivf_ok = sorted((r for r in ivf_rows if r["recall@10"] >= TARGET),
                    key=lambda r: r["total s"])
    ivf_cands = [(r["nlist"], r["nprobe"]) for r in ivf_ok[:IVF_CANDIDATES]] or [
        max(((r["nlist"], r["nprobe"]) for r in ivf_rows),
            key=lambda p: next(r["recall@10"] for r in ivf_rows
                               if (r["nlist"], r["nprobe"]) == p))]

    def ivf_round():
        best = None
        for nlist, nprobe in ivf_cands:
            t0 = time.perf_counter()
            ix = ivf_build(nlist)
            tb = time.perf_counter() - t0
            ix.nprobe = nprobe
            _, rows = ix.search(Zte, K)
            tq = time.perf_counter() - t0 - tb
            res = {"build s": tb, "query s": tq, "total s": tb + tq,
                   "recall@10": rec(tr_ids[rows]), "setting": f"nlist={nlist}, nprobe={nprobe}"}
            ok = res["recall@10"] >= TARGET
            if best is None or (ok, -res["total s"]) > (best["recall@10"] >= TARGET,
                                                        -best["total s"]):
                best = res
            del ix
        return best

    # ------------------------------------------------ hnswlib sweep (one build, ef swept)
    def hnsw_build():
        ix = hnswlib.Index(space="l2", dim=d)
        ix.init_index(max_elements=N, M=HNSW_M, ef_construction=HNSW_EFC, random_seed=100)
        common.hnsw_pin(ix, T)
        ix.add_items(Ztr, np.arange(N), num_threads=T)
        return ix

    t0 = time.perf_counter()
    hix = hnsw_build()
    t_hb = time.perf_counter() - t0
    hnsw_rows = []
    for ef in HNSW_EFS:
        hix.set_ef(ef)
        t0 = time.perf_counter()
        rows, _ = hix.knn_query(Zte, k=K, num_threads=T)
        t_s = time.perf_counter() - t0
        r = rec(tr_ids[rows.astype(np.int64)])
        hnsw_rows.append({"ef": ef, "recall@10": r, "build s": t_hb, "query s": t_s,
                          "total s": t_hb + t_s})
        print(f"hnswlib ef={ef}: recall {r:.4f}, build {t_hb:.2f} s, query {t_s:.3f} s",
              flush=True)
        if r >= TARGET:
            break
    del hix
    hnsw_ef = hnsw_rows[-1]["ef"]

    def hnsw_round():
        t0 = time.perf_counter()
        ix = hnsw_build()
        tb = time.perf_counter() - t0
        ix.set_ef(hnsw_ef)
        rows, _ = ix.knn_query(Zte, k=K, num_threads=T)
        tq = time.perf_counter() - t0 - tb
        return {"build s": tb, "query s": tq, "total s": tb + tq,
                "recall@10": rec(tr_ids[rows.astype(np.int64)]), "setting": f"ef={hnsw_ef}"}

    def flat_round():
        tb, tq, ids = flat_job()
        return {"build s": tb, "query s": tq, "total s": tb + tq, "recall@10": rec(ids)}

    # ------------------------------------------------ lshdist run, the command
    cli_env = {k: v for k, v in os.environ.items()
               if k not in ("LSHDIST_BENCH_PID", "NUMBA_CACHE_DIR")}  # its own process, cache

    def cli_round():
        t0 = time.perf_counter()
        p = subprocess.run([str(Path(sys.executable).with_name("lshdist")), "run",
                            str(run_cfg)], capture_output=True, text=True, env=cli_env,
                           cwd=ROOT)
        wall = time.perf_counter() - t0
        if p.returncode:
            raise SystemExit(f"lshdist run failed ({p.returncode}): {p.stderr[-2000:]}")
        rep = json.loads((WORK / "report.json").read_text())
        s = rep["seconds"]
        _, nb, _, _ = read_results(WORK / "results-search", te_ids)
        op = rep["search"].get("operating_point")
        # the search starts while the index is written: its total is their joint wall time
        return {"build s": s["index"], "query s": s["query-search"],
                "total s": s["index-and-search"], "recall@10": rec(nb),
                "wall s": wall, "query-scan s": s.get("query-scan"),
                "setting": (f"{rep['search'].get('mode')}, M={op.get('permutations')}, "
                            f"W={op.get('window')}, H={op.get('hamming_keep')}" if op
                            else str(rep["search"].get("mode")))}

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
            search = plan_following_query(plan, queries=str(test.path), out=str(results),
                                          cfg=cfg.query, overwrite=results.exists())
            held: list = []  # as `lshdist run`: the built segments stay in worker memory
            # as `lshdist run`: the query starts once the build is calibrated, while the
            # segments are written (build and query overlap; the total is both)
            built, info, secs = build_and_query(client, plan, search, stall=stall, hold=held)
            total = time.perf_counter() - t0  # planning, build and query
            manifest = built.to_json()
            tb, tq = secs["index"], secs["query"]
            client.cancel(held)
            _, nb, _, cand = read_results(results, te_ids)
            cal = manifest.get("calibration") or {}
            op = info["operating_point"]
            return {"build s": tb, "query s": tq, "total s": total,
                    "recall@10": rec(nb),
                    "mode": info["mode"],
                    "setting": (f"M={op[0]}, W={op[1]}, H={op[2]} per segment" if op
                                else "exact scan"),
                    "segments": len(manifest["segments"]),
                    "% searched": 100 * float(cand.mean()) / train.n,
                    "calibration s": cal.get("seconds"), "reason": cal.get("reason")}

        systems = {"lshdist": lsh_job, "lshdist run": cli_round, "flat": flat_round,
                   "ivf": ivf_round}
        if WITH_HNSW:
            systems["hnsw"] = hnsw_round
        print(f"paired rounds: 1 warm-up + {ROUNDS}", flush=True)
        paired = common.paired_rounds(systems, "lshdist", ROUNDS, 1)
        t0 = time.perf_counter()
    t_close = time.perf_counter() - t0

    summ = common.paired_summary(paired["runs"], "lshdist")
    lsh_runs = [r["lshdist"] for r in paired["runs"]]
    setting = "; ".join(sorted({f"{r['setting']} ({r['mode']})" for r in lsh_runs}))

    def settings_of(name):
        return "; ".join(sorted({r[name].get("setting", "–") for r in paired["runs"]}))

    def row(system, key, setting):
        s = summ[key]
        return {"system": system, "setting": setting, "recall@10": s["recall@10"],
                "build s": s["build s"], "query s": s["query s"], "total s": s["total s"],
                "peer / lshdist (median [min–max])": ("1" if key == "lshdist"
                                                      else common.fmt_ratio(s)),
                "runs total s": ", ".join(f"{v:.2f}" for v in s["runs total s"])}

    cli_runs = [r["lshdist run"] for r in paired["runs"]]
    summary = [
        row(f"lshdist index + query, {n_workers}-worker LocalCluster", "lshdist",
            f"{lsh_runs[0]['segments']} segments; {setting}"),
        row("lshdist run CONFIG (index-and-search of its report)", "lshdist run",
            f"{settings_of('lshdist run')}; wall {np.median([r['wall s'] for r in cli_runs]):.1f}"
            " s with its cluster, exact-scan query, evaluation, plots"),
        row("FAISS IndexFlatL2 on Gx", "flat", f"{T} threads"),
        row("FAISS IVFFlat on Gx, best total at recall >= 0.9", "ivf",
            f"{T} threads; per round the cheapest of {settings_of('ivf')}"),
    ]
    if WITH_HNSW:
        summary.append(row(f"hnswlib (M={HNSW_M}, efC={HNSW_EFC}) on Gx, build + query",
                           "hnsw", f"{T} threads; {settings_of('hnsw')}"))
    stages = [{"stage": "ingest (train + test, reused if present)", "s": t_ingest},
              {"stage": "learn (the config's section) + save model (0: reused)", "s": t_learn},
              {"stage": f"Gx of the {N + Q:,} rows (peers' input, not in their totals)",
               "s": t_tx},
              {"stage": "cluster start-up (2 workers, numba warm-up)", "s": t_cluster},
              {"stage": "cluster shut-down", "s": t_close},
              {"stage": "lshdist index (median)", "s": summ["lshdist"]["build s"]},
              {"stage": f"lshdist {Q:,} queries (median)", "s": summ["lshdist"]["query s"]}]
    lrows = [{"round": i + 1, **{k: r[k] for k in ("build s", "query s", "total s", "recall@10",
                                                   "mode", "setting", "% searched",
                                                   "calibration s", "load")}}
             for i, r in enumerate(lsh_runs)]
    crows = [{"round": i + 1, **{k: r[k] for k in ("build s", "query s", "total s", "recall@10",
                                                   "wall s", "query-scan s", "load")}}
             for i, r in enumerate(cli_runs)]
    print(common.md_table(summary))
    notes = [
        f"Data {DATA}: {N:,} x {Q:,}; config {CONFIG.relative_to(ROOT)} with workdir {WORK}: "
        f"index section {dataclasses.asdict(cfg.index)}, query section "
        f"{dataclasses.asdict(cfg.query)} (defaults of IndexConfig/QueryConfig except the "
        "layout keys the config sets).",
        f"Paired rounds: 1 warm-up then {ROUNDS}; order alternated (reversed on odd rounds); "
        "ratio per round = peer total / lshdist total in that round; median [min–max]. 'load' "
        "= 1-minute load average after each run (other engineers share the 2 cores).",
        "lshdist: plan_build + plan_following_query + build_and_query, as lshdist run: build "
        "(fit segments on the workers, calibrate on the queries, write) and query (mode auto) "
        "of all queries, started once the build is calibrated, while the segments are written; "
        "total = both, start to end; build s and query s overlap; results written as Parquet; "
        "reading them back for the recall is not timed.",
        "lshdist run: the CLI in a subprocess on a copy of the config pointing at the same "
        "workdir (datasets and model reused); total = index-and-search seconds of its "
        "report.json; its cluster start-up, exact-scan query, evaluation and plots are only "
        "in its wall time; its trade-off plots "
        + ("on (the config's evaluate section)." if RUN_PLOTS else "off (BENCH_RUN_PLOTS=0)."),
        f"Peers on Gx = ExplicitMetric.transform of the saved model, computed once "
        f"({t_tx:.2f} s, not in their totals); ground truth: FAISS flat on Gx, once.",
        f"IVFFlat: nlist = int(f sqrt N), f in {IVF_FACTORS}, trained on 40 nlist rows of a "
        f"seeded permutation; sweep one run a point; the {IVF_CANDIDATES} cheapest settings "
        "at recall >= 0.9 run in every round, the round counts the cheapest that reached 0.9.",
        f"hnswlib: ef swept on one build ({t_hb:.1f} s), the first ef at recall >= 0.9 runs "
        "build + query in the rounds" + ("" if WITH_HNSW else " (left out: BENCH_HNSW=0)")
        + ".",
        f"Calibration: {lsh_runs[0]['reason']}.",
    ]
    tables = {
        f"Summary ({DATA}, {N:,} x {Q:,}, learned metric, k={K}, {T} threads)": summary,
        "Stages (end to end)": stages,
        "lshdist rounds": lrows,
        "lshdist run rounds": crows,
        "FAISS IVFFlat sweep (one run a point)": ivf_rows,
        f"hnswlib sweep (M={HNSW_M}, ef_construction={HNSW_EFC}, one build)": hnsw_rows,
    }
    name = os.environ.get("BENCH_NAME", "distributed_run_fashion" if DATA == "fashion"
                          else f"distributed_run_{DATA}")
    j, m = common.write_results(
        name, tables,
        title=f"lshdist on 2 Dask workers vs FAISS flat, IVFFlat and hnswlib on Gx ({DATA})",
        notes=notes, peer_modules=("faiss", "hnswlib", "distributed"),
        extra={"paired": paired, "summary": summ})
    print(f"wrote {j} and {m}; total {time.perf_counter() - t_start:.0f} s; load "
          f"{common.loadavg()}")


if __name__ == "__main__":
    main()
