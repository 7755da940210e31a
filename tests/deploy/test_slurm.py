"""``--cluster slurm`` submitted for real, to a one-node SLURM on this machine.

The session fixture brings SLURM up with ``deploy/slurm/local-cluster.sh`` (installing
slurm-wlm and munge when missing: root and apt-get needed, else the tests skip -- or fail
under ``LSHDIST_REQUIRE_SLURM=1``, as in CI) and takes it down at the end.  The tests marked
``slurm`` run index and query on SLURM worker jobs and compare their neighbours with a
LocalCluster's, run ``deploy/slurm/driver.sbatch`` under ``sbatch --wait`` for build_index and
bulk_query, submit to a misspelt partition (exit 2 within 60 s with SLURM's reason), and watch
every socket the driver, the worker jobs and the SLURM daemons listen on (loopback only).
The unmarked tests check the messages without SLURM.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from lshdist.config import ClusterConfig
from lshdist.errors import InputError

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "deploy" / "slurm"
BIN = Path(sys.executable).parent
LSHDIST = str(BIN / "lshdist")
RUN_TIMEOUT = 300
#: M, W and H fixed and the hashed search asked for: calibration and the auto mode choose by
#: timing, which differs from run to run (and so would the neighbours)
INDEX_OPTIONS = ("--segment-rows", "1500", "--permutations", "16", "--window", "4",
                 "--hamming-keep", "20")
QUERY_OPTIONS = ("--k", "5", "--mode", "hash")


# --------------------------------------------------------------------------------------------
# without SLURM: the messages


def test_interface_null_is_refused(tmp_path):
    pytest.importorskip("dask_jobqueue")
    from lshdist.cluster.client import slurm_cluster

    jq = _jobqueue(tmp_path, interface=None)
    with pytest.raises(InputError, match=r"jobqueue\.slurm\.interface is not set .*0\.0\.0\.0"):
        slurm_cluster(ClusterConfig(kind="slurm", jobqueue=str(jq)))


def test_worker_settings_of_their_own(tmp_path):
    pytest.importorskip("dask_jobqueue")
    from lshdist.cluster.client import slurm_cluster

    cluster = slurm_cluster(ClusterConfig(kind="slurm", jobqueue=str(_jobqueue(tmp_path))))
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "export DASK_LOGGING__DISTRIBUTED=info" in script
    assert "--dashboard-address 127.0.0.1:0" in script and "--interface lo" in script


def test_unset_prologue_variable_is_refused(tmp_path, monkeypatch):
    pytest.importorskip("dask_jobqueue")
    from lshdist.cluster.client import slurm_cluster
    from lshdist.cluster.slurm import check_submission

    monkeypatch.delenv("LSHDIST_VENV", raising=False)
    jq = _jobqueue(tmp_path)
    cluster = slurm_cluster(ClusterConfig(kind="slurm", jobqueue=str(jq)))
    try:
        with pytest.raises(InputError, match=r"reads \$LSHDIST_VENV, not set here.*"
                                             r"export LSHDIST_VENV"):
            check_submission(cluster, str(jq))
    finally:
        cluster.close()


def test_prologue_variables():
    from lshdist.cluster.slurm import prologue_variables

    lines = ["export A=1 NUMBA_CACHE_DIR=$HOME/x", "source ${VENV}/bin/activate", "echo $A $B",
             "cd $SLURM_SUBMIT_DIR $TMPDIR"]
    assert prologue_variables(lines) == ["VENV", "B"]


def test_sbatch_reason():
    from lshdist.cluster.slurm import sbatch_reason

    err = ("sbatch: error: invalid partition specified: nosuch\n"
           "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    assert sbatch_reason(err) == ("invalid partition specified: nosuch; Batch job submission "
                                  "failed: Invalid partition name specified")


@pytest.mark.parametrize("unset, message", [
    ("LSHDIST_HOME", "set LSHDIST_HOME to the lshdist checkout"),
    ("LSHDIST_WORKDIR", "set LSHDIST_WORKDIR to the job's directory"),
    ("LSHDIST_VENV", "LSHDIST_VENV=/nonexistent is not a virtualenv"),
])
def test_driver_sbatch_environment(tmp_path, unset, message):
    env = {**os.environ, "LSHDIST_HOME": str(REPO), "LSHDIST_WORKDIR": str(tmp_path),
           "LSHDIST_VENV": str(BIN.parent)}
    if unset == "LSHDIST_VENV":
        env[unset] = "/nonexistent"
    else:
        env.pop(unset)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("workdir: .\n")
    r = subprocess.run(["bash", str(SLURM / "driver.sbatch"), str(cfg)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr


# --------------------------------------------------------------------------------------------
# a real SLURM


def _jobqueue(tmp_path: Path, **changes: object) -> Path:
    """The shipped jobqueue.yaml with a test's request (small memory and walltime)."""
    raw = yaml.safe_load((SLURM / "jobqueue.yaml").read_text())
    raw["jobqueue"]["slurm"].update({"memory": "2GiB", "walltime": "00:30:00", **changes})
    path = tmp_path / f"jobqueue-{len(list(tmp_path.glob('jobqueue-*')))}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A one-node SLURM (``local-cluster.sh up``), SLURM_CONF and LSHDIST_VENV set for the
    session; taken down at the end."""
    required = os.environ.get("LSHDIST_REQUIRE_SLURM") == "1"

    def unavailable(why: str) -> None:
        if required:
            pytest.fail(f"SLURM required (LSHDIST_REQUIRE_SLURM=1) but {why}")
        pytest.skip(why)

    installed = all(shutil.which(c) for c in ("slurmctld", "slurmd", "munged", "sbatch"))
    if os.geteuid() != 0:
        unavailable("not root: local-cluster.sh starts munged, slurmctld and slurmd as root")
    if not installed and not shutil.which("apt-get"):
        unavailable("slurm-wlm/munge not installed and no apt-get to install them")
    d = tmp_path_factory.mktemp("slurm")
    t0 = time.perf_counter()
    r = subprocess.run(["bash", str(SLURM / "local-cluster.sh"), "up", str(d)],
                       capture_output=True, text=True, timeout=600)
    up = time.perf_counter() - t0
    try:
        assert r.returncode == 0, f"local-cluster.sh up failed: {r.stderr}{r.stdout}"
        print(f"\nlocal-cluster.sh up: {up:.1f}s")
        with pytest.MonkeyPatch.context() as env:  # restored when the session ends
            env.setenv("SLURM_CONF", str(d / "slurm.conf"))
            env.setenv("LSHDIST_VENV", str(BIN.parent))
            yield d
    finally:
        subprocess.run(["bash", str(SLURM / "local-cluster.sh"), "down", str(d)],
                       capture_output=True, text=True, timeout=120)
        left = [p for p in ("munged", "slurmctld", "slurmd") if (d / f"{p}.pid").exists()]
        assert not left, f"local-cluster.sh down left {left}"


def _lshdist(*args: object, cwd: Path, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([LSHDIST, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="session")
def letter_job(tmp_path_factory):
    """Letter's first 3,000 rows as the database and 400 later rows as queries (sklearn's
    digits without the real datasets), a learned model, and the LocalCluster's index and
    answers; the numba cache the worker jobs read warmed."""
    from lshdist.datasets import data_dir

    d = tmp_path_factory.mktemp("letter")
    try:
        src = data_dir() / "letter" / "letter-recognition.data"
        db_rows, q_rows = "0:3000", "16000:16400"
    except InputError:
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        src = d / "digits.npz"
        np.savez(src, X=X.astype(np.float32), y=y.astype(np.int64))
        db_rows, q_rows = "0:1400", "1400:1797"
    _ok(_lshdist("ingest", src, "--out", "data", "--rows", db_rows, "--shard-rows", 750, cwd=d))
    _ok(_lshdist("ingest", src, "--out", "queries", "--rows", q_rows, "--shard-rows", 400,
                 cwd=d))
    _ok(_lshdist("learn", "--data", "data", "--out", "model", "--no-search", "--constraints",
                 400, "--force-learned", cwd=d))
    _ok(_lshdist("index", "--data", "data", "--model", "model", "--out", "index-local",
                 *INDEX_OPTIONS, cwd=d))
    _ok(_lshdist("query", "--index", "index-local", "--queries", "queries", "--out",
                 "results-local", *QUERY_OPTIONS, cwd=d))
    # the worker jobs' NUMBA_CACHE_DIR (the shipped prologue's), compiled into once here
    subprocess.run([sys.executable, "-c", "from lshdist.cluster.client import warm_kernels; "
                    "warm_kernels()"], check=True, timeout=600,
                   env={**os.environ, "NUMBA_CACHE_DIR": str(Path.home() / ".cache" /
                                                              "lshdist-numba")})
    return d


def _neighbours(results: Path) -> np.ndarray:
    from lshdist import read_results

    df = read_results(results).sort_values(["query_id", "rank"])
    return df[["query_id", "rank", "neighbor_id"]].to_numpy()


def _tree(roots: set[int]) -> set[int]:
    """``roots`` and all their descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p.name))
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def _listeners(pids: set[int]) -> set[tuple[int, str]]:
    """``(pid, address)`` of the TCP sockets ``pids`` listen on (/proc/net/tcp and tcp6)."""
    inodes: dict[str, str] = {}
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":  # LISTEN
                inodes[f[9]] = f[1]
    out = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            m = re.fullmatch(r"socket:\[(\d+)\]", link)
            if m and m.group(1) in inodes:
                out.add((pid, _address(inodes[m.group(1)])))
    return out


