"""Reads of artefact files are bounded: a chunk or manifest that is a device, a FIFO or a symlink
leaving the artefact is refused, and no file is read past what it may hold.

A chunk symlinked to /dev/zero was read without end (killed at 2.5 GB) by `verify` and `query`;
a FIFO blocked the reader for ever.  Those cases run in a child process with a memory limit and
a timeout, so that a regression fails instead of taking the machine down.
"""

import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

from lshdist.cli import main
from lshdist.errors import FormatError
from lshdist.metric.learned import ExplicitMetric
from lshdist.store import files
from lshdist.store.dataset import Dataset, write_dataset
from lshdist.store.model import load_model, save_model


def _dataset(tmp_path: Path) -> Path:
    X = np.arange(60, dtype=np.float32).reshape(20, 3)
    return write_dataset(tmp_path / "ds", X, shard_rows=10).path


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (3 * 2**30, 3 * 2**30))


HOSTILE = textwrap.dedent("""
    import os, sys, numpy as np
    from pathlib import Path
    from lshdist.errors import FormatError
    from lshdist.metric.learned import ExplicitMetric
    from lshdist.store.dataset import Dataset, write_dataset
    from lshdist.store.model import load_model, save_model
    root = Path(sys.argv[1])
    X = np.arange(60, dtype=np.float32).reshape(20, 3)
    cases = []
    for special in ("/dev/zero", "fifo"):
        ds = write_dataset(root / f"ds-{special[-4:]}", X, shard_rows=10).path
        model = root / f"model-{special[-4:]}"
        save_model(model, ExplicitMetric(np.eye(3) * 2.0))
        for chunk in (ds / "X" / "c" / "1" / "0", model / "arrays" / "A" / "c" / "0" / "0"):
            chunk.unlink()
            if special == "fifo":
                os.mkfifo(chunk)
            else:
                chunk.symlink_to(special)
        cases += [(lambda ds=ds: Dataset(ds).read_all()), (lambda m=model: load_model(m))]
    for case in cases:
        try:
            case()
            print("READ")
        except FormatError as exc:
            print("REFUSED", exc)
""")


def test_devices_and_fifos_as_chunks_are_refused_not_read(tmp_path):
    out = subprocess.run([sys.executable, "-c", HOSTILE, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, preexec_fn=_limit_memory)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 4, out.stderr[-2000:]
    assert all(line.startswith("REFUSED") and ("is not a regular file" in line or
                                               "is a symlink to '/dev/zero', outside" in line)
               for line in lines), lines


def test_a_symlink_leaving_the_artefact_is_refused(tmp_path):
    ds = _dataset(tmp_path)
    chunk = ds / "X" / "c" / "1" / "0"
    outside = tmp_path / "elsewhere"
    outside.write_bytes(chunk.read_bytes())
    chunk.unlink()
    chunk.symlink_to(outside)
    with pytest.raises(FormatError, match=r"c/1/0' is a symlink to .*elsewhere', outside"):
        Dataset(ds).read_all()
    np.testing.assert_array_equal(Dataset(ds).read_shard(0)[0], [0, 1, 2])
    inside = ds / "copy-of-chunk"  # a symlink that stays inside is followed
    inside.write_bytes(outside.read_bytes())
    chunk.unlink()
    chunk.symlink_to(inside)
    Dataset(ds).verify()


def test_a_chunk_larger_than_its_array_allows_is_not_read(tmp_path):
    ds = _dataset(tmp_path)
    chunk = ds / "X" / "c" / "1" / "0"
    size = 10 * 3 * zarr.open_array(ds / "X", mode="r").dtype.itemsize  # uint8: byte values
    bound = size + size // 8 + 64 * 2**10
    with open(chunk, "ab") as f:
        f.write(b"\0" * bound)
    with pytest.raises(FormatError, match=r"c/1/0' holds [\d,]+ bytes or more, more than the "
                                          rf"{bound:,} it may"):
        Dataset(ds).read_all()


def test_model_and_index_manifests_are_bounded(tmp_path, monkeypatch):
    save_model(tmp_path / "m", ExplicitMetric(np.eye(3) * 2.0))
    load_model(tmp_path / "m")
    size = (tmp_path / "m" / "model.json").stat().st_size
    monkeypatch.setattr(files, "MAX_JSON_BYTES", size - 1)
    with pytest.raises(FormatError, match=rf"model.json is corrupted \(.*holds {size:,} bytes "
                                          r"or more.*learn it again"):
        load_model(tmp_path / "m")


@pytest.mark.parametrize("name", ["index.json", "model.json", "results.json", "zarr.json"])
def test_deeply_nested_manifests_are_one_line_errors(tmp_path, capsys, name):
    d = tmp_path / "art"
    d.mkdir()
    (d / name).write_text("[" * 200_000 + "]" * 200_000)
    assert main(["info", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{name} is corrupted (JSON nested too deeply)" in err
    assert main(["verify", str(d)]) == 2
    assert "nested too deeply" in capsys.readouterr().err
