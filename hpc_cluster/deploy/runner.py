"""`hpc-cluster run script.py` inside a SLURM allocation: the runner mode (issue 33, point 5).

A user already holding an allocation (`sbatch -N 3 --wrap "hpc-cluster run script.py"`, or
`salloc -N 3`) runs the scheduler here, on the node the batch script runs on (the allocation's
first), one worker set on every node of the allocation, each its own `srun` step (as a nodes=
job does, so a node's death is judged on its own step: scheduler/node_view.py), then the
user's script with DASK_SCHEDULER_ADDRESS naming the cluster, so its `Client()` without
arguments connects. When the script ends the workers are told to leave and the scheduler
stops; the exit status is the script's. dask-jobqueue's SLURMRunner and dask-mpi do the same
with one process per MPI rank/task; here a node's workers share one step under their nanny.

`allocation` and `worker_steps` are pure (environment in, commands out); `run` does the I/O.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dask.utils import format_bytes

from ..adapters.slurm import SLURMAdapter
from ..adapters.slurm_text import expand_hostlist
from ..protocol.clusterfile import (cluster_file_for, new_secret, private_directory, tls_directory_for,
                                    write_cluster_file)
from ..protocol.tls import Security, make_certificate

logger = logging.getLogger("hpc_cluster.runner")

NOT_INSIDE = ("not inside a SLURM allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are not set): run it with "
              "sbatch -N 3 --wrap 'hpc-cluster run script.py' or inside salloc -N 3")
# How long the workers have to leave once the script ended, before their steps are ended.
LEAVE_TIMEOUT = 30.0


class RunnerError(RuntimeError):
    """The runner cannot start (not in an allocation, a bad value); the message says what to do."""


@dataclass
class Allocation:
    job_id: str
    nodes: list[str]
    cpus: int                       # per node: SLURM_CPUS_ON_NODE (this node's; SLURM gives all the same
                                    # with -N and --cpus-per-task or --exclusive)
    memory: int | None              # bytes per node (SLURM_MEM_PER_NODE), None: the node's own

    def describe(self) -> str:
        mem = format_bytes(self.memory) if self.memory else "the node's memory"
        return f"job {self.job_id}: {len(self.nodes)} node(s) ({', '.join(self.nodes)}), {self.cpus} core(s) and {mem} each"


def allocation(environ) -> Allocation:
    """The allocation this process runs in, from SLURM's variables; RunnerError outside one."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        raise RunnerError(NOT_INSIDE)
    nodes = expand_hostlist(nodelist)
    try:
        cpus = int((environ.get("SLURM_CPUS_ON_NODE") or "1").split("(")[0].split(",")[0])
    except ValueError:
        cpus = 1
    mem = environ.get("SLURM_MEM_PER_NODE")
    return Allocation(job_id=job_id, nodes=nodes, cpus=max(1, cpus),
                      memory=int(mem) * 2**20 if mem and mem.isdigit() and int(mem) > 0 else None)


@dataclass
class RunSettings:
    processes: int = 1              # worker processes per node
    cores: int | None = None        # per node; None: the allocation's
    memory: int | None = None       # bytes per node; None: the allocation's (or the node's: 'auto')
    nanny: bool = True
    death_timeout: float = 60.0
    worker_extra_args: tuple[str, ...] = ()
    tls: bool = True                # False (--no-tls): plain TCP, each connection still proving the secret


