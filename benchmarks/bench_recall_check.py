"""The recall a query job promises, measured on queries unlike the database's rows.

The database is `make_million.py --variants 8`: the 60,000 Fashion-MNIST training images under
8 variants (unshifted and 7 one-pixel shifts), 480,000 rows — every row has near-copies, so the
index's build-time calibration (leave-one-out on its own rows) finds easy neighbours.  The
queries are the first 300 and the first 1,000 unshifted test images, which have no copy in the
database.  The commands are the user's, with no index flag but the target:

    lshdist learn --data m8/train --out model
    lshdist index --data m8/train --model model --out idx --target-recall 0.9
    lshdist query --index idx --queries qN --out rN          # N = 300, 1000
    lshdist query --index idx --queries qN --out sN --mode scan

and the recall@10 of ``rN`` against ``sN`` is compared with what the job measured on its own
sample (``results.json``'s ``measured_recall``).  Pass: recall >= 0.88 for both, and the
record present.  Artefacts go under ``--work`` (kept, reused when present).

    cd /work/main && .venv/bin/python benchmarks/bench_recall_check.py [--work out/recall-check]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULT = HERE / "results" / "recall_check_shifted.json"


def sh(*argv: str, cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--work", type=Path, default=HERE.parent / "out" / "recall-check")
    a = p.parse_args()
    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = Path(os.environ.get("LSHDIST_DATA_DIR", HERE.parent.parent / "shared" / "datasets"))
    lshdist = str(Path(sys.executable).with_name("lshdist"))
    secs: dict[str, float] = {}
    if not (work / "m8").exists():
        secs["make_million"] = sh(sys.executable, str(HERE / "make_million.py"), "--variants",
                                  "8", "--out", str(work / "m8"), cwd=work)
    for n in (300, 1000):
        if not (work / f"q{n}").exists():
            sh(lshdist, "ingest", str(data / "fashion-mnist" / "t10k-images-idx3-ubyte.gz"),
               "--out", f"q{n}", "--rows", f"0:{n}", "--in-process", cwd=work)
    if not (work / "model").exists():
        secs["learn"] = sh(lshdist, "learn", "--data", "m8/train", "--out", "model", cwd=work)
    if not (work / "idx").exists():
        secs["index"] = sh(lshdist, "index", "--data", "m8/train", "--model", "model",
                           "--out", "idx", "--target-recall", "0.9", cwd=work)
    from lshdist.store.results import read_meta, read_results

    rows = []
    for n in (300, 1000):
        secs[f"query {n}"] = sh(lshdist, "query", "--index", "idx", "--queries", f"q{n}",
                                "--out", f"r{n}", "--overwrite", cwd=work)
        secs[f"scan {n}"] = sh(lshdist, "query", "--index", "idx", "--queries", f"q{n}",
                               "--out", f"s{n}", "--mode", "scan", "--overwrite", cwd=work)

        def answers(name: str) -> np.ndarray:
            q, nb, _, _ = read_results(work / name)
            return nb[np.argsort(q, kind="stable")]

        got, exact = answers(f"r{n}"), answers(f"s{n}")
        real = float(np.mean([len(np.intersect1d(x, y)) / 10 for x, y in zip(got, exact)]))
        info = read_meta(work / f"r{n}").info
        rec = info["measured_recall"]
        rows.append({"queries": n, "recall_vs_scan": round(real, 4), "mode": info["mode"],
                     "operating_point": info["operating_point"],
                     "measured": rec["value"], "interval": rec["interval"],
                     "sampled": rec["queries_sampled"], "action": rec["action"],
                     "estimate": rec["estimate"],
                     "first_check": rec["checks"][0] if rec["checks"] else None,
                     "pass": real >= 0.88})
        print(json.dumps(rows[-1]))
    RESULT.write_text(json.dumps({"rows": rows, "seconds": secs}, indent=2))
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
