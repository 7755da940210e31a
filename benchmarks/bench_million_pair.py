"""The million-row comparison in paired rounds: lshdist index + query on 2 Dask workers against
FAISS IVFFlat's best train + add + search, both over all 100,000 queries.

Data: `make_million.py`'s 1,020,000 x 784 database and 100,000 queries (``out/million-fashion``;
made if absent), recall@10 on its stored exact truth (2,000 sampled queries).  The model is the
one `bench_scale.py` learned at this size (``out/scale/n1020000/model``; ``BENCH_MODEL`` names
another); its transform is what the peers search (`Gx`: the rows themselves when the learning
kept the prior).

* lshdist, as ``lshdist run`` runs it: ``plan_build`` + ``plan_following_query`` +
  ``build_and_query``: the build with IndexConfig defaults calibrated on the query set (target
  recall 0.9), the segments held in worker memory, and the query (QueryConfig defaults: mode
  auto, the recall check) started once the build is calibrated, while the segments are
  written; total = both, start to end; on one 2-worker LocalCluster started once (start-up
  reported apart).
* FAISS ``IVFFlat`` on 2 threads: nlist in (1, 2) x sqrt(N), trained on 40 rows per list;
  nprobe swept once on the truth queries; in every round the ``BENCH_IVF_CANDIDATES``
  (default 2) cheapest settings (by the sweep's build + search scaled to 100,000 queries)
  reaching recall 0.9 are built and searched with all queries, and the round's IVF total is
  the fastest of them that reached 0.9 on the truth queries.

Rounds alternate the order (`common.paired_rounds`); the ratio is IVF / lshdist per round.
Numba's default cache (``BENCH_NUMBA_CACHE=default`` is set here: a user's second run; a fresh
cache would compile in the first round).

    cd /work/main && .venv/bin/python benchmarks/bench_million_pair.py

``BENCH_ROUNDS`` (default 3), ``BENCH_WARMUP`` (default 0), ``BENCH_NAME`` (default
``million_pair``).
"""

import os

os.environ.setdefault("BENCH_NUMBA_CACHE", "default")

import common  # noqa: I001  (first: pins threads before numpy loads)

import math
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "out" / "million-fashion"
MODEL = Path(os.environ.get("BENCH_MODEL", ROOT / "out" / "scale" / "n1020000" / "model"))
WORK = ROOT / "out" / "bench-million-pair"
K, TARGET = 10, 0.9
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "0"))
NPROBES = [1, 2, 4, 8, 16]
IVF_FACTORS = (1, 2)
IVF_CANDIDATES = int(os.environ.get("BENCH_IVF_CANDIDATES", "2"))


