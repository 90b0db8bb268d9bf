"""The cluster daemon: a scheduler and a job manager in one long-lived process.

`hpc-cluster up` starts it detached; `SLURMCluster(...)` starts it as a child. Either way
it reads a plan (deploy/plan.py's Plan, written by `deploy/launch.py`), listens, writes the
address into the cluster file, submits the jobs, and serves `scale`, `jobs`, `adapt` and
`shutdown` requests from clients (handlers.py). On SIGTERM or `shutdown` it retires every
worker, cancels every job and removes its cluster file, so nothing of it is left in the queue
or the process table.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from ...adapters import get_adapter
from ...dashboard.server import Dashboard
from ...protocol.admission import raise_open_file_limit
from ...lifeline import alive, process_start
from ...protocol.comm import port_of
from ...protocol.frames import Limits
from ...protocol.clusterfile import journal_for, read_cluster_file, write_cluster_file
from ...protocol.tls import Security
from ...scheduler.journal import Journal, resume_from
from ...scheduler.server import Scheduler
from ..plan import Plan, SchedulerPlan
from ..remote import place_tls, remote_tls_directory
from .handlers import SHUTDOWN, WALLTIME, Daemon, hand_over, jobs_record, let_go, on_signal, register
from .polling import PollSettings
from .pools import PoolManager, announce
from ...runners.local import LocalRunner
from ...runners.ssh import SSHRunner
from .scheduler_job import Renewal, await_predecessor, handover_path, own_job, owner_path, watch_owner_file

logger = logging.getLogger("hpc_cluster.daemon")

# Seconds a resumed scheduler places nothing, so that the workers that kept running report
# their results and running tasks first (they retry every 2 s at most: worker/reattach.py).
RESUME_GRACE = 10.0


def make_runner(ssh: dict | None):
    if not ssh:
        return LocalRunner()
    return SSHRunner(**ssh)


async def run(plan: Plan) -> int:
    cluster_file = Path(plan.cluster_file)
    info = read_cluster_file(cluster_file)
    secret, security = info["secret"], Security.from_dict(info.get("tls"))
    sc = plan.scheduler
    runner = make_runner(plan.ssh)
    adapter = get_adapter(plan.batch, runner)
    # How to submit and cancel (LSF's use_stdin, HTCondor's command extras) is the jobs' own
    # setting, not the script's: the default pool's (pools share the batch system's commands).
    default_pool = plan.pools.get("default")
    adapter.configure((default_pool.job if default_pool else plan.job).batch_options or {})
    # Run as a scheduler job (scheduler_in_job, deploy/daemon/scheduler_job.py): this job's id and times.
    in_job = own_job() if plan.scheduler_job else None
    if in_job and plan.successor_of:
        # A successor: the old daemon lets go of the journal and the port before we read and bind them.
        how = await await_predecessor(adapter, cluster_file, in_job["id"], str(plan.successor_of))
        logger.info("taking over from scheduler job %s (%s)", plan.successor_of, how)
    if in_job and sc.interface:
        from ...worker.__main__ import interface_address    # this node's address on it, not the login node's
        sc = dataclasses.replace(sc, host=interface_address(sc.interface))
    if not sc.host:                            # none set: the address routing to the compute nodes, here
        from ..address import scheduler_address_here
        choice = await asyncio.to_thread(scheduler_address_here, adapter, plan.ssh, plan.job.queue)
        sc = dataclasses.replace(sc, host=choice.host)
    # The journal (issue 16): kept next to the cluster file; one a daemon of this cluster left
    # when it died is resumed from (its tasks, results held by workers, errors, deaths, jobs).
    journal = recovered = None
    if plan.journal:
        path = journal_for(cluster_file)
        recovered = resume_from(path, plan.name) if plan.resume else None
        journal = Journal(path, cluster=plan.name)
    inherited = dict(recovered.jobs) if recovered is not None and isinstance(recovered.jobs, dict) else {}

    def scheduler(port: int) -> Scheduler:
        return Scheduler(secret, host=sc.host, port=port,
                         allowed_failures=sc.allowed_failures, heartbeat_ttl=sc.heartbeat_ttl,
                         versions=sc.versions, walltime_margin=sc.walltime_margin,
                         limits=Limits(max_frame_bytes=sc.max_frame_bytes,
                                       max_message_bytes=sc.max_message_bytes),
                         security=security, journal=journal, recovered=recovered,
                         # Resumed: nothing is placed until the workers that kept running have
                         # said what they hold and run (scheduler/state/reattach.py).
                         reattach_grace=float(RESUME_GRACE if plan.reattach_grace is None else plan.reattach_grace)
                         if plan.resume else 0.0)
    sched = scheduler(sc.prefer_port or sc.port)
    try:
        address = await sched.start()
    except OSError as exc:                     # the old address is taken: the cluster file names the new one
        logger.warning("could not listen on the old port %s again (%s); taking another", sc.prefer_port, exc)
        sched = scheduler(sc.port)
        address = await sched.start()
    meta = {"name": plan.name, "pid": os.getpid(), "pid_started": process_start(os.getpid()),
            "batch": plan.batch, "site": plan.site,
            "log_directory": plan.job.log_directory, "ssh": bool(plan.ssh),
            "daemon_log": plan.daemon_log, "processes": plan.job.processes}
    if in_job:                                 # status shows it; down cancels it if the daemon does not answer
        meta.update(scheduler_job=in_job["id"], host=socket.gethostname())
    if security is not None:                   # the workers and clients that read the file use it
        meta["tls"] = security.to_dict()
    pools = plan.pools
    meta["pools"] = {name: {"processes": p.job.processes, "max_jobs": p.max_jobs} for name, p in pools.items()}
    jm = PoolManager(sched, adapter, pools, poll=PollSettings.from_plan(plan),
                     max_jobs_in_queue=plan.max_jobs_in_queue, startup_failures=plan.startup_failures,
                     # Without a log_directory the batch system writes job logs where it was
                     # asked to submit: our cwd, or the login node's over SSH.
                     submit_directory=plan.submit_directory,
                     cluster=plan.name)        # tags its jobs: lost submissions are found by it
    announce(sched.state, pools, plan.escalate)   # placement and escalation by pool (issue 15)
    sched.deaths.source = jm               # accounting and job logs for the diagnosis (every pool's jobs)
    engine = None
    if sc.engine == "distributed":
        # distributed's Scheduler beside ours: clients and workers use its address; ours keeps
        # the jobs, the nannies and the deaths (hpc_cluster/engines/).
        from ...engines.dask_scheduler import scheduler_file_for, start as start_engine
        engine = await start_engine(sched, sc.host, sc.allowed_failures, security=security,
                                    dashboard=bool(sc.dashboard), dashboard_host=sc.dashboard and sc.dashboard[0])
        # distributed's scheduler file beside the cluster file: Client(scheduler_file=...) works as
        # with dask-jobqueue; the cluster file and `status` name it.
        engine.write_scheduler_file(scheduler_file_for(cluster_file))
        meta.update(engine.meta())
        if security is not None:
            meta["engine_tls"] = security.to_dict()
    dashboard = start_dashboard(sched, secret, sc, jm, plan.name)
    if dashboard is not None:
        meta["dashboard"] = dashboard.link     # the link with its token: `hpc-cluster status` prints it
    sched.expecting_workers = lambda: bool(jm.active())
    sched.worker_events.append(jm.worker_event)   # registrations and deaths replace polls
    meta["job_log_directory"] = jm.log_directory()
    daemon = Daemon(pools=jm, stop=asyncio.Event(), name=plan.name, scheduler=sched, journal=journal,
                    dashboard=dashboard, in_job=in_job)
    register(sched, daemon)
    # The address in the cluster file tells clients we are ready, so it is written only once
    # the handlers exist: a `scale` arriving while the remote copy is written over SSH
    # (an await) would otherwise be refused as an unknown op.
    write_cluster_file(cluster_file, address, secret, **meta)
    shared = plan.job_cluster_file
    if shared:
        write_cluster_file(shared, address, secret, **meta)     # the jobs' copy (shared_temp_directory)
    remote = plan.remote_cluster_file
    if plan.ssh and remote:
        # Workers read the secret from the login node's copy (its home, shared with the
        # compute nodes); launch() made its directory there (deploy/remote.py). The
        # certificates go beside it: our paths mean nothing there.
        there = dict(meta)
        if security is not None:
            there["tls"] = await asyncio.to_thread(place_tls, runner, security.to_dict(), remote)
            if "engine_tls" in there:
                there["engine_tls"] = there["tls"]
        text = json.dumps({"address": address, "secret": secret.hex(), **there})
        await asyncio.to_thread(runner.write_file, remote, text, 0o600)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda sig=sig: on_signal(daemon, sig, time.time()))
    if plan.owner_pid:
        asyncio.create_task(_watch_owner(int(plan.owner_pid), daemon.stop))
    elif in_job and plan.owner_file:           # on another node: the owner's heartbeat file instead
        asyncio.create_task(watch_owner_file(plan.owner_file, daemon.stop))
    adopted = jm.adopt(inherited) if inherited else {}
    if adopted:
        logger.warning("resumed from the journal: adopted %s", ", ".join(
            f"{n} job(s) of pool {pool}" for pool, n in adopted.items()))
        asyncio.create_task(_end_grace_when_back(sched, inherited))
    await jm.start()
    if journal is not None:
        journal.jobs = lambda: jobs_record(jm)
    for name, p in pools.items():
        # A resumed cluster keeps the jobs it adopted; it submits only what the command adds.
        if p.n_jobs and p.n_jobs > adopted.get(name, 0):
            await jm.scale(p.n_jobs, name)
    if in_job and in_job.get("walltime"):
        daemon.renewal = Renewal(adapter, plan, in_job, port_of(address), lambda: hand_over(daemon))
        renewal_task = asyncio.create_task(daemon.renewal.run())
        renewal_task.add_done_callback(_log_failure)
    logger.info("cluster %s up at %s (%s%s)", plan.name, address, plan.batch,
                f", scheduler job {in_job['id']}" if in_job else "")
    await daemon.stop.wait()
    if daemon.why != SHUTDOWN:
        if daemon.why == WALLTIME:
            await let_go(sched, journal, jm)
        await asyncio.sleep(0.1)
        logger.info("cluster %s: scheduler job %s let go (%s)", plan.name, in_job and in_job["id"], daemon.why)
        return 0
    if daemon.renewal is not None:
        daemon.renewal.cancel_successor()
    await jm.close()
    if dashboard is not None:
        dashboard.stop()
    if engine is not None:
        await engine.close()
    await sched.close()
    if journal is not None:
        journal.remove()                      # shut down on purpose: nothing to resume
    await asyncio.sleep(0.1)                  # let the last replies leave
    await _remove_files(plan, runner)
    logger.info("cluster %s down", plan.name)
    return 0


async def _remove_files(plan: Plan, runner) -> None:
    """A cluster shut down on purpose leaves nothing: its cluster files (ours, the jobs' and
    the login node's copies), plan, handover and owner files, and the TLS files made for it."""
    cluster_file = Path(plan.cluster_file)
    for path in (cluster_file, plan.job_cluster_file):
        if path:
            Path(path).unlink(missing_ok=True)
    if plan.ssh and plan.remote_cluster_file:
        try:
            await asyncio.to_thread(runner.run, ["rm", "-rf", "--", plan.remote_cluster_file,
                                                 remote_tls_directory(plan.remote_cluster_file)], None, 30, False)
        except Exception as exc:
            logger.warning("could not remove %s on the login node: %s", plan.remote_cluster_file, exc)
    if plan.plan_file:
        Path(plan.plan_file).unlink(missing_ok=True)
    handover_path(cluster_file).unlink(missing_ok=True)
    owner_path(cluster_file).unlink(missing_ok=True)
    if plan.tls_directory:                     # certificates made for this cluster alone
        shutil.rmtree(plan.tls_directory, ignore_errors=True)


def start_dashboard(sched, secret: bytes, sc: SchedulerPlan, jm, name: str) -> Dashboard | None:
    """The dashboard (issue 17) on this process's loop, beside the scheduler, where the
    scheduler listens unless dashboard_address names a host; it reads the job manager's table
    (no batch command per request: the table is what the last poll saw). A dashboard that
    cannot listen is logged, not fatal: the cluster works without it."""
    if not sc.dashboard:
        return None
    host, port = sc.dashboard
    dashboard = Dashboard(sched, secret, host=host or sc.host, port=int(port), jobs=lambda: jm.table(demand=False),
                          name=name)
    try:
        dashboard.start()
    except OSError as exc:
        logger.error("the dashboard could not listen on %s:%s (%s); the cluster runs without it. Change "
                     "scheduler_options' dashboard_address", host or sc.host, port, exc)
        return None
    return dashboard


async def _end_grace_when_back(sched, jobs: dict, poll: float = 0.2) -> None:
    """The placement grace of a resumed scheduler ends as soon as every worker the adopted
    running jobs had is back (each has said what it holds and runs), not at its full length."""
    want = {str(n) for rec in jobs.values() if isinstance(rec, dict) and rec.get("state") == "running"
            for n in rec.get("workers") or ()}
    while sched.state.placement_held_until is not None:
        back = {ws.name for ws in sched.state.workers.values()}
        if want and want <= back:
            logger.info("every worker of the adopted jobs is back (%d): placing tasks again", len(want))
            sched.state.release_placement()
            sched._flush()
            return
        await asyncio.sleep(poll)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("renewing the scheduler job failed: %r; the job ends at its walltime and "
                     "`hpc-cluster up` resumes the cluster from its journal", task.exception())


async def _watch_owner(pid: int, stop: asyncio.Event) -> None:
    """A cluster started from Python ends with its Python process, even one killed with -9:
    jobs must not keep running (and billing) for an owner that is gone. It started us and waits
    for us to come up, so it lives now: its start time tells it from a later process given its pid."""
    started = process_start(pid)
    while not stop.is_set():
        await asyncio.sleep(2)
        if not alive(pid, started):
            logger.warning("the Python process that started this cluster (pid %d) is gone; shutting down", pid)
            stop.set()


def main(argv=None) -> int:
    raise_open_file_limit()          # a soft 1024 under a far higher hard limit is common
    p = argparse.ArgumentParser(prog="python -m hpc_cluster.deploy.daemon")
    p.add_argument("plan", help="JSON plan written by hpc_cluster.deploy.launch (deploy/plan.py's Plan)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(run(Plan.load(args.plan)))


if __name__ == "__main__":
    sys.exit(main())
