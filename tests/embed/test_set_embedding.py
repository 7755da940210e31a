"""`SetEmbedding` (the rows a set-kernel model sees), the point-set dataset kind, the local
feature extractors, and the set kernels through learn / evaluate / index / query."""

import json

import numpy as np
import pytest

from lshdist.blocks import SparseBlock
from lshdist.embed import IntersectionKernel, PointSets, ProximityDistribution, PyramidMatch
from lshdist.embed.features import dense_patches, extract_sets
from lshdist.embed.model import SetEmbedding
from lshdist.errors import FormatError, InputError
from lshdist.metric.learned import ImplicitMetric
from lshdist.store.dataset import Dataset, write_dataset, write_pointsets
from lshdist.store.embedded import EmbeddedDataset, open_data
from lshdist.store.model import load_model, save_model


def _sets(seed=0, n=40, d=5, coords=True):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 15, n)
    sizes[4] = 0  # an empty set: a zero row
    off = np.concatenate([[0], np.cumsum(sizes)])
    V = rng.uniform(0, 10, (off[-1], d)).astype(np.float32)
    C = rng.uniform(0, 28, (off[-1], 2)).astype(np.float32) if coords else None
    return PointSets.from_arrays(V, off, coords=C)


def test_unary_rows_give_the_normalised_pmk_exactly():
    # Bugs caught: a quantum not square-rooted (f.f = sum q^2 min), a row normalised by its
    # mass instead of its length, rows permuted, an empty set giving NaN.
    sets = _sets()
    emb = SetEmbedding("pmk", levels=4, finest_side=1.5, pca=0, spatial=0.0, seed=2).fit(sets)
    F = emb.transform(sets)
    H = PyramidMatch(levels=4, finest_side=1.5, seed=2).fit(sets).transform(sets)
    want = IntersectionKernel(normalize=True)(H, H)
    np.testing.assert_allclose(F.dot_t(F), want, atol=1e-6)
    assert not F.dot_t(F)[4].any()
    raw = SetEmbedding("pmk", levels=4, finest_side=1.5, pca=0, spatial=0.0, seed=2,
                       normalize=False).fit(sets).transform(sets)
    np.testing.assert_allclose(raw.dot_t(raw), IntersectionKernel()(H, H), rtol=1e-5)


def test_unary_rows_give_the_pdk_exactly():
    sets = _sets(1)
    emb = SetEmbedding("pdk", words=6, neighbors=3, normalize=False, seed=1).fit(sets)
    pd = ProximityDistribution(n_words=6, neighbors=3, seed=1).fit(sets)
    H = pd.transform(sets)
    F = emb.transform(sets)
    np.testing.assert_allclose(F.dot_t(F), IntersectionKernel()(H, H), rtol=1e-5)


def test_pca_and_spatial_points():
    sets = _sets(2, d=12)
    emb = SetEmbedding("pmk", pca=3, spatial=2.0).fit(sets)
    P = emb._points(sets)
    assert P.d == 5  # 3 projected features + 2 coordinates
    Vc = sets.values.astype(np.float64) - sets.values.mean(axis=0)
    # the projection keeps the top principal directions: its variance is the top 3 eigenvalues
    ev = np.sort(np.linalg.eigvalsh(np.cov(Vc.T)))[::-1][:3]
    np.testing.assert_allclose(np.var(P.values[:, :3].astype(np.float64), axis=0, ddof=1).sum(),
                               ev.sum(), rtol=1e-3)
    span = np.max(np.ptp(P.values[:, :3], axis=0))
    extent = np.max(np.ptp(P.values[:, 3:], axis=0))
    assert extent == pytest.approx(2.0 * span, rel=1e-3)
    with pytest.raises(InputError, match="image coordinates"):
        SetEmbedding("pmk").fit(_sets(coords=False))
    SetEmbedding("pmk", spatial=0.0).fit(_sets(coords=False))  # features alone: fine


@pytest.mark.parametrize("kernel", ["pmk", "pdk"])
def test_model_round_trip_keeps_the_embedding(kernel, tmp_path):
    sets = _sets(3, d=9)
    emb = SetEmbedding(kernel, pca=4, words=5, neighbors=2, seed=4).fit(sets)
    F = emb.transform(sets)
    metric = ImplicitMetric.identity(F.take(np.arange(10)), d=2**64, embedding=emb)
    save_model(tmp_path / "m", metric)
    back, meta = load_model(tmp_path / "m")
    assert meta["embedding"]["kernel"] == kernel and back.embedding is not None
    G = back.embedding.transform(sets)
    np.testing.assert_array_equal(G.dot_t(G), F.dot_t(F))
    # damage: an embedding parameter edited in model.json is caught by the model checksum
    meta_f = tmp_path / "m" / "model.json"
    m = json.loads(meta_f.read_text())
    m["embedding"]["normalize"] = False
    meta_f.write_text(json.dumps(m))
    with pytest.raises(FormatError, match="checksum"):
        load_model(tmp_path / "m")


