"""What the cluster daemon does on a client's request (scale, jobs, adapt, shutdown), on a
signal, and when its scheduler job hands over to a successor: named functions over a `Daemon`
(the few things they act on), so that each is tested alone, with fakes, and run.py only wires
them up (`register`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from dataclasses import dataclass
from typing import Any

from ...protocol.messages import Op
from .scheduler_job import is_walltime_sigterm

logger = logging.getLogger("hpc_cluster.daemon")

# Why a daemon stops: "shutdown" (down, SIGTERM, the owner gone: the cluster ends), or
# "handover" / "walltime" (a scheduler job's end: everything is kept for the next daemon).
SHUTDOWN, HANDOVER, WALLTIME = "shutdown", "handover", "walltime"


@dataclass
class Daemon:
    """What the handlers act on: the pools' job manager, the event that ends the daemon and why."""

    pools: Any                             # deploy/daemon/pools.py's PoolManager
    stop: asyncio.Event
    name: str = ""                          # the cluster's
    scheduler: Any = None                  # the Scheduler (a handover closes it)
    journal: Any = None
    dashboard: Any = None
    in_job: dict | None = None             # the daemon's own batch job (scheduler_job.own_job()), if any
    renewal: Any = None                    # scheduler_job.Renewal, once started
    why: str = SHUTDOWN


async def scale(daemon: Daemon, msg: dict) -> dict:
    return await daemon.pools.scale(int(msg["jobs"]), msg.get("pool"))


async def jobs(daemon: Daemon, msg: dict) -> dict:
    await daemon.pools.refresh()           # the batch system's word when it may have changed
    return daemon.pools.table()


async def shutdown(daemon: Daemon, msg: dict) -> dict:
    if daemon.renewal is not None:
        daemon.renewal.cancel_successor()
    await daemon.pools.close()
    # Set after this reply is on its way: the daemon's end closes the scheduler.
    asyncio.get_running_loop().call_soon(daemon.stop.set)
    return daemon.pools.table()


async def adapt(daemon: Daemon, msg: dict) -> dict:
    if msg.get("stop"):
        daemon.pools.stop_adapting(msg.get("pool"))
    else:
        daemon.pools.adapt(int(msg["minimum"]), None if msg.get("maximum") is None else int(msg["maximum"]),
                           msg.get("pool"), interval=float(msg.get("interval") or 1.0),
                           wait_count=int(msg.get("wait_count") or 3),
                           target_duration=float(msg.get("target_duration") or 5.0))
    return daemon.pools.table()


HANDLERS = {Op.SCALE: scale, Op.JOBS: jobs, Op.SHUTDOWN: shutdown, Op.ADAPT: adapt}


def register(sched, daemon: Daemon) -> None:
    """Serve the daemon's requests on `sched` (Scheduler.handlers: op -> async fn(msg))."""
    sched.handlers.update({op: functools.partial(fn, daemon) for op, fn in HANDLERS.items()})


def on_signal(daemon: Daemon, sig: int, now: float) -> None:
    """SIGTERM or SIGINT: the daemon stops. A SIGTERM at the end of its scheduler job's time is
    the batch system's limit: then the journal and the worker jobs stay for the next daemon."""
    job = daemon.in_job
    if job and sig == signal.SIGTERM and is_walltime_sigterm(now, job["started"], job["walltime"]):
        logger.warning("scheduler job %s reached its walltime before a successor took over; leaving the "
                       "journal and the worker jobs for the next daemon (`hpc-cluster up --name %s`)",
                       job["id"], daemon.name)
        daemon.why = WALLTIME
    daemon.stop.set()


async def hand_over(daemon: Daemon) -> None:
    """The successor scheduler job is ready (scheduler_job.Renewal): let go and stop."""
    daemon.why = HANDOVER
    if daemon.dashboard is not None:
        daemon.dashboard.stop()            # its port too is the successor's to take
    await let_go(daemon.scheduler, daemon.journal, daemon.pools)
    daemon.stop.set()


def jobs_record(jm) -> dict:
    """The journal's jobs record: job id -> what adopting it takes (jobs.py's Job fields), for
    every unfinished job; read at each journal flush, so a job submitted is in it within 0.2 s."""
    names: dict[str, list] = {}
    for ws in jm.scheduler.state.workers.values():
        if ws.info.get("job_id"):
            names.setdefault(str(ws.info["job_id"]), []).append(ws.name)
    return {jid: {"pool": m.pool, "index": j.index, "state": j.state, "submitted": j.submitted,
                  "started": j.started, "registered": j.registered, "retiring": j.retiring,
                  "workers": sorted(set(names.get(jid, ())) | set(j.worker_names))}
            for m in jm.managers.values() for jid, j in m.jobs.items() if not j.final}


async def let_go(sched, journal, jm) -> None:
    """A scheduler job's end: the next daemon takes over. The job manager stops watching (its
    jobs stay in the queue: the next daemon adopts them from the journal's jobs record), the
    journal gets the last changes, and the scheduler closes without telling its workers and
    clients to leave, so they reattach to the successor."""
    if sched.closed.is_set():
        return
    jm.stop_watching()
    if journal is not None:
        journal.jobs = jobs_record(jm)
    await sched.close(restarting=True)        # flushes and closes the journal, frees the port
