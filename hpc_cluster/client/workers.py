"""Client methods that reach and prepare the workers themselves, outside the task graph
(issue 31, points 3 and 4): run, run_on_scheduler, upload_file, register_plugin and the older
register_worker_plugin, unregister_worker_plugin, register_worker_callbacks; and get_worker()
for code a worker runs. Mixed into Client; they use its request plumbing (`_request`, `_lt`,
`_worker_request`).

The client talks to each worker over the worker's own port, as gather does: the scheduler
only names the workers (and, for plugins, keeps them for the workers that join later:
scheduler/worker_plugins.py). Arguments are checked before anything is sent: an unknown
worker, a missing file, a plugin that is not one, a bad on_error.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import uuid
import warnings

from .worker_plugins import SetupCallback, UploadFile, WorkerPlugin
from ..protocol import context, serialize
from ..protocol.frames import Opaque
from ..protocol.messages import Op

logger = logging.getLogger("hpc_cluster.client")

ON_ERROR = ("raise", "return", "ignore")
NANNY_RUN_TIMEOUT = 24 * 3600.0      # s: a nanny's run is answered or failed by the scheduler (nanny_runs.py)


def get_worker():
    """The worker running this code (a task, a function of client.run, a plugin's setup): its
    address, name, nthreads, memory_limit, local_directory, data, plugins (worker/plugins.py)."""
    ctx = context.worker()
    view = getattr(ctx, "view", None)
    if view is None:
        raise ValueError("No worker found: get_worker() works in code a worker runs (a task, a function given to "
                         "client.run, a worker plugin), not in this process")
    return view


class WorkersMixin:
    # -- run ------------------------------------------------------------------------------
    def run(self, function, *args, workers: list[str] | None = None, wait: bool = True, nanny: bool = False,
            on_error: str = "raise", **kwargs):
        """Run `function(*args, **kwargs)` on every worker (or those in `workers`, addresses or
        names) now, outside the task graph; returns {worker address: result}. A `dask_worker`
        parameter gets the worker (get_worker()'s object); `nanny=True` runs it in each worker's
        nanny process instead. A coroutine function runs on the worker's event loop (with
        wait=False it is only started); a plain one on a thread of its own there. on_error:
        "raise" the first worker's exception, "return" it as that worker's result, or "ignore"
        that worker."""
        if on_error not in ON_ERROR:
            raise ValueError(f"run(on_error={on_error!r}): use 'raise', 'return' or 'ignore'")
        if not callable(function):
            raise TypeError(f"run() needs a callable first, got {type(function).__name__}")
        if "dask_scheduler" in _parameters(function):
            raise ValueError("run() gives a function the worker (a dask_worker parameter), never the scheduler: "
                             "hpc-cluster's scheduler runs no user code (see run_on_scheduler's error); drop the "
                             "dask_scheduler parameter")
        msg = {"op": Op.RUN, "function": Opaque(serialize.dumps_function(function)),
               "args": Opaque(_pickled(args, "run()'s arguments")),
               "kwargs": Opaque(_pickled(kwargs, "run()'s keyword arguments")), "wait": bool(wait)}
        results = self._lt.run(self._run(msg, workers, nanny, on_error), None)
        return results if wait else None

    async def _run(self, msg: dict, workers, nanny: bool, on_error: str) -> dict:
        addresses = await self._pick_workers(workers, "run")
        if nanny:                 # through the scheduler, to each worker's nanny (it listens on no port)
            answers = await asyncio.gather(*(self._request({**msg, "worker": a}, NANNY_RUN_TIMEOUT)
                                             for a in addresses), return_exceptions=True)
        else:
            answers = await asyncio.gather(*(self._worker_request(a, msg) for a in addresses),
                                           return_exceptions=True)
        results = {}
        for addr, answer in zip(addresses, answers):
            exc = _failure(answer, f"client.run on {'the nanny of ' if nanny else ''}worker {addr}")
            if exc is None:
                results[addr] = serialize.loads(answer["result"].data)
            elif on_error == "raise":
                raise _with_traceback(exc)
            elif on_error == "return":
                results[addr] = _with_traceback(exc)
        return results

    def run_on_scheduler(self, function, *args, **kwargs):
        """Refused: hpc-cluster's scheduler never runs (nor unpickles) user code."""
        name = getattr(function, "__name__", type(function).__name__)
        raise NotImplementedError(
            f"run_on_scheduler({name}): hpc-cluster's scheduler never runs or unpickles user code (DESIGN.md, "
            "principle 2: a bad function or pickle cannot take the cluster's state down with it), so there is no "
            "scheduler object to give a dask_scheduler parameter. Ask the client instead: client.scheduler_info() "
            "(workers, their threads, memory, names), client.nthreads(), client.deaths() and client.why(future) "
            "(what happened to workers and tasks); client.run(fn) runs a function on the workers' hosts; a "
            "function that needs no scheduler can run in this process")

    async def _pick_workers(self, workers, what: str) -> list[str]:
        """The addresses of `workers` (addresses or names; None: all), each checked against the
        cluster's workers before anything is sent."""
        table = await self._request({"op": Op.WORKERS})
        if workers is None:
            return [w["address"] for w in table]
        by_name = {str(w.get("name")): w["address"] for w in table}
        known = {w["address"] for w in table}
        picked = []
        for w in [workers] if isinstance(workers, str) else list(workers):
            addr = w if w in known else by_name.get(str(w))
            if addr is None:
                shown = ", ".join(sorted(known)[:8]) + (" ..." if len(known) > 8 else "") if known else "none yet"
                raise ValueError(f"{what}(workers=...): {w!r} is not a worker of this cluster (an address or a name); "
                                 f"its workers are: {shown}")
            if addr not in picked:
                picked.append(addr)
        return picked

    # -- preparing workers ---------------------------------------------------------------
    def upload_file(self, filename: str, load: bool = True):
        """Send a local file to every worker, now and those that join later, into its
        local_directory (on its sys.path): a .py, .zip or .egg is then importable there, and
        with `load` imported at once (a new version reloads the old). Returns the workers'
        answers, as register_plugin."""
        path = os.path.expanduser(os.fspath(filename))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"upload_file({filename!r}): no such file here (looked in {os.getcwd()}); give "
                                    "the path of a .py, .zip or .egg file to send to the workers")
        plugin = UploadFile(path, load=load)
        return self.register_plugin(plugin, name=f"upload-file-{plugin.filename}")

    def register_plugin(self, plugin, name: str | None = None, idempotent: bool | None = None):
        """Register a worker plugin (hpc_cluster.WorkerPlugin, or distributed's): set up on every
        worker now and on each that joins later, before it runs a task. `name`: the plugin's
        `name`, else its class's and a random part; a plugin of a name already registered
        replaces it, unless it is idempotent (its `idempotent` attribute, or this argument).
        Returns {worker: {"status": "OK"}}; a setup that raises raises here, naming the plugin
        and the worker, and the workers carry on as they were."""
        _check_plugin(plugin)
        name = name or getattr(plugin, "name", None) or f"{type(plugin).__name__}-{uuid.uuid4()}"
        if not isinstance(name, str):
            raise TypeError(f"register_plugin(name={name!r}): a plugin's name is a string")
        idempotent = bool(getattr(plugin, "idempotent", False) if idempotent is None else idempotent)
        blob = _pickled(plugin, f"the plugin {name!r}")
        return self._lt.run(self._register_plugin(name, blob, idempotent), None)

    async def _register_plugin(self, name: str, blob: bytes, idempotent: bool) -> dict:
        reply = await self._request({"op": Op.REGISTER_WORKER_PLUGIN, "name": name, "plugin": Opaque(blob),
                                     "idempotent": idempotent})
        answers = await self._ask_each(reply["workers"], {"op": Op.SETUP_PLUGIN, "name": name, "plugin": Opaque(blob)})
        failed = [(a, exc) for a, exc in ((a, _failure(r, f"setup of plugin {name!r} on worker {a}"))
                                          for a, r in answers.items()) if exc is not None]
        if failed:
            addr, exc = failed[0]
            others = f" (and on {len(failed) - 1} more)" if len(failed) > 1 else ""
            exc.add_note(f"worker plugin {name!r} failed in setup() on worker {addr}{others}. That worker carries on "
                         f"without it, the others that set it up keep it, and it stays registered for workers that "
                         f"join later: fix it and register it again (same name: it replaces this one), or "
                         f"client.unregister_worker_plugin({name!r})")
            raise _with_traceback(exc)
        restart = [a for a, r in answers.items() if r.get("restart")]
        if restart:
            done = await self._request({"op": Op.RESTART_WORKERS, "workers": restart})
            if done["without_nanny"]:
                warnings.warn(f"plugin {name!r} asked to restart its workers, but {len(done['without_nanny'])} run "
                              f"without a nanny and were not restarted: {', '.join(done['without_nanny'])}",
                              RuntimeWarning, stacklevel=4)
        return {a: {"status": "OK"} for a in answers}

    def register_worker_plugin(self, plugin=None, name: str | None = None, nanny: bool | None = None):
        """The older name of register_plugin (`nanny` is not needed: every plugin of ours runs in
        the worker)."""
        warnings.warn("register_worker_plugin is deprecated (as in distributed); use register_plugin",
                      DeprecationWarning, stacklevel=2)
        return self.register_plugin(plugin, name)

    def register_worker_callbacks(self, setup=None):
        """Run `setup()` (or `setup(dask_worker=worker)`) on every worker, now and on those that
        join later."""
        if not callable(setup):
            raise TypeError("register_worker_callbacks(setup=...) needs a function")
        return self.register_plugin(SetupCallback(setup))

    def unregister_worker_plugin(self, name: str, nanny: bool | None = None):
        """Remove a plugin registered under `name`: torn down on every worker, and not set up on
        those that join later."""
        return self._lt.run(self._unregister_worker_plugin(name), None)

    async def _unregister_worker_plugin(self, name: str) -> dict:
        reply = await self._request({"op": Op.UNREGISTER_WORKER_PLUGIN, "name": name})
        if not reply["known"]:
            have = ", ".join(map(repr, reply.get("registered") or [])) or "none"
            raise ValueError(f"unregister_worker_plugin({name!r}): no worker plugin of that name is registered "
                             f"(registered: {have})")
        answers = await self._ask_each(reply["workers"], {"op": Op.TEARDOWN_PLUGIN, "name": name})
        for addr, answer in answers.items():
            exc = _failure(answer, f"teardown of plugin {name!r} on worker {addr}")
            if exc is not None:
                exc.add_note("it is unregistered all the same: no worker that joins later sets it up")
                raise _with_traceback(exc)
        return {a: {"status": "OK"} for a in answers}

    async def _ask_each(self, addresses: list[str], msg: dict) -> dict:
        """Each worker's answer; one that cannot be reached is left out (gone: its successor
        gets the plugins as it registers; back after an outage: it gets them as it reattaches)."""
        answers = await asyncio.gather(*(self._worker_request(a, msg) for a in addresses), return_exceptions=True)
        out = {}
        for addr, answer in zip(addresses, answers):
            if isinstance(answer, (OSError, ConnectionError, asyncio.TimeoutError)):
                logger.warning("worker %s could not be reached for %s: %s", addr, msg["op"], answer)
            else:
                out[addr] = answer
        return out


