"""How each stage's cost grows with N — lshdist on 2 Dask workers against the peers.

Sizes: the first v database variants of `make_million` (v = 1, 4, 8, 17: N = 60,000, 240,000,
480,000, 1,020,000 shifted Fashion-MNIST rows), Q = N/10 queries (the first Q rows of its query
set; the first 2,000 have stored exact truth), k = 10, target recall 0.9.  ``--sizes`` picks
some of them.

lshdist, through the library calls the CLI makes, on a 2-worker LocalCluster started per size
(start-up reported apart, never in a stage): learn (`lshdist.jobs.learn.learn`, LearnConfig
defaults: a 20,000-row stratified sample, metric selection), index (IndexConfig defaults,
calibrated on the query set), query (QueryConfig defaults, mode auto) — once as `lshdist run`
does it (the segments the build holds in worker memory are searched) and once as a separate
`lshdist query` (the index read back from disk); wall time per stage,
recall@10 on the truth sample, peak RSS of each worker process (whole life: a fresh cluster
per size), bytes per indexed item on disk.  Before the first size, a warm-up runs the same job
on 20,000 rows (learn on 4,000) so that every numba kernel is compiled into the benchmark's
cache: its time is reported apart (BENCHMARKS.md), not in any stage (left in, the compilation
would add about 20 s to the index stage at 1 M).  At the largest size also: the
query stage on 1 worker (same index), and Q = N/100.

Peers, in the same run, on Gx when the model is a learned metric (the model is saved; its
transform is what the workers re-rank with):

* FAISS ``IndexFlatL2``: add + search of the 2,000 truth queries, scaled by Q/2,000 (brute force
  is linear in Q);
* FAISS ``IVFFlat``: nlist = sqrt(N), trained on 40 rows per list, add; nprobe swept on the
  truth sample; the best total (build + sample search scaled by Q/2,000) reaching 0.9;
* hnswlib (M=16, efC=200) measured at N = 60,000 only (its build at 240,000 took 203 s);
  larger sizes extrapolated: build x (N log N)/(n log n), query x Q log N/(q log n) at the ef
  that reached 0.9 at 60,000 (optimistic for hnswlib: recall at that ef falls with N);
* exact k-NN in plain Dask on the same workers (`dask.array` from the Zarr dataset, squared
  distances, `da.argtopk`): 500 queries, scaled by Q/500;
* Spark MLlib: not measured (no pyspark in this environment; said in the output).

    cd /work/main && .venv/bin/python benchmarks/bench_scale.py [--sizes 1,4,8,17]

(``BENCH_NAME=other`` writes ``results/other.{json,md}`` instead of ``scale_fashion``.)
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import argparse
import dataclasses
import math
import os
import resource
import shutil
import time
from pathlib import Path

import numpy as np

import make_million

BENCH = Path(__file__).resolve().parent
WORK = BENCH.parent / "out" / "scale"
K = 10
TARGET = 0.9
TRUTH = 2_000
DASK_Q = 500
NPROBES = [4, 6, 8, 12, 16, 24]
HNSW_M, HNSW_EFC, HNSW_EFS = 16, 200, [10, 16, 24, 32, 48, 64]


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def worker_rss(client) -> dict:
    def peak() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    return client.run(peak)


def queries_subset(qs, n: int, where: Path):
    """A dataset of ``n`` query rows drawn at random (`make_million.query_order`: they hold the
    truth sample), ids kept (reused when present)."""
    from lshdist.store.dataset import Dataset, write_dataset

    if n >= qs.n:
        return qs
    rows = np.sort(make_million.query_order(qs.n)[:n])
    ids = qs.ids()[rows]
    if where.exists():
        d = Dataset(where)
        if d.n == n and np.array_equal(d.ids(), ids):
            return d
    X = qs.read_row_set(rows)
    y = qs.labels()[rows]
    return write_dataset(where, np.asarray(X, np.float32), y, classes=qs.classes, ids=ids,
                         shard_rows=20_000, overwrite=where.exists())


def run_lshdist(ds, qsets, size_dir: Path, truth, *, workers: int, model: Path | None,
                learn_too: bool, segment_rows: int | None = None, tag: str = "",
                learn_cfg=None):
    """Learn (optional), index and query each of ``qsets`` on a fresh ``workers``-worker
    cluster; returns the stage rows."""
    from lshdist.cluster.pipeline import plan_build, plan_query, run_build, run_query
    from lshdist.config import ClusterConfig, IndexConfig, LearnConfig, QueryConfig
    from lshdist.evaluation import recall_at_k
    from lshdist.jobs.common import client_from_config
    from lshdist.jobs.learn import learn
    from lshdist.store.model import save_model
    from lshdist.store.results import read_results

    out = {}
    model = model or size_dir / "model"
    if learn_too:
        t0 = time.perf_counter()
        metric, params, _ = learn(ds, learn_cfg or LearnConfig())
        save_model(model, metric, params=params, seed=0, overwrite=model.exists())
        out["learn s"] = time.perf_counter() - t0
        out["metric"] = params.get("selected", "?")
    index = size_dir / f"index{tag}"
    t0 = time.perf_counter()
    with client_from_config(ClusterConfig(workers=workers)) as client:
        out["cluster start s"] = time.perf_counter() - t0
        if learn_too or segment_rows:
            cfg = dataclasses.replace(IndexConfig(), calibration_queries=str(qsets[0].path))
            if segment_rows:
                cfg = dataclasses.replace(cfg, segment_rows=segment_rows)
            t0 = time.perf_counter()
            plan = plan_build(data=str(ds.path), model=str(model), out=str(index), cfg=cfg,
                              overwrite=index.exists())
            held: list = []  # the segments just built, kept in worker memory (as `run` does)
            manifest = run_build(client, plan, hold=held if learn_too else None)
            out["index s"] = time.perf_counter() - t0
            out["segments"] = len(manifest.segments)
            out["calibration"] = manifest.calibration and manifest.calibration.reason
            out["index bytes/item"] = du(index) / ds.n
            if held:
                # `lshdist run`: the queries search the segments the build holds (no re-read);
                # then every query set as a separate `lshdist query` (segments read back)
                qset = qsets[0]
                res = size_dir / f"results{tag}-held-{qset.n}"
                t0 = time.perf_counter()
                qp = plan_query(index=str(index), queries=str(qset.path), out=str(res),
                                cfg=QueryConfig(), overwrite=res.exists())
                run_query(client, qp, segments=held)
                out[f"query {qset.n} s, segments held (as run)"] = time.perf_counter() - t0
                client.cancel(held)
                if truth is not None:
                    qid, nb, _, _ = read_results(res, qset.ids())
                    pos = np.searchsorted(np.asarray(qid), qs_ids_of_truth(truth, qset))
                    out[f"query {qset.n} recall@10, segments held"] = recall_at_k(
                        np.asarray(nb[pos], np.int64), truth["ids"], K)
                shutil.rmtree(res, ignore_errors=True)
        for qset in qsets:
            res = size_dir / f"results{tag}-{qset.n}"
            t0 = time.perf_counter()
            qp = plan_query(index=str(index), queries=str(qset.path), out=str(res),
                            cfg=QueryConfig(), overwrite=res.exists())
            info = run_query(client, qp)
            tq = time.perf_counter() - t0
            qid, nb, _, cand = read_results(res, qset.ids())
            if truth is None:  # the warm-up: no recall to measure
                continue
            pos = np.searchsorted(np.asarray(qid), qs_ids_of_truth(truth, qset))
            rec = recall_at_k(np.asarray(nb[pos], np.int64), truth["ids"], K)
            op = info["operating_point"]
            out[f"query {qset.n} s"] = tq
            out[f"query {qset.n} recall@10"] = rec
            out[f"query {qset.n} setting"] = (f"{info['mode']} M={op[0]} W={op[1]} H={op[2]}"
                                              if op else info["mode"])
            out[f"query {qset.n} % searched"] = 100 * float(cand.mean()) / ds.n
            print(f"  {workers} worker(s), {qset.n} queries: {tq:.1f} s, recall {rec:.3f}, "
                  f"{out[f'query {qset.n} setting']}", flush=True)
        out["peak RSS per worker GiB"] = max(worker_rss(client).values()) / 2**30
    return out, model


def warm_up(ds, qs_all) -> float:
    """Compile every numba kernel of learn + index + query before anything is timed
    (BENCHMARKS.md: compilation is reported apart, never mixed into a stage): the whole job on
    the first 20,000 database rows and 4,000 queries, on a 2-worker cluster sharing the
    benchmark's numba cache.  Returns its wall time."""
    from lshdist.store.dataset import write_dataset

    t0 = time.perf_counter()
    where = WORK / "warm-up"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    rows = np.arange(20_000)
    small = write_dataset(where / "data", ds.read_row_set(rows), ds.labels()[rows],
                          classes=ds.classes, shard_rows=10_000)
    qrows = np.arange(4_000)
    qs = write_dataset(where / "queries", qs_all.read_row_set(qrows), qs_all.labels()[qrows],
                       classes=qs_all.classes, ids=qs_all.ids()[qrows], shard_rows=4_000)
    from lshdist.config import LearnConfig

    run_lshdist(small, [qs], where, None, workers=2, model=None, learn_too=True,
                learn_cfg=LearnConfig(sample=4_000))
    shutil.rmtree(where, ignore_errors=True)
    return time.perf_counter() - t0


