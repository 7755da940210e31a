"""``lshdist active`` at one-process scale: the digits of scikit-learn as pool
and test sets, every selection method, outputs and the margin ordering the paper reports.

Bugs each assertion catches are named beside it.
"""

import json

import numpy as np
import pytest

from lshdist.cli import main
from lshdist.store.dataset import write_dataset


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("active")
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    p = np.random.default_rng(0).permutation(len(X))
    classes = [str(i) for i in range(10)]
    write_dataset(root / "pool", X[p[:1300]], y[p[:1300]], classes=classes)
    write_dataset(root / "test", X[p[1300:]], y[p[1300:]], classes=classes)
    write_dataset(root / "unlabelled", X[p[:50]])
    write_dataset(root / "narrow", X[p[1300:], :60], y[p[1300:]], classes=classes)
    return root


@pytest.mark.parametrize("search", [
    ["--search", "rank", "--bits", "256", "--candidates", "60"],
    ["--search", "lists", "--bits", "32", "--permutations", "8", "--window", "4"]])
def test_active_learning_job(digits, tmp_path, search):
    rounds = 15
    assert main(["active", "--pool", str(digits / "pool"), "--test", str(digits / "test"),
                 "--out", str(tmp_path / "out"), "--rounds", str(rounds), "--runs", "2",
                 *search]) == 0
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (tmp_path / "out" / "learning_curves.png").stat().st_size > 1000
    assert (tmp_path / "out" / "selection.png").stat().st_size > 1000
    assert s["settings"]["search"] == search[1]
    # dense pool, eh_terms not given: EH-Hash over every entry, and the summary says so
    assert s["settings"]["eh_terms"] is None and s["eh_terms"] is None
    m = s["methods"]
    assert set(m) == {"h-hash", "eh-hash", "exhaustive", "random"}
    for v in m.values():
        assert len(v["auroc_improvement_mean"]) == rounds + 1
        assert v["auroc_improvement_mean"][0] == 0.0  # improvement over round 0
        assert len(v["final_auroc_improvement_per_class"]) == 10  # one binary problem a class
    # the selected margins: exhaustive is the minimum over the pool; hashing finds far smaller
    # margins than random.  Measured (under the defaults: SVMs at unit RMS norm, centred keys,
    # bias at their RMS norm), one binary hyperplane a query: exhaustive 0.0055, random 0.750;
    # rank (256 bits, 60 of 1,300 rows): h-hash 0.031, eh-hash 0.064 (H-Hash's score is
    # linear in the angle, EH-Hash's quadratic); lists (M=8, W=4): eh-hash 0.158, h-hash
    # 0.238 (EH-Hash below H-Hash, as in the paper).
    # Bugs caught: the hyperplane's bias b dropped from the queries (margins of the wrong
    # hyperplane: hashing no better than random), labelled points re-selected.
    margin = {k: v["selected_margin_mean"] for k, v in m.items()}
    assert margin["exhaustive"] <= min(margin["h-hash"], margin["eh-hash"])
    assert margin["h-hash"] < 0.5 * margin["random"], margin
    assert margin["eh-hash"] < 0.3 * margin["random"], margin
    if search[1] == "rank":
        assert margin["h-hash"] < 0.15 * margin["random"], margin
    med = {k: v["selected_margin_median"] for k, v in m.items()}
    # (after round 0 each method has its own labelled set and hyperplanes: the exhaustive
    # minimum is over its own hyperplane, so the medians are compared with random only)
    assert max(med["exhaustive"], med["h-hash"]) < 0.5 * med["random"], med
    # hashing computes margins for a part of the pool only
    assert m["h-hash"]["fraction_scanned"] < 0.15 and m["exhaustive"]["fraction_scanned"] > 0.9


