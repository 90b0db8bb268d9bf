"""Processes we start end with the process that owns them (issue 14, point 6).

A LocalCluster's scheduler, nannies and workers, and every nanny's worker, are given their
owner's pid (`--owner-pid`). An owner killed with SIGKILL runs no cleanup, so each of them
looks for itself: a thread checks once a second, asks its process to shut down cleanly when
the owner is gone, and ends it with os._exit should that take longer than a grace period
(a blocked event loop, a task holding the GIL). Nothing we start lives on under PID 1.
The batch daemon watches the Python process that started it the same way (deploy/daemon/run.py).
A leaf: any layer may use it.
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


def owner_alive(pid: int, parent_at_start: int) -> bool:
    if pid == parent_at_start:
        # Its child: when it dies we are re-parented (to init or a subreaper), which no reuse
        # of its pid by a later process can hide.
        return os.getppid() == pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # alive, someone else's
        return True
    return True


def watch_owner(pid: int | None, shutdown: Callable[[str], bool], what: str, grace: float = GRACE,
                exit_code: int = 0, interval: float = CHECK_INTERVAL) -> threading.Thread | None:
    """Once `pid` is gone, call `shutdown(reason)` (from this thread: hand it to the event loop
    with call_soon_threadsafe); it returns False when there is nothing to close cleanly. Then
    the process gets `grace` seconds to end before os._exit(exit_code)."""
    if not pid:
        return None
    parent = os.getppid()

    def run() -> None:
        while owner_alive(pid, parent):
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
