"""One exit-2 line, no traceback, for what the system or the user got wrong: OS errors of any
kind (a file size limit, EFBIG, was a traceback with exit 1), a scheduler address that is not
one (a ValueError traceback), an object storage URL as a path (silently a local folder named
``s3:``), a task that fails on a worker (Dask's "Compute Failed" traceback, three times).

The file size limit runs in child processes (``ulimit -f`` is per process); those are drills.
"""

from __future__ import annotations

import errno
import logging
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lshdist.cli import guarded, main
from lshdist.cluster.client import check_scheduler_address, dask_client
from lshdist.errors import InputError
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.files import local_path
from lshdist.store.model import save_model

BIN = Path(sys.executable).parent


@pytest.fixture
def small(tmp_path: Path) -> Path:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 5)).astype(np.float32)
    write_dataset(tmp_path / "data", X, shard_rows=100)
    save_model(tmp_path / "model", ExplicitMetric(np.eye(5) * 2.0))
    return tmp_path


def _one_line(err: str, *needles: str) -> None:
    assert "Traceback" not in err and "Compute Failed" not in err, err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1, err
    for needle in needles:
        assert needle in errors[0], err


@pytest.mark.parametrize("address", ["http://localhost:8786", "localhost:8786", "tcp://host:x",
                                     "tcp://host:99999", "tcp://host", "scheduler"])
def test_what_is_not_a_scheduler_address_is_refused(address):
    with pytest.raises(InputError, match=r"is not a Dask scheduler address: expected "
                                         r"tcp://HOST:PORT"):
        check_scheduler_address(address)


def test_a_dashboard_url_as_scheduler_is_one_line(small, capsys):
    assert main(["index", "--data", str(small / "data"), "--model", str(small / "model"),
                 "--out", str(small / "idx"), "--scheduler", "http://127.0.0.1:8787/status",
                 "--connect-timeout", "2"]) == 2
    _one_line(capsys.readouterr().err, "the dashboard's http:// address is not it")
    assert not (small / "idx").exists()
    for ok in ("tcp://10.0.0.5:8786", "tls://[::1]:8786", "tcp://node-7.cluster:40000"):
        check_scheduler_address(ok)


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("url,needles", [
    ("https://host/x", ["unknown storage scheme 'https://'", "s3://, gs://, abfs://"]),
    ("ftp://host/x", ["unknown storage scheme 'ftp://'"]),
    ("s3:/bucket/idx", ["is not a local path (it starts like a URL)", "s3://BUCKET/PATH"]),
    pytest.param("gs://b/x", ["gs:// needs the gcsfs package", "pip install 'lshdist[gcs]'"],
                 marks=pytest.mark.skipif(_installed("gcsfs"), reason="gcsfs is installed")),
    pytest.param("abfs://c@acct/x", ["abfs:// needs the adlfs package",
                                     "pip install 'lshdist[azure]'"],
                 marks=pytest.mark.skipif(_installed("adlfs"), reason="adlfs is installed")),
])
def test_urls_lshdist_cannot_serve_are_refused_before_anything_is_written(small, capsys,
                                                                          monkeypatch, url,
                                                                          needles):
    monkeypatch.chdir(small)
    for args in (["index", "--data", "data", "--model", "model", "--out", url],
                 ["index", "--data", url, "--model", "model", "--out", "idx"],
                 ["ingest", url, "--out", "new"], ["verify", url], ["info", url]):
        assert main(args) == 2
        _one_line(capsys.readouterr().err, *needles)
    assert sorted(p.name for p in small.iterdir()) == ["data", "model"]  # no 's3:' folder


def test_file_urls_are_local_paths(small, capsys):
    assert local_path(f"file://{small}/data") == small / "data"
    assert main(["verify", f"file://{small}/data"]) == 0
    assert "OK dataset" in capsys.readouterr().out
    with pytest.raises(InputError, match="names another host; a file:// URL must name a local"):
        local_path("file://otherhost/x")