def qs_ids_of_truth(truth, qset) -> np.ndarray:
    """The ids (in the full query set) of the truth sample's queries: query ids are row
    numbers of the full query set (make_million writes them 0..n-1)."""
    return np.asarray(truth["queries"], np.int64)


def dask_scan(ds, Q, workers: int) -> tuple[float, np.ndarray]:
    import dask.array as da

    from lshdist.config import ClusterConfig
    from lshdist.jobs.common import client_from_config

    with client_from_config(ClusterConfig(workers=workers)):
        t0 = time.perf_counter()
        X = da.from_zarr(str(ds.path), component="X")
        q = da.from_array(Q)
        D = (X * X).sum(axis=1)[None, :] - 2.0 * (q @ X.T)
        idx = da.argtopk(D, -K, axis=1).compute()
        t = time.perf_counter() - t0
    # argtopk's order is by value; sort each row's k by distance for the recall (a set anyway)
    return t, np.asarray(idx, np.int64)


def faiss_peers(faiss, X, Q_truth, truth_ids, Q_total: int, T: int) -> list[dict]:
    from lshdist.evaluation import recall_at_k

    N, d = X.shape
    scale = Q_total / len(Q_truth)
    rows = []
    t0 = time.perf_counter()
    fx = faiss.IndexFlatL2(d)
    fx.add(X)
    t_add = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, I = fx.search(Q_truth, K)
    t_s = time.perf_counter() - t0
    rows.append({"system": "FAISS IndexFlatL2", "setting": f"{T} threads, search x{scale:.1f}",
                 "recall@10": recall_at_k(I.astype(np.int64), truth_ids, K),
                 "build s": t_add, "query s": t_s * scale, "total s": t_add + t_s * scale})
    del fx
    nlist = int(math.sqrt(N))
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    quant = faiss.IndexFlatL2(d)
    ivf = faiss.IndexIVFFlat(quant, d, nlist)
    ivf.train(X[np.sort(rng.permutation(N)[: 40 * nlist])])
    ivf.add(X)
    t_build = time.perf_counter() - t0
    best = None
    for nprobe in NPROBES:
        ivf.nprobe = nprobe
        t0 = time.perf_counter()
        _, I = ivf.search(Q_truth, K)
        t_s = time.perf_counter() - t0
        r = recall_at_k(I.astype(np.int64), truth_ids, K)
        tot = t_build + t_s * scale
        print(f"  IVF nlist={nlist} nprobe={nprobe}: recall {r:.3f}, total {tot:.1f} s",
              flush=True)
        if r >= TARGET and (best is None or tot < best["total s"]):
            best = {"system": "FAISS IVFFlat (best total at 0.9)",
                    "setting": f"nlist={nlist}, nprobe={nprobe}, search x{scale:.1f}",
                    "recall@10": r, "build s": t_build, "query s": t_s * scale, "total s": tot}
    if best:
        rows.append(best)
    return rows