def test_active_errors(digits, tmp_path, capsys):
    base = ["active", "--pool", str(digits / "pool"), "--test", str(digits / "test"), "--out",
            str(tmp_path / "o")]
    for extra, message in [(["--methods", "h-hash,bogus"], "comma-separated list of distinct"),
                           (["--pool", str(digits / "unlabelled")], "has no labels"),
                           (["--initial", "500"], "initial examples per class"),
                           (["--classes", "11"], "the pool has only 10 classes"),
                           (["--class-weight", "auto"], "expected one of balanced, none"),
                           (["--eval-every", "0"], "--eval-every: '0': expected an integer >= 1"),
                           (["--test", str(digits / "narrow")],
                            "the test rows have 60 features, the pool's 64")]:
        capsys.readouterr()
        try:
            code = main([*base, *extra])
        except SystemExit as e:  # argparse's own choices
            code = e.code
        assert code == 2
        assert message in capsys.readouterr().err


def test_active_output_is_replaced_only_when_it_is_one(digits, tmp_path, capsys):
    """An existing OUT is refused without --overwrite, and even with it unless it is the output
    of an earlier `lshdist active` (a user's directory is never deleted)."""
    out = tmp_path / "o"
    cmd = ["active", "--pool", str(digits / "pool"), "--test", str(digits / "test"), "--out",
           str(out), "--methods", "random", "--rounds", "2", "--runs", "1", "--classes", "2"]
    assert main(cmd) == 0
    first = (out / "summary.json").read_text()
    capsys.readouterr()
    assert main(cmd) == 2
    assert "already exists" in capsys.readouterr().err
    assert main([*cmd, "--overwrite", "--seed", "1"]) == 0
    assert (out / "summary.json").read_text() != first  # replaced by the seed-1 run
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    capsys.readouterr()
    assert main([*cmd[:6], str(mine), *cmd[7:], "--overwrite"]) == 2
    assert "not an lshdist artefact" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "precious"


def test_unconverged_svm_fits_are_counted_not_printed(digits, tmp_path, capsys, monkeypatch,
                                                     caplog):
    """A LinearSVC fit that stops at the iteration cap is counted in the summary and logged
    once per run and method, not warned at every fit (a 300-round Fashion-MNIST run printed
    ~1,600 ConvergenceWarnings).  Bug caught: the count lost, or warnings still raised."""
    import warnings

    import lshdist.active as active

    monkeypatch.setattr(active, "SVM_MAX_ITER", 1)
    out = tmp_path / "o"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any ConvergenceWarning reaching the user fails
        assert main(["active", "--pool", str(digits / "pool"), "--test", str(digits / "test"),
                     "--out", str(out), "--methods", "random", "--rounds", "3", "--runs", "2",
                     "--classes", "2"]) == 0
    m = json.loads((out / "summary.json").read_text())["methods"]["random"]
    assert m["svm_unconverged"] == 1.0  # every fit of 2 runs x 2 classes x 4 rounds
    assert "SVM fits unconverged 100.0%" in capsys.readouterr().out
    assert sum("SVM fits stopped at liblinear's 1 iterations" in r.message
               for r in caplog.records) == 2  # once per run
    monkeypatch.setattr(active, "SVM_MAX_ITER", 5000)
    assert main(["active", "--pool", str(digits / "pool"), "--test", str(digits / "test"),
                 "--out", str(tmp_path / "p"), "--methods", "random", "--rounds", "3",
                 "--runs", "1", "--classes", "2"]) == 0
    m = json.loads((tmp_path / "p" / "summary.json").read_text())["methods"]["random"]
    assert m["svm_unconverged"] == 0.0


def _two_clusters(seed, n):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.5).astype(np.int64)
    X = rng.normal(size=(n, 10))
    X[:, 0] += 1.5 * (2 * y - 1)  # the classes overlap along axis 0 only
    return X.astype(np.float32), y