@pytest.mark.parametrize("exc,needles", [
    (OSError(errno.EFBIG, "File too large"),
     ["cannot write a file (the system did not say which): a file would exceed the file size "
      "limit (ulimit -f)", "raise the limit"]),
    (OSError(errno.ENOSPC, "No space left on device", "/data/idx/segments/seg-1/codes"),
     ["cannot write '/data/idx/segments/seg-1/codes': the disk is full"]),
    (OSError(errno.EIO, "Input/output error", "/data/x"),
     ["the operating system refused an operation on '/data/x': Input/output error (EIO)"]),
    (OSError(errno.EMFILE, "Too many open files"), ["Too many open files (EMFILE)"]),
])
def test_every_os_error_is_one_line(capsys, caplog, exc, needles):
    def job() -> int:
        raise exc

    with caplog.at_level(logging.DEBUG, logger="lshdist"):
        assert guarded("lshdist x", job) == 2
    _one_line(capsys.readouterr().err, *needles)
    assert "Traceback" in caplog.text  # kept for -v


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_failed_task_is_logged_at_debug_not_three_times():
    """What a worker logs when a task fails (once per try) goes to lshdist's debug log; the
    worker's other messages pass.  (End to end: the file size drill below, in-process.)"""
    with dask_client(processes=False, workers=1):
        pass  # a client installs the filter on the in-process workers' logger
    worker, ours = logging.getLogger("distributed.worker"), logging.getLogger("lshdist")
    seen, mine = _Records(), _Records()
    worker.addHandler(seen)
    ours.addHandler(mine)
    old = ours.level
    ours.setLevel(logging.DEBUG)
    try:
        for _ in range(3):
            worker.error("Compute Failed\nKey: write-1\nException: OSError(27)\nTraceback: ...")
        worker.error("a worker's own trouble")
    finally:
        worker.removeHandler(seen)
        ours.removeHandler(mine)
        ours.setLevel(old)
    assert [r.getMessage() for r in seen.records] == ["a worker's own trouble"]
    assert len(mine.records) == 3 and all(r.levelno == logging.DEBUG and "Compute Failed" in
                                          r.getMessage() for r in mine.records)


def _fsize(limit: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


def _run(args: list[str], limit: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "lshdist"), *args], capture_output=True, text=True,
                          timeout=300, preexec_fn=_fsize(limit))


@pytest.mark.drills
def test_a_file_size_limit_is_one_line_in_every_job(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "big.npy", rng.normal(size=(20000, 50)).astype(np.float32))
    out = _run(["ingest", str(tmp_path / "big.npy"), "--out", str(tmp_path / "d")], 200_000)
    assert out.returncode == 2, out.stderr
    _one_line(out.stderr, f"cannot write '{tmp_path / 'd'}': a file would exceed the file size "
                          "limit (ulimit -f)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.npy"]

    X = rng.normal(size=(20000, 50)).astype(np.float32)
    write_dataset(tmp_path / "data", X, shard_rows=5000)
    write_dataset(tmp_path / "more", X[:4000] + 1, ids=np.arange(4000) + 10**6, shard_rows=4000)
    write_dataset(tmp_path / "queries", X[:3000], shard_rows=3000)
    save_model(tmp_path / "model", ExplicitMetric(np.eye(50) * 2.0))
    build = ["index", "--data", str(tmp_path / "data"), "--model", str(tmp_path / "model"),
             "--bits", "32", "--permutations", "4", "--in-process", "--workers", "2"]
    out = _run([*build, "--out", str(tmp_path / "idx")], 500_000)
    assert out.returncode == 2, out.stderr
    _one_line(out.stderr, "a file would exceed the file size limit (ulimit -f)")
    assert not (tmp_path / "idx").exists()

    assert _run([*build, "--out", str(tmp_path / "idx")], 2**40).returncode == 0
    out = _run(["index", "--append", "--data", str(tmp_path / "more"), "--model",
                str(tmp_path / "model"), "--out", str(tmp_path / "idx"), "--in-process",
                "--workers", "1"], 100_000)
    assert out.returncode == 2, out.stderr
    # the file is named: zarr's own error did not say which
    _one_line(out.stderr, f"cannot write '{tmp_path / 'idx' / 'segments'}/seg-",
              "file size limit")
    assert main(["verify", str(tmp_path / "idx")]) == 0  # the previous index stands

    out = _run(["query", "--index", str(tmp_path / "idx"), "--queries",
                str(tmp_path / "queries"), "--k", "50", "--out", str(tmp_path / "res"),
                "--in-process", "--workers", "1"], 20_000)
    assert out.returncode == 2, out.stderr
    _one_line(out.stderr, "file size limit")
    assert not (tmp_path / "res").exists()
