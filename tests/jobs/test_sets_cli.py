"""Sets of local features from the command line: ingest --features, learn/evaluate --kernel,
index and query of a point-set dataset through the model's embedding, and the refusals."""

import json

import numpy as np
import pytest
from sklearn.datasets import load_digits

from lshdist.cli import main
from lshdist.store.dataset import Dataset
from lshdist.store.embedded import open_data
from lshdist.store.model import load_model
from lshdist.store.results import read_results

CLUSTER = ["--in-process", "--workers", "1"]


@pytest.fixture(scope="module")
def digits_sets(tmp_path_factory):
    """Digits images (16 x 16, upscaled) as npz train/test, ingested as dense patches."""
    root = tmp_path_factory.mktemp("sets")
    d = load_digits()
    images = np.kron(d.images, np.ones((2, 2))) * 15  # 0..240, float: read as 0..255
    rng = np.random.default_rng(0)
    order = rng.permutation(len(images))
    tr, te = order[:700], order[700:800]
    np.savez(root / "train.npz", X=images[tr].astype(np.float32), y=d.target[tr])
    np.savez(root / "test.npz", X=images[te].astype(np.float32), y=d.target[te])
    for name in ("train", "test"):
        assert main(["ingest", str(root / f"{name}.npz"), "--features", "dense-patches",
                     "--patch", "4", "--step", "2", "--out", str(root / name), *CLUSTER]) == 0
    return root


def test_ingest_features_npz(digits_sets, capsys):
    ds = Dataset(digits_sets / "train")
    assert ds.kind == "pointsets" and ds.n == 700 and ds.d == 16 and ds.has_coords
    assert ds.classes == [str(i) for i in range(10)]
    sets = ds.read_sets(0, ds.n)
    assert sets.sizes.max() <= 49 and sets.sizes.min() > 0
    assert ds.attrs["features"]["kind"] == "dense-patches"


def test_ingest_image_folder(tmp_path, capsys):
    from skimage.io import imsave

    rng = np.random.default_rng(1)
    for c in ("cat", "dog"):
        (tmp_path / "img" / c).mkdir(parents=True)
        for i in range(3):
            imsave(tmp_path / "img" / c / f"{i}.png",
                   (rng.random((20, 24)) * 255).astype(np.uint8), check_contrast=False)
    (tmp_path / "img" / "dog" / "notes.txt").write_text("not an image")
    assert main(["ingest", str(tmp_path / "img"), "--features", "daisy", "--out",
                 str(tmp_path / "ds"), *CLUSTER]) == 0
    ds = Dataset(tmp_path / "ds")
    assert ds.n == 6 and ds.classes == ["cat", "dog"] and list(ds.labels()) == [0, 0, 0, 1, 1, 1]
    assert "6 images as sets of daisy features" in capsys.readouterr().out


def test_learn_index_query_pmk(digits_sets, tmp_path, capsys):
    root = digits_sets
    model, index, res = tmp_path / "m", tmp_path / "i", tmp_path / "r"
    assert main(["learn", "--data", str(root / "train"), "--kernel", "pmk", "--basis", "60",
                 "--constraints", "300", "--no-search", "--force-learned", "--out",
                 str(model)]) == 0
    metric, meta = load_model(model)
    assert meta["embedding"]["kernel"] == "pmk" and metric.embedding is not None
    assert not metric.is_identity
    assert main(["index", "--data", str(root / "train"), "--model", str(model), "--out",
                 str(index), "--bits", "128", *CLUSTER]) == 0
    assert main(["query", "--index", str(index), "--queries", str(root / "test"), "--k", "5",
                 "--mode", "scan", "--out", str(res), *CLUSTER]) == 0
    # the exact answer equals the learned kernel distance computed directly
    X = open_data(root / "train", metric.embedding).read_all()
    Q = open_data(root / "test", metric.embedding).read_all()
    qids = Dataset(root / "test").ids()
    _, nb, dist, _ = read_results(res, qids)
    D = metric.pairwise(Q, X)
    want = np.argsort(D, axis=1, kind="stable")[:, :5]
    np.testing.assert_allclose(dist.reshape(-1, 5), np.take_along_axis(D, want, 1), atol=1e-4)
    agree = np.mean(nb.reshape(-1, 5) == Dataset(root / "train").ids()[want])
    assert agree > 0.99  # ties in float32 may swap
    # the hashed answer, calibrated to the default target
    assert main(["query", "--index", str(index), "--queries", str(root / "test"), "--k", "5",
                 "--out", str(tmp_path / "rh"), *CLUSTER]) == 0
    _, nbh, _, _ = read_results(tmp_path / "rh", qids)
    recall = np.mean([len(set(a) & set(b)) / 5 for a, b in
                      zip(nbh.reshape(-1, 5), nb.reshape(-1, 5))])
    assert recall >= 0.8


def test_evaluate_pmk(digits_sets, tmp_path, capsys):
    root = digits_sets
    assert main(["evaluate", "--train", str(root / "train"), "--test", str(root / "test"),
                 "--kernel", "pmk", "--basis", "60", "--constraints", "300", "--no-search",
                 "--no-plots", "--bits", "128", "--out", str(tmp_path / "ev")]) == 0
    rec = {(r["setting"], r["k"]): r for r in
           json.loads((tmp_path / "ev" / "summary.json").read_text())}
    # dense patches of digits: the PMK k-NN is far above chance (10 classes)
    assert rec[("L2-scan", 1)]["knn_accuracy"] > 0.7
    assert rec[("ML-scan", 1)]["recall_at_k"] == 1.0


def test_refusals(digits_sets, tmp_path, capsys):
    root = digits_sets
    vec = tmp_path / "vec"
    np.save(tmp_path / "x.npy", np.ones((20, 16), np.float32))
    np.save(tmp_path / "y.npy", np.arange(20) % 2)
    assert main(["ingest", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"),
                 "--out", str(vec)]) == 0
    capsys.readouterr()
    assert main(["learn", "--data", str(vec), "--kernel", "pmk", "--out",
                 str(tmp_path / "m1")]) == 2
    assert "--kernel pmk is a kernel over sets of local features" in capsys.readouterr().err
    assert main(["learn", "--data", str(root / "train"), "--out", str(tmp_path / "m2")]) == 2
    assert "choose the set kernel" in capsys.readouterr().err
    assert main(["learn", "--data", str(root / "train"), "--kernel", "pmk", "--kind",
                 "explicit", "--out", str(tmp_path / "m3")]) == 2
    assert "needs --kind implicit" in capsys.readouterr().err
    assert main(["ingest", str(root / "train.npz"), "--features", "daisy", "--format", "npz",
                 "--out", str(tmp_path / "x")]) == 2
    assert "--format apply to vector inputs" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    np.savez(tmp_path / "bright.npz", X=np.full((3, 16, 16), 1000.0, np.float32))
    assert main(["ingest", str(tmp_path / "bright.npz"), "--features", "daisy", "--out",
                 str(tmp_path / "b"), *CLUSTER]) == 2
    assert "float images must hold values in [0, 1] or [0, 255], got 1000.0" in (
        capsys.readouterr().err)
    assert not (tmp_path / "b").exists()
    assert main(["learn", "--data", str(root / "train"), "--kernel", "pmk", "--basis", "30",
                 "--constraints", "100", "--no-search", "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert main(["index", "--data", str(vec), "--model", str(tmp_path / "m"), "--out",
                 str(tmp_path / "i"), *CLUSTER]) == 2
    err = capsys.readouterr().err
    assert "holds dense vectors, but the model embeds sets" in err and "Traceback" not in err
    assert not (tmp_path / "i").exists()