def test_margin_selection_beats_random_on_two_clusters():
    """The binary one-vs-all protocol: selecting the pool point nearest the current hyperplane
    improves the test AUROC more than random selection (measured, 30 rounds x 4 runs: +0.150
    vs +0.133), and picks far smaller margins (0.002 vs 1.3).  Bugs caught: the farthest point
    selected (argmax), a class's labels not binarised (every SVM fits one class's rows), the
    selected point never added to the labelled set (the same hyperplane every round: no gain),
    round 0 not the baseline of the improvement."""
    from lshdist.active import run_active, summarize
    from lshdist.config import ActiveConfig

    X, y = _two_clusters(1, 1500)
    T, yt = _two_clusters(101, 1000)
    cfg = ActiveConfig(methods="exhaustive,random", rounds=30, runs=4, initial=2, seed=1,
                       svm_scale="none")
    result = run_active(X, y, T, yt, settings=cfg)
    assert result["records"]["random"]["auroc"].shape == (4, 2, 31)
    m = summarize(result)["methods"]
    ex, rnd = m["exhaustive"], m["random"]
    assert ex["final_auroc_improvement"] > rnd["final_auroc_improvement"] + 0.01, (ex, rnd)
    assert rnd["final_auroc_improvement"] > 0.05
    assert ex["selected_margin_mean"] < 0.01 < 1.0 < rnd["selected_margin_mean"]
    assert ex["auroc_improvement_mean"][0] == 0.0


def test_svm_scale_makes_the_experiment_independent_of_the_data_units():
    """``svm_scale`` rms: the digits as given ([0, 1]) and times 255 give the same AUROC curves
    and the same selections (margins in the data's units, so 255 times larger); as given
    (``none``) the SVMs' C means another regularisation at each scale and the curves differ.
    Also: sparse unit-norm rows get the factor 1 (to float32 rounding)."""
    from sklearn.datasets import load_digits

    from lshdist.active import LocalPool, run_active, svm_scale
    from lshdist.config import ActiveConfig

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    pool, test = slice(0, 1300), slice(1300, None)
    res = {}
    for scale in ("rms", "none"):
        cfg = ActiveConfig(methods="exhaustive,random", rounds=6, runs=1, classes=3,
                           svm_scale=scale)
        for f in (1.0, 255.0):
            res[scale, f] = run_active(X[pool] * np.float32(f), y[pool], X[test] * np.float32(f),
                                       y[test], settings=cfg)
    a, b = res["rms", 1.0]["records"], res["rms", 255.0]["records"]
    for m in ("exhaustive", "random"):
        np.testing.assert_allclose(a[m]["auroc"], b[m]["auroc"], rtol=0, atol=1e-9)
        # (margins computed in float32: the same selections, to float32 rounding)
        np.testing.assert_allclose(255 * a[m]["margin"], b[m]["margin"], rtol=1e-3)
    assert abs(res["rms", 255.0]["svm_scale"] * 255 - res["rms", 1.0]["svm_scale"]) < 1e-9
    c, d = res["none", 1.0]["records"], res["none", 255.0]["records"]
    assert not np.allclose(c["exhaustive"]["auroc"], d["exhaustive"]["auroc"], atol=1e-3)
    assert res["none", 1.0]["svm_scale"] == 1.0
    # sparse rows of unit norm: the factor is 1
    from scipy import sparse

    from lshdist.blocks import SparseBlock

    M = sparse.random(500, 2000, density=0.01, format="csr", random_state=1, dtype=np.float32)
    M = sparse.csr_matrix(M.multiply(1 / np.sqrt(M.multiply(M).sum(1) + 1e-30)))
    keep = np.asarray(M.getnnz(1) > 0)
    P = LocalPool(SparseBlock(M[keep], np.arange(2000, dtype=np.uint64)),
                  ActiveConfig(svm_scale="rms"))
    assert abs(svm_scale(P, int(keep.sum()), P.settings) - 1.0) < 1e-6


