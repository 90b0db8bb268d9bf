"""A worker's plugins and the face user code sees of its worker (issue 31, points 3 and 4).

`WorkerView` is what `get_worker()`, a `dask_worker` parameter of client.run's function and a
plugin's setup(worker) get: the worker's address, name, threads, memory limit, local
directory, its results (`data`, a read-only mapping), its plugins, and upload_file. Not the
Worker itself: its internals are the scheduler protocol's, and user code that changed them
would break what the scheduler counts on.

`WorkerPlugins` runs the plugins (client/worker_plugins.py's protocol): set up one at a time in
the order they were registered, those the scheduler hands over at registration before the
worker reads its first task, those a client sends while it runs as they come; torn down when
unregistered or when the worker closes. A plugin whose setup raises is not kept, and the
worker carries on: the caller gets the error (client/workers.py), a later worker logs it.
A plain setup or teardown runs on a thread (a pip install must not stop the heartbeats); a
coroutine on the loop. It also answers client.run (worker/running.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import pkgutil
import shutil
import socket
import sys
import tempfile
import types
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from ..protocol import context, serialize
from ..protocol.clusterfile import private_directory
from ..protocol.frames import Opaque
from ..protocol.messages import Op
from .running import OK, error_answer, run_function

logger = logging.getLogger("hpc_cluster.worker.plugins")

TEARDOWN_TIMEOUT = 10.0        # s a plugin's teardown may take when its worker closes
WORKER_DIRECTORY = "hpc-cluster-worker"


def worker_directory(base: str | None, pid: int) -> str:
    """A worker's local_directory: under its --local-directory (or the node's temp directory),
    one per worker process, known from the host and pid so its nanny can remove what a worker
    it saw die left there (as it does the spill directory, worker/store.py)."""
    return os.path.join(base or tempfile.gettempdir(), f"{WORKER_DIRECTORY}-{socket.gethostname()}-{pid}")


class WorkerData(Mapping):
    """The worker's results by key, read-only: reading one that was spilled reads its file."""

    def __init__(self, store):
        self._store = store

    def __getitem__(self, key):
        if key not in self._store:
            raise KeyError(key)
        return self._store[key]

    def __contains__(self, key) -> bool:
        return key in self._store

    def __iter__(self):
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        return f"<WorkerData: {len(self)} results>"


class WorkerView:
    """This worker, as distributed's Worker object shows it to user code (the attributes a
    program reads; see the module's docstring for why it is not the Worker)."""

    def __init__(self, worker, host: "WorkerPlugins"):
        self._worker, self._host = worker, host
        self.data = WorkerData(worker.data)

    address = property(lambda self: self._worker.address)
    name = property(lambda self: self._worker.name)
    id = property(lambda self: self._worker.name)
    nthreads = property(lambda self: self._worker.nthreads)
    memory_limit = property(lambda self: self._worker.memory_limit or None)   # distributed's None: no limit
    resources = property(lambda self: dict(self._worker.resources))
    scheduler_address = property(lambda self: self._worker.scheduler_address)
    loop = property(lambda self: self._worker.loop)       # an asyncio loop (distributed's is tornado's)
    plugins = property(lambda self: dict(self._host.plugins))
    executing_count = property(lambda self: len(self._worker.executing))
    status = property(lambda self: "closed" if self._worker.closed.is_set() else "running")

    @property
    def host(self) -> str:
        return (self.address or "").split("://")[-1].rsplit(":", 1)[0]

    @property
    def local_directory(self) -> str:
        """This worker's own directory (made on first use, on sys.path, removed when it closes)."""
        return self._host.directory()

    @property
    def scheduler(self):
        """distributed's is a connection to the scheduler; what programs read of it is its address."""
        return types.SimpleNamespace(address=self._worker.scheduler_address)

    def get_current_task(self):
        """The key of the task this thread runs (None outside a task)."""
        return context.task()

    def log_event(self, topic, msg) -> None:
        """An event for the clients that subscribe to `topic` (worker/events.py sends it)."""
        send = getattr(context.worker(), "log_event", None)
        if send is None:
            raise RuntimeError("log_event: this worker is not connected to its scheduler yet")
        send(topic, msg)

    async def upload_file(self, filename: str, data, load: bool = True) -> dict:
        """Write `data` as local_directory/filename; .py, .zip, .egg are importable from there,
        and with `load` imported (reloaded if imported before) at once."""
        return await self._host.in_thread(self._host.write_and_import, filename, data, load)

    def __repr__(self) -> str:
        return f"<Worker {self.address!r}, name: {self.name!r}, threads: {self.nthreads}>"