def _address(hexaddr: str) -> str:
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ".".join(str(b) for b in raw[::-1])
    else:  # four little-endian 32-bit words
        words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
        ip = words.hex()
        ip = {"0" * 31 + "1": "::1", "0" * 32: "::"}.get(ip, ip)
        if words[:12] == b"\0" * 10 + b"\xff\xff":
            ip = ".".join(str(b) for b in words[12:])
    return f"{ip}:{int(port, 16)}"


def _loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr.startswith("::1:")


def _watched(cmd: list[str], cwd: Path, roots: set[int]) -> tuple[subprocess.CompletedProcess,
                                                                  set[tuple[int, str]]]:
    """Run ``cmd``; meanwhile, every 0.3 s, the sockets listened on by it, its descendants and
    ``roots``' (the SLURM daemons: the worker jobs descend from slurmd)."""
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    seen: set[tuple[int, str]] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(_listeners(_tree({p.pid, *roots, *_job_processes()})))
            time.sleep(0.3)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        out, err = p.communicate(timeout=RUN_TIMEOUT)
    finally:
        done.set()
        t.join()
        if p.poll() is None:
            p.kill()
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), seen


def _job_processes() -> set[int]:
    """The processes of this SLURM's jobs: slurmstepd daemonises (its parent is init, not
    slurmd), so they are found by the SLURM_CONF the jobs inherit."""
    want = f"SLURM_CONF={os.environ['SLURM_CONF']}".encode()
    out = set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if want in (p / "environ").read_bytes().split(b"\0"):
                    out.add(int(p.name))
            except OSError:
                continue
    return out