def test_distributed_pool_matches_one_process(digits, tmp_path, monkeypatch):
    """``--distributed`` (an in-process cluster, the pool in 300-row shards, 4 segments of whole
    shards cut nearest equal shares of the rows: 300, 300, 300, 400): the random method's
    learning curve is the one-process curve exactly (the same rows fetched from the workers
    train the same SVMs), exhaustive selection
    picks points of the same margins, the hashed selection finds small margins from its
    segments' merged top lists, and the summary states the bytes held per pool row.  Bugs
    caught: rows fetched from the wrong segment (other SVMs), ids of a segment taken as rows
    of the pool, the bias dropped, --candidates re-ranked in every segment instead of shared."""
    from lshdist.cluster import active as cluster_active
    from lshdist.store.dataset import Dataset

    monkeypatch.setattr(cluster_active, "SEGMENT_ROWS", 400)
    ds = Dataset(digits / "pool")
    write_dataset(tmp_path / "pool", ds.read_rows(0, ds.n), ds.labels(), shard_rows=300,
                  classes=[str(i) for i in range(10)])
    common = ["--test", str(digits / "test"), "--rounds", "8", "--runs", "1", "--methods",
              "h-hash,exhaustive,random", "--bits", "256", "--candidates", "60"]
    assert main(["active", "--pool", str(tmp_path / "pool"), "--out", str(tmp_path / "one"),
                 *common]) == 0
    assert main(["active", "--pool", str(tmp_path / "pool"), "--out", str(tmp_path / "dist"),
                 "--distributed", "--in-process", "--workers", "1", *common]) == 0
    one = json.loads((tmp_path / "one" / "summary.json").read_text())["methods"]
    dist_s = json.loads((tmp_path / "dist" / "summary.json").read_text())
    dist = dist_s["methods"]
    assert dist_s["distributed"] is True
    assert dist["random"]["auroc_improvement_mean"] == one["random"]["auroc_improvement_mean"]
    np.testing.assert_allclose(dist["exhaustive"]["selected_margin_mean"],
                               one["exhaustive"]["selected_margin_mean"], rtol=1e-4)
    assert dist["exhaustive"]["fraction_scanned"] == 1.0
    assert dist["h-hash"]["selected_margin_mean"] < 0.15 * dist["random"]["selected_margin_mean"]
    # 60 candidates per hyperplane shared by the segments in proportion to their rows, rounded
    # up: 14 + 14 + 14 + 19 of 1,300 rows
    assert abs(dist["h-hash"]["fraction_scanned"] - 61 / 1300) < 1e-9
    # keys (32 B) + the rows with their bias column (65 float32) + ids + a one-list index
    assert 32 + 65 * 4 + 8 < dist_s["bytes_per_pool_row"] < 32 + 65 * 4 + 40


def test_distributed_errors(digits, tmp_path, capsys, monkeypatch):
    """Refused on the driver, before a cluster starts (`client_for` is never called): a sparse
    pool, an unlabelled pool, ids that are not rows, too many rounds."""
    import lshdist.cluster.client as client_mod

    def no_cluster(*a, **k):
        raise AssertionError("a cluster was started before the inputs were checked")

    monkeypatch.setattr(client_mod, "client_for", no_cluster)
    from scipy import sparse

    write_dataset(tmp_path / "sparse", sparse.csr_matrix(np.eye(20, dtype=np.float32)),
                  np.arange(20) % 2)
    base = ["active", "--test", str(digits / "test"), "--out", str(tmp_path / "o"),
            "--distributed", "--in-process", "--workers", "1"]
    write_dataset(tmp_path / "ids", np.eye(20, dtype=np.float32), np.arange(20) % 2,
                  ids=np.arange(20) + 5)
    for extra, message in [(["--pool", str(tmp_path / "sparse")], "holds sparse rows"),
                           (["--pool", str(digits / "unlabelled")], "has no labels"),
                           (["--pool", str(tmp_path / "ids")], "not its row numbers"),
                           (["--pool", str(digits / "pool"), "--rounds", "5000"],
                            "rounds=5000: the pool has only")]:
        capsys.readouterr()
        assert main([*base, *extra]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("search", "lists"), [("rank", 1), ("lists", 6)])
