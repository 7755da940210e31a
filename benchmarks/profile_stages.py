"""Where a distributed index and query spend their time, stage by stage, beside each stage's
floor on this machine (a diagnostic, not a comparison — no peers).

1. **Floors of this machine**, measured here on one core (threadpoolctl pins BLAS to 1 thread):
   float32 GEMM GFLOP/s (the hashing's shape), float64 GEMM GFLOP/s (the learned transform's),
   memory copy GB/s (numpy copy of 256 MiB), sha256 GB/s, and disk write GB/s (512 MiB written
   and fsync'ed under ``WORK``).  Reads come from the page cache (the datasets were just
   written or read): a read's floor is its bytes at the memory copy rate.
2. **One segment replayed in this process, on one core**: the steps of the workers' tasks
   timed apart — read the rows (`Dataset.read_rows`), hash (`hash_rows`), re-rank payload
   (`make_payload`), lists (`PermutationIndex.fit`), truncate to the kept lists + compact
   payload, sha256 of the stored arrays, Zarr write (`write_segment` minus its checksums);
   median of ``REPEATS``.  They split the cluster's per-task core-seconds (step 3) into stages.
3. **The distributed job**: index (`plan_build` + `run_build`, calibrated on the queries, as
   `lshdist run`) and query (`plan_query` + `run_query`, segments held in memory) on a 2-worker
   LocalCluster, Dask's task stream summed per task kind (core-seconds; fetched inputs), the
   wall time of each stage.  Overheads = 2 x wall - the core-seconds of the tasks (the cores'
   idle time: scheduling, task round trips, serialisation, waits on the driver).
4. **The table**: per stage its core-seconds, its floor in core-seconds (flops at the GEMM rate,
   bytes at the memory / disk / sha256 rate), and the ratio; written to
   ``benchmarks/results/<BENCH_NAME>.json`` / ``.md``.

    cd /work/main && .venv/bin/python benchmarks/profile_stages.py \\
        [DATA (out/bench-distributed-run/train)] [QUERIES (out/bench-distributed-run/test)] \\
        [WORK (out/profile)] [MODEL (WORK/model; learned with LearnConfig defaults if absent)]

``BENCH_SEGMENT_ROWS``: the index's segment_rows (default IndexConfig's; 30000 is
`configs/fashion-mnist.yaml`'s); ``BENCH_NAME``: the results' name (default stages_<N/1000>k).
``BENCH_INDEX_ONLY=1``: the index stage alone (no floors, query or replay; nothing written):
its wall, task core-seconds and the calibration's, one JSON line — for paired runs of two
checkouts (``PYTHONPATH=<checkout>``; the workers inherit it).
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import collections
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
#: the index job's calibration tasks (their core-seconds are the calibration stage's)
CAL_KINDS = ("calibration_sample", "segment_neighbours", "segment_grid", "calibrate_segment")


def med(fn, repeats: int = REPEATS):
    """``(median seconds, last result)`` of ``repeats`` calls, no warm-up (`common.timed`)."""
    return common.timed(fn, repeats, warmup=0)


def machine_floors(work: Path) -> dict:
    """One core's rates: GEMM (float32, float64), memory copy, sha256, disk write."""
    rng = np.random.default_rng(0)
    out = {}
    with threadpool_limits(1):
        for dt, key in ((np.float32, "gemm32 GFLOP/s"), (np.float64, "gemm64 GFLOP/s")):
            A = rng.standard_normal((8192, 784)).astype(dt)
            B = rng.standard_normal((784, 512)).astype(dt)
            t, _ = med(lambda A=A, B=B: A @ B)
            out[key] = 2 * A.shape[0] * 784 * 512 / t / 1e9
    src = np.ones(2**28, np.uint8)
    dst = np.empty_like(src)
    t, _ = med(lambda: np.copyto(dst, src))
    out["memcopy GB/s"] = src.nbytes / t / 1e9  # bytes copied (each read once, written once)
    t, _ = med(lambda: hashlib.sha256(src.data).digest())
    out["sha256 GB/s"] = src.nbytes / t / 1e9
    path = work / "disk-probe.bin"

    def write():
        with open(path, "wb") as f:
            f.write(src.data)
            f.write(src.data)
            f.flush()
            os.fsync(f.fileno())
    t, _ = med(write)
    out["disk write GB/s"] = 2 * src.nbytes / t / 1e9
    path.unlink()
    return out


