"""``--overwrite`` replaces only what lshdist wrote: a user's own file inside a results
directory (or any store artefact) is not deleted with it, and the current directory is never
renamed away (``--out .`` inside a results directory was an ``OSError: [Errno 16]``)."""

import errno

import numpy as np
import pytest

from lshdist.errors import OutputExistsError
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.atomic import check_output, describe_os_error, foreign_files
from lshdist.store.dataset import write_dataset
from lshdist.store.model import save_model
from lshdist.store.results import read_results, write_part, write_results


def _results(path, k=2):
    with write_results(path, k=k, overwrite=True) as tmp:
        write_part(tmp, 0, np.arange(3), np.zeros((3, k), np.float32),
                   np.arange(3 * k).reshape(3, k), np.ones(3, np.int32))


def test_a_users_file_in_a_results_directory_is_not_deleted(tmp_path):
    res = tmp_path / "res"
    _results(res)
    assert foreign_files(res, "lshdist-results") == []
    (res / "notes.txt").write_text("mine")
    (res / "neighbors" / "plot.png").write_bytes(b"png")
    with pytest.raises(OutputExistsError, match=r"refusing to overwrite .*res': it holds "
                                                r"'neighbors/plot.png' and 1 more, which lshdist "
                                                r"did not write; move what you keep"):
        _results(res)
    assert (res / "notes.txt").read_text() == "mine" and (res / "neighbors" / "plot.png").exists()
    (res / "notes.txt").unlink()
    (res / "neighbors" / "plot.png").unlink()
    _results(res, k=3)
    assert read_results(res)[1].shape == (3, 3)


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_other_artefacts_keep_a_users_file_too(tmp_path, kind):
    path = tmp_path / kind

    def write():
        if kind == "dataset":
            write_dataset(path, np.ones((4, 2)), overwrite=True)
        else:
            save_model(path, ExplicitMetric(np.eye(2)), overwrite=True)

    write()
    write()  # its own files only: replaced
    (path / "README").write_text("mine")
    with pytest.raises(OutputExistsError, match="it holds 'README', which lshdist did not write"):
        write()
    assert (path / "README").exists()


def test_the_current_directory_is_not_overwritten(tmp_path, monkeypatch):
    res = tmp_path / "res"
    _results(res)
    monkeypatch.chdir(res / "stats")
    for out in (res, "..", tmp_path / "res" / "."):
        with pytest.raises(OutputExistsError, match="it is \\(or holds\\) the current directory"):
            check_output(out, True, kind="lshdist-results")
    monkeypatch.chdir(tmp_path)
    assert check_output(res, True, kind="lshdist-results") == res


def test_a_permission_error_is_not_called_a_write_error():
    msg = str(describe_os_error(PermissionError(errno.EACCES, "Permission denied",
                                                "/x/idx/segments")))
    assert msg.startswith("permission denied on '/x/idx/segments': lshdist cannot read or "
                          "write it") and "cannot write '" not in msg