def test_the_pool_builds_lists_only_for_search_lists(search, lists):
    """Search rank reads no permutation list: the pool in this process builds one (as the
    cluster's does), not ``permutations`` of them (12 bytes a row each: 768 at 64)."""
    from lshdist.active import LocalPool
    from lshdist.config import ActiveConfig

    X = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    pool = LocalPool(X, ActiveConfig(search=search, permutations=6, bits=32))
    pool.build("h-hash")
    assert pool.indexes["h-hash"].index_.sorted_rows_.shape == (lists, 300)


def test_auroc_equals_scikit_learns_with_ties():
    """The rank form of the AUROC is scikit-learn's ``roc_auc_score``, ties included (rounded
    scores: many ties; a plain Mann-Whitney count without average ranks misses them), and NaN
    for one class."""
    from sklearn.metrics import roc_auc_score

    from lshdist.active import _auroc

    rng = np.random.default_rng(3)
    for n, decimals in ((50, 1), (7528, 2), (7528, 8)):
        pos = rng.random(n) < 0.07
        score = np.round(rng.normal(size=n) + 0.8 * pos, decimals)
        assert _auroc(pos, score) == pytest.approx(roc_auc_score(pos, score), abs=1e-12)
        assert _auroc(pos, -score) == pytest.approx(1 - roc_auc_score(pos, score), abs=1e-12)
    assert np.isnan(_auroc(np.zeros(5, bool), np.arange(5.0)))
    assert np.isnan(_auroc(np.ones(5, bool), np.arange(5.0)))


def test_the_plan_and_progress_are_logged(caplog):
    """Before any work the plan (fits, selections, EH-Hash's pool pair-bits: the rows with the
    bias feature cut to eh_terms), after round 3 an estimate of the whole loop, then progress
    every tenth of the rounds with the time left, the last line at the last round.  Bugs
    caught: the pool's pairs counted without the cut (41 x 42 / 2 = 861 pairs a row, not 528
    at m = 32), the first round's time (loading) taken as a round's, progress only at round 0,
    the counter not reaching the total."""
    import logging

    import scipy.sparse as sp

    from lshdist.active import run_active, summarize
    from lshdist.blocks import SparseBlock
    from lshdist.config import ActiveConfig

    X, y = _two_clusters(1, 300)
    T, yt = _two_clusters(101, 200)
    # 40 nonzero features a row (+ the bias): cut to 32
    S, St = (SparseBlock.from_csr(sp.csr_matrix(np.hstack([A] * 4)).astype(np.float32))
             for A in (X, T))
    cfg = ActiveConfig(methods="eh-hash,random", rounds=20, runs=1, initial=2, seed=1,
                       bits=64, eh_terms=32)
    lines: list[str] = []
    with caplog.at_level(logging.INFO, logger="lshdist.active"):
        run_active(S, y, St, yt, settings=cfg, progress=lines.append)
    rows_pairs = 32 * 33 // 2 * 64  # every row cut to 32 entries: 528 pairs x 64 bits
    plan = next(r.getMessage() for r in caplog.records if "active learning:" in r.getMessage())
    assert "300 pool rows, 2 one-vs-all classes" in plan, plan
    assert "42 SVM fits and 40 selections a method" in plan, plan
    assert f"{300 * rows_pairs:.3g} pair-bits" in plan and "32 largest" in plan, plan
    assert any(ln.startswith("rounds 2-3 took") and "the 42 rounds" in ln for ln in lines)
    ticks = [ln for ln in lines if "rounds in" in ln]
    assert len(ticks) == 2 * 11 - 1, ticks  # rounds 0, 2, 4, ..., 20 of each method, less #3
    assert "(42/42 rounds in" in ticks[-1] and "round 20/20" in ticks[-1]
    # a sparse pool's default cut (64) is the one used and recorded; 0 is every entry
    for given, used in ((None, 64), (0, None), (5, 5)):
        cfg = ActiveConfig(methods="eh-hash", rounds=1, runs=1, initial=2, bits=64,
                           eh_terms=given)
        result = run_active(S, y, St, yt, settings=cfg)
        assert result["eh_terms"] == used
        assert summarize(result)["eh_terms"] == used