def test_pointsets_dataset_round_trip_and_shards(tmp_path):
    sets = _sets(5)
    y = np.arange(len(sets)) % 3
    ds = write_pointsets(tmp_path / "s", sets, y, shard_rows=7)
    assert ds.kind == "pointsets" and ds.n == len(sets) and ds.d == 5 and ds.has_coords
    ds.verify()
    back = ds.read_sets(0, ds.n)
    np.testing.assert_array_equal(back.values, sets.values)
    np.testing.assert_array_equal(back.offsets, sets.offsets)
    np.testing.assert_array_equal(back.coords, sets.coords)
    rows = np.array([1, 4, 8, 20, 39])
    some = ds.read_set_rows(rows)
    want = sets.take(rows)
    np.testing.assert_array_equal(some.values, want.values)
    np.testing.assert_array_equal(some.offsets, want.offsets)
    with pytest.raises(InputError, match="--kernel pmk"):
        ds.read_rows(0, 3)
    # embedded rows do not depend on the shard size
    emb = SetEmbedding("pmk", pca=3).fit(sets)
    ds2 = write_pointsets(tmp_path / "s2", sets, y, shard_rows=50)
    a = EmbeddedDataset(tmp_path / "s", emb)
    b = EmbeddedDataset(tmp_path / "s2", emb)
    assert a.kind == "sparse" and a.n_shards == 6 and b.n_shards == 1
    A = a.read_all()
    B = b.read_all()
    assert isinstance(A, SparseBlock) and isinstance(B, SparseBlock)
    np.testing.assert_array_equal(A.dot_t(A), B.dot_t(B))
    parts = [a.read_shard(i) for i in range(a.n_shards)]
    np.testing.assert_array_equal(np.vstack([p.dot_t(A) for p in parts]), A.dot_t(A))
    np.testing.assert_array_equal(a.read_row_set(rows).dot_t(A), A.take(rows).dot_t(A))
    # the wrong pairing of data and model is refused with what to do
    write_dataset(tmp_path / "v", np.ones((3, 5), np.float32))
    with pytest.raises(InputError, match="ingest --features"):
        open_data(tmp_path / "v", emb)
    with pytest.raises(InputError, match="learn --kernel"):
        open_data(tmp_path / "s", None)
    del ds2


def test_pointsets_damage_is_refused(tmp_path):
    import zarr

    ds = write_pointsets(tmp_path / "s", _sets(6), shard_rows=10)
    g = zarr.open_group(str(tmp_path / "s"), mode="r+")
    off = g["P/offsets"]
    off[5] = 10**9
    with pytest.raises(FormatError, match="offsets"):
        Dataset(tmp_path / "s").read_sets(0, 10)
    with pytest.raises(FormatError):
        Dataset(tmp_path / "s").verify()
    del ds


def test_dense_patches_content_and_coordinates():
    img = np.zeros((8, 8), np.uint8)
    img[0:4, 4:8] = 255
    img[0, 4] = 0
    img[5, 1] = 51
    img[1, 1] = 102
    img[6:8, 6:8] = 17
    img[4:8, 4:8] = 17  # a constant patch (rows 4-7, cols 4-7): no local feature, left out
    f, c = dense_patches(img, 4, 4)
    assert len(f) == 3
    top_right = f[np.argmax(f.sum(axis=1))]
    np.testing.assert_allclose(top_right, np.r_[0.0, np.ones(15)])  # row-major pixels
    assert {tuple(x) for x in c} == {(1.5, 1.5), (1.5, 5.5), (5.5, 1.5)}
    k = [tuple(x) for x in c].index((5.5, 1.5))
    assert f[k].max() == pytest.approx(0.2) and np.count_nonzero(f[k]) == 1


def test_extractors_on_real_shapes():
    rng = np.random.default_rng(0)
    imgs = (rng.random((3, 28, 28)) * 255).astype(np.uint8)
    s = extract_sets(imgs, "daisy", patch=4, step=4)
    assert s.d == 104 and list(s.sizes) == [25, 25, 25] and s.coords is not None
    o = extract_sets(imgs[:1], "orb", keypoints=20)
    assert o.d == 256 and 0 < o.sizes[0] <= 20
    assert set(np.unique(o.values)) <= {0.0, 1.0}
    assert o.coords is not None and o.coords.min() >= 0 and o.coords.max() < 28
    from scipy.ndimage import gaussian_filter

    t = gaussian_filter(rng.random((28, 28)), 1.5)  # blobs for the detector
    f = extract_sets(t[None], "sift", keypoints=7)
    assert f.d == 128 and 0 < f.sizes[0] <= 7
    assert f.coords is not None and f.coords.min() >= 0 and f.coords.max() < 28
    blank = extract_sets(np.zeros((1, 28, 28)), "dense-patches")
    assert blank.sizes[0] == 0
    with pytest.raises(InputError, match="choose one of"):
        extract_sets(imgs, "hog")
    with pytest.raises(InputError, match=r"float images must hold values in \[0, 1\]"):
        extract_sets(np.full((1, 28, 28), 3.0), "dense-patches")
