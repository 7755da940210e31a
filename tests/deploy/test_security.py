"""Security of the clusters lshdist starts or joins: TLS, loopback-only listening.

* TLS (marked ``cluster``): self-signed CA and certificates made with ``openssl``; a
  ``dask scheduler --protocol tls`` and 2 ``dask worker`` processes on 127.0.0.1; ``lshdist
  index`` and ``query`` run on it with ``--scheduler tls://`` and the certificate options and
  give the results of an in-process cluster; a plain-TCP client, a ``tls://`` client without
  certificates, and one holding a certificate of another CA are all refused.
* Loopback only (marked ``cluster``): every socket a default ``lshdist index`` run (LocalCluster
  of 2 worker processes) listens on, in the CLI process and its children, is on 127.0.0.1, and
  the dashboard address it logs is that address.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lshdist.cli import main
from lshdist.cluster.client import cluster_security
from lshdist.errors import InputError
from lshdist.metric.learned import ExplicitMetric
from lshdist.store.dataset import write_dataset
from lshdist.store.model import save_model
from lshdist.store.results import read_results

BIN = Path(sys.executable).parent
OPTS = ["--bits", "64", "--permutations", "8", "--window", "4", "--hamming-keep", "0",
        "--segment-rows", "500"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             f"/CN={name}", "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.pem"))


def _cert(d: Path, ca: str, name: str) -> None:
    """A certificate for 127.0.0.1 signed by ``ca`` (distributed checks the peer's address)."""
    ext = d / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
             "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
    _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / f"{ca}.pem"),
             "-CAkey", str(d / f"{ca}.key"), "-CAcreateserial", "-days", "2",
             "-extfile", str(ext), "-out", str(d / f"{name}.pem"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("secure")
    rng = np.random.default_rng(7)
    X = rng.normal(size=(2000, 16)).astype(np.float32)
    write_dataset(root / "data", X, ids=rng.permutation(2000) * 3 + 1, shard_rows=250)
    write_dataset(root / "queries", X[:200] + 0.01, ids=np.arange(200) + 10**5,
                  shard_rows=100)
    save_model(root / "model", ExplicitMetric.identity(16))
    return root


def test_tls_needs_certificates(tmp_path):
    with pytest.raises(InputError, match="needs TLS certificates"):
        cluster_security("tls://127.0.0.1:1")
    with pytest.raises(InputError, match="does not exist"):
        cluster_security("tls://127.0.0.1:1", ca_file=str(tmp_path / "none.pem"))
    (tmp_path / "ca.pem").write_text("x")
    with pytest.raises(InputError, match="is not tls://"):
        cluster_security("tcp://127.0.0.1:1", ca_file=str(tmp_path / "ca.pem"))
    assert cluster_security("tcp://127.0.0.1:1") is None


def _scheduler_address(path: Path, timeout: float = 60.0) -> str:
    """The address in a scheduler file, once the scheduler has written all of it.

    `dask scheduler` creates the file before it writes its content, so existence alone is not
    enough: wait until it parses.
    """
    import json

    deadline = time.monotonic() + timeout
    while True:
        try:
            return str(json.loads(path.read_text())["address"])
        except (FileNotFoundError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.cluster
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_cluster(data, tmp_path, capsys):
    certs = tmp_path / "certs"
    certs.mkdir()
    _ca(certs, "ca")
    _ca(certs, "other-ca")
    for name in ("scheduler", "worker", "client"):
        _cert(certs, "ca", name)
    _cert(certs, "other-ca", "intruder")
    tls = ["--tls-ca-file", str(certs / "ca.pem")]
    sched_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--protocol", "tls", "--host", "127.0.0.1", "--port",
         "0", "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file), *tls,
         "--tls-cert", str(certs / "scheduler.pem"), "--tls-key", str(certs / "scheduler.key")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        address = _scheduler_address(sched_file)
        assert address.startswith("tls://127.0.0.1:")
        for _ in range(2):
            procs.append(subprocess.Popen(
                [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                 "--no-dashboard", *tls, "--tls-cert", str(certs / "worker.pem"),
                 "--tls-key", str(certs / "worker.key")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        client_tls = [*tls, "--tls-cert", str(certs / "client.pem"), "--tls-key",
                      str(certs / "client.key")]
        from distributed import Client, Security

        sec = Security(tls_ca_file=str(certs / "ca.pem"), tls_client_cert=str(
            certs / "client.pem"), tls_client_key=str(certs / "client.key"),
            require_encryption=True)
        with Client(address, security=sec, timeout=30) as c:
            c.wait_for_workers(2, timeout=60)
        cluster = ["--scheduler", address, *client_tls, "--connect-timeout", "15"]
        root = data
        assert main(["index", "--data", str(root / "data"), "--model", str(root / "model"),
                     "--out", str(tmp_path / "idx"), *OPTS, *cluster]) == 0
        assert main(["query", "--index", str(tmp_path / "idx"), "--queries",
                     str(root / "queries"), "--k", "5", "--mode", "hash", "--out",
                     str(tmp_path / "res"), *cluster]) == 0
        # the same job on an in-process cluster gives the same answers
        local = ["--in-process", "--workers", "1"]
        assert main(["index", "--data", str(root / "data"), "--model", str(root / "model"),
                     "--out", str(tmp_path / "idx-local"), *OPTS, *local]) == 0
        assert main(["query", "--index", str(tmp_path / "idx-local"), "--queries",
                     str(root / "queries"), "--k", "5", "--mode", "hash", "--out",
                     str(tmp_path / "res-local"), *local]) == 0
        for a, b in zip(read_results(tmp_path / "res"), read_results(tmp_path / "res-local")):
            assert np.array_equal(a, b)
        capsys.readouterr()
        # refused: plain TCP on the TLS port, tls:// without certificates, another CA's cert
        tcp = address.replace("tls://", "tcp://")
        assert main(["index", "--data", str(root / "data"), "--model", str(root / "model"),
                     "--out", str(tmp_path / "x1"), *OPTS, "--scheduler", tcp,
                     "--connect-timeout", "3"]) == 2
        assert "could not reach the Dask scheduler" in capsys.readouterr().err
        assert main(["index", "--data", str(root / "data"), "--model", str(root / "model"),
                     "--out", str(tmp_path / "x2"), *OPTS, "--scheduler", address]) == 2
        assert "needs TLS certificates" in capsys.readouterr().err
        assert main(["index", "--data", str(root / "data"), "--model", str(root / "model"),
                     "--out", str(tmp_path / "x3"), *OPTS, "--scheduler", address, *tls,
                     "--tls-cert", str(certs / "intruder.pem"), "--tls-key",
                     str(certs / "intruder.key"), "--connect-timeout", "3"]) == 2
        assert "could not reach the Dask scheduler" in capsys.readouterr().err
        assert not any((tmp_path / x).exists() for x in ("x1", "x2", "x3"))
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.mark.cluster
def test_default_run_listens_on_loopback_only(data, tmp_path):
    import psutil

    out = tmp_path / "idx"
    p = subprocess.Popen([str(BIN / "lshdist"), "index", "--data", str(data / "data"),
                          "--model", str(data / "model"), "--out", str(out), *OPTS],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[tuple[str, int, int]] = set()  # (address, port, pid)
    try:
        proc = psutil.Process(p.pid)
        while p.poll() is None:
            try:
                tree = [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for q in tree:
                try:
                    conns = q.net_connections(kind="inet")
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                seen |= {(c.laddr.ip, c.laddr.port, q.pid) for c in conns
                         if c.status == psutil.CONN_LISTEN}
            time.sleep(0.05)
    finally:
        _stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr
    pids = {pid for _, _, pid in seen}
    print(f"\nlistening sockets seen: {sorted(seen)}")
    assert len(pids) >= 3  # the CLI (scheduler, dashboard) and 2 workers (nanny + worker)
    assert {ip for ip, _, _ in seen} == {"127.0.0.1"}, seen
    m = re.search(r"Dask scheduler (\S+), dashboard (\S+)", stderr)
    assert m, stderr
    assert m.group(1).startswith("tcp://127.0.0.1:")
    assert m.group(2).startswith("http://127.0.0.1:")
    port = int(m.group(2).split(":")[2].split("/")[0])
    assert ("127.0.0.1", port, p.pid) in seen  # the dashboard logged is the one listening
