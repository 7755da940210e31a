"""The key length b end to end: index + query at two values of ``--bits``, paired and alternated.

Hashing costs 2 d b flops a row (database and queries); more bits make the Hamming cut
sharper, so a query re-ranks fewer rows for the same recall.  Which b makes a job faster
depends on how many queries share one build, so this measures whole jobs: on one warm
2-worker LocalCluster, the build and the query that follows it (`build_and_query`, as
`lshdist run` runs them: target recall 0.9, M, W and H calibrated on the queries), at
``BENCH_BITS_A`` (512) and ``BENCH_BITS_B`` (256) in alternating order, ``BENCH_ROUNDS``
pairs after one unmeasured job at each.  Reported per b: the median total, index and query
seconds, the operating point the calibration chose, the job's measured recall; and the
per-pair ratio A / B (median [min-max]).

``BENCH_DATA``:

- ``fashion``, ``letter``, ``news``: the datasets and model of ``lshdist run
  configs/fashion-mnist.yaml`` (``letter.yaml``, ``20newsgroups.yaml``) in its work directory
  (run it once first), with the config's segments;
- ``shifted``: `make_shifted.py`'s 240,000 x 10,000 (made if absent), default segments;
- ``million``: `make_million.py`'s 1,020,000 x 100,000 (``out/million-fashion``), default
  segments;

``shifted`` and ``million`` use the model `bench_scale.py` learned at 1 M rows
(``out/scale/n1020000/model``, ``BENCH_MODEL``: the metric selection kept the prior there).

    cd /work/main && BENCH_DATA=fashion .venv/bin/python benchmarks/bench_bits.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = os.environ.get("BENCH_DATA", "fashion")
A = int(os.environ.get("BENCH_BITS_A", "512"))
B = int(os.environ.get("BENCH_BITS_B", "256"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "4"))
MODEL = Path(os.environ.get("BENCH_MODEL", ROOT / "out" / "scale" / "n1020000" / "model"))
CONFIGS = {"fashion": "fashion-mnist", "letter": "letter", "news": "20newsgroups"}
WORK = ROOT / "out" / "bench-bits" / DATA


def _inputs():
    """(train path, test path, model path, IndexConfig without bits, QueryConfig)."""
    from lshdist.config import IndexConfig, QueryConfig, load_run_config
    from lshdist.jobs.run import ingest_split, run_index_config

    if DATA in CONFIGS:
        cfg = load_run_config(ROOT / "configs" / f"{CONFIGS[DATA]}.yaml")
        work = ROOT / cfg.workdir
        if not (work / "model").exists():
            raise SystemExit(f"no model in {work}: run `lshdist run configs/{CONFIGS[DATA]}.yaml`"
                             " once first")
        train = ingest_split(cfg.train, work / "train", None)
        test = ingest_split(cfg.test, work / "test", work / "train")
        return (str(train.path), str(test.path), str(work / "model"),
                run_index_config(cfg, test), cfg.query)
    if DATA == "shifted":
        import make_shifted

        ds, qs = make_shifted.make()
        data = (str(ds.path), str(qs.path))
    elif DATA == "million":
        data = (str(ROOT / "out" / "million-fashion" / "train"),
                str(ROOT / "out" / "million-fashion" / "test"))
        if not Path(data[0]).exists():
            raise SystemExit("no out/million-fashion: run benchmarks/make_million.py first")
    else:
        raise SystemExit(f"BENCH_DATA={DATA!r}: fashion, letter, news, shifted or million")
    if not MODEL.exists():
        raise SystemExit(f"no model at {MODEL}: run bench_scale.py --sizes 17 first, or set "
                         "BENCH_MODEL")
    return data[0], data[1], str(MODEL), IndexConfig(calibration_queries=data[1]), \
        QueryConfig(k=10)


def main():
    from lshdist.cluster.pipeline import build_and_query, plan_build, plan_following_query
    from lshdist.config import ClusterConfig
    from lshdist.jobs.common import client_from_config

    common.pin_threads(2)
    os.environ.setdefault("LSHDIST_DATA_DIR", str(common.data_dir()))
    WORK.mkdir(parents=True, exist_ok=True)
    train, test, model, icfg, qcfg = _inputs()
    index, results = WORK / "index", WORK / "results"
    runs = []
    with client_from_config(ClusterConfig(workers=2)) as client:
        def job(bits: int) -> dict:
            t0 = time.perf_counter()
            plan = plan_build(data=train, model=model, out=str(index),
                              cfg=dataclasses.replace(icfg, bits=bits), overwrite=index.exists())
            search = plan_following_query(plan, queries=test, out=str(results), cfg=qcfg,
                                          overwrite=results.exists())
            held: list = []
            _, info, secs = build_and_query(client, plan, search, stall=3600, hold=held)
            client.cancel(held)
            total = time.perf_counter() - t0
            m = json.loads((index / "index.json").read_text())
            rec = info.get("measured_recall") or {}
            return {"bits": bits, "total s": total, "index s": secs["index"],
                    "query s": secs["query"], "mode": (m.get("calibration") or {}).get("mode"),
                    "point (M, W, H)": f"{m['permutations']}, {m['window']}, "
                                       f"{m['hamming_keep']}",
                    "measured recall": rec.get("value"), "load": common.loadavg()}

        for bits in (A, B):  # one unmeasured job each: the cluster and the caches warm
            print("warm-up", job(bits), flush=True)
        for r in range(ROUNDS):
            for bits in ((A, B) if r % 2 == 0 else (B, A)):
                run = dict(job(bits), round=r + 1)
                runs.append(run)
                print(run, flush=True)
    ratios = []
    for r in range(1, ROUNDS + 1):
        t = {x["bits"]: x["total s"] for x in runs if x["round"] == r}
        ratios.append(t[A] / t[B])
    summary = []
    for bits in (A, B):
        mine = [x for x in runs if x["bits"] == bits]
        summary.append({
            "bits": bits, "point (M, W, H)": mine[-1]["point (M, W, H)"],
            "mode": mine[-1]["mode"], "measured recall": mine[-1]["measured recall"],
            **{f"{key} (median)": statistics.median(x[key] for x in mine)
               for key in ("index s", "query s", "total s")},
            f"{A} / this, per pair (median [min-max])":
                "1" if bits == A else
                f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}]"})
    for row in summary:
        print(row, flush=True)
    common.write_results(os.environ.get("BENCH_NAME", f"bits_{DATA}"),
                         {f"index + query at b = {A} and {B}": summary, "runs": runs},
                         title=f"The key length end to end ({DATA}): {A} against {B} bits, "
                               "paired and alternated on a warm 2-worker cluster")


if __name__ == "__main__":
    main()