class WorkerPlugins:
    """The plugins of one worker (its `plugins` attribute) and its answers to run/setup/teardown."""

    def __init__(self, worker, local_directory: str | None = None):
        self.worker = worker
        self.base = local_directory
        self.plugins: dict[str, object] = {}       # name -> plugin, in the order they were set up
        self.blobs: dict[str, bytes] = {}          # name -> its pickle: the same again is set up once
        self.watching: list = []                   # plugins with a transition() of their own
        self.view = WorkerView(worker, self)
        self._lock = asyncio.Lock()                # setups and teardowns one at a time, in order
        # client.run's functions and plugins' plain setups: off the loop, apart from the task threads.
        self.threads = ThreadPoolExecutor(4, thread_name_prefix="hpc-run")
        self._directory: str | None = None
        self._closing = False

    # -- the peer port's requests (worker.py's _serve_peer) -----------------------------------
    async def answer(self, msg: dict) -> dict:
        op = msg["op"]
        if self._closing:
            return error_answer(RuntimeError(f"worker {self.worker.address} is closing; it runs nothing more"))
        if op == Op.RUN:
            return await run_function(msg, self.view, self.threads, self.worker._unpickle_lock)
        if op == Op.SETUP_PLUGIN:
            return await self.setup(str(msg["name"]), msg["plugin"], running=True)
        return await self.teardown(str(msg["name"]))

    async def setup_registered(self, entries) -> None:
        """The plugins the scheduler keeps, handed over as this worker registers: set up before
        it reads a task; one that fails is logged and left out (the worker is of use without it)."""
        for entry in entries or ():
            try:
                name, blob = str(entry["name"]), entry["plugin"]
            except (TypeError, KeyError):
                logger.warning("ignored a malformed plugin entry from the scheduler")
                continue
            reply = await self.setup(name, blob, running=False)
            if reply["status"] != OK:
                logger.error("worker plugin %r failed in setup; this worker runs without it: %s", name, reply["text"])

    async def setup(self, name: str, blob: Opaque, running: bool) -> dict:
        """Set the plugin up here (replacing one of that name). `running`: asked while the worker
        runs, not as it registers (a plugin's restart_workers applies only then)."""
        data = bytes(blob.data)
        async with self._lock:
            if self.blobs.get(name) == data:
                return {"op": Op.RUN_RESULT, "status": OK}        # this one is set up here already
            try:
                with self.worker._unpickle_lock:
                    plugin = serialize.loads(data)
            except Exception as exc:
                return error_answer(exc)
            if name in self.plugins:                  # replaced: the old one goes first, as in distributed
                try:
                    await self._teardown(name)
                except Exception:
                    logger.exception("worker plugin %r failed in teardown as it was replaced", name)
            try:
                await self._call(plugin, "setup")
            except Exception as exc:
                return error_answer(exc)
            self.plugins[name], self.blobs[name] = plugin, data
            if _overrides(plugin, "transition"):
                self.watching.append(plugin)
            logger.info("worker plugin %r set up", name)
        return {"op": Op.RUN_RESULT, "status": OK,
                "restart": bool(running and getattr(plugin, "restart_workers", False))}

    async def teardown(self, name: str) -> dict:
        async with self._lock:
            if name not in self.plugins:
                return {"op": Op.RUN_RESULT, "status": OK}        # never set up here (its setup failed)
            try:
                await self._teardown(name)
            except Exception as exc:
                return error_answer(exc)
        return {"op": Op.RUN_RESULT, "status": OK}

    async def _teardown(self, name: str) -> None:
        plugin = self.plugins.pop(name)
        self.blobs.pop(name, None)
        if plugin in self.watching:
            self.watching.remove(plugin)
        await self._call(plugin, "teardown")

    async def _call(self, plugin, method: str) -> None:
        fn = getattr(plugin, method, None)
        if fn is None:
            return
        if inspect.iscoroutinefunction(fn):
            await fn(self.view)
        else:
            result = await self.in_thread(fn, self.view)
            if inspect.isawaitable(result):            # a plain def that returns a coroutine
                await result

    async def in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.threads, fn, *args)

    # -- tasks' transitions (worker.py calls this only while `watching` is not empty) ------------
    def transition(self, key: str, start: str, finish: str) -> None:
        for plugin in list(self.watching):
            try:
                plugin.transition(key, start, finish)
            except Exception:            # a plugin's bug must not stop the worker's task flow
                logger.exception("worker plugin %r failed in transition(%r, %r, %r)", _name_of(self, plugin),
                                 key, start, finish)

    # -- files -------------------------------------------------------------------------------
    def directory(self) -> str:
        if self._directory is None:
            path = worker_directory(self.base, os.getpid())
            private_directory(path, fix=True)      # on a node's /tmp, shared by every user's jobs
            if path not in sys.path:
                sys.path.insert(0, path)            # uploaded modules import from here
            self._directory = path
        return self._directory

    def write_and_import(self, filename: str, data, load: bool) -> dict:
        if os.path.basename(filename) != filename or filename in ("", ".", ".."):
            raise ValueError(f"upload_file: {filename!r} must be a file name, without a directory")
        data = data.encode() if isinstance(data, str) else bytes(data)
        path = os.path.join(self.directory(), filename)
        partial = f"{path}.part-{os.getpid()}"
        with open(partial, "wb") as f:              # a task importing it meanwhile sees the old or the new
            f.write(data)
        os.replace(partial, path)
        if load:
            with self.worker._unpickle_lock:        # imports: one thread at a time (worker.py's _execute)
                import_file(path)
        return {"status": OK, "nbytes": len(data)}

    # -- the end -----------------------------------------------------------------------------
    async def close(self) -> None:
        """The worker closes: tear every plugin down (bounded), then remove its directory."""
        self._closing = True
        for name in reversed(list(self.plugins)):
            try:
                await asyncio.wait_for(self._teardown(name), TEARDOWN_TIMEOUT)
            except Exception:
                logger.exception("worker plugin %r failed in teardown", name)
        self.threads.shutdown(wait=False, cancel_futures=True)
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)


