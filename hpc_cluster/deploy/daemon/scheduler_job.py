"""The scheduler as a batch job (issue 16, point 5; dask-jobqueue#186).

Some sites forbid long processes on login nodes. With `scheduler_in_job: true` the cluster
daemon (scheduler + job manager, deploy/daemon/run.py) is itself submitted as a small job (1 core,
`scheduler_job_memory`), through the workers' adapter and template: its "worker command" is
`python -m hpc_cluster.deploy.daemon PLAN`. The login-node side (launch.py) only waits for the
address in the cluster file, which the job writes on the shared filesystem.

This module holds:
- the job: its spec (`scheduler_spec`, pure) and `SchedulerJob`, a handle with Popen's
  poll/wait/kill backed by the batch job's state, which launch() returns in place of a
  Popen so that its callers (cli `up`, the cluster classes, deploy/keeper.py) work unchanged;
- liveness (`job_alive`): a pid means nothing on another node, the job's state does;
- renewal (`Renewal`, `await_predecessor`): before its walltime the daemon submits its
  successor; the successor says it is ready in NAME.handover; the old daemon hands over
  (journal flushed, scheduler closed with restarting=True, worker jobs left running), writes
  "done" and exits; the successor resumes from the journal and adopts the worker jobs;
  workers and clients reattach (worker/reattach.py, client/reattach.py).

The handover file's states: "submitted" (by the old daemon, naming the successor's job),
"ready" (by the successor, once it runs), "done" (by the old daemon, once it let go).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Awaitable, Callable

from ...adapters.base import FINAL_STATES, BatchAdapter, BatchError, JobSpec
from ..plan import Plan

logger = logging.getLogger("hpc_cluster.daemon")

# Seconds from a scheduler job's start to its daemon serving (Python, imports, the journal):
# part of the lead with which the successor is submitted.
DAEMON_STARTUP = 10.0
# A SIGTERM this close to the job's end is the batch system's time limit, not `scancel`.
WALLTIME_SIGTERM = 15.0
STATUS_INTERVAL = 2.0          # seconds between squeue/qstat calls of a handle or a wait


# -- pure ------------------------------------------------------------------------------------
def scheduler_spec(worker_job: JobSpec, command: str, walltime: int, memory: int, job_name: str) -> JobSpec:
    """The scheduler job: the workers' spec (queue, account, directives, prologue, env, log
    directory, template) with 1 core, `memory`, `walltime` and the daemon's command. The
    epilogue is the workers' own; SLURM's job_cpu/job_mem and PBS's resource_spec size the
    workers' jobs, not this one."""
    return worker_job.replace(worker_command=command, job_name=job_name, cores=1, memory=int(memory), processes=1,
                        walltime=int(walltime), nanny=False, job_cpu=None, job_mem=None, resource_spec=None,
                        epilogue=[], worker_index=0)


def daemon_command(python_word: str, plan_path: str, log_path: str) -> str:
    """The job's command: the daemon, its output appended to the cluster's daemon log (one log
    for every scheduler job of the cluster, as for a daemon on the login node)."""
    return (f"{python_word} -m hpc_cluster.deploy.daemon {shlex.quote(plan_path)} "
            f">> {shlex.quote(log_path)} 2>&1")


def renew_at(started: float, walltime: float, margin: float, queue_wait: float) -> float:
    """When a scheduler job that started at `started` submits its successor: its walltime less
    the workers' drain margin (at most a fifth of the walltime, as jobs.py's), the observed
    queue wait and the daemon's startup; never before half its walltime (a short job must not
    hand over at once, again and again)."""
    lead = min(margin, 0.2 * walltime) + max(0.0, queue_wait) + DAEMON_STARTUP
    return started + max(0.5 * walltime, walltime - lead)


def is_walltime_sigterm(now: float, started: float | None, walltime: float | None) -> bool:
    """A SIGTERM at the end of the job's time is the batch system's limit: the daemon then
    leaves like a crashed one (journal, cluster file and worker jobs kept for a successor or
    `hpc-cluster up`), not like `hpc-cluster down`."""
    if started is None or not walltime:
        return False
    return now >= started + walltime - WALLTIME_SIGTERM


def own_job(environ=os.environ) -> dict | None:
    """This process's batch job, from the job script's exports (templates/*.sh.j2): id, start
    (epoch seconds) and walltime (seconds); None outside a job."""
    job_id = environ.get("HPC_CLUSTER_JOB_ID")
    if not job_id:
        return None
    def number(key):
        try:
            return float(environ[key])
        except (KeyError, ValueError):
            return None
    return {"id": job_id, "started": number("HPC_CLUSTER_JOB_START"), "walltime": number("HPC_CLUSTER_JOB_WALLTIME")}


# -- the Python owner's heartbeat --------------------------------------------------------------------
# A daemon on another node cannot watch its Python owner's pid. The owner (deploy/keeper.py)
# touches NAME.owner beside the cluster file every OWNER_BEAT seconds; a daemon that sees the
# file's mtime unchanged for OWNER_TIMEOUT seconds of its own clock (immune to clock skew
# between nodes) shuts the cluster down, as the pid watch does on the login node.
OWNER_BEAT = 5.0
OWNER_TIMEOUT = 60.0


