"""Fashion-MNIST as sets of DAISY features, through the command line (slow: real data).

Pins the set kernels' claims on real images at a reduced size: the PMK's k-NN accuracy, and
its hashed search within 2 points of its scan, re-ranking at most 25 % (at most 10 % for one
of the two metrics; README, "Sets of local features"; the full-size figures are
`benchmarks/bench_sets.py`'s).
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
    # which point calibration picks, and whether `auto` keeps the scan, depend on measured
    # times (CI, 2026-11-25: L2 chose M=128 W=24 H=960 at 16 % re-ranked, 1.5x faster than
    # the scan, where this machine had kept the scan); what does not: every hashed setting is
    # sublinear (<= 25 % re-ranked, below) and at least one of the two re-ranks at most 10 %
    # (ML: 5.3 % on both machines). The README's <= 10 % claim is at full size
    # (`benchmarks/bench_sets.py`). Where `auto` keeps the scan, the hashed search runs at the
    # reference point, which takes the recall margin too: then it must reach the target.
    hashed_rows = [r for (name, k), r in rec.items() if k == 1 and name.endswith("-hash")]
    assert min(r["fraction_searched"] for r in hashed_rows) <= 0.10, hashed_rows
    for name in ("L2-hash", "ML-hash"):
        r10 = rec[(name, 10)]
        assert r10["recall_at_k"] >= (0.9 if r10["auto_mode"] == "scan" else 0.85), r10
        assert r10["fraction_searched"] <= 0.25