def _parameters(func) -> set[str]:
    try:
        return set(inspect.signature(func).parameters)
    except (TypeError, ValueError):      # a builtin without a signature
        return set()


def _pickled(obj, what: str) -> bytes:
    try:
        with serialize.local_modules_by_value():
            return serialize.dumps(obj)
    except Exception as exc:
        raise serialize.SerializationError(f"could not pickle {what}: {type(exc).__name__}: {exc}; avoid "
                                           "unpicklable objects (locks, open files, sockets, clients)") from exc


def _failure(answer, where: str) -> BaseException | None:
    """None for an OK answer; else the exception to raise, with a note saying where it happened
    (its remote traceback goes last, _with_traceback, after what the caller adds)."""
    if isinstance(answer, BaseException):
        exc = answer
    elif answer.get("status") == "OK":
        return None
    else:
        exc = _remote_exception(answer)
    exc.add_note(f"(in {where})")
    return exc


def _remote_exception(answer: dict) -> BaseException:
    blob = answer.get("exception")
    try:
        exc = serialize.loads(blob.data) if isinstance(blob, Opaque) else RuntimeError(answer.get("text"))
    except Exception as inner:           # a class this process cannot import
        exc = RuntimeError(f"{answer.get('text')} (the exception could not be unpickled here: {inner})")
    tb = answer.get("traceback")
    if isinstance(tb, Opaque):
        try:
            exc.remote_traceback = serialize.loads(tb.data)
        except Exception:                # the text is only a help: the exception still says what
            pass
    return exc