def owner_path(cluster_file) -> Path:
    return Path(cluster_file).with_suffix(".owner")


def touch_owner(path) -> None:
    try:
        Path(path).touch(mode=0o600)
    except OSError as exc:
        logger.warning("could not touch %s (the cluster daemon takes silence for a gone owner): %s", path, exc)


async def watch_owner_file(path, stop: asyncio.Event, timeout: float = OWNER_TIMEOUT,
                           clock=time.monotonic) -> None:
    """Set `stop` once `path`'s mtime stood still for `timeout` seconds."""
    seen, since = None, clock()
    while not stop.is_set():
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            mtime = None
        if mtime != seen:
            seen, since = mtime, clock()
        elif clock() - since > timeout:
            logger.warning("the Python process that started this cluster stopped touching %s %.0f s ago (gone, "
                           "or its machine is); shutting down", path, clock() - since)
            stop.set()
            return
        await asyncio.sleep(min(OWNER_BEAT, timeout / 4))


# -- the handover file -------------------------------------------------------------------------
def handover_path(cluster_file) -> Path:
    return Path(cluster_file).with_suffix(".handover")


def read_handover(cluster_file) -> dict:
    try:
        data = json.loads(handover_path(cluster_file).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_handover(cluster_file, **fields) -> None:
    path = handover_path(cluster_file)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({**fields, "time": time.time()}, f)
    os.replace(tmp, path)


def job_ids(info: dict, cluster_file) -> list[str]:
    """The scheduler jobs a cluster has now: the one its cluster file names and a successor
    being handed over to."""
    ids = [str(info["scheduler_job"])] if info.get("scheduler_job") else []
    successor = read_handover(cluster_file).get("successor")
    if successor and str(successor) not in ids:
        ids.append(str(successor))
    return ids


def job_alive(info: dict, cluster_file, adapter: BatchAdapter | None = None) -> bool | None:
    """For a cluster whose daemon runs as a batch job: whether one of its scheduler jobs is
    queued or running (a failed squeue counts as alive: better a question than a removed
    cluster); None for a daemon on this machine (its pid tells)."""
    ids = job_ids(info, cluster_file)
    if not ids:
        return None
    if adapter is None:
        from ...adapters import get_adapter
        adapter = get_adapter(info.get("batch") or "slurm")
    try:
        statuses = adapter.status(ids)
    except BatchError:
        return True
    return any(s.state not in FINAL_STATES for s in statuses.values())


# -- the handle the callers of launch() hold -----------------------------------------------------
class SchedulerJob:
    """Popen's surface (pid, returncode, poll, wait, kill, send_signal, terminate) for a daemon
    that runs as a batch job. It follows the cluster's scheduler job through renewals: the
    cluster is alive while its current job or a successor is queued or running."""

    pid = None

    def __init__(self, adapter: BatchAdapter, job_id: str, cluster_file, clock=time.monotonic):
        self.adapter, self.job_id, self.cluster_file, self.clock = adapter, str(job_id), Path(cluster_file), clock
        self.returncode: int | None = None
        self.state = "pending"
        self._checked = -1e9

    def ids(self) -> list[str]:
        try:
            info = json.loads(self.cluster_file.read_text())
        except (OSError, ValueError):
            info = {}
        ids = job_ids(info, self.cluster_file)
        if self.job_id not in ids:
            ids.insert(0, self.job_id)
        return ids

    def poll(self) -> int | None:
        if self.returncode is not None or self.clock() - self._checked < STATUS_INTERVAL:
            return self.returncode
        self._checked = self.clock()
        ids = self.ids()
        try:
            statuses = self.adapter.status(ids)
        except BatchError:
            return None                       # not known to have ended
        live = [s for s in statuses.values() if s.state not in FINAL_STATES]
        if live:
            self.job_id, self.state = live[-1].job_id, live[-1].state
            return None
        last = statuses.get(ids[-1])
        self.state = last.state if last else "gone"
        self.returncode = 0 if self.state == "completed" else 1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else self.clock() + timeout
        while self.poll() is None:
            if deadline is not None and self.clock() > deadline:
                raise subprocess.TimeoutExpired(f"scheduler job {self.job_id}", timeout)
            time.sleep(0.5)
        return self.returncode

    def kill(self) -> None:
        """Cancel the scheduler job(s): scancel/qdel send SIGTERM first, and a daemon far from
        its walltime then shuts the cluster down (its worker jobs too)."""
        try:
            self.adapter.cancel(self.ids())
        except BatchError as exc:
            logger.warning("could not cancel the scheduler job %s: %s", self.job_id, exc)

    def send_signal(self, sig) -> None:
        self.kill()

    terminate = kill

    def __repr__(self) -> str:
        return f"<SchedulerJob {self.job_id} {self.state}>"


# -- in the daemon: renewal and handover ----------------------------------------------------------
class Renewal:
    """Runs in a daemon that is a scheduler job: submits its successor in time, waits until it
    is ready, then calls `hand_over` (the daemon lets go) and writes "done"."""

    def __init__(self, adapter: BatchAdapter, plan: Plan, job: dict, address_port: int,
                 hand_over: Callable[[], Awaitable[None]], clock=time.time):
        self.adapter, self.plan, self.job, self.port = adapter, plan, job, address_port
        self.hand_over, self.clock = hand_over, clock
        self.cluster_file = Path(plan.cluster_file)
        sj = plan.scheduler_job
        self.walltime = float(job.get("walltime") or sj.job.walltime)
        self.started = float(job.get("started") or clock())
        submitted = sj.submitted
        self.queue_wait = max(0.0, self.started - float(submitted)) if submitted else 10.0
        self.successor: str | None = None
        self.handed_over = False

    def due(self) -> float:
        return renew_at(self.started, self.walltime, float(self.plan.scheduler.walltime_margin),
                        self.queue_wait)

    def successor_plan(self) -> Plan:
        plan = self.plan.copy()
        plan.resume = True
        plan.successor_of = self.job["id"]
        plan.scheduler.prefer_port = self.port
        plan.scheduler_job.submitted = self.clock()
        # The successor keeps the jobs it adopts from the journal, and submits none of its own.
        plan.n_jobs = 0
        for pool in plan.pools.values():
            pool.n_jobs = 0
        return plan

    async def run(self) -> None:
        delay = self.due() - self.clock()
        logger.info("scheduler job %s: its successor is submitted in %.0f s (walltime %.0f s)",
                    self.job["id"], max(0.0, delay), self.walltime)
        await asyncio.sleep(max(0.0, delay))
        while not self.handed_over:
            if not await self._submit():
                await asyncio.sleep(30)       # sbatch refused: try again while there is time
                continue
            if await self._wait_ready():
                await self.hand_over()
                self.handed_over = True
                write_handover(self.cluster_file, predecessor=self.job["id"], successor=self.successor, state="done")
                logger.info("handed over to scheduler job %s", self.successor)
                return

    async def _submit(self) -> bool:
        plan = self.successor_plan()
        plan.save(plan.plan_file)
        try:
            script = self.adapter.render(plan.scheduler_job.job)
            self.successor = await asyncio.to_thread(self.adapter.submit, script)
        except BatchError as exc:
            logger.error("could not submit the successor of scheduler job %s: %s", self.job["id"], exc)
            return False
        write_handover(self.cluster_file, predecessor=self.job["id"], successor=self.successor, state="submitted")
        logger.info("submitted scheduler job %s to take over from %s before its walltime", self.successor,
                    self.job["id"])
        return True

    async def _wait_ready(self) -> bool:
        """True once the successor says it runs; False if its job ended first."""
        last_status = self.clock()
        while True:
            h = read_handover(self.cluster_file)
            if h.get("successor") == self.successor and h.get("state") == "ready":
                return True
            if self.clock() - last_status > STATUS_INTERVAL * 2.5:
                last_status = self.clock()
                try:
                    st = (await asyncio.to_thread(self.adapter.status, [self.successor])).get(self.successor)
                except BatchError:
                    st = None
                if st is not None and st.state in FINAL_STATES:
                    logger.error("the successor scheduler job %s ended (%s) before it took over; submitting "
                                 "another", self.successor, st.raw_state)
                    return False
            await asyncio.sleep(0.2)

    def cancel_successor(self) -> None:
        """The cluster is shut down: a successor still queued must not start it again."""
        if self.successor and not self.handed_over:
            try:
                self.adapter.cancel([self.successor])
            except BatchError as exc:
                logger.warning("could not cancel the successor scheduler job %s: %s", self.successor, exc)


async def await_predecessor(adapter: BatchAdapter, cluster_file, own_id: str, predecessor: str,
                            timeout: float = 900.0) -> str:
    """In a successor, before it reads the journal: say "ready", then wait until the old daemon
    has let go ("done") or its job ended (its walltime came first: the journal is then what it
    left, as after a crash). Returns "done", "gone" or "timeout"."""
    write_handover(cluster_file, predecessor=predecessor, successor=own_id, state="ready")
    logger.info("scheduler job %s is ready to take over from %s", own_id, predecessor)
    start, last_status = time.monotonic(), -1e9       # the first look at once: it may be long gone
    while time.monotonic() - start < timeout:
        if read_handover(cluster_file).get("state") == "done":
            return "done"
        if time.monotonic() - last_status > STATUS_INTERVAL * 2.5:
            last_status = time.monotonic()
            try:
                st = (await asyncio.to_thread(adapter.status, [predecessor])).get(predecessor)
            except BatchError:
                st = None
            if st is not None and st.state in FINAL_STATES:
                return "gone"
        await asyncio.sleep(0.2)
    return "timeout"