def worker_steps(alloc: Allocation, settings: RunSettings, cluster_file: str, name: str,
                 python: str = sys.executable) -> list[list[str]]:
    """One `srun` per node of the allocation, each starting that node's worker set (pure)."""
    cores = settings.cores or alloc.cpus
    processes = max(1, min(settings.processes, cores))
    memory = settings.memory or alloc.memory
    limit = format_bytes(memory // processes).replace(" ", "") if memory else "auto"
    out = []
    for i, node in enumerate(alloc.nodes):
        worker = [python, "-m", "hpc_cluster.worker", "--cluster-file", cluster_file, "--name", f"{name}-n{i}",
                  "--nthreads", str(max(1, cores // processes)), "--memory-limit", limit,
                  *(["--nworkers", str(processes)] if processes > 1 else []),
                  "--nanny" if settings.nanny else "--no-nanny", "--death-timeout", f"{settings.death_timeout:g}",
                  "--host", "0.0.0.0", *settings.worker_extra_args]
        # --overlap: the batch step (this process, the scheduler) shares the first node's CPUs.
        out.append(["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", f"--cpus-per-task={cores}",
                    "--overlap", *worker])
    return out


class AccountingSource:
    """The diagnosis' evidence source (scheduler/evidence.py) for the allocation's own job."""

    def __init__(self, adapter):
        self.adapter = adapter

    async def accounting(self, job_ids: list[str]) -> dict[str, dict]:
        records = await asyncio.to_thread(self.adapter.accounting, job_ids)
        return {jid: {**dataclasses.asdict(r), "final": r.final} for jid, r in records.items()}

    async def log_tail(self, job_id: str) -> list[str]:
        return []                    # the job's own output: this script's, still being written


class _SchedulerThread:
    """Our scheduler on a loop of its own, in this process (the script runs beside it)."""

    def __init__(self, secret: bytes, host: str, adapter, security: Security | None = None):
        self.secret, self.host, self.adapter, self.security = secret, host, adapter, security
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.sched = self.address = self.error = None
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._main, name="hpc-cluster-run-scheduler", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        from ..scheduler.server import Scheduler
        self._stop = asyncio.Event()
        try:
            self.sched = Scheduler(self.secret, host=self.host, port=0, security=self.security)
            self.address = await self.sched.start()
            self.sched.deaths.source = AccountingSource(self.adapter)
        except BaseException as exc:
            self.error = exc
            self.ready.set()
            return
        self.ready.set()
        await self._stop.wait()
        await self.sched.close()             # tells the workers to leave

    def start(self, timeout: float = 60.0) -> str:
        self.thread.start()
        if not self.ready.wait(timeout) or self.error is not None:
            raise RunnerError(f"the scheduler did not start on {self.host}: {self.error or 'timed out'}")
        return self.address

    def workers(self) -> int:
        return len(self.sched.state.workers) if self.sched is not None else 0

    def stop(self, timeout: float = LEAVE_TIMEOUT) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(timeout)


def _scheduler_host(adapter) -> str:
    from .address import scheduler_address_here
    return scheduler_address_here(adapter).host


def run(script: list[str], settings: RunSettings, environ=None, wait_workers: float = 120.0,
        out=None) -> int:
    """Run `script` (its path and arguments) against a cluster spread over this allocation; the
    script's exit status."""
    out = out or sys.stderr
    environ = dict(os.environ if environ is None else environ)
    alloc = allocation(environ)
    if not script:
        raise RunnerError("hpc-cluster run: give the script to run, e.g. hpc-cluster run script.py ARGS")
    adapter = SLURMAdapter()
    name = f"run-{alloc.job_id}"
    cluster_file = str(cluster_file_for(name))
    secret = new_secret()
    # Encrypted, as every batch cluster is by default (issue 34): a certificate for this run
    # alone, beside the cluster file (a shared home: the workers read it there), removed after.
    private_directory(Path(cluster_file).parent, fix=True)
    tls_dir = tls_directory_for(cluster_file)
    security = make_certificate(tls_dir) if settings.tls else None
    sched = _SchedulerThread(secret, _scheduler_host(adapter), adapter, security)
    try:
        address = sched.start()
    except BaseException:
        shutil.rmtree(tls_dir, ignore_errors=True)
        raise
    write_cluster_file(cluster_file, address, secret, name=name, **({"tls": security.to_dict()} if security else {}))
    print(f"hpc-cluster run: scheduler {address} on {os.uname().nodename}; workers on {alloc.describe()}",
          file=out, flush=True)
    steps = []
    status = 1
    try:
        worker_env = {**environ, "HPC_CLUSTER_JOB_ID": alloc.job_id}
        for argv in worker_steps(alloc, settings, cluster_file, name):
            steps.append(subprocess.Popen(argv, env=worker_env, stdin=subprocess.DEVNULL))
        processes = max(1, min(settings.processes, settings.cores or alloc.cpus))
        want = len(alloc.nodes) * processes
        deadline = time.monotonic() + wait_workers
        while sched.workers() < want and time.monotonic() < deadline \
                and any(p.poll() is None for p in steps):
            time.sleep(0.2)
        if sched.workers() < want:
            print(f"hpc-cluster run: {sched.workers()} of {want} workers registered within {wait_workers:g} s; "
                  "starting the script anyway (the cluster's deaths say why the others did not come)",
                  file=out, flush=True)
        # Client() without arguments reads dask's scheduler-address: a cluster's name is one.
        script_env = {**environ, "DASK_SCHEDULER_ADDRESS": name}
        status = subprocess.run([sys.executable, *script] if script[0].endswith(".py") else script,
                                env=script_env).returncode
    finally:
        sched.stop()
        for p in steps:
            try:
                p.wait(LEAVE_TIMEOUT)
            except subprocess.TimeoutExpired:
                p.terminate()                # srun passes it on to the step
        for p in steps:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        Path(cluster_file).unlink(missing_ok=True)
        shutil.rmtree(tls_dir, ignore_errors=True)
    print(f"hpc-cluster run: {shlex.join(script)} exited with status {status}", file=out, flush=True)
    return status