def import_file(path: str) -> list:
    """Import what a .py, .zip or .egg file holds (reloading what was imported before): as
    distributed's import_file. A .py's stale bytecode is removed first, since a new upload may
    keep the old file's size and time."""
    directory, filename = os.path.split(path)
    name, ext = os.path.splitext(filename)
    if ext == ".py":
        with contextlib.suppress(OSError):
            os.remove(importlib.util.cache_from_source(path))
        names = [name]
        if directory not in sys.path:
            sys.path.insert(0, directory)
    elif ext in (".zip", ".egg", ".pyz"):
        if path not in sys.path:
            sys.path.insert(0, path)
        names = [m.name for m in pkgutil.iter_modules([path])]
    else:
        return []
    importlib.invalidate_caches()
    return [importlib.reload(importlib.import_module(n)) for n in names]


def _overrides(plugin, method: str) -> bool:
    """Has the plugin a `method` of its own (not the base class's that does nothing)?"""
    fn = getattr(type(plugin), method, None)
    return callable(fn) and not any(getattr(base, method, None) is fn for base in type(plugin).__mro__[1:]
                                    if base.__name__ == "WorkerPlugin")


def _name_of(host: WorkerPlugins, plugin) -> str:
    return next((n for n, p in host.plugins.items() if p is plugin), type(plugin).__name__)
