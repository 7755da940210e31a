"""SLURM worker jobs (``--cluster slurm``): what dask-jobqueue leaves unchecked.

dask-jobqueue submits the worker jobs in the background and logs a refused submission; the
driver would then wait for workers that never come (the whole stall timeout) and fail with an
unrelated error.  Here the job script is tried first (``sbatch --test-only``: SLURM's own
reason, at once), the environment its prologue reads is checked, the scheduler is kept off
every-address binding, the workers warm the numba kernels as they join (a plugin: a warm-up
at job start finds no SLURM worker yet), and the driver waits for the workers while watching
their jobs, failing fast on a job that cannot start or ended before its worker joined.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from lshdist.errors import ClusterError, InputError

log = logging.getLogger(__name__)

#: the worker jobs' Dask log level when their prologue sets none (the driver's level, in its
#: environment, would otherwise reach them through sbatch, which passes the environment on)
WORKER_LOG_LEVEL = "info"
#: pending reasons that do not clear by waiting (squeue(1), JOB REASON CODES)
HOPELESS_REASONS = frozenset({
    "BadConstraints", "PartitionDown", "PartitionInactive", "PartitionNodeLimit",
    "PartitionTimeLimit", "PartitionConfig", "InvalidAccount", "InvalidQOS",
    "AccountNotAllowed", "QOSNotAllowed", "JobHeldAdmin", "JobHeldUser",
    "DependencyNeverSatisfied", "FrontEndDown",
})
#: job states after which a worker that has not joined never will
ENDED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED",
                          "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"})
#: variables a SLURM job has whatever the submitting environment holds
JOB_VARIABLES = frozenset({"HOME", "USER", "LOGNAME", "PATH", "SHELL", "PWD", "TMPDIR",
                           "HOSTNAME"})
WARM_PLUGIN = "lshdist-warm-kernels"


def slurm_kwargs(kwargs: dict[str, Any], source: str) -> dict[str, Any]:
    """The ``SLURMCluster`` arguments with lshdist's rules applied: a scheduler address named
    (refused otherwise: dask would listen on every address of this machine), the workers'
    HTTP server (dashboard, health, metrics) on their loopback (``dask worker``'s binds every
    address whatever its ``--interface``) unless ``worker-extra-args`` names a dashboard
    address, and the worker jobs' own Dask log level
    (`WORKER_LOG_LEVEL` unless their prologue sets one).

    ``source`` names where the settings came from, for the messages."""
    import dask

    def setting(key: str) -> Any:
        return kwargs.get(key.replace("-", "_"), dask.config.get(f"jobqueue.slurm.{key}", None))

    sched = setting("scheduler-options") or {}
    if not (setting("interface") or sched.get("host") or sched.get("interface")):
        raise InputError(f"jobqueue.slurm.interface is not set ({source}): the scheduler would "
                         "listen on every address of this machine (0.0.0.0); name the network "
                         "the worker jobs reach this node on (interface: ib0, eth0, ...; lo on "
                         "a one-node SLURM) or scheduler-options: {host: ADDRESS}")
    extra = list(setting("worker-extra-args") or [])
    if not any("dashboard" in a for a in extra):  # dask worker's HTTP server binds every
        extra += ["--dashboard-address", "127.0.0.1:0"]  # address whatever its --interface
    prologue = list(setting("job-script-prologue") or [])
    if not any("DASK_LOGGING__DISTRIBUTED" in line for line in prologue):
        prologue.insert(0, f"export DASK_LOGGING__DISTRIBUTED={WORKER_LOG_LEVEL}")
    return {**kwargs, "job_script_prologue": prologue, "worker_extra_args": extra}


def prologue_variables(lines: Iterable[str]) -> list[str]:
    """The environment variables ``lines`` (a job script's prologue) read before setting them,
    except those every SLURM job has (`JOB_VARIABLES`, ``SLURM_*``)."""
    seen: set[str] = set()
    out: list[str] = []
    for line in lines:
        for name in re.findall(r"\$\{?([A-Za-z_]\w*)", line):
            if (name not in seen and name not in JOB_VARIABLES
                    and not name.startswith("SLURM_")):
                out.append(name)
            seen.add(name)
        seen.update(re.findall(r"(?:^|[\s;])([A-Za-z_]\w*)=", line))
    return out


def check_submission(cluster: Any, source: str) -> None:
    """Raise before any worker job is submitted: `InputError` when the prologue reads an
    environment variable that is not set here (sbatch passes this environment to the jobs),
    `ClusterError` with SLURM's reason when ``sbatch --test-only`` refuses the job script."""
    script = cluster.job_script()
    lines = [ln for ln in script.splitlines() if not ln.lstrip().startswith("#")]
    missing = [v for v in prologue_variables(lines) if v not in os.environ]
    if missing:
        names = ", ".join(f"${v}" for v in missing)
        hint = ("; LSHDIST_VENV is the virtualenv lshdist is installed in"
                if "LSHDIST_VENV" in missing else "")
        raise InputError(f"the worker job script (jobqueue.slurm.job-script-prologue, "
                         f"{source}) reads {names}, not set here; sbatch passes this "
                         f"environment to the jobs: export {' '.join(missing)}{hint}")
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="lshdist-worker-") as f:
        f.write(script)
        f.flush()
        try:
            r = subprocess.run(["sbatch", "--test-only", f.name], capture_output=True,
                               text=True, timeout=60)
        except FileNotFoundError:
            raise ClusterError("sbatch not found: --cluster slurm submits its worker jobs with "
                               "SLURM's sbatch; run on a node with SLURM's commands") from None
        except subprocess.TimeoutExpired:
            raise ClusterError("sbatch --test-only did not answer within 60s; is slurmctld "
                               "running (SLURM_CONF)?") from None
    if r.returncode != 0:
        raise ClusterError(f"SLURM refused the worker job: {sbatch_reason(r.stderr)} (sbatch "
                           f"exit {r.returncode}); check jobqueue.slurm's queue, account, "
                           f"memory and walltime ({source})")