def replay_segment(data: str, model: str, rows: int, lists_kept: int, seed: int = 0) -> dict:
    """The steps of `fit_segment` and `write_fitted` on the first ``rows`` rows, one core."""
    from lshdist.blocks import as_block
    from lshdist.cluster.tasks import load_family
    from lshdist.config import IndexConfig
    from lshdist.index.metric_payload import make_payload
    from lshdist.index.permutation import PermutationIndex
    from lshdist.index.searcher import calibrated_lists, hash_rows, kernel_values, permutation_seed
    from lshdist.store.dataset import Dataset
    from lshdist.store.index import write_segment
    from lshdist.store.model import array_checksum, read_model_meta

    cfg = IndexConfig()
    family = load_family(model, cfg.key_bits(read_model_meta(model)["kind"] == "explicit"),
                         cfg.seed, True)
    metric = family.metric
    ds = Dataset(data)
    tmp = Path(model).parent / "replay-index"
    t = {}
    with threadpool_limits(1):
        t["read"], X = med(lambda: ds.read_rows(0, rows))
        B = metric.check(as_block(X))
        kx = kernel_values(metric, B)
        t["hash"], codes = med(lambda: hash_rows(family, B, kx, 1))
        t["payload"], payload = med(lambda: make_payload(metric, B, kx=kx))
        ids = ds.ids()[:rows]

        def fit():
            m = calibrated_lists(rows, n_permutations=None, epsilon=None)  # as plan_build
            ix = PermutationIndex(n_permutations=m, epsilon=None, seed=permutation_seed(seed))
            return ix.fit(codes, family.bits, payload, ids)
        t["lists"], index = med(fit)
        t["truncate + compact"], kept = med(lambda: index.truncated(
            min(lists_kept, index.n_permutations_)))
        arrays = {"ids": kept.ids_, "codes": kept.codes_, "positions": kept.positions_,
                  "sorted_rows": kept.sorted_rows_, **{f"payload/{k}": v for k, v in
                                                      kept.payload_.arrays().items()}}
        t["checksums"], _ = med(lambda: [array_checksum(a) for a in arrays.values()])

        def write():
            if tmp.exists():
                shutil.rmtree(tmp)
            (tmp / "segments").mkdir(parents=True)
            write_segment(str(tmp), "seg-" + "0" * 16, kept)
        t["write + checksums"], _ = med(write)
        disk = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
        shutil.rmtree(tmp)
    return {"times": t, "rows": rows, "d": int(X.shape[1]), "bits": family.bits,
            "lists built": int(index.n_permutations_), "lists kept": int(kept.n_permutations_),
            "array bytes": int(sum(a.nbytes for a in arrays.values())), "disk bytes": disk,
            "payload bytes": int(sum(v.nbytes for v in kept.payload_.arrays().values())),
            "identity metric": bool(getattr(metric, "is_identity", False))}


def per_kind(stream: list[dict]) -> dict:
    """Core-seconds, task count and fetched-input seconds per task kind (the key's prefix)."""
    per: dict = collections.defaultdict(lambda: {"core s": 0.0, "tasks": 0, "fetch s": 0.0})
    for t in stream:
        key = t["key"][0] if isinstance(t["key"], tuple) else t["key"]
        name = str(key).split("-", 1)[0]
        for s in t["startstops"]:
            if s["action"] == "compute":
                per[name]["core s"] += s["stop"] - s["start"]
            elif s["action"] == "transfer":
                per[name]["fetch s"] += s["stop"] - s["start"]
        per[name]["tasks"] += 1
    return dict(per)


