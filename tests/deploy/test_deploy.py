"""deploy/: what can be checked without a container runtime, SLURM or Kubernetes.

Validated: the Dockerfile's instructions (base, NUMBA_CACHE_DIR, a non-root USER after the
install, the COPY sources exist, ENTRYPOINT lshdist) and its smoke RUN commands executed here
in the venv (paths under /opt/lshdist mapped to this checkout; numba's cache lands in the
NUMBA_CACHE_DIR given); the dask-jobqueue job script generated from deploy/slurm/jobqueue.yaml
(the SBATCH directives, one single-threaded worker per job, the prologue); driver.sbatch parsed
by ``bash -n``; the DaskJob against the fields the dask-kubernetes CRD requires (spec.job,
spec.cluster; cluster.spec.scheduler.{spec,service}, worker.{spec,replicas}; containers with
name and image; service ports with port; documented at
dask_kubernetes/operator/customresources/daskjob.yaml and templates.yaml) and the commands it
runs exist; the NetworkPolicy and PVC against their required fields; the cron line and the
systemd units parsed and pointing at jobs/daily_append.py; ``--cluster kubernetes`` connects to
$DASK_SCHEDULER_ADDRESS (a local scheduler here).

Not validated here: a docker build, a Kubernetes apply (no engine, no API server on this
machine); SLURM submissions run for real in test_slurm.py (marker slurm); the full PodSpec
schema of the CRD (470 KB; only the required fields above and the types used are checked).
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lshdist.cluster.client import client_for
from lshdist.config import ClusterConfig, load_job_config
from lshdist.errors import InputError

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BIN = Path(sys.executable).parent


def _dockerfile() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (DEPLOY / "container" / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_instructions():
    ins = _dockerfile()
    ops = [op for op, _ in ins]
    assert ops[0] == "FROM" and ins[0][1].startswith("python:3.11")
    env = " ".join(v for op, v in ins if op == "ENV")
    assert "NUMBA_CACHE_DIR=/var/cache/lshdist/numba" in env and "OMP_NUM_THREADS=1" in env
    user = [v for op, v in ins if op == "USER"]
    assert user == ["lshdist"]  # non-root
    install = next(i for i, (op, v) in enumerate(ins) if op == "RUN" and "pip install" in v)
    assert install < ops.index("USER")
    useradd = next(v for op, v in ins if op == "RUN" and "useradd" in v)
    assert "chown -R lshdist /var/cache/lshdist" in useradd  # the cache is the user's
    for op, v in ins:
        if op == "COPY":
            *srcs, _ = v.split()
            assert all((REPO / s).exists() for s in srcs), v
    assert ("ENTRYPOINT", '["lshdist"]') in ins


def test_dockerfile_smoke_commands(tmp_path):
    """The image's smoke RUN, executed in the venv with a fresh NUMBA_CACHE_DIR."""
    smoke = [v for op, v in _dockerfile() if op == "RUN" and "--version" in v]
    assert len(smoke) == 1
    cache = tmp_path / "numba"
    cache.mkdir()
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    for cmd in smoke[0].split("&&"):
        argv = [str(REPO) + a.removeprefix("/opt/lshdist") if a.startswith("/opt/lshdist")
                else a for a in shlex.split(cmd)]
        argv = [sys.executable if a == "python" else a for a in argv]
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                           cwd=tmp_path)
        assert r.returncode == 0, (cmd, r.stderr)
    assert list(cache.rglob("*.nbi")), "numba wrote no cache into NUMBA_CACHE_DIR"


def test_slurm_job_script():
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue not installed (the deploy extra)")
    cfg = ClusterConfig(kind="slurm", jobqueue=str(DEPLOY / "slurm" / "jobqueue.yaml"))
    from lshdist.cluster.client import slurm_cluster

    cluster = slurm_cluster(cfg)
    try:
        script = cluster.job_script()
        steals = "stealing" in cluster.scheduler.extensions  # its scheduler: this process
    finally:
        cluster.close()
    assert not steals  # lshdist places every task beside its data (SCHEDULER_PLACEMENT)
    print("\n" + script)
    assert "#SBATCH -J lshdist-worker" in script
    assert "#SBATCH --cpus-per-task=1" in script
    assert "#SBATCH -t 04:00:00" in script
    assert "export OMP_NUM_THREADS=1" in script
    assert re.search(r"distributed\.cli\.dask_worker .*--nthreads 1", script)