def _daemons(slurm: Path) -> set[int]:
    return {int((slurm / f"{d}.pid").read_text()) for d in ("munged", "slurmctld", "slurmd")}


def _allocated(slurm: Path) -> int:
    """Jobs slurmctld's log says it started (by its main scheduler or by backfill)."""
    text = (slurm / "slurmctld.log").read_text()
    return len(re.findall(r"sched: Allocate JobId=|_start_job: Started JobId=", text))


@pytest.mark.slurm
def test_index_and_query_on_slurm_workers(slurm, letter_job, tmp_path):
    """index and query with --cluster slurm: the LocalCluster's neighbours, the worker jobs in
    slurmctld's log, and every socket of the driver, the jobs and the daemons on loopback."""
    jq = _jobqueue(tmp_path)
    d = letter_job
    opts = ["--cluster", "slurm", "--jobqueue", str(jq), "--workers", "2",
            "--stall-timeout", "240"]
    before = _allocated(slurm)
    t0 = time.perf_counter()
    r, seen = _watched([LSHDIST, "index", "--data", "data", "--model", "model", "--out",
                        str(tmp_path / "index"), *INDEX_OPTIONS, *opts], d, _daemons(slurm))
    t_index = time.perf_counter() - t0
    _ok(r)
    assert "2 SLURM workers joined" in r.stderr, r.stderr[-2000:]
    t0 = time.perf_counter()
    r, seen_q = _watched([LSHDIST, "query", "--index", str(tmp_path / "index"), "--queries",
                          "queries", "--out", str(tmp_path / "results"), *QUERY_OPTIONS,
                          *opts], d, _daemons(slurm))
    t_query = time.perf_counter() - t0
    _ok(r)
    print(f"\nindex on SLURM {t_index:.1f}s, query {t_query:.1f}s")
    assert _allocated(slurm) - before == 4  # 2 worker jobs a run
    assert (_neighbours(tmp_path / "results") == _neighbours(d / "results-local")).all()
    seen |= seen_q
    outside = sorted((pid, a) for pid, a in seen if not _loopback(a))
    assert not outside, f"listening beyond loopback: {outside}"
    # the check saw slurmctld, slurmd, each driver's scheduler and dashboard, and each
    # worker job's nanny, worker and HTTP server (2 drivers, 4 jobs)
    assert len({a for _, a in seen}) >= 2 + 2 * 2 + 4 * 3, sorted(seen)


