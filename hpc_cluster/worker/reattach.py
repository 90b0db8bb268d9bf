"""A worker that lost its scheduler reattaches to it, or to the one that replaced it (issue 16,
point 3).

Before, a worker whose connection broke dropped its results and registered afresh for its
death_timeout (60 s), then exited; a scheduler restart cost every result. Now it keeps its
results and the tasks its threads run (tasks only queued are dropped: the scheduler that
comes back places them again if it still wants them), tries for its reconnect window (default
the larger of 10 minutes and --death-timeout, never past its job's walltime or its lifetime),
re-reading its cluster file each time for a new address, and registers again saying what it
holds (key -> nbytes) and what it runs. The scheduler keeps the results it can use and tells
the worker to drop the rest (scheduler/state/reattach.py). After the window it exits with
EXIT_LOST_SCHEDULER, which the diagnosis calls 'scheduler-lost' and the nanny does not restart.

While there is no scheduler, what the worker would tell it goes to `Offline`: dropped, since
the report at registration says where things stand, except what happens after that report is
made, which is sent after the registration (a task that finishes while it travels is reported
as finished, not lost).
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..protocol import context
from ..retry import Backoff
from ..protocol.frames import ProtocolError
from ..protocol.clusterfile import read_cluster_file

logger = logging.getLogger("hpc_cluster.worker")

DEFAULT_RECONNECT_WINDOW = 600.0      # seconds: a login node's reboot, a daemon restarted by hand


def reconnect_window(death_timeout: float, window: float | None) -> float:
    """--reconnect-window if given, else the larger of 10 minutes and --death-timeout (dask's
    flag: a user who asked for a longer wait still gets it)."""
    return float(window) if window is not None else max(float(death_timeout), DEFAULT_RECONNECT_WINDOW)


class Offline:
    """The scheduler's stream while there is none: drops messages, or keeps them (`buffer` a
    list) from the moment a registration's report was made, for `Worker._register` to send."""

    def __init__(self):
        self.buffer: list | None = None

    def send(self, msg: dict) -> None:
        if self.buffer is not None:
            self.buffer.append(msg)

    def extend(self, msgs: list) -> None:
        if self.buffer is not None:
            self.buffer.extend(msgs)

    def flush(self) -> None:
        pass

    async def drain(self) -> None:
        pass


def deadline(worker, lost: float, now_wall: float) -> float:
    """When (monotonic) to give up: the reconnect window, cut short by the job's walltime or the
    worker's lifetime: past those the batch system (or the scheduler) would end it anyway."""
    end = lost + worker.reconnect_window
    info = worker.extra_info
    start, walltime = info.get("job_start"), info.get("job_walltime")
    ends = [info.get("lifetime_end")] + ([start + walltime] if start is not None and walltime is not None else [])
    for wall_end in ends:
        if wall_end is not None:
            end = min(end, lost + max(0.0, wall_end - now_wall))
    return end


def report(worker) -> dict:
    """What the worker holds (its own results, not borrowed copies) and what its threads run."""
    running = [k for k in worker.executing if getattr(worker.tasks.get(k), "state", None) == "executing"]
    return {"held": dict(worker.nbytes), "running": running}


def scheduler_address(worker) -> str:
    """The cluster file's address (a restarted scheduler may publish a new one), else the old."""
    if worker.cluster_file:
        try:
            # Empty while a resumed daemon starts (deploy/launch.py): the old address may come back.
            return read_cluster_file(worker.cluster_file)["address"] or worker.scheduler_address
        except (OSError, ValueError, KeyError) as exc:
            logger.info("cluster file %s unreadable (%s); trying %s", worker.cluster_file, exc,
                        worker.scheduler_address)
    return worker.scheduler_address


async def reattach(worker) -> bool:
    """The connection to the scheduler broke (it dropped us, or it is gone: killed, restarted, a
    network cut; a mere pause closes nothing and never gets here). False if the window ended."""
    worker._beat.cancel()
    worker.scheduler_comm.close()
    offline = worker.scheduler = Offline()
    worker._free([k for k, ts in worker.tasks.items() if ts.state not in ("executing", "cancelled")])
    worker.drop_held_ahead()             # held for a scheduler that may not know them now (scheduler/state/ahead.py)
    lost = time.monotonic()
    end = deadline(worker, lost, time.time())
    # Jittered: every worker of the cluster lost the scheduler at the same moment; in step,
    # each round would be a burst of hundreds of handshakes at the one that comes back.
    backoff = Backoff(0.1, 2.0, jitter=0.5)
    while not worker.closed.is_set() and time.monotonic() < end:
        address = scheduler_address(worker)
        if address != worker.scheduler_address:
            logger.warning("worker %s: the cluster file names a new scheduler address, %s (was %s)",
                           worker.address, address, worker.scheduler_address)
            worker.scheduler_address = address
            context.set_worker(context.WorkerContext(address, worker.secret, worker.address, worker._secede,
                                                     worker._rejoin, worker.security))
        offline.buffer = []                  # from this report on, what happens is sent after it
        held = report(worker)
        try:
            await asyncio.wait_for(worker._register(held), max(0.1, end - time.monotonic()))
            logger.warning("worker %s reattached to %s after %.1f s with %d results and %d running tasks",
                           worker.address, worker.scheduler_address, time.monotonic() - lost,
                           len(held["held"]), len(held["running"]))
            worker._run_ready()
            return True
        # Not even an AuthenticationError ends the window early: a scheduler dying under our
        # handshake closes it, which reads as one ('closed the connection during the handshake').
        except (OSError, ConnectionError, ProtocolError) as exc:   # TimeoutError is an OSError
            offline.buffer = None
            logger.info("scheduler %s not reachable yet (%s); %.0f s of the reconnect window left",
                        worker.scheduler_address, exc, end - time.monotonic())
        await asyncio.sleep(min(backoff.next(), max(0.0, end - time.monotonic())))
    if not worker.closed.is_set():
        logger.error("worker %s: no scheduler at %s for %.0f s (its reconnect window); exiting with its %d "
                     "results", worker.address, worker.scheduler_address, time.monotonic() - lost, len(worker.nbytes))
    return False
