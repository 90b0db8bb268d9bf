"""LocalCluster(processes=False): the workers as threads of this process, as distributed's.

Our Worker objects run on one event loop in a background thread of the user's process, with
their task threads beside it; no nanny (there is no process of theirs to watch). Tasks see the
user's modules and objects without pickling them into another process, and start at once.

The scheduler stays a process of its own (deploy/local/scheduler.py), as with processes=True:
it never unpickles user data, so running it here would buy nothing but a loop that a busy
user thread holding the GIL could stall, and the dashboard would need a second home.

What differs from worker processes, on purpose:
- a worker's context (get_client(), secede(), get_worker() inside a task) is known to its own
  task threads only (protocol/context.py's host_workers): the user's thread is no worker's;
- each worker has its own local directory (spilled results, uploaded files) under the
  cluster's, since all of them share one pid;
- their memory monitor reads this process's memory, the user's objects included (as
  distributed's threads do): memory_limit is per worker, against the whole process;
- the worker's log buffer (get_worker_logs) leaves the user's root logger level as it was.

Each worker is handled through a `ThreadWorkerHandle`, which answers as the subprocess.Popen of
a worker process does (poll, pid, send_signal, wait, kill), so LocalCluster's scale and close
treat both alike.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import threading

from ...protocol import context
from ...protocol.clusterfile import private_directory
from ...protocol.frames import Limits
from ...worker.store import MemoryFractions
from ...worker.worker import Worker


def thread_worker_keywords(cluster, name: str) -> dict:
    """The Worker keywords of LocalCluster `cluster`'s in-process worker `name`: what its
    _worker_command tells a worker process, and a local directory of its own."""
    st = cluster.settings
    directory = private_directory(os.path.join(cluster.local_directory or cluster._tmp.name, name))
    return {"scheduler": cluster.scheduler_address, "secret": cluster.secret, "name": name, "host": cluster.host,
            "nthreads": cluster.threads_per_worker, "memory_limit": cluster.memory_limit,
            "resources": cluster.resources, "heartbeat_interval": st["heartbeat_interval"],
            "limits": Limits(max_frame_bytes=st["max_frame_bytes"], max_message_bytes=st["max_message_bytes"]),
            "memory_fractions": MemoryFractions.read(*(st[f"memory_{f}_fraction"]
                                                       for f in ("target", "spill", "pause", "terminate"))),
            "extra_info": {"pool": "default"}, "local_directory": str(directory), "security": cluster.security}


class ThreadWorker(Worker):
    """A Worker inside a user's process: each task's thread is told whose task it runs."""

    hosted_by: "WorkerThreads"

    def _execute(self, ts):
        context.set_thread_worker(self.hosted_by.contexts.get(self.address))
        try:
            return super()._execute(ts)
        finally:
            context.set_thread_worker(None)


class WorkerThreads:
    """The event loop, in a daemon thread, that runs one LocalCluster's in-process workers."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.contexts: dict[str, context.WorkerContext] = {}     # worker address -> its context
        self.thread = threading.Thread(target=self._run, name="hpc-cluster-workers", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        context.host_workers(self._keep_context)     # workers started here are not this process's
        self.loop.run_forever()

    def _keep_context(self, ctx: context.WorkerContext | None) -> None:
        if ctx is not None:
            self.contexts[ctx.address] = ctx

    def start(self, timeout: float, **worker_kwargs) -> "ThreadWorkerHandle":
        """A worker registered with the scheduler (Worker's keywords), or the reason it is not."""
        worker = asyncio.run_coroutine_threadsafe(self._start(worker_kwargs), self.loop).result(timeout)
        return ThreadWorkerHandle(self, worker)

    async def _start(self, worker_kwargs: dict) -> ThreadWorker:
        root = logging.getLogger()
        level = root.level
        worker = ThreadWorker(**worker_kwargs)
        root.setLevel(level)          # the log buffer raises the root level to INFO (worker/logs.py)
        worker.hosted_by = self
        try:
            await worker.start()
        except BaseException:
            if getattr(worker, "listener", None) is not None:
                await worker.close(report=False)
            raise
        return worker

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class ThreadWorkerHandle:
    """A worker thread, as LocalCluster handles a worker process (subprocess.Popen's calls)."""

    def __init__(self, threads: WorkerThreads, worker: ThreadWorker):
        self.threads, self.worker = threads, worker
        self.pid = os.getpid()

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        return self.worker.exit_code if self.worker.closed.is_set() else None

    def send_signal(self, sig: int) -> None:
        """Any signal ends it as SIGTERM ends a worker process: it says goodbye and closes."""
        reason = f"received {signal.Signals(sig).name}" if sig in signal.Signals._value2member_map_ else "stopped"
        self._close(reason, report=True)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self._close("killed", report=False)

    def _close(self, reason: str, report: bool) -> None:
        if self.poll() is None and not self.threads.loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.worker.close(reason, report=report), self.threads.loop)

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            waiting = asyncio.run_coroutine_threadsafe(self.worker.closed.wait(), self.threads.loop)
            try:
                waiting.result(timeout)
            except TimeoutError:
                waiting.cancel()
                raise subprocess.TimeoutExpired(f"worker thread {self.worker.name}", timeout) from None
        return self.poll()
