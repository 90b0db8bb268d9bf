"""Work that submits work: `get_client()`, `worker_client()`, `secede()`, `rejoin()`.

Inside a task, `get_client()` gives a Client connected to the task's own cluster (one per
worker process, made dask's default there, so `x.compute()` inside a task also runs on the
cluster). A task that waits on the subtasks it submits should do so inside
`worker_client()`, which gives up the task's thread slot while it waits (secede) and takes
one again after (rejoin): on a worker with one thread, the subtasks could not run otherwise.
Outside a task, `get_client()` is the current default Client. `secede` and `rejoin` live in
seceding.py (the Client's gather uses them too) and are named here as well, where users of
dask.distributed look for them.
"""

from __future__ import annotations

import contextlib
import threading

from ..protocol import context
from .seceding import rejoin, secede

__all__ = ["get_client", "worker_client", "secede", "rejoin"]

_lock = threading.Lock()
_worker_clients: dict[str, object] = {}


def get_client(address: str | None = None, timeout=None, resolve_address: bool = True):
    """The Client of this task's cluster (inside a task), else the current default Client, or
    one connected to `address` (distributed's get_client; `resolve_address` is taken, unused:
    addresses are compared as written).

    Inside a task it is not dask's default scheduler there: a plain `x.compute()` in a task
    still runs in the task's process; `get_client().compute(x)` runs it on the cluster, and
    waiting for it gives up the task's thread slot meanwhile (no deadlock on one thread)."""
    timeout = 30.0 if timeout is None else timeout
    ctx = context.worker()
    if ctx is not None and (address is None or address == ctx.scheduler):
        return _task_client(ctx, timeout)
    from .dask_collections import current_client
    try:
        client = current_client()
    except ValueError:
        client = None
    if client is not None and (address is None or client.scheduler_address == address):
        return client
    if address is None:
        raise ValueError("No global client found and no address provided: create one, e.g. client = Client()")
    from .client import Client
    return Client(address, timeout=timeout)


def _task_client(ctx: context.WorkerContext, timeout):
    """The one Client per worker (process, or thread of a user's process) for its tasks."""
    context.refuse_on_loop("get_client()")     # it would wait on the loop it blocks (worker/inline.py)
    with _lock:
        client = _worker_clients.get(ctx.scheduler)
        if client is None or client.status in ("closed", "closing", "disconnected"):
            from .client import Client
            client = Client(ctx.scheduler, secret=ctx.secret, security=ctx.security, timeout=timeout,
                            set_as_default=False, direct_to_workers=True)   # as distributed's says (ours always are)
            _worker_clients[ctx.scheduler] = client
    return client


@contextlib.contextmanager
def worker_client(timeout=None, separate_thread: bool = True):
    """`with worker_client() as client:` inside a task: submit subtasks and wait for them
    without holding the task's thread slot (dask.distributed's worker_client)."""
    client = get_client(timeout=timeout)
    if separate_thread:
        secede()
    try:
        yield client
    finally:
        if separate_thread:
            rejoin()
