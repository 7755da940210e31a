"""Fashion-MNIST as sets of DAISY features, through the command line (slow: real data).

Pins the set kernels' claims on real images at a reduced size: the PMK's k-NN accuracy, and
its hashed search within 2 points of its scan, re-ranking at most 10 % where calibration
chose hashing (README, "Sets of
local features"; the full-size figures are `benchmarks/bench_sets.py`'s).
"""

import json

import pytest

from lshdist.cli import main

CLUSTER = ["--in-process", "--workers", "1"]
pytestmark = pytest.mark.slow
#: measured 0.758 (2026-11-22); pixel patches without coordinates gave 0.50, the 104-d
#: descriptors binned without PCA 0.75 with hashing useless (95 % re-ranked)
THRESH_SCAN = 0.74


def test_pmk_on_fashion_daisy(data_root, tmp_path, capsys):
    f = data_root / "fashion-mnist"
    for name, stem, rows in (("tr", "train", "0:6000"), ("te", "t10k", "0:1500")):
        assert main(["ingest", str(f / f"{stem}-images-idx3-ubyte.gz"),
                     str(f / f"{stem}-labels-idx1-ubyte.gz"), "--features", "daisy",
                     "--rows", rows, "--out", str(tmp_path / name), *CLUSTER]) == 0
    assert main(["evaluate", "--train", str(tmp_path / "tr"), "--test", str(tmp_path / "te"),
                 "--kernel", "pmk", "--k", "1,10", "--no-plots", "--sample", "3000",
                 "--budget", "30", "--out", str(tmp_path / "ev")]) == 0
    rec = {(r["setting"], r["k"]): r for r in
           json.loads((tmp_path / "ev" / "summary.json").read_text())}
    scan, hashed = rec[("L2-scan", 1)], rec[("L2-hash", 1)]
    print(f"\nPMK on DAISY sets, 6,000 x 1,500: scan 1-NN {scan['knn_accuracy']:.4f}, hash "
          f"{hashed['knn_accuracy']:.4f} at {hashed['fraction_searched']:.4f} re-ranked, "
          f"recall@10 {rec[('L2-hash', 10)]['recall_at_k']:.3f}")
    assert scan["knn_accuracy"] >= THRESH_SCAN
    assert hashed["knn_accuracy"] >= scan["knn_accuracy"] - 0.02
    # where calibration chose the hashed search it re-ranks at most 10 % (at this reduced
    # size it does for one of the two settings); where `auto` keeps the scan, the hashed
    # search runs at the reference point, which since session 12 also takes the recall
    # margin (target + one standard error, as a chosen point does): then it must reach the
    # target, and re-ranks more (16 % measured for L2, recall@10 0.917)
    chosen = [r for (name, k), r in rec.items()
              if k == 1 and name.endswith("-hash") and r["auto_mode"] == "hash"]
    assert chosen and all(r["fraction_searched"] <= 0.10 for r in chosen)
    for name in ("L2-hash", "ML-hash"):
        r10 = rec[(name, 10)]
        assert r10["recall_at_k"] >= (0.9 if r10["auto_mode"] == "scan" else 0.85), r10
        assert r10["fraction_searched"] <= 0.25

