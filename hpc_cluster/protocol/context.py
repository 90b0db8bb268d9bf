"""Where a task runs, for code inside it: `get_client()`, `secede()`, `rejoin()`.

The worker process registers itself here (its scheduler's address and the cluster's secret,
and how to secede and rejoin), and each task thread records the key it runs. The client
layer reads it; the worker never imports the client, nor the client the worker: both use
this small registry at the bottom of the layers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class WorkerContext:
    scheduler: str                        # the scheduler's address
    secret: bytes                         # the cluster's secret (kept in memory, not in the environment)
    address: str                          # this worker's own address
    secede: Callable[[str], None]         # give up the task's thread slot (the task runs on)
    rejoin: Callable[[str], None]         # wait for a free slot and take it again
    security: object = None               # the cluster's TLS (protocol/tls.py's Security), if any
    view: object = None                   # what get_worker() returns (worker/plugins.py's WorkerView)
    log_event: Callable | None = None     # (topic, msg) -> None: an event to the scheduler (worker/events.py)


_worker: WorkerContext | None = None
_local = threading.local()


def set_worker(context: WorkerContext | None) -> None:
    """This process's worker. Called from a thread that hosts workers inside a user's process
    (host_workers: LocalCluster(processes=False)), it goes to that host instead: the process
    is the user's, not a worker, and its other threads must not take it for one."""
    global _worker
    host = getattr(_local, "host", None)
    if host is not None:
        host(context)
        return
    _worker = context


def worker() -> WorkerContext | None:
    """The worker this thread runs a task for: this process's, or, in a user's process that
    hosts workers as threads, the one whose task thread this is (set_thread_worker)."""
    ctx = getattr(_local, "worker", None)
    return _worker if ctx is None else ctx


def host_workers(on_worker: Callable[[WorkerContext | None], None]) -> None:
    """This thread runs workers inside a user's process: their set_worker() calls go to
    `on_worker` (deploy/local/threads.py keeps each worker's context for its task threads)."""
    _local.host = on_worker


def set_thread_worker(context: WorkerContext | None) -> None:
    """The worker whose task this thread runs, when workers are threads of a user's process."""
    _local.worker = context


def set_task(key: str | None) -> None:
    _local.key = key
    _local.seceded = False


def task() -> str | None:
    """The key of the task this thread is running, if any."""
    return getattr(_local, "key", None)


def set_seceded(seceded: bool) -> None:
    _local.seceded = seceded


def seceded() -> bool:
    """Has the task this thread runs given up its slot (secede) and not taken one again?"""
    return getattr(_local, "seceded", False)


class RunOnThread(BaseException):
    """Raised in a task the worker runs on its event loop (worker/inline.py) when it would
    wait on its own cluster: the worker runs it again on a task thread. A BaseException, so
    that a task's `except Exception` does not take it for its own error."""


def set_inline(inline: bool) -> None:
    _local.inline = inline


def refuse_on_loop(what: str) -> None:
    """Raise RunOnThread when called from a task running on the worker's event loop."""
    if getattr(_local, "inline", False):
        raise RunOnThread(f"{what} in a task run on the worker's event loop; it runs again on a task thread")