def main() -> None:
    from distributed import get_task_stream

    from lshdist.cluster.pipeline import plan_build, plan_query, run_build, run_query
    from lshdist.config import ClusterConfig, IndexConfig, LearnConfig, QueryConfig
    from lshdist.jobs.common import client_from_config
    from lshdist.jobs.learn import learn
    from lshdist.store.dataset import Dataset
    from lshdist.store.model import save_model
    from lshdist.store.results import read_results

    args = sys.argv[1:]
    data = Path(args[0]) if args else ROOT / "out" / "bench-distributed-run" / "train"
    queries = Path(args[1]) if len(args) > 1 else ROOT / "out" / "bench-distributed-run" / "test"
    work = Path(args[2]) if len(args) > 2 else ROOT / "out" / "profile"
    work.mkdir(parents=True, exist_ok=True)
    model = Path(args[3]) if len(args) > 3 else work / "model"
    ds, qs = Dataset(data), Dataset(queries)
    N, Q, d = ds.n, qs.n, ds.d
    t_learn = None
    if not model.exists():
        t0 = time.perf_counter()
        metric, params, _ = learn(ds, LearnConfig())
        save_model(model, metric, params=params, seed=0)
        t_learn = time.perf_counter() - t0
        print(f"learn {t_learn:.1f} s ({params.get('selected')})", flush=True)
    print(f"{N:,} x {Q:,} x {d}; load {common.loadavg()}", flush=True)
    index_only = os.environ.get("BENCH_INDEX_ONLY") == "1"
    fl = {} if index_only else machine_floors(work)
    print("one core:", {k: round(v, 2) for k, v in fl.items()}, flush=True)

    cfg_i = dataclasses.replace(IndexConfig(), calibration_queries=str(qs.path))
    if os.environ.get("BENCH_SEGMENT_ROWS"):  # e.g. 30000, as configs/fashion-mnist.yaml
        cfg_i = dataclasses.replace(cfg_i, segment_rows=int(os.environ["BENCH_SEGMENT_ROWS"]))
    with client_from_config(ClusterConfig(workers=2)) as client:
        index, res = work / "index", work / "results"
        held: list = []
        load_b = common.loadavg()
        t0 = time.perf_counter()
        with get_task_stream(client) as ts:
            plan = plan_build(data=str(ds.path), model=str(model), out=str(index), cfg=cfg_i,
                              overwrite=index.exists())
            built = run_build(client, plan, hold=held)
            manifest = built.to_json() if hasattr(built, "to_json") else built
        wall_b = time.perf_counter() - t0
        kinds_b = per_kind(ts.data)
        cal = manifest.get("calibration") or {}
        print(f"index {wall_b:.1f} s (load {load_b}): {len(manifest['segments'])} segments, "
              f"M={manifest['permutations']}; calibration {cal.get('seconds')} s: "
              f"{cal.get('reason')}", flush=True)
        if index_only:
            client.cancel(held)
            import lshdist
            line = {"lshdist": str(Path(lshdist.__file__).parent), "N": N, "wall s": wall_b,
                    "load": load_b, "task core s": sum(v["core s"] for v in kinds_b.values()),
                    "calibration core s": sum(kinds_b.get(k, {}).get("core s", 0.0)
                                              for k in CAL_KINDS),
                    **{f"{k} core s": kinds_b.get(k, {}).get("core s", 0.0) for k in CAL_KINDS}}
            print("INDEX_ONLY " + json.dumps(line), flush=True)
            return
        load_q = common.loadavg()
        t0 = time.perf_counter()
        with get_task_stream(client) as ts:
            qp = plan_query(index=str(index), queries=str(qs.path), out=str(res),
                            cfg=QueryConfig(), overwrite=res.exists())
            info = run_query(client, qp, segments=held)
        wall_q = time.perf_counter() - t0
        kinds_q = per_kind(ts.data)
        print(f"query {wall_q:.1f} s (load {load_q}): {info['mode']} {info['operating_point']}",
              flush=True)
        client.cancel(held)
    _, _, _, cand = read_results(res, qs.ids())
    for name, kinds in (("index", kinds_b), ("query", kinds_q)):
        for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]["core s"]):
            print(f"  {name} {k:28s} {v['core s']:7.2f} core-s {v['tasks']:4d} tasks "
                  f"fetch {v['fetch s']:.2f} s", flush=True)

    seg_rows = int(manifest["segments"][0]["rows"])
    rep = replay_segment(str(ds.path), str(model), seg_rows, int(manifest["permutations"]))
    rt = rep["times"]
    print("replay of one segment, one core:", {k: round(v, 3) for k, v in rt.items()},
          {k: v for k, v in rep.items() if k != "times"}, flush=True)

    g32, g64 = fl["gemm32 GFLOP/s"] * 1e9, fl["gemm64 GFLOP/s"] * 1e9
    mem, sha, disk = (fl["memcopy GB/s"] * 1e9, fl["sha256 GB/s"] * 1e9,
                      fl["disk write GB/s"] * 1e9)
    b, M_built, M_kept = rep["bits"], rep["lists built"], rep["lists kept"]

    def core(kinds, *names):
        return sum(kinds.get(n, {}).get("core s", 0.0) for n in names)

    # the fit task = read + hash + payload + lists, split by the replay's shares
    fit = core(kinds_b, "fit_segment")
    parts = ("read", "hash", "payload", "lists")
    share = {p: rt[p] / sum(rt[p] for p in parts) for p in parts}
    write = core(kinds_b, "write_fitted")
    ck_share = rt["checksums"] / rt["write + checksums"]
    cal_kinds = CAL_KINDS
    calib = core(kinds_b, *cal_kinds)
    keep = core(kinds_b, "truncated")
    tasks_b = sum(v["core s"] for v in kinds_b.values())
    # the exact truth covers the whole calibration sample in every segment (its
    # `segment_neighbours` tasks), not only the queries the calibration record counts
    # (``n_queries``: the ones its grid used -- 200 of 1,000 at 480k)
    from lshdist.index.calibrate import query_sample_size
    n_cal_q = query_sample_size(Q)
    disk_total = rep["disk bytes"] * N / seg_rows
    arr_total = rep["array bytes"] * N / seg_rows
    other_b = tasks_b - fit - write - calib - keep
    rows_b = [
        {"stage": "read (page cache)", "core s": fit * share["read"],
         "floor core s": N * d * 4 / mem, "floor from": f"{N * d * 4 / 1e9:.2f} GB at memcopy"},
        {"stage": "hash", "core s": fit * share["hash"], "floor core s": 2 * N * d * b / g32,
         "floor from": f"2·N·d·b = {2 * N * d * b / 1e12:.3f} TFlop at gemm32"},
        {"stage": "re-rank payload" + (" (identity: a copy)" if rep["identity metric"]
                                       else " (Gx)"),
         "core s": fit * share["payload"],
         "floor core s": (N * d * 4 / mem if rep["identity metric"]
                          else 2 * N * d * d / g64),
         "floor from": "N·d·4 B at memcopy" if rep["identity metric"] else "2·N·d² at gemm64"},
        {"stage": f"lists ({M_built} built, {M_kept} kept)", "core s": fit * share["lists"],
         "floor core s": M_kept * N * 12 / mem,
         "floor from": f"kept lists' prefix + order written once: {M_kept}·N·12 B at memcopy"},
        {"stage": "calibration (on the queries)", "core s": calib,
         "floor core s": 2 * n_cal_q * N * d / g32,
         "floor from": f"exact truth of its {n_cal_q:,} sample queries: 2·q·N·d at gemm32"},
        {"stage": "write (Zarr)", "core s": write * (1 - ck_share),
         "floor core s": disk_total / disk,
         "floor from": f"{disk_total / 1e9:.2f} GB at disk write (fsync)"},
        {"stage": "checksums (sha256)", "core s": write * ck_share,
         "floor core s": arr_total / sha, "floor from": f"{arr_total / 1e9:.2f} GB at sha256"},
        {"stage": "keep in memory (truncate + compact)", "core s": keep, "floor core s": 0.0,
         "floor from": "views; 0"},
        {"stage": "other tasks (" + ", ".join(sorted(k for k in kinds_b if k not in (
            "fit_segment", "write_fitted", "truncated", *cal_kinds))) + ")",
         "core s": other_b, "floor core s": 0.0, "floor from": "–"},
        {"stage": "task + transfer overheads (idle cores: 2·wall − task core-s)",
         "core s": 2 * wall_b - tasks_b, "floor core s": 0.0,
         "floor from": f"{sum(v['tasks'] for v in kinds_b.values())} tasks; "
                       f"inputs fetched {sum(v['fetch s'] for v in kinds_b.values()):.2f} s"},
    ]
    searched = float(cand.mean())
    enc_q = core(kinds_q, "encode_queries", "encode_query_rows")
    search_q = core(kinds_q, "search_segment")
    merge_q = core(kinds_q, "merge_partials", "merge_and_write")
    cal_q = core(kinds_q, *cal_kinds, "calibrate_on_queries")
    tasks_q = sum(v["core s"] for v in kinds_q.values())
    rows_q = [
        {"stage": "encode queries (read + hash + payload)", "core s": enc_q,
         "floor core s": 2 * Q * d * b / g32 + Q * d * 4 / mem,
         "floor from": "2·Q·d·b at gemm32 + Q·d·4 B"},
        {"stage": f"search (lists + re-rank of {searched:,.0f} candidates a query)",
         "core s": search_q, "floor core s": Q * searched * d / mem,
         "floor from": "the candidates' uint8 rows read once (Q·cand·d B at memcopy)"},
        {"stage": "merge + write results", "core s": merge_q,
         "floor core s": Q * 10 * 24 / disk, "floor from": "Q·k·24 B at disk write"},
        {"stage": "calibration at query time", "core s": cal_q, "floor core s": 0.0,
         "floor from": "0 (the index's calibration on these queries stands)"},
        {"stage": "other tasks (" + ", ".join(sorted(k for k in kinds_q if k not in (
            "encode_queries", "encode_query_rows", "search_segment", "merge_partials",
            "merge_and_write", "calibrate_on_queries", *cal_kinds))) + ")",
         "core s": tasks_q - enc_q - search_q - merge_q - cal_q, "floor core s": 0.0,
         "floor from": "–"},
        {"stage": "task + transfer overheads (idle cores: 2·wall − task core-s)",
         "core s": 2 * wall_q - tasks_q, "floor core s": 0.0,
         "floor from": f"{sum(v['tasks'] for v in kinds_q.values())} tasks; "
                       f"inputs fetched {sum(v['fetch s'] for v in kinds_q.values()):.2f} s"},
    ]
    for r in rows_b + rows_q:
        r["core s / floor"] = (r["core s"] / r["floor core s"] if r["floor core s"] > 0
                               else None)
    head = [{"stage": "index", "wall s": wall_b, "2·wall core s": 2 * wall_b,
             "task core s": tasks_b, "load at start": load_b[0] if load_b else None},
            {"stage": "query", "wall s": wall_q, "2·wall core s": 2 * wall_q,
             "task core s": tasks_q, "load at start": load_q[0] if load_q else None}]
    if t_learn is not None:
        head.insert(0, {"stage": "learn (driver, LearnConfig defaults)", "wall s": t_learn})
    tasks = [{"job": job, "task kind": k, **v} for job, kinds in (("index", kinds_b),
                                                                  ("query", kinds_q))
             for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]["core s"])]
    replay = [{"step": k, "s (one core)": v} for k, v in rt.items()]
    print(common.md_table(head))
    print(common.md_table(rows_b))
    print(common.md_table(rows_q))
    name = os.environ.get("BENCH_NAME", f"stages_{N // 1000}k")
    common.write_results(
        name, {"Wall": head, "Index stage by stage (core-seconds)": rows_b,
               "Query stage by stage (core-seconds)": rows_q,
               "One core's floors": [dict(fl)],
               "Task stream per kind": tasks, "One segment replayed on one core": replay},
        title=f"Stages of the distributed index and query, {N:,} x {Q:,}, beside their floors",
        notes=[f"segments: {len(manifest['segments'])} of ~{seg_rows:,} rows; M built "
               f"{M_built}, kept {M_kept}; W {manifest['window']}, H "
               f"{manifest['hamming_keep']}; calibration {cal.get('seconds')} s wall, "
               f"{cal.get('reason')}",
               f"query mode {info['mode']}, operating point {info['operating_point']}; "
               f"candidates a query {searched:,.0f} ({100 * searched / N:.2f} % of N)",
               "fit_segment's core-seconds are split into read / hash / payload / lists by the "
               "one-core replay's shares; write_fitted's into write / checksums likewise.",
               f"replay: {rep}"],
        extra={"replay": rep, "floors": fl, "kinds_index": kinds_b, "kinds_query": kinds_q,
               "calibration": cal})


if __name__ == "__main__":
    main()
