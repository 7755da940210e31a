"""Object storage against a local disk: the same Fashion-MNIST index and queries read from
``s3://`` (a real S3 server on 127.0.0.1, moto's) and from local disk, paired and alternated.

Fashion-MNIST train (60,000 x 784) and test (10,000) are ingested on both; one model is learnt
(``learn --no-search``) on local disk and copied to the bucket; the index is built on each
(calibrated on local disk; the s3 build is given the point chosen, so both hold the same
lists); then ``BENCH_ROUNDS`` (3) rounds of the
query stage on one LocalCluster of 2 workers, alternating which store goes first -- each query
a cold read of the index and the queries by the workers, as a user's `lshdist query` is.
Reported: query seconds per run, the ratio s3 / local per round (median [min-max]), the index
build on each, the requests the server answered, and that both gave the same neighbours.

    cd /work/main && .venv/bin/python benchmarks/bench_object_storage.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out" / "bench-object-storage"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SEGMENTS = ["--seed", "1", "--segment-rows", "20000"]


def _server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(OUT / "moto.log", "w")  # noqa: SIM115 -- open for the server's lifetime
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def _cli(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "lshdist"), *args], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    common.pin_threads()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    proc, endpoint = _server()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
    try:
        import s3fs

        fs = s3fs.S3FileSystem()
        fs.mkdir("bench")
        data = common.data_dir() / "fashion-mnist"
        stores = {"local": str(OUT / "local"), "s3": "s3://bench/fashion"}
        setup: list[dict] = []
        point: list[str] = []
        for name, root in stores.items():
            t_ing = _cli("ingest", str(data / "train-images-idx3-ubyte.gz"),
                         str(data / "train-labels-idx1-ubyte.gz"), "--out", f"{root}/train",
                         "--shard-rows", "10000")
            t_ing += _cli("ingest", str(data / "t10k-images-idx3-ubyte.gz"),
                          str(data / "t10k-labels-idx1-ubyte.gz"), "--out", f"{root}/test",
                          "--shard-rows", "5000")
            if name == "local":
                _cli("learn", "--data", f"{root}/train", "--out", f"{root}/model", "--no-search",
                     "--sample", "5000")
            else:
                fs.put(str(OUT / "local" / "model"), "bench/fashion/model", recursive=True)
            # local disk calibrates; s3 builds the same lists at the point it chose (the
            # calibration's choice depends on timings, and the answers are compared)
            fixed = [] if name == "local" else point
            t_idx = _cli("index", "--data", f"{root}/train", "--model", f"{root}/model",
                         "--out", f"{root}/index", *SEGMENTS, *fixed)
            if name == "local":
                from lshdist.store.index import read_manifest

                m = read_manifest(f"{root}/index")
                point = ["--permutations", str(m["permutations"]), "--window",
                         str(m["window"]), "--hamming-keep", str(m["hamming_keep"])]
            setup.append({"store": name, "ingest s (2 files, CLI)": round(t_ing, 2),
                          "index s (CLI, 2 workers)": round(t_idx, 2)})
            print(setup[-1], flush=True)

        from lshdist.cluster.pipeline import plan_query, run_query
        from lshdist.config import ClusterConfig, QueryConfig
        from lshdist.jobs.common import client_from_config
        from lshdist.store.dataset import Dataset
        from lshdist.store.results import read_results

        answers: dict[str, np.ndarray] = {}
        with client_from_config(ClusterConfig(workers=2)) as client:
            def query(name: str):
                root = stores[name]
                res = f"{root}/results"
                t0 = time.perf_counter()
                qp = plan_query(index=f"{root}/index", queries=f"{root}/test", out=res,
                                cfg=QueryConfig(mode="hash"), overwrite=True)
                run_query(client, qp)
                secs = time.perf_counter() - t0
                _, nb, _, _ = read_results(res, Dataset(f"{root}/test").ids())
                answers[name] = np.asarray(nb)
                return {"total s": secs}

            out = common.paired_rounds({"local": lambda: query("local"),
                                        "s3": lambda: query("s3")}, ref="local",
                                       rounds=ROUNDS, warmup=1)
        same = bool(np.array_equal(answers["local"], answers["s3"]))
        summary = common.paired_summary(out["runs"], ref="local", keys=("total s",))
        rows = [{"store": n, "query s (median)": round(r["total s"], 3),
                 "s3 / local median": round(r["ratio median"], 3),
                 "min": round(r["ratio min"], 3), "max": round(r["ratio max"], 3),
                 "runs": r["runs total s"]} for n, r in summary.items()]
        lines = (OUT / "moto.log").read_text().splitlines()
        requests = sum(1 for line in lines if '" 200 ' in line or '" 206 ' in line)
        notes = [f"the same neighbours from both stores: {same}",
                 f"requests the S3 server answered in all (setup and every query): {requests}",
                 "query: QueryConfig(mode='hash') at the calibrated point, recall check on "
                 "(2 % of the queries answered exactly too), results written to the same "
                 "store as the index"]
        print(rows, notes, flush=True)
        common.write_results("object_storage_fashion",
                             {"Query stage, paired (2 workers, one LocalCluster)": rows,
                              "Setup (CLI, one run each)": setup},
                             title="Fashion-MNIST from s3:// (moto on 127.0.0.1) vs local disk",
                             notes=notes)
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
