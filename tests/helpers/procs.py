"""A scheduler and workers as processes of their own (`python -m hpc_cluster.scheduler`,
`python -m hpc_cluster.worker`), for tests that kill the scheduler and start it again on the same
address with the same secret: a restart, as a crash and a new scheduler are."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from hpc_cluster.protocol.clusterfile import SECRET_ENV, new_secret

from helpers.wait import wait_until


class ClusterProcesses:
    """The scheduler and worker processes a test starts (their logs in `directory`); `end()` kills
    those still running."""

    def __init__(self, directory):
        self.directory, self.procs = directory, []
        self.secret = new_secret()
        self.env = dict(os.environ, **{SECRET_ENV: self.secret.hex()})

    def scheduler(self, *args: str, port: int = 0) -> tuple[subprocess.Popen, str]:
        """A scheduler listening on `port` (0: any), and its address once it listens."""
        address_file = self.directory / f"address-{time.monotonic_ns()}"
        proc = self._start("hpc_cluster.scheduler", "--port", str(port), "--address-file", str(address_file), *args)
        address = wait_until(lambda: address_file.exists() and address_file.read_text(), what="the scheduler")
        return proc, address

    def worker(self, address: str, *args: str) -> subprocess.Popen:
        """A one-thread worker of the scheduler at `address` (or of the one its `--cluster-file`
        in `args` names), beating every 0.2 s."""
        where = [] if "--cluster-file" in args else ["--scheduler", address]
        return self._start("hpc_cluster.worker", *where, "--heartbeat-interval", "0.2", "--nthreads", "1", *args)

    def _start(self, module: str, *args: str) -> subprocess.Popen:
        with open(self.directory / f"{module}-{len(self.procs)}.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", module, *args], env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def end(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