def main() -> None:
    import faiss
    import make_million

    from lshdist.cluster.pipeline import build_and_query, plan_build, plan_following_query
    from lshdist.config import ClusterConfig, IndexConfig, QueryConfig
    from lshdist.evaluation import recall_at_k
    from lshdist.jobs.common import client_from_config
    from lshdist.store.model import load_model
    from lshdist.store.results import read_results

    T = common.N_THREADS
    pinned = common.pin_threads(T)
    ds, qs, truth = make_million.make(DATA)
    if not MODEL.exists():
        raise SystemExit(f"no model at {MODEL}: run bench_scale.py --sizes 17 first, or set "
                         "BENCH_MODEL")
    WORK.mkdir(parents=True, exist_ok=True)
    qids = qs.ids()
    t_ids = np.asarray(qids[np.asarray(truth["queries"])], np.int64)
    t_nb = np.asarray(truth["ids"], np.int64)
    print(f"{ds.n:,} x {qs.n:,}; threads {pinned}; load {common.loadavg()}", flush=True)

    # ------------------------------------------------ the peers' input: Gx, all of it
    metric, _ = load_model(MODEL)
    t0 = time.perf_counter()
    Z = np.ascontiguousarray(metric.transform(ds.read_all()), np.float32)
    Zq = np.ascontiguousarray(metric.transform(qs.read_all()), np.float32)
    t_read = time.perf_counter() - t0
    db_ids = ds.ids()
    N = len(Z)
    Zt = Zq[np.asarray(truth["queries"])]
    print(f"Gx read and transformed in {t_read:.1f} s", flush=True)

    def rec_rows(rows_found: np.ndarray, which: np.ndarray) -> float:
        return recall_at_k(np.asarray(db_ids[rows_found], np.int64), t_nb[which], K)

    order = np.random.default_rng(0).permutation(N)

    def ivf_build(nlist: int):
        return common.ivf_flat(faiss, Z, nlist, order)

    sweep = []
    for f in IVF_FACTORS:
        nlist = int(f * math.sqrt(N))
        t0 = time.perf_counter()
        ix = ivf_build(nlist)
        tb = time.perf_counter() - t0
        for nprobe in NPROBES:
            ix.nprobe = nprobe
            t0 = time.perf_counter()
            _, rows = ix.search(Zt, K)
            ts = time.perf_counter() - t0
            r = rec_rows(rows, np.arange(len(Zt)))
            est = tb + ts * len(Zq) / len(Zt)
            sweep.append({"nlist": nlist, "nprobe": nprobe, "recall@10": r,
                          "train+add s": tb, "sample search s": ts, "estimated total s": est})
            print(f"IVFFlat nlist={nlist} nprobe={nprobe}: recall {r:.4f} on the truth "
                  f"sample, train+add {tb:.1f} s, estimated total {est:.1f} s", flush=True)
            if r >= 0.99:
                break
        del ix
    ok = sorted((s for s in sweep if s["recall@10"] >= TARGET),
                key=lambda s: s["estimated total s"])
    if not ok:
        raise SystemExit("no IVFFlat setting of the sweep reached recall 0.9")
    # the sweep times each setting once: a noisy sample search can make a setting look
    # dearer than it is, so every round runs the cheapest few and keeps the fastest that
    # reaches the target (IVF's best total, not the one setting the sweep happened to favour)
    cands = sorted(ok[:IVF_CANDIDATES], key=lambda s: (s["nlist"], s["nprobe"]))

    def ivf_round() -> dict:
        best, last, built = None, None, None
        for c in cands:
            nlist, nprobe = c["nlist"], c["nprobe"]
            if built is None or built[0] != nlist:  # one build per nlist (grouped above)
                built = None
                t0 = time.perf_counter()
                built = (nlist, ivf_build(nlist), time.perf_counter() - t0)
            _, ix, tb = built
            ix.nprobe = nprobe
            t0 = time.perf_counter()
            _, rows = ix.search(Zq, K)
            tq = time.perf_counter() - t0
            r = rec_rows(rows[np.asarray(truth["queries"])], np.arange(len(t_ids)))
            last = {"build s": tb, "query s": tq, "total s": tb + tq, "recall@10": r,
                    "setting": f"nlist={nlist}, nprobe={nprobe}"}
            if r >= TARGET and (best is None or last["total s"] < best["total s"]):
                best = last
        del built
        return best if best is not None else last

    # ------------------------------------------------ lshdist on one 2-worker cluster
    index, results = WORK / "index", WORK / "results"
    icfg = IndexConfig(calibration_queries=str(qs.path))
    qcfg = QueryConfig(k=K)
    t0 = time.perf_counter()
    with client_from_config(ClusterConfig(workers=2)) as client:
        t_cluster = time.perf_counter() - t0
        print(f"cluster up in {t_cluster:.1f} s", flush=True)

        def lsh_round() -> dict:
            t0 = time.perf_counter()
            plan = plan_build(data=str(ds.path), model=str(MODEL), out=str(index), cfg=icfg,
                              overwrite=index.exists())
            search = plan_following_query(plan, queries=str(qs.path), out=str(results),
                                          cfg=qcfg, overwrite=results.exists())
            held: list = []
            # as `lshdist run`: the query starts once the build is calibrated, while the
            # segments are written (build s and query s overlap; total = both)
            built, info, secs = build_and_query(client, plan, search, stall=3600, hold=held)
            total = time.perf_counter() - t0
            tb, tq = secs["index"], secs["query"]
            client.cancel(held)
            qid, nb, _, _ = read_results(results, qids)
            pos = np.searchsorted(np.asarray(qid), t_ids)
            r = recall_at_k(np.asarray(nb[pos], np.int64), t_nb, K)
            op = info["operating_point"]
            mr = info.get("measured_recall") or {}
            return {"build s": tb, "query s": tq, "total s": total, "recall@10": r,
                    "mode": info["mode"], "segments": len(built.segments),
                    "setting": (f"M={op[0]}, W={op[1]}, H={op[2]}" if op else "scan"),
                    "measured recall": mr.get("value") if isinstance(mr, dict) else None}

        paired = common.paired_rounds({"lshdist": lsh_round, "ivf": ivf_round}, "lshdist",
                                      ROUNDS, WARMUP)
    summary = common.paired_summary(paired["runs"], "lshdist")
    name = os.environ.get("BENCH_NAME", "million_pair")
    labels = {"lshdist": "lshdist index + query, 2 Dask workers (segments held)",
              "ivf": "FAISS IVFFlat on Gx, 2 threads, best at recall >= 0.9"}
    table = []
    for sysname, label in labels.items():
        s = summary[sysname]
        runs = [r[sysname] for r in paired["runs"]]
        table.append({"system": label, "setting": runs[-1].get("setting", ""),
                      "recall@10": s["recall@10"], "build s": s["build s"],
                      "query s": s["query s"], "total s": s["total s"],
                      "peer / lshdist (median [min–max])":
                          "1" if sysname == "lshdist" else common.fmt_ratio(s),
                      "runs total s": ", ".join(f"{r['total s']:.1f}" for r in runs)})
    rounds = [{"round": i + 1, "system": n, "build s": r["build s"], "query s": r["query s"],
               "total s": r["total s"], "recall@10": r["recall@10"], "load": r["load"],
               "notes": (f"{r['mode']}, {r['setting']}, {r['segments']} segments, the job's "
                         f"own recall check {r['measured recall']}" if n == "lshdist"
                         else r["setting"])}
              for i, rnd in enumerate(paired["runs"]) for n, r in rnd.items()]
    notes = [f"Cluster start-up ({t_cluster:.1f} s) and the peers' read + transform of Gx "
             f"({t_read:.1f} s) are in no total.",
             f"{ROUNDS} rounds (+{WARMUP} warm-up), order alternated; numba's default cache."]
    j, m = common.write_results(
        name, {"Summary (1,020,000 x 100,000, k=10, target 0.9)": table,
               "IVFFlat sweep (truth sample; search scaled to all queries)": sweep,
               "Rounds": rounds},
        title="lshdist vs FAISS IVFFlat at a million rows, paired rounds", notes=notes,
        peer_modules=("faiss", "distributed"), extra={"paired": paired, "summary": summary})
    print(f"wrote {j} and {m}")
    print(common.md_table(table))

if __name__ == "__main__":
    main()
