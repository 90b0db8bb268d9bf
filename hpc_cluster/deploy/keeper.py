"""A SLURMCluster/PBSCluster's daemon, kept alive while its Python owner lives (issue 16).

The daemon is a child of the user's Python process. If it dies (SIGKILL, the OOM killer, a
bug) while the owner still wants the cluster, the keeper starts it again once, with the same
name: launch() finds the journal it left and resumes (the same secret, the old address if it
is free, its jobs adopted; workers and clients reattach). A second death is left dead, with a
warning naming the log: a daemon that keeps dying needs a person, not a loop.
"""

from __future__ import annotations

import logging
import threading
import time

from .daemon.scheduler_job import OWNER_BEAT, touch_owner

logger = logging.getLogger("hpc_cluster.cluster")

RESTARTS = 1          # automatic restarts per cluster
POLL = 0.5            # seconds between looks at the daemon's process


class DaemonKeeper:
    def __init__(self, cluster, restart):
        """`cluster`: has `_proc` (the daemon's Popen) and `status`; `restart()`: a new Popen
        (the cluster's own launch, which resumes)."""
        self.cluster, self.restart = cluster, restart
        self.restarts = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpc-cluster-daemon-keeper", daemon=True)

    def start(self) -> "DaemonKeeper":
        self._thread.start()
        return self

    def stop(self) -> None:
        """The owner closes the cluster: its daemon's exit is wanted from now on."""
        self._stop.set()

    def _watch(self) -> None:
        beat = 0.0
        while not self._stop.wait(POLL):
            owner = getattr(self.cluster, "owner_file", None)
            if owner is not None and time.monotonic() - beat >= OWNER_BEAT:
                # A daemon in a scheduler job, on another node, takes a still file for a gone owner.
                touch_owner(owner)
                beat = time.monotonic()
            proc = self.cluster._proc
            if proc is None or proc.poll() is None:
                continue
            if self._stop.is_set():
                return
            code = proc.returncode
            if self.restarts >= RESTARTS:
                self.error = (f"the cluster daemon died again (exit code {code}) after {self.restarts} automatic "
                              f"restart(s); not restarting it. Its log: {self.cluster.daemon_log}")
                logger.error("%s", self.error)
                return
            self.restarts += 1
            engine = getattr(self.cluster, "engine", "hpc-cluster")
            logger.warning("the cluster daemon of %s died (exit code %s); restarting it from its journal (%s)",
                           self.cluster.id, code, "its workers and clients reattach" if engine == "hpc-cluster" else
                           "engine='distributed': its scheduler starts anew at a new address; its futures are "
                           "lost, and Client(cluster) connects to the new one")
            try:
                self.cluster._proc = self.restart()
                reread = getattr(self.cluster, "_read_addresses", None)
                if reread is not None:
                    reread()
            except Exception as exc:          # noqa: BLE001  (said, not raised: no caller to raise to)
                self.error = f"restarting the cluster daemon failed: {exc}"
                logger.error("%s", self.error)
                return
