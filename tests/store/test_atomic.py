"""An output is never an input of the same job: not the input itself, not a directory that
holds it, not a directory inside it."""

import pytest

from lshdist.errors import InputError
from lshdist.store.atomic import atomic_dir, check_not_input, check_output


@pytest.mark.parametrize("out", ["data", "data/sub/out", "data/out", ".", "data/../data"])
def test_an_output_that_is_holds_or_lies_inside_an_input_is_refused(tmp_path, monkeypatch, out):
    """Mutant caught: `check_not_input` without its 'lies inside' clause (an output inside an
    input accepted: an index written into the dataset's directory)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "zarr.json").write_text("{}")
    with pytest.raises(InputError, match=r"would overwrite the input 'data' \(it is, contains or "
                                         r"lies inside it\)"):
        check_not_input(out, ["data"])
    with pytest.raises(InputError, match="would overwrite the input"):
        check_output(out, True, inputs=[None, "data"])
    with pytest.raises(InputError, match="would overwrite the input"), atomic_dir(
            out, overwrite=True, inputs=["data"]):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["zarr.json"]


def test_a_sibling_is_not_an_input(tmp_path):
    check_not_input(tmp_path / "data-out", [tmp_path / "data"])
    check_not_input(tmp_path / "out" / "data", [tmp_path / "data"])