def hnsw_at(X, Q, truth_ids, T: int) -> dict:
    import hnswlib

    from lshdist.evaluation import recall_at_k

    t0 = time.perf_counter()
    ix = hnswlib.Index(space="l2", dim=X.shape[1])
    ix.init_index(max_elements=len(X), M=HNSW_M, ef_construction=HNSW_EFC, random_seed=100)
    common.hnsw_pin(ix, T)
    ix.add_items(X, np.arange(len(X)), num_threads=T)
    t_build = time.perf_counter() - t0
    for ef in HNSW_EFS:
        ix.set_ef(ef)
        t0 = time.perf_counter()
        I, _ = ix.knn_query(Q, k=K, num_threads=T)
        t_q = time.perf_counter() - t0
        r = recall_at_k(I.astype(np.int64), truth_ids, K)
        print(f"  hnswlib ef={ef}: recall {r:.3f}, {t_q:.2f} s for {len(Q)}", flush=True)
        if r >= TARGET:
            return {"n": len(X), "build s": t_build, "ef": ef, "recall@10": r,
                    "query s per query": t_q / len(Q)}
    return {"n": len(X), "build s": t_build, "ef": None, "recall@10": r,
            "query s per query": t_q / len(Q)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,4,8,17", help="database variants (60,000 rows each)")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the JSON")
    args = ap.parse_args()
    from lshdist.limits import keep_freed_memory

    keep_freed_memory()  # the driver's malloc, as the command line sets it (learn, calibration)
    if args.plot_only:
        replot()
        return
    import faiss

    T = common.N_THREADS
    pinned = common.pin_threads(T)
    sizes = [int(v) for v in args.sizes.split(",")]
    WORK.mkdir(parents=True, exist_ok=True)
    rows, stage_rows, hnsw = [], [], None
    t_start = time.perf_counter()
    warmed = None
    for v in sizes:
        out = (make_million.DEFAULT_OUT if v == len(make_million.DB_SHIFTS)
               else WORK / f"data-v{v}")
        ds, qs_all, truth = make_million.make(out, variants=v)
        N = ds.n
        Qn = min(qs_all.n, N // 10)
        size_dir = WORK / f"n{N}"
        size_dir.mkdir(parents=True, exist_ok=True)
        qsets = [queries_subset(qs_all, Qn, size_dir / f"queries-{Qn}")]
        largest = v == max(sizes)
        if largest and N // 100 >= TRUTH:
            qsets.append(queries_subset(qs_all, N // 100, size_dir / f"queries-{N // 100}"))
        print(f"== N={N:,}, Q={Qn:,}; threads {pinned}; load {common.loadavg()}", flush=True)
        if warmed is None:
            warmed = warm_up(ds, qs_all)
            print(f"  warm-up (numba compile, first calls; not in any stage): {warmed:.1f} s",
                  flush=True)
        lsh, model = run_lshdist(ds, qsets, size_dir, truth, workers=2, model=None,
                                 learn_too=True)
        if largest:
            one, _ = run_lshdist(ds, qsets[:1], size_dir, truth, workers=1, model=model,
                                 learn_too=False)
            lsh["1 worker: query s"] = one[f"query {Qn} s"]
            lsh["1 worker: peak RSS GiB"] = one["peak RSS per worker GiB"]
            # segments sized to the workers (N / 2 rows, whole shards) instead of 100,000 rows
            per = run_lshdist(ds, qsets[:1], size_dir, truth, workers=2, model=model,
                              learn_too=False, segment_rows=-(-N // 2), tag="-per-worker")[0]
            lsh["segments per worker: index s"] = per["index s"]
            lsh["segments per worker: segments"] = per["segments"]
            lsh["segments per worker: query s"] = per[f"query {Qn} s"]
            lsh["segments per worker: recall@10"] = per[f"query {Qn} recall@10"]
            lsh["segments per worker: setting"] = per[f"query {Qn} setting"]
            shutil.rmtree(size_dir / "index-per-worker", ignore_errors=True)
        total = lsh["learn s"] + lsh["index s"] + lsh[f"query {Qn} s"]
        total_held = lsh["learn s"] + lsh["index s"] + lsh[f"query {Qn} s, segments held (as run)"]
        stage_rows.append({"N": N, "Q": Qn, **lsh, "learn + index + query s": total,
                           "learn + index + query s, segments held (as run)": total_held})
        print(f"  lshdist: {stage_rows[-1]}", flush=True)

        from lshdist.store.model import load_model

        metric, _ = load_model(model)
        learned = not bool(getattr(metric, "is_identity", False))
        Q_truth = np.ascontiguousarray(qs_all.read_row_set(np.asarray(truth["queries"])),
                                       np.float32)
        t_dask, idx = dask_scan(ds, Q_truth[:DASK_Q], 2)
        X = np.ascontiguousarray(ds.read_all(), np.float32)
        Z, Zq = (metric.transform(X), metric.transform(Q_truth)) if learned else (X, Q_truth)
        Z, Zq = np.ascontiguousarray(Z, np.float32), np.ascontiguousarray(Zq, np.float32)
        del X
        peers = faiss_peers(faiss, Z, Zq, truth["ids"], Qn, T)
        from lshdist.evaluation import recall_at_k

        peers.append({"system": "exact k-NN in plain Dask (2 workers)",
                      "setting": f"{DASK_Q} queries, x{Qn / DASK_Q:.0f}",
                      "recall@10": recall_at_k(idx, truth["ids"][:DASK_Q], K),
                      "build s": 0.0, "query s": t_dask * Qn / DASK_Q,
                      "total s": t_dask * Qn / DASK_Q})
        if hnsw is None:
            sub = Z[:60_000]  # the first variant: the original training images
            hnsw = hnsw_at(sub, Zq, truth["ids"] if len(sub) == N else
                           np.asarray(common.exact_knn_l2(sub, Zq, K)[1], np.int64), T)
        n0 = hnsw["n"]
        f_build = (N * math.log(N)) / (n0 * math.log(n0))
        f_query = math.log(N) / math.log(n0)
        measured = n0 == N
        peers.append({"system": "hnswlib (M=16, efC=200)" + ("" if measured else
                                                             ", extrapolated"),
                      "setting": (f"ef={hnsw['ef']}" + ("" if measured else
                                                        f" (from N={n0:,})")),
                      "recall@10": hnsw["recall@10"] if measured else None,
                      "build s": hnsw["build s"] * f_build,
                      "query s": hnsw["query s per query"] * Qn * f_query,
                      "total s": hnsw["build s"] * f_build
                      + hnsw["query s per query"] * Qn * f_query})
        del Z
        lsh_row = {"system": "lshdist, 2 Dask workers (learn + index + query)",
                   "setting": f"{lsh['segments']} segments; {lsh[f'query {Qn} setting']}",
                   "recall@10": lsh[f"query {Qn} recall@10"], "build s": lsh["learn s"]
                   + lsh["index s"], "query s": lsh[f"query {Qn} s"], "total s": total}
        held_row = {"system": "lshdist run (segments held; 2 Dask workers)",
                    "setting": f"{lsh['segments']} segments; {lsh[f'query {Qn} setting']}",
                    "recall@10": lsh.get(f"query {Qn} recall@10, segments held"),
                    "build s": lsh["learn s"] + lsh["index s"],
                    "query s": lsh[f"query {Qn} s, segments held (as run)"],
                    "total s": total_held}
        for r in [held_row, lsh_row, *peers]:
            r["N"], r["Q"] = N, Qn
            r["peer / lshdist"] = r["total s"] / total
            r["peer / lshdist as run"] = r["total s"] / total_held
            rows.append(r)
            print("  ", {k: (round(x, 3) if isinstance(x, float) else x)
                         for k, x in r.items()}, flush=True)
        common.write_results(
            os.environ.get("BENCH_NAME", "scale_fashion"),
            {"Systems by size (k=10, target 0.9, 2 threads / 2 workers)": rows,
             "lshdist stages by size": stage_rows},
            title="Growth with N: shifted Fashion-MNIST, lshdist on 2 Dask workers vs peers",
            notes=["See benchmarks/bench_scale.py's docstring for what is measured, scaled "
                   "and extrapolated.", "Spark MLlib: not measured (pyspark is not installed "
                   "here)."],
            peer_modules=("faiss", "hnswlib", "distributed", "dask"),
            extra={"hnsw": hnsw, "elapsed s": time.perf_counter() - t_start,
                   "warm-up s (numba compile, not in any stage)": warmed})
        if not largest:
            shutil.rmtree(size_dir / "index", ignore_errors=True)
    plot(rows, stage_rows)
    print(common.md_table(rows))
    print(common.md_table(stage_rows))


def plot(rows: list[dict], stages: list[dict] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        label = r["system"].split(" (")[0].split(",")[0]
        series.setdefault(label, []).append((r["N"], r["total s"]))
    for label, pts in series.items():
        pts = sorted(pts)
        ax.loglog([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    if stages:  # lshdist without the fixed-cost metric learning
        pts = sorted((s["N"], s["learn + index + query s"] - s["learn s"]) for s in stages)
        ax.loglog([p[0] for p in pts], [p[1] for p in pts], "o--", color="C0",
                  label="lshdist, index + query only")
    ax.set_xlabel("database rows N (queries Q = N/10)")
    ax.set_ylabel("end-to-end seconds")
    ax.set_title("shifted Fashion-MNIST, k=10, recall 0.9, 2 cores\n"
                 "(hnswlib beyond 60,000 rows extrapolated from its 60,000-row build)",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    # a run under another BENCH_NAME (a subset of the sizes) plots beside its tables, never over
    # the four-size plot the README shows
    fig.savefig(common.RESULTS_DIR / f"{os.environ.get('BENCH_NAME', 'scale_fashion')}.png",
                dpi=110)


def replot() -> None:
    """Redraw the plot from ``results/scale_fashion.json`` (``--plot-only``)."""
    import json

    d = json.loads((common.RESULTS_DIR / "scale_fashion.json").read_text())
    tables = d["tables"]
    plot(tables["Systems by size (k=10, target 0.9, 2 threads / 2 workers)"],
         tables["lshdist stages by size"])


if __name__ == "__main__":
    os.environ.setdefault("LSHDIST_DATA_DIR", str(common.data_dir()))
    main()
