"""Processes we start end with the process that owns them (issue 14, point 6).

A LocalCluster's scheduler, nannies and workers, and every nanny's worker, are given their
owner's pid (`--owner-pid`). An owner killed with SIGKILL runs no cleanup, so each of them
looks for itself: a thread checks once a second, asks its process to shut down cleanly when
the owner is gone, and ends it with os._exit should that take longer than a grace period
(a blocked event loop, a task holding the GIL). Nothing we start lives on under PID 1.
The batch daemon watches the Python process that started it the same way (deploy/daemon/run.py).

`alive(pid, started)` is the one liveness check (the cluster file's daemon, LocalCluster's
owner file, the owners watched here): a pid alone can name another process after a login
node's reboot or a wrap of the pid space, so where a pid is kept for later its process's start
time is kept beside it (psutil's create_time) and a process that started at another time is
not the one we mean. A leaf: any layer may use it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

logger = logging.getLogger("hpc_cluster.lifeline")

CHECK_INTERVAL = 1.0     # seconds between looks at the owner
GRACE = 5.0              # seconds a clean shutdown may take before os._exit


# How far two readings of one process's start time may differ: psutil derives it from the
# boot time, which the kernel recomputes from the wall clock (an NTP step moves it). A reused
# pid's process started seconds to days later.
START_TOLERANCE = 1.0


def process_start(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), to keep beside its pid; None if
    there is no such process."""
    import psutil
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def alive(pid: int, started: float | None = None, tolerance: float = START_TOLERANCE) -> bool:
    """Whether process `pid` lives (a zombie does not) and, given the start time recorded with
    the pid, is still that process and not a later one given the same pid. Without `started`
    (a file written before we kept it), the pid alone answers."""
    import psutil
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - float(started)) > tolerance:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:      # alive, someone else's
        return True


def owner_alive(pid: int, parent_at_start: int, started: float | None = None) -> bool:
    if pid == parent_at_start:
        # Its child: when it dies we are re-parented (to init or a subreaper), which no reuse
        # of its pid by a later process can hide.
        return os.getppid() == pid
    return alive(pid, started)


def watch_owner(pid: int | None, shutdown: Callable[[str], bool], what: str, grace: float = GRACE,
                exit_code: int = 0, interval: float = CHECK_INTERVAL) -> threading.Thread | None:
    """Once `pid` is gone, call `shutdown(reason)` (from this thread: hand it to the event loop
    with call_soon_threadsafe); it returns False when there is nothing to close cleanly. Then
    the process gets `grace` seconds to end before os._exit(exit_code)."""
    if not pid:
        return None
    parent = os.getppid()
    # The owner started us, so it lives now: its start time tells it from a later process
    # given its pid (--owner-pid carries the pid alone).
    started = process_start(pid)

    def run() -> None:
        while owner_alive(pid, parent, started):
            time.sleep(interval)
        reason = f"the process that started it (pid {pid}) is gone"
        logger.warning("%s: %s; shutting down", what, reason)
        try:
            clean = shutdown(reason)
        except Exception:   # the exit below must happen whatever went wrong
            logger.exception("%s: shutting down failed", what)
            clean = False
        if clean:
            time.sleep(grace)
            logger.error("%s did not end within %.0f s of losing its owner; exiting now", what, grace)
        logging.shutdown()
        os._exit(exit_code)

    thread = threading.Thread(target=run, name="owner-watch", daemon=True)
    thread.start()
    return thread