def sbatch_reason(stderr: str) -> str:
    """sbatch's error lines as one line, without their ``sbatch: error:`` prefixes."""
    lines = [re.sub(r"^\s*sbatch:\s*(error:\s*)?", "", ln).strip() for ln in stderr.splitlines()]
    return "; ".join(ln for ln in lines if ln) or "no reason given"


class WarmKernels(WorkerPlugin):
    """Warms the numba kernels (`lshdist.cluster.client.warm_kernels`) and sets Zarr's I/O to
    one thread on each worker as it joins, in a thread of its own, not awaited: a worker's
    start (plugins included) must end within its death timeout (60 s), which a cold compile
    exceeds, and the worker keeps answering meanwhile (a task that arrives first waits on
    numba's compile lock, not on a second compilation).  `start_workers` waits for it."""

    name = WARM_PLUGIN

    def __init__(self) -> None:
        self.state = "pending"
        self._task: Any = None

    def setup(self, worker: Any) -> None:
        self.state = "running"
        self._task = asyncio.ensure_future(self._warm())

    async def _warm(self) -> None:
        from lshdist.cluster.client import one_thread_io, warm_kernels

        def warm() -> None:
            one_thread_io()
            warm_kernels()

        t0 = time.perf_counter()
        try:
            await asyncio.get_running_loop().run_in_executor(None, warm)
        except Exception as exc:  # kernels then compile at their first use
            self.state = f"failed: {type(exc).__name__}: {exc}"
            return
        self.state = f"done in {time.perf_counter() - t0:.1f}s"


def warm_state(dask_worker: Any) -> str:
    """On a worker: the state of its `WarmKernels` plugin."""
    plugin = dask_worker.plugins.get(WARM_PLUGIN)
    return "pending" if plugin is None else str(plugin.state)


def job_states(job_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """``{job id: (state, reason)}`` of this user's jobs among ``job_ids`` that SLURM still
    lists (finished ones for a few minutes, ``MinJobAge``)."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    try:
        r = subprocess.run(["squeue", "-h", "--states=all", "-u", getpass.getuser(),
                            "-o", "%i|%T|%r"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in r.stdout.splitlines():
        jid, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        if jid in wanted:
            out[jid] = (state, reason)
    return out


def _job_output(job_id: str) -> str:
    try:
        r = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                           timeout=30)
        m = re.search(r"StdOut=(\S+)", r.stdout)
    except (OSError, subprocess.TimeoutExpired):
        m = None
    return m.group(1) if m else f"slurm-{job_id}.out in {os.getcwd()}"


def start_workers(client: Any, cluster: Any, n: int, *, timeout: float,
                  poll: float = 1.0) -> None:
    """Submit ``n`` worker jobs and wait, at most ``timeout`` s, until they have joined and
    warmed their kernels; watch the jobs meanwhile.

    Raises
    ------
    ClusterError
        A job pending for a reason that waiting does not clear (`HOPELESS_REASONS`), a job that
        ended before its worker joined (with its output file), or no worker after ``timeout``
        s (with the jobs' pending reasons).  Some of the ``n`` still pending then: a warning,
        and the job runs on the workers it has.
    """
    client.register_plugin(WarmKernels(), name=WARM_PLUGIN)
    cluster.scale(n=n)
    t0 = time.monotonic()
    pending: dict[str, tuple[str, str]] = {}
    while True:
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        names = {str(w.get("name")) for w in workers}
        if len(names) >= n:
            break
        jobs = {str(j.job_id): str(name) for name, j in list(cluster.workers.items())
                if getattr(j, "job_id", None)}
        states = job_states(jobs)
        pending = {}
        for jid, (state, reason) in states.items():
            if jobs[jid] in names:
                continue
            if state in ENDED_STATES:
                raise ClusterError(f"worker job {jid} ended ({state}) before its Dask worker "
                                   f"joined; see its output, {_job_output(jid)}")
            if state == "PENDING" and reason in HOPELESS_REASONS:
                raise ClusterError(f"worker job {jid} cannot start: SLURM holds it pending "
                                   f"({reason}); check jobqueue.slurm's queue, account and "
                                   "limits")
            if state == "PENDING":
                pending[jid] = (state, reason)
        if time.monotonic() - t0 > timeout:
            why = ", ".join(f"job {j}: {r}" for j, (_, r) in pending.items()) or "no job listed"
            if not names:
                raise ClusterError(f"no worker joined within {timeout:.0f}s ({why}); the "
                                   "cluster may be full -- raise --stall-timeout to wait longer")
            log.warning("%d of %d workers joined within %.0fs (%s); going on with them",
                        len(names), n, timeout, why)
            break
        time.sleep(poll)
    joined = time.monotonic() - t0
    while True:
        states = client.run(warm_state)
        if not any(s in ("pending", "running") for s in states.values()):
            break
        if time.monotonic() - t0 > timeout:
            log.warning("kernels still compiling on %d workers after %.0fs; going on",
                        sum(s == "running" for s in states.values()), timeout)
            break
        time.sleep(poll)
    for addr, state in states.items():
        if state.startswith("failed"):
            log.warning("worker %s: kernel warm-up %s (they compile at first use)", addr, state)
    log.info("%d SLURM workers joined in %.1fs, kernels warm after %.1fs", len(states), joined,
             time.monotonic() - t0)
