import os

import pytest

from lshdist.datasets import data_dir
from lshdist.errors import InputError


@pytest.fixture(scope="session")
def data_root():
    """The real datasets folder (`lshdist.datasets.data_dir`).

    Without it the tests that need it skip — except under CI (``LSHDIST_REQUIRE_DATA=1``,
    set by ``.ci/run``), where a missing dataset fails the run instead of greening it.
    """
    try:
        return data_dir()
    except InputError as exc:
        if os.environ.get("LSHDIST_REQUIRE_DATA") == "1":
            pytest.fail(f"real datasets required (LSHDIST_REQUIRE_DATA=1) but not available: "
                        f"{exc}")
        pytest.skip(f"real datasets not available: {exc}")


@pytest.fixture(scope="session")
def letter(data_root):
    from lshdist.datasets import load_letter

    return load_letter(data_root)


@pytest.fixture(scope="session")
def fashion(data_root):
    from lshdist.datasets import load_fashion_mnist

    return load_fashion_mnist(data_root)


@pytest.fixture(scope="session")
def newsgroups(data_root):
    from lshdist.datasets import load_newsgroups

    return load_newsgroups(root=data_root)


def _reseal_dataset(path):
    """Seal a dataset edited on purpose as a careful forger would: every shard checksum and the
    attributes checksum recomputed from what is stored now (so only the content checks are
    left between the edit and the readers)."""
    import json
    from pathlib import Path

    import numpy as np
    import zarr

    from lshdist.store.dataset import attrs_checksum, shard_digest

    path = Path(path)
    meta = json.loads((path / "zarr.json").read_text())
    attrs = meta["attributes"]
    g = zarr.open_group(str(path), mode="r")
    n = attrs["N"]
    if attrs["kind"] == "sparse":
        b = np.asarray(g["X/shard_bounds"][:])
    else:
        b = np.append(np.arange(0, n, attrs["shard_rows"]), n)
    spans = list(zip(b[:-1].tolist(), b[1:].tolist()))

    def rows(name):
        a = np.asarray(g[name][:])
        return [shard_digest(a[lo:hi]) for lo, hi in spans]

    def csr(offsets, *names):
        off, arrays = np.asarray(g[offsets][:]), [np.asarray(g[a][:]) for a in names]
        return [shard_digest(off[lo:hi + 1], *(a[off[lo]:off[hi]] for a in arrays))
                for lo, hi in spans]

    sums = {"ids": rows("ids")}
    if "y" in g:
        sums["y"] = rows("y")
    if attrs["kind"] == "dense":
        sums["X"] = rows("X")
    elif attrs["kind"] == "sparse":
        sums["X"] = csr("X/indptr", "X/indices", "X/data")
    else:
        sums["P"] = csr("P/offsets", "P/values", *(["P/coords"] if "P/coords" in g else []))
    attrs["checksums"] = sums
    attrs["checksum"] = attrs_checksum(attrs)
    (path / "zarr.json").write_text(json.dumps(meta))


@pytest.fixture
def reseal():
    """``reseal(dataset_path)``: `_reseal_dataset`."""
    return _reseal_dataset


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server (moto's) on 127.0.0.1 for the session; the AWS_* environment points
    the process (and the workers it starts) at it.  Yields its endpoint URL."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    mp = pytest.MonkeyPatch()
    for name, value in {"AWS_ACCESS_KEY_ID": "lshdist-test", "AWS_SECRET_ACCESS_KEY": "secret",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
        mp.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "LSHDIST_STORAGE_OPTIONS"):
        mp.delenv(name, raising=False)
    yield endpoint
    mp.undo()
    server.stop()


@pytest.fixture
def bucket(s3_server):
    """A fresh, empty bucket on the test S3 server: ``s3://NAME``."""
    import uuid

    import s3fs

    name = f"lshdist-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(endpoint_url=s3_server, skip_instance_cache=True).mkdir(name)
    return f"s3://{name}"
