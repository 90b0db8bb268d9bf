"""client.run's function, run in a worker (or, with nanny=True, in its nanny), and the answer.

As in distributed: a `dask_worker` parameter gets the worker object (worker/plugins.py's
WorkerView; in a nanny, a NannyView), a coroutine function runs on the process's event loop
(with wait=False it is started and the answer does not wait for it). Unlike distributed, a
plain function runs on a thread of its own, not on the event loop: our workers' heartbeats are
judged in seconds, not minutes, and a function that takes a while (installing something,
reading a large file) must not get its worker taken for dead.

The answer carries the result pickled, or the exception and its traceback, for the client to
raise as its own (client/workers.py); the process never fails for what the function did.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import traceback
from concurrent.futures import Executor

from ..protocol import serialize
from ..protocol.frames import Opaque
from ..protocol.messages import Op

logger = logging.getLogger("hpc_cluster.worker.run")

OK, ERROR = "OK", "error"      # an answer's status, as distributed's


def takes(func, name: str) -> bool:
    """Does `func` have a parameter called `name` (dask_worker, dask_scheduler)?"""
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):         # a builtin without a signature: it takes no such thing
        return False


def error_answer(exc: BaseException, text: str | None = None) -> dict:
    """An exception as it travels: pickled when it can be, its type and text always."""
    try:
        blob = serialize.dumps(exc)
    except Exception:                       # some hold unpicklable state: the text still says what
        blob = serialize.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
    tb = text if text is not None else "".join(traceback.format_exception(exc))
    return {"op": Op.RUN_RESULT, "status": ERROR, "exception": Opaque(blob),
            "traceback": Opaque(serialize.dumps(tb)), "text": f"{type(exc).__name__}: {exc}"[:2000]}


def ok_answer(result) -> dict:
    try:
        blob = serialize.dumps(result)
    except Exception as exc:
        return error_answer(TypeError(f"the function ran, but its result ({type(result).__name__}) cannot be "
                                      f"pickled to send back: {exc}; return something picklable"))
    return {"op": Op.RUN_RESULT, "status": OK, "result": Opaque(blob)}


async def run_function(msg: dict, me, threads: Executor | None, lock=None) -> dict:
    """Run the function of a `run` message; `me` is what a dask_worker parameter gets; plain
    functions run on `threads`; `lock` (the worker's unpickling lock) is held while the
    function and its arguments are unpickled, which imports modules."""
    try:
        with lock if lock is not None else contextlib.nullcontext():
            func = serialize.loads(msg["function"].data)
            args = serialize.loads(msg["args"].data)
            kwargs = serialize.loads(msg["kwargs"].data)
        if takes(func, "dask_worker"):
            kwargs["dask_worker"] = me
        if inspect.iscoroutinefunction(func):
            if not msg.get("wait", True):
                task = asyncio.ensure_future(func(*args, **kwargs))
                task.add_done_callback(_log_failure)
                _BACKGROUND.add(task)
                task.add_done_callback(_BACKGROUND.discard)
                return ok_answer(None)
            result = await func(*args, **kwargs)
        else:
            result = await asyncio.get_running_loop().run_in_executor(threads, functools.partial(func, *args, **kwargs))
    except Exception as exc:     # the user's function (or its unpickling) failed: the caller's to see
        return error_answer(exc)
    return ok_answer(result)


_BACKGROUND: set = set()         # run(wait=False)'s coroutines: kept referenced until they end


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("a function started by client.run(wait=False) failed: %r", task.exception())


class NannyView:
    """What a `dask_worker` parameter gets in a nanny (client.run(nanny=True)): the nanny, as
    much of distributed's Nanny as a program reads."""

    def __init__(self, nanny, worker_address: str | None):
        self._nanny = nanny
        self.worker_address = worker_address
        self.id = nanny.id
        self.name = nanny.name
        self.memory_limit = nanny.memory_limit or None
        self.local_directory = nanny.local_directory or os.getcwd()

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def worker_pid(self) -> int | None:
        proc = self._nanny.proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def __repr__(self) -> str:
        return f"<Nanny of {self.worker_address!r}, name: {self.name!r}>"


def run_in_nanny(link, msg: dict) -> None:
    """A `run` the scheduler relayed to this nanny (scheduler/nanny_runs.py): run it here and
    send the answer back up the nanny's link, tagged with the relay's id."""
    task = asyncio.ensure_future(_answer_in_nanny(link, msg))
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def _answer_in_nanny(link, msg: dict) -> None:
    answer = await run_function(msg, NannyView(link.nanny, msg.get("worker")), None)
    answer["relay"] = msg.get("relay")
    comm = link.comm
    if comm is not None and not comm.closed:
        try:
            await comm.write(answer)
        except ConnectionError:          # the scheduler is gone: the caller's request ended with it
            pass