def _with_traceback(exc: BaseException) -> BaseException:
    """The exception as raised here: the worker's traceback as its last note (a task's error
    shows it so too, client/exceptions.py)."""
    tb = getattr(exc, "remote_traceback", None)
    if tb:
        exc.add_note(f"Remote traceback:\n{tb}")
    return exc


def _check_plugin(plugin) -> None:
    """A worker plugin, or a clear refusal saying what to pass instead."""
    if isinstance(plugin, type):
        raise TypeError(f"register_plugin() needs a plugin instance, not the class {plugin.__name__}: "
                        f"write {plugin.__name__}(...)")
    if isinstance(plugin, WorkerPlugin):
        return
    kinds = {c.__name__ for c in type(plugin).__mro__}
    if "SchedulerPlugin" in kinds:
        raise TypeError(f"{type(plugin).__name__} is a scheduler plugin: hpc-cluster's scheduler runs no user code, "
                        "so it takes none; a WorkerPlugin runs on every worker instead")
    if "NannyPlugin" in kinds:
        raise TypeError(f"{type(plugin).__name__} is a nanny plugin: hpc-cluster runs plugins in the workers; use "
                        "hpc_cluster.Environ / UploadDirectory / PipInstall, or a WorkerPlugin")
    if "WorkerPlugin" not in kinds:
        raise TypeError(f"register_plugin() takes a worker plugin, not a {type(plugin).__name__}: subclass "
                        "hpc_cluster.WorkerPlugin (setup(worker), teardown(worker), transition(key, start, finish))")