@pytest.mark.slurm
def test_misspelt_partition_exits_2_with_slurms_reason(slurm, letter_job, tmp_path):
    jq = _jobqueue(tmp_path, queue="nosuchpartition")
    t0 = time.perf_counter()
    r = _lshdist("query", "--index", "index-local", "--queries", "queries", "--out",
                 tmp_path / "results", "--cluster", "slurm", "--jobqueue", jq, "--workers", 2,
                 cwd=letter_job, timeout=120)
    took = time.perf_counter() - t0
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
    assert r.returncode == 2, r.stderr[-2000:]
    assert took < 60
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert re.search(r"SLURM refused the worker job: invalid partition specified: "
                     r"nosuchpartition.*Invalid partition name", errors[0]), errors[0]
    assert not (tmp_path / "results").exists()


@pytest.mark.slurm
def test_driver_sbatch_build_index_and_bulk_query(slurm, letter_job, tmp_path):
    """``sbatch --wait deploy/slurm/driver.sbatch CONFIG JOB`` for build_index, then
    bulk_query: the LocalCluster's neighbours, the driver's log beside the configs."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("data", "model", "queries"):
        (work / name).symlink_to(letter_job / name)
    jq = _jobqueue(tmp_path)
    cluster = {"kind": "slurm", "workers": 2, "jobqueue": str(jq), "stall_timeout": 240}
    build = tmp_path / "build.yaml"
    build.write_text(yaml.safe_dump({
        "workdir": "${LSHDIST_WORKDIR}", "paths": {"data": "data", "model": "model",
                                                   "index": "index"},
        "index": {"segment_rows": 1500, "permutations": 16, "window": 4, "hamming_keep": 20},
        "cluster": cluster}))
    query = tmp_path / "query.yaml"
    query.write_text(yaml.safe_dump({
        "workdir": "${LSHDIST_WORKDIR}", "paths": {"index": "index", "queries": "queries",
                                                   "results": "results"},
        "query": {"k": 5, "mode": "hash"}, "cluster": cluster}))
    env = {**os.environ, "LSHDIST_HOME": str(REPO), "LSHDIST_WORKDIR": str(work)}
    for cfg, job in ((build, "build_index"), (query, "bulk_query")):
        t0 = time.perf_counter()
        r = subprocess.run(["sbatch", "--wait", str(SLURM / "driver.sbatch"), str(cfg), job],
                           cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=RUN_TIMEOUT)
        jid = re.search(r"Submitted batch job (\d+)", r.stdout)
        log = tmp_path / f"lshdist-driver-{jid.group(1)}.log" if jid else None
        text = log.read_text() if log and log.exists() else "(no driver log)"
        assert r.returncode == 0, f"{r.stderr}\n{text[-3000:]}"
        print(f"\nsbatch --wait driver.sbatch {job}: {time.perf_counter() - t0:.1f}s")
        assert "2 SLURM workers joined" in text, text[-3000:]
    assert (_neighbours(work / "results") == _neighbours(letter_job / "results-local")).all()


@pytest.fixture
def closed_partition(slurm):
    """A partition that is down: jobs sent there pend (PartitionDown) for ever."""
    subprocess.run(["scontrol", "create", "PartitionName=closed", "Nodes=localhost",
                    "State=DOWN"], check=True, timeout=30)
    yield "closed"
    subprocess.run(["scontrol", "delete", "PartitionName=closed"], check=True, timeout=30)


@pytest.mark.slurm
@pytest.mark.parametrize("case", ["pending", "ended"])
def test_worker_jobs_that_cannot_join_fail_fast(slurm, letter_job, tmp_path, request, case):
    """A job held pending for a reason waiting does not clear, and a job that ends before its
    worker joins (its prologue fails): exit 2 in seconds, naming the reason or the output."""
    if case == "pending":
        jq = _jobqueue(tmp_path, queue=request.getfixturevalue("closed_partition"))
        expected = r"worker job \d+ cannot start: SLURM holds it pending \(PartitionDown\)"
    else:
        raw = yaml.safe_load((SLURM / "jobqueue.yaml").read_text())["jobqueue"]["slurm"]
        jq = _jobqueue(tmp_path, job_script_prologue=[*raw["job-script-prologue"], "exit 3"])
        expected = r"worker job \d+ ended \(FAILED\) before its Dask worker joined; see its " \
                   r"output, \S+slurm-\d+\.out"
    t0 = time.perf_counter()
    r = _lshdist("query", "--index", "index-local", "--queries", "queries", "--out",
                 tmp_path / "results", "--cluster", "slurm", "--jobqueue", jq, "--workers", 2,
                 "--stall-timeout", 240, cwd=letter_job, timeout=120)
    took = time.perf_counter() - t0
    assert r.returncode == 2, r.stderr[-2000:]
    assert re.search(expected, r.stderr), r.stderr[-2000:]
    assert took < 60 and "Traceback" not in r.stderr
    mine = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True,
                          timeout=30).stdout
    assert not mine.strip(), f"worker jobs left behind: {mine}"
