import json

import numpy as np
import pytest
import scipy.sparse as sp

from lshdist.blocks import SparseBlock
from lshdist.cli import main
from lshdist.errors import FormatError, OutputExistsError
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric
from lshdist.store.model import load_model, save_model


def test_explicit_model_round_trips_bit_exactly(tmp_path):
    rng = np.random.default_rng(0)
    B = rng.normal(size=(6, 6))
    m = ExplicitMetric(B @ B.T + np.eye(6), center=rng.normal(size=6))
    save_model(tmp_path / "m", m, params={"gamma": 1.0}, seed=3)
    back, meta = load_model(tmp_path / "m")
    assert np.array_equal(back.A, m.A) and np.array_equal(back.G, m.G)
    assert np.array_equal(back.center, m.center)
    assert meta["kind"] == "explicit" and meta["seed"] == 3 and meta["params"]["gamma"] == 1.0
    assert not list(tmp_path.glob(".*tmp*"))


def test_implicit_sparse_model_round_trips_bit_exactly(tmp_path):
    rng = np.random.default_rng(1)
    basis = SparseBlock.from_csr(sp.random(5, 1000, density=0.02, format="csr", random_state=1))
    S = rng.normal(size=(5, 5)) * 0.1
    m = ImplicitMetric(basis, S, d=2**64)
    save_model(tmp_path / "m", m)
    back, meta = load_model(tmp_path / "m")
    assert np.array_equal(back.S, m.S) and np.array_equal(back.kernel_form, m.kernel_form)
    for a, b in zip(back.basis.to_arrays(), m.basis.to_arrays()):
        assert np.array_equal(a, b)
    assert meta["d"] == 2**64 and meta["c"] == 5


def test_corrupted_model_is_refused(tmp_path):
    save_model(tmp_path / "m", ExplicitMetric.identity(3))
    with pytest.raises(OutputExistsError, match="already exists"):
        save_model(tmp_path / "m", ExplicitMetric.identity(3))
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    meta["checksums"]["A"] = "0" * 64
    (tmp_path / "m" / "model.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="does not match its checksum"):
        load_model(tmp_path / "m")
    (tmp_path / "n").mkdir()
    with pytest.raises(FormatError, match="not an lshdist model"):
        load_model(tmp_path / "n")


def test_learn_cli_writes_a_model(tmp_path, capsys):
    from lshdist.datasets import load_digits
    from lshdist.store.dataset import write_dataset

    s = load_digits()
    write_dataset(tmp_path / "d", s.X_train, s.y_train, classes=s.classes)
    assert main(["learn", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "m"),
                 "--constraints", "500", "--no-search", "--force-learned"]) == 0
    m, meta = load_model(tmp_path / "m")
    assert meta["params"]["n_pairs"] == 500 and m.d == 64
    assert meta["params"]["selection"]["selected"] == "learned"  # forced
    assert main(["info", str(tmp_path / "m")]) == 0
    assert "lshdist-model" in capsys.readouterr().out
    assert main(["learn", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "m")]) == 2
    assert "already exists" in capsys.readouterr().err
    write_dataset(tmp_path / "one", s.X_train[:50], np.zeros(50, int))
    assert main(["learn", "--data", str(tmp_path / "one"), "--out", str(tmp_path / "m2")]) == 2
    assert "one class only" in capsys.readouterr().err
    assert not (tmp_path / "m2").exists()
    # rows whose squared distances overflow float32: refused before ITML runs (it ran, then
    # the first scan refused them), naming a row by its id
    big = s.X_train.astype(np.float32) * np.float32(1e19)
    write_dataset(tmp_path / "big", big, s.y_train, ids=np.arange(100, 100 + len(big)))
    assert main(["learn", "--data", str(tmp_path / "big"), "--out", str(tmp_path / "m3")]) == 2
    err = capsys.readouterr().err
    assert "exceeds float32's range (3.4e38)" in err and "scale the data down" in err, err
    assert "row 1" in err and "ITML" not in err and not (tmp_path / "m3").exists()


def _edit(path, change):
    meta = json.loads((path / "model.json").read_text())
    change(meta)
    (path / "model.json").write_text(json.dumps(meta))


@pytest.fixture
def centered(tmp_path):
    rng = np.random.default_rng(0)
    B = rng.normal(size=(4, 4))
    save_model(tmp_path / "m", ExplicitMetric(B @ B.T + np.eye(4), center=rng.normal(size=4)))
    return tmp_path / "m"


def test_a_dropped_checksum_entry_is_refused(centered):
    from lshdist.store.model import checksums_digest

    def drop_center(meta):
        del meta["checksums"]["center"]

    _edit(centered, drop_center)
    with pytest.raises(FormatError, match=r"checksum .* does not match its checksums"):
        load_model(centered)
    # resealed: the model checksum agrees, but the centre array is still on disk
    _edit(centered, lambda m: m.update(checksum=checksums_digest(m["checksums"])))
    with pytest.raises(FormatError, match=r"holds arrays \['A', 'center'\], model.json names "
                                          r"\['A'\]"):
        load_model(centered)
    _edit(centered, lambda m: m.update(checksums={}, checksum=checksums_digest({})))
    with pytest.raises(FormatError, match=r"checksums name arrays \[\], a explicit model has "
                                          r"\['A'\] or \['A', 'center'\]"):
        load_model(centered)


@pytest.mark.parametrize("key,value,match", [
    ("d", "4", "d='4' is not an integer"),
    ("d", None, "d=None is not an integer"),
    ("sparse", 0, "sparse=0 is not true or false"),
    ("kind", "magic", "kind='magic'"),
    ("checksums", [], "checksums=\\[\\] is not an object"),
])
def test_mistyped_model_fields_are_refused(centered, key, value, match):
    _edit(centered, lambda m: m.update({key: value}))
    with pytest.raises(FormatError, match=match):
        load_model(centered)


def test_missing_model_field_is_named(centered):
    _edit(centered, lambda m: m.pop("seed"))
    with pytest.raises(FormatError, match=r"model.json has no 'seed'"):
        load_model(centered)


def test_inconsistent_shapes_are_refused(centered):
    _edit(centered, lambda m: m.update(d=5))
    with pytest.raises(FormatError, match=r"A has shape \(4, 4\), expected \(5, 5\)"):
        load_model(centered)
