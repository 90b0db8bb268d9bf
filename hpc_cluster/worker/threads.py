"""The worker's task threads: long-lived, each taking the next started task from one queue.

They replace a ThreadPoolExecutor, whose submit() made a Future, a work item and a check of
its thread count for every task, and whose threads set each Future's result (a Condition
and its lock): 14 % of a worker's busy time on a map of tiny tasks (BENCHMARKS.md, lever 6).
Here a start is one SimpleQueue.put (C code) that wakes one idle thread, and a thread that
ends its task takes the next one already queued without going back to sleep.

The queue only ever holds tasks the event loop has *started*: it decides what runs and
when, and puts a task here only after its `task-started` is on the wire (blame: only tasks
a worker reported as executing are charged for its death). A thread cannot take a ready
task by itself for the same reason: only the loop writes to the scheduler's connection.

Threads are made as needed, up to `most`: a task that seceded (worker_client) keeps its
thread while it waits on its subtasks, so another one runs the tasks started meanwhile.
They are daemon threads: a task that never returns does not keep the process from exiting.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

logger = logging.getLogger("hpc_cluster.worker")

_STOP = object()


class TaskThreads:
    def __init__(self, run: Callable, most: int, name: str = "hpc-task", done: Callable | None = None):
        self._run = run                      # called in a task thread with each item
        self._done = done                    # then done(item, what run returned), once the thread counts as idle
        self._most = max(1, int(most))
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0                       # threads in (or just before) the queue's get()
        self._closed = False

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, item) -> None:
        """Run `run(item)` in a task thread: an idle one, or a new one while under `most` (else
        the first thread to end its task takes it)."""
        with self._lock:
            if self._closed:
                return
            # Each queued item will take one idle thread: a new one only when none is left over.
            if self._idle <= self._queue.qsize() and len(self._threads) < self._most:
                t = threading.Thread(target=self._serve, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
            self._queue.put(item)

    def _serve(self) -> None:
        with self._lock:
            self._idle += 1
        while True:
            # An item queued while this thread ran its last task is taken without sleeping.
            item = self._queue.get()
            with self._lock:
                self._idle -= 1
            if item is _STOP or self._closed:
                return
            try:
                out = self._run(item)
            except BaseException:  # run() reports the task's own errors; this is ours: keep the thread
                logger.exception("a task thread failed outside its task")
                continue
            finally:
                with self._lock:
                    self._idle += 1
            if self._done is not None:
                # Only now, with this thread counted idle: a task the loop starts on hearing of
                # this one's end is this thread's (it made a second thread per 1-thread worker).
                self._done(item, out)

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        """Stop: items not taken yet are dropped; running tasks end on their own (daemon
        threads). `wait`: join the threads (only those not running a task stop at once)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(_STOP)
        if wait:
            for t in threads:
                if t is not threading.current_thread():
                    t.join()