def test_slurm_needs_a_jobqueue_section(tmp_path):
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue not installed (the deploy extra)")
    from lshdist.cluster.client import slurm_cluster

    bad = tmp_path / "jq.yaml"
    bad.write_text("jobqueue: {pbs: {}}\n")
    with pytest.raises(InputError, match=r"no jobqueue\.slurm section"):
        slurm_cluster(ClusterConfig(kind="slurm", jobqueue=str(bad)))


def test_driver_sbatch():
    path = DEPLOY / "slurm" / "driver.sbatch"
    if shutil.which("bash"):
        subprocess.run(["bash", "-n", str(path)], check=True)
    text = path.read_text()
    assert re.search(r"^#SBATCH --cpus-per-task=1$", text, re.M)
    assert 'python "$LSHDIST_HOME/jobs/$JOB.py" "$CONFIG"' in text
    job = load_job_config(REPO / "configs" / "jobs" / "slurm.yaml") if os.environ.get(
        "LSHDIST_WORKDIR") else None
    assert job is None or job.cluster.resolved_kind == "slurm"


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


def _need(obj: dict, keys: list[str], where: str) -> None:
    missing = [k for k in keys if k not in obj]
    assert not missing, f"{where}: missing required {missing}"


def _pod_spec(spec: dict, where: str) -> None:
    _need(spec, ["containers"], where)
    assert spec.get("restartPolicy", "Always") in ("Always", "OnFailure", "Never")
    assert spec.get("securityContext", {}).get("runAsNonRoot") is True, where
    for c in spec["containers"]:
        _need(c, ["name", "image"], f"{where}.containers")
        assert isinstance(c.get("command", []), list) and isinstance(c.get("args", []), list)
        for p in c.get("ports", []):
            _need(p, ["containerPort"], f"{where}.ports")
            assert isinstance(p["containerPort"], int)
        names = {v["name"] for v in spec.get("volumes", [])}
        assert {m["name"] for m in c.get("volumeMounts", [])} <= names, where


def test_daskjob_schema():
    (job,) = _docs("daskjob.yaml")
    assert job["apiVersion"] == "kubernetes.dask.org/v1" and job["kind"] == "DaskJob"
    _need(job["metadata"], ["name"], "metadata")
    spec = job["spec"]
    _need(spec, ["job", "cluster"], "spec")
    _pod_spec(spec["job"]["spec"], "spec.job.spec")
    cluster = spec["cluster"]["spec"]
    _need(cluster, ["scheduler", "worker"], "spec.cluster.spec")
    _need(cluster["scheduler"], ["spec", "service"], "scheduler")
    _need(cluster["worker"], ["spec", "replicas"], "worker")
    assert isinstance(cluster["worker"]["replicas"], int) and cluster["worker"]["replicas"] >= 1
    _pod_spec(cluster["scheduler"]["spec"], "scheduler.spec")
    _pod_spec(cluster["worker"]["spec"], "worker.spec")
    service = cluster["scheduler"]["service"]
    assert service["type"] == "ClusterIP"
    for p in service["ports"]:
        _need(p, ["port"], "service.ports")
    assert service["selector"]["dask.org/cluster-name"] == job["metadata"]["name"]
    # the job pod runs a script and a config of this checkout (image paths under /opt/lshdist)
    c = spec["job"]["spec"]["containers"][0]
    for arg in [*c["command"], *c["args"]]:
        if arg.startswith("/opt/lshdist/"):
            assert (REPO / arg.removeprefix("/opt/lshdist/")).is_file(), arg
    cfg = load_job_config(REPO / "configs" / "jobs" / "kubernetes.yaml")
    assert cfg.cluster.resolved_kind == "kubernetes"
    assert c["volumeMounts"][0]["mountPath"] == str(cfg.workdir)
    (policy,) = _docs("networkpolicy.yaml")
    assert policy["kind"] == "NetworkPolicy" and policy["apiVersion"] == "networking.k8s.io/v1"
    _need(policy["spec"], ["podSelector"], "networkpolicy.spec")
    assert policy["spec"]["podSelector"]["matchLabels"]["dask.org/cluster-name"] == (
        job["metadata"]["name"])
    (pvc,) = _docs("pvc.yaml")
    assert pvc["kind"] == "PersistentVolumeClaim"
    _need(pvc["spec"], ["accessModes", "resources"], "pvc.spec")
    assert pvc["metadata"]["name"] == spec["job"]["spec"]["volumes"][0][
        "persistentVolumeClaim"]["claimName"]


