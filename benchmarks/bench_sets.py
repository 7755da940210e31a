"""Fashion-MNIST as sets of local features: PMK and PDK, unlearned and learned, scan and hash.

Everything runs through the ``lshdist`` command line, as a user would, with default settings
(only the choices a user makes are given: the features, the kernel, k):

1. ``lshdist ingest --features daisy`` of all 70,000 images (train and test IDX files) on a
   LocalCluster of 2 workers: seconds and bytes per set.
2. ``lshdist evaluate --kernel pmk|pdk`` with the first ``BENCH_DB`` (default 20,000) training
   images as the database and the 10,000 test images as queries (one process): k-NN accuracy
   for the unlearned kernel ("L2" rows of evaluate: ``S = 0`` over the same embedding) and the
   learned one (what metric selection kept), each by exact scan and hashed (calibrated to the
   default recall target 0.9), with recall against the scan and the fraction re-ranked.
3. ``lshdist learn`` + ``index`` + ``query`` of all 60,000 training sets with the PMK on the
   LocalCluster (2 workers): seconds per stage and bytes per indexed set, recall@10 of the
   hashed query against ``--mode scan``.
4. The plain pixel vectors on the same database and queries (exact L2 k-NN, numpy) for
   comparison with the README's pixel figures.

    cd /work/main && .venv/bin/python benchmarks/bench_sets.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from lshdist.datasets import load_fashion_mnist
from lshdist.store.dataset import Dataset
from lshdist.store.results import read_results

DB = int(os.environ.get("BENCH_DB", "20000"))
FEATURES = os.environ.get("BENCH_FEATURES", "daisy")
KERNELS = os.environ.get("BENCH_KERNELS", "pmk,pdk").split(",")
WORK = Path(os.environ.get("BENCH_WORK", "out/bench-sets"))
LSHDIST = str(Path(sys.executable).with_name("lshdist"))


def cli(*args: str) -> tuple[float, str]:
    """Run ``lshdist ARGS``; return (seconds, stdout); fail loudly."""
    t0 = time.perf_counter()
    p = subprocess.run([LSHDIST, *args], capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"lshdist {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return secs, p.stdout


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    f = common.data_dir() / "fashion-mnist"
    tr_img, tr_lab = f / "train-images-idx3-ubyte.gz", f / "train-labels-idx1-ubyte.gz"
    te_img, te_lab = f / "t10k-images-idx3-ubyte.gz", f / "t10k-labels-idx1-ubyte.gz"
    ingest, timings = [], []
    for name, files, rows in (("train", (tr_img, tr_lab), None), ("test", (te_img, te_lab), None),
                              (f"train{DB}", (tr_img, tr_lab), f"0:{DB}")):
        out = WORK / name
        args = ["ingest", *map(str, files), "--features", FEATURES, "--out", str(out),
                "--overwrite"] + (["--rows", rows] if rows else [])
        secs, text = cli(*args)
        ds = Dataset(out)
        ingest.append({"dataset": name, "sets": ds.n, "points": ds.nnz, "point dim": ds.d,
                       "seconds": round(secs, 1), "bytes/set": round(du(out) / ds.n)})
        print(text.strip(), flush=True)

    evals = []
    for kernel in KERNELS:
        out = WORK / f"eval-{kernel}"
        secs, text = cli("evaluate", "--train", str(WORK / f"train{DB}"), "--test",
                         str(WORK / "test"), "--kernel", kernel, "--k", "1,10", "--no-plots",
                         "--out", str(out), "--overwrite")
        print(text, flush=True)
        records = json.loads((out / "summary.json").read_text())
        learning = json.loads((out / "learning.json").read_text())
        name = kernel.upper()
        for r in records:
            setting = {"L2-scan": f"{name}-scan", "L2-hash": f"{name}-hash",
                       "ML-scan": f"learned-{name}-scan",
                       "ML-hash": f"learned-{name}-hash"}[r["setting"]]
            evals.append({"setting": setting, "k": r["k"],
                          "k-NN accuracy %": round(100 * r["knn_accuracy"], 2),
                          "recall@k vs its scan": round(r["recall_at_k"], 3),
                          "% re-ranked": round(100 * r["fraction_searched"], 2),
                          "speedup vs its scan": round(r["speedup"], 2),
                          "seconds": round(r["seconds"], 2),
                          "selected": learning.get("selected")})
        timings.append({"stage": f"evaluate {kernel} (learn + 2 scans + 2 hashed, one process)",
                        "seconds": round(secs, 1)})

    # the PMK on all 60,000 training sets on the LocalCluster
    model, index = WORK / "model-pmk", WORK / "index-pmk"
    secs, _ = cli("learn", "--data", str(WORK / "train"), "--kernel", "pmk", "--out", str(model),
                  "--overwrite")
    timings.append({"stage": "learn pmk (60k sets, 20k-set sample, selection)",
                    "seconds": round(secs, 1)})
    secs, _ = cli("index", "--data", str(WORK / "train"), "--model", str(model), "--out",
                  str(index), "--overwrite")
    timings.append({"stage": "index pmk (60k sets, LocalCluster 2 workers)",
                    "seconds": round(secs, 1), "bytes/set": round(du(index) / 60000)})
    for mode in ("scan", "auto"):
        secs, _ = cli("query", "--index", str(index), "--queries", str(WORK / "test"), "--k",
                      "10", "--mode", mode, "--out", str(WORK / f"res-{mode}"), "--overwrite")
        timings.append({"stage": f"query pmk, 10k queries, --mode {mode}",
                        "seconds": round(secs, 1)})
    qids = Dataset(WORK / "test").ids()
    _, exact, _, _ = read_results(WORK / "res-scan", qids)
    _, hashed, _, _ = read_results(WORK / "res-auto", qids)
    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in
                            zip(exact.reshape(-1, 10), hashed.reshape(-1, 10))]))
    timings.append({"stage": "recall@10 of --mode auto vs --mode scan", "seconds": None,
                    "value": round(recall, 3)})

    # plain pixels on the same database and queries
    split = load_fashion_mnist()
    Xtr, ytr = np.asarray(split.X_train[:DB], np.float32), split.y_train[:DB]
    Xte, yte = np.asarray(split.X_test, np.float32), split.y_test
    acc = common.knn_accuracy(Xtr, ytr, Xte, yte, ks=(1, 10), n_classes=10)
    pixels = [{"setting": "pixels L2-scan", "k": k, "k-NN accuracy %": round(100 * a, 2)}
              for k, a in acc.items()]

    paths = common.write_results(
        "sets_fashion",
        {"ingest": ingest, "k-NN on sets (database = first DB training images)": evals + pixels,
         "60k sets on the LocalCluster": timings},
        title=f"Fashion-MNIST as sets of {FEATURES} features: PMK / PDK, scan / hash",
        notes=[f"database: the first {DB} training images, queries: the 10,000 test images",
               "hashed rows: calibrated to the default target recall@10 0.9 against their own "
               "scan; 'auto' may choose the scan when it is cheaper (summary in evaluate)"])
    print(paths[1].read_text())


if __name__ == "__main__":
    main()
