"""A task's thread slot: `secede()`, `rejoin()`, and `seceded_while_waiting` around a wait.

A task that waits on work of its own cluster gives up its slot meanwhile, so that the worker
can run that work (on a worker with one thread it could not otherwise). This module needs only
the task's context (protocol/context.py): the Client (gather) and subtasks.py both use it,
and it uses neither, so no import goes round in a circle.
"""

from __future__ import annotations

import contextlib

from ..protocol import context


def _running_task() -> tuple[context.WorkerContext, str]:
    ctx, key = context.worker(), context.task()
    if ctx is None or key is None:
        raise RuntimeError("secede() and rejoin() work only inside a task running on a worker")
    return ctx, key


def secede() -> None:
    """Give up this task's thread slot: the worker may start another task while this one
    waits (it keeps running; a worker death still counts it as executing)."""
    ctx, key = _running_task()
    context.refuse_on_loop("secede()")
    if not context.seceded():
        ctx.secede(key)
        context.set_seceded(True)


def rejoin() -> None:
    """Wait for a free thread slot on this worker and take it again (after secede())."""
    ctx, key = _running_task()
    if context.seceded():
        ctx.rejoin(key)
        context.set_seceded(False)


@contextlib.contextmanager
def seceded_while_waiting(scheduler: str):
    """Around a blocking wait in a task for results of its own cluster: give up the slot
    while waiting, unless the task already did (worker_client)."""
    ctx = context.worker()
    if ctx is None or context.task() is None or context.seceded() or ctx.scheduler != scheduler:
        yield
        return
    secede()
    try:
        yield
    finally:
        rejoin()