def test_kubernetes_kind_uses_the_operators_address(monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    with pytest.raises(InputError, match="DASK_SCHEDULER_ADDRESS"):
        client_for(ClusterConfig(kind="kubernetes"))
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, protocol="tcp://", host="127.0.0.1",
                      dashboard_address=None) as cluster:
        monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
        with client_for(ClusterConfig(kind="kubernetes")) as client:
            assert client.scheduler.address == cluster.scheduler_address
            assert client.submit(sum, [1, 2]).result() == 3


def test_schedule_files():
    cron = [ln for ln in (DEPLOY / "schedule" / "lshdist-daily.cron").read_text().splitlines()
            if ln.strip() and not ln.startswith("#") and "=" not in ln.split()[0]]
    assert len(cron) == 1
    fields = cron[0].split()
    assert all(re.fullmatch(r"[\d*/,-]+", f) for f in fields[:5]), fields[:5]
    assert "jobs/daily_append.py" in cron[0] and "configs/jobs/daily.yaml" in cron[0]
    units = {}
    for name in ("lshdist-daily.service", "lshdist-daily.timer"):
        p = configparser.ConfigParser(strict=False, interpolation=None)
        p.optionxform = str  # systemd keys are case-sensitive
        p.read(DEPLOY / "schedule" / name)
        units[name] = p
    svc = units["lshdist-daily.service"]["Service"]
    assert svc["Type"] == "oneshot" and svc["User"] != "root"
    assert svc["ExecStart"].split()[1].endswith("jobs/daily_append.py")
    timer = units["lshdist-daily.timer"]["Timer"]
    assert timer["OnCalendar"] and timer["Persistent"] == "true"
    for rel in ("jobs/daily_append.py", "configs/jobs/daily.yaml"):
        assert (REPO / rel).is_file()


def test_image_dask_config_sets_the_worker_malloc():
    """deploy/dask/workers.yaml (copied to /etc/dask in the image) gives `dask worker`
    processes the malloc and numpy page settings lshdist's LocalCluster uses, and lshdist
    keeps them."""
    import dask
    import distributed  # noqa: F401

    from lshdist.cluster.client import WORKER_MALLOC, WORKER_PAGES, worker_pre_spawn_env

    assert ("COPY", "deploy/dask/workers.yaml /etc/dask/lshdist-workers.yaml") in _dockerfile()
    cfg = dask.config.collect(paths=[str(DEPLOY / "dask")], env={})
    pre = cfg["distributed"]["nanny"]["pre-spawn-environ"]
    assert {k: str(v) for k, v in pre.items()} == {**WORKER_MALLOC, **WORKER_PAGES}
    # merged over distributed's defaults, as dask merges /etc/dask files
    with dask.config.set({f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in pre.items()}):
        got = worker_pre_spawn_env()
    assert {k: got[k] for k in WORKER_MALLOC} == WORKER_MALLOC and got["OMP_NUM_THREADS"] == "1"
    # and the quieter housekeeping of lshdist's LocalCluster workers
    from lshdist.cluster.client import SCHEDULER_PLACEMENT, WORKER_HOUSEKEEPING, WORKER_MEMORY

    flat = {k: dask.config.get(k, config=cfg) for k in WORKER_HOUSEKEEPING}
    assert flat == WORKER_HOUSEKEEPING
    # and no spilling to disk (Dask spills with pickle)
    assert {k: dask.config.get(k, config=cfg) for k in WORKER_MEMORY} == WORKER_MEMORY
    # and tasks stay where lshdist placed them (read by the scheduler's process)
    assert {k: dask.config.get(k, config=cfg) for k in SCHEDULER_PLACEMENT} == SCHEDULER_PLACEMENT
