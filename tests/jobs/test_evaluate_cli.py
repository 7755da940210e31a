import json

from lshdist.cli import main
from lshdist.datasets import load_digits
from lshdist.store.dataset import write_dataset


def test_evaluate_writes_summary_and_plots(tmp_path, capsys):
    s = load_digits()
    write_dataset(tmp_path / "tr", s.X_train, s.y_train, classes=s.classes)
    write_dataset(tmp_path / "te", s.X_test, s.y_test, classes=s.classes)
    out = tmp_path / "ev"
    assert main(["evaluate", "--train", str(tmp_path / "tr"), "--test", str(tmp_path / "te"),
                 "--out", str(out), "--constraints", "1000", "--bits", "64",
                 "--permutations", "20", "--window", "4", "--sweep-bits", "16,64",
                 "--sweep-window", "1,4"]) == 0
    records = json.loads((out / "summary.json").read_text())
    assert {(r["setting"], r["k"]) for r in records} == {
        (s_, k) for s_ in ("L2-scan", "L2-hash", "ML-scan", "ML-hash") for k in (1, 4)}
    for r in records:
        assert {"knn_accuracy", "recall_at_k", "fraction_searched", "speedup", "seconds"} <= set(r)
        assert 0.85 <= r["knn_accuracy"] <= 1.0
        assert 0 < r["fraction_searched"] <= 1.0
    for png in ("accuracy_vs_bits.png", "recall_vs_searched.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "ML-hash" in capsys.readouterr().out
    assert main(["evaluate", "--train", str(tmp_path / "tr"), "--test", str(tmp_path / "tr"),
                 "--out", str(out)]) == 2  # exists
