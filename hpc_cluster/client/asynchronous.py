"""An asynchronous Client (issue 31, point 2): `client = await Client(..., asynchronous=True)`,
`async with Client(asynchronous=True) as c`, `await c.gather(...)`, `await future`,
`client.sync(fn, *args)`, `client.loop`.

Our Client's connections run on a loop thread of their own (client/loop.py) in both modes, so
an asynchronous client never needs the user's loop to make progress, and never blocks it:

- waiting for futures (`await future`, gather, wait, as_completed) hangs a countdown on the
  futures' states that wakes the user's loop (futures.FutureStates.wait_async): no thread waits;
  only the fetch of finished results runs in a thread;
- the other blocking methods (distributed's methods that go through its `sync`: scatter,
  wait_for_workers, restart, close, ...) run in a thread of their own, and the caller gets an
  asyncio future of it, started at once, awaited or not.

A method gives an awaitable only when called from async code (a running event loop other
than the client's own) of a client made with asynchronous=True. The same client called from a
plain thread blocks as a synchronous one (as distributed's does off its loop), and the
client's own methods, calling each other from those threads, make plain calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading

from .exceptions import TimeoutError
from .futures import flatten_futures
from .timeouts import parse_timeout

# distributed.Client's methods that go through its `sync` (2026.8): awaitable in async code.
# Those our Client has are made so when the class is made (AwaitableMixin.__init_subclass__),
# whichever mixin defines them.
AWAITABLE = frozenset({
    "benchmark_hardware", "call_stack", "cancel", "close", "dump_cluster_state", "gather", "get_dataset",
    "get_events", "get_metadata", "get_scheduler_logs", "get_task_stream", "get_versions", "get_worker_logs",
    "has_what", "list_datasets", "log_event", "nbytes", "nthreads", "processing", "profile", "publish_dataset",
    "rebalance", "register_plugin", "replicate", "restart", "restart_workers", "retire_workers", "retry", "run",
    "run_on_scheduler", "scatter", "set_metadata", "shutdown", "story", "unpublish_dataset",
    "unregister_scheduler_plugin", "unregister_worker_plugin", "upload_file", "wait_for_workers", "who_has",
})
# Their versions that wait on the loop instead of in a thread.
ON_THE_LOOP = {"gather": "gather_async"}

_ioloops: dict[int, object] = {}


def _in_a_thread(fn, *args, **kwargs) -> concurrent.futures.Future:
    """`fn(*args, **kwargs)` in a daemon thread of its own. Not a ThreadPoolExecutor: its threads
    are joined when the program ends, and a wait_for_workers never awaited would hold up the exit
    for ever; a thread costs ~0.1 ms, and these are calls, not tasks."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run():
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the caller's await raises it
                future.set_exception(exc)
    threading.Thread(target=run, name="hpc-cluster-async", daemon=True).start()
    return future


class _Awaitable:
    """A Client method that gives an awaitable when called from async code of an asynchronous
    client; a plain bound method otherwise (a synchronous client pays one attribute test)."""

    def __init__(self, func, name: str):
        self.func, self.name = func, name
        functools.update_wrapper(self, func)

    def __get__(self, client, owner=None):
        bound = self.func.__get__(client, owner)
        if client is None or not client._asynchronous:
            return bound
        on_loop = ON_THE_LOOP.get(self.name)

        @functools.wraps(self.func)
        def call(*args, **kwargs):
            if not client.asynchronous:
                return bound(*args, **kwargs)
            if on_loop is not None:
                return asyncio.ensure_future(getattr(client, on_loop)(*args, **kwargs))
            return client._awaitable(bound, *args, **kwargs)
        return call


class SchedulerInfo(dict):
    """scheduler_info() from async code: the info last fetched (a dict, as distributed's
    asynchronous client returns), and, awaited, a fresh one."""

    def __init__(self, last: dict, fresh: asyncio.Future):
        super().__init__(last)
        self._fresh = fresh

    def __await__(self):
        return self._fresh.__await__()


class AwaitableMixin:
    """What makes an object usable from async code, as distributed's clients and clusters are:
    `await obj` (its start, run in a thread by `_start_in_background`), `async with obj`, and
    the methods named in its AWAITABLE_METHODS giving awaitables there. LocalCluster uses it
    too (deploy/local/cluster.py)."""

    AWAITABLE_METHODS: frozenset = frozenset()
    _asynchronous = False
    _started: concurrent.futures.Future | None = None     # the blocking start, in a thread
    _user_loop = None                                     # where an asynchronous one was made

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.AWAITABLE_METHODS:
            found = inspect.getattr_static(cls, name, None)
            if inspect.isfunction(found):
                setattr(cls, name, _Awaitable(found, name))

    def _start_in_background(self, start, *args) -> None:
        """An asynchronous constructor's blocking half: `start(*args)` goes on in a thread;
        `await obj` waits for it (and raises what it raised)."""
        try:
            self._user_loop = asyncio.get_running_loop()
        except RuntimeError:
            self._user_loop = None
        self._started = _in_a_thread(start, *args)

    @property
    def asynchronous(self) -> bool:
        """True when called from async code (a running event loop not the client's own) of a
        client made with asynchronous=True: its blocking methods then give awaitables."""
        if not self._asynchronous:
            return False
        try:
            return asyncio.get_running_loop() is not getattr(self, "_loop", None)
        except RuntimeError:
            return False

    def __await__(self):
        return self._when_started().__await__()

    async def _when_started(self):
        if self._started is not None:
            await asyncio.wrap_future(self._started)
        return self

    async def __aenter__(self):
        return await self

    async def __aexit__(self, *exc):
        closing = self.close()
        if inspect.isawaitable(closing):
            await closing

    def _awaitable(self, fn, *args, **kwargs) -> asyncio.Future:
        """`fn(*args, **kwargs)` in a thread, as an asyncio future of the caller's loop; started
        now if the client is connected, else once it is."""
        started = self._started
        if started is None or (started.done() and started.exception() is None):
            return asyncio.wrap_future(_in_a_thread(fn, *args, **kwargs))
        return asyncio.ensure_future(self._in_thread(fn, *args, **kwargs))

    async def _in_thread(self, fn, *args, **kwargs):
        await self
        return await asyncio.wrap_future(_in_a_thread(fn, *args, **kwargs))


class AsyncClientMixin(AwaitableMixin):
    """The Client's asynchronous face. Needs: _loop, _lt (client/loop.py), _states, timeout,
    gather(), _scheduler_info(); first among the Client's bases (its `asynchronous` is the one
    dask reads, CollectionsMixin's plain False is the synchronous default)."""

    AWAITABLE_METHODS = AWAITABLE
    _last_info: dict = {}                                 # scheduler_info() last fetched

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        info = inspect.getattr_static(cls, "scheduler_info", None)
        if inspect.isfunction(info):
            setattr(cls, "scheduler_info", _InfoMethod(info))

    def _start_in_background(self, begin, *args) -> None:
        def start():
            begin(*args)
            self._last_info = self._scheduler_info(stacklevel=3)    # what scheduler_info() gives at once
        super()._start_in_background(start)

    @property
    def loop(self):
        """A tornado IOLoop, as distributed's `client.loop`: an asynchronous client's is the loop
        it was made in (the user's), a synchronous one's the client's own loop thread."""
        loop = self._user_loop if self._asynchronous and self._user_loop is not None else self._loop
        ioloop = _ioloops.get(id(loop))
        if ioloop is None or ioloop.asyncio_loop is not loop:
            ioloop = _ioloops[id(loop)] = self._ioloop_of(loop)
        return ioloop

    def _ioloop_of(self, loop):
        from tornado.ioloop import IOLoop

        async def current():
            return IOLoop.current()
        try:
            if asyncio.get_running_loop() is loop:
                return IOLoop.current()
        except RuntimeError:
            pass
        return asyncio.run_coroutine_threadsafe(current(), loop).result(self.timeout)

    def sync(self, func, *args, asynchronous=None, callback_timeout=None, **kwargs):
        """Call `func(*args, **kwargs)` (a coroutine function, or a plain one), as distributed's
        Client.sync: from async code of an asynchronous client (or with asynchronous=True) on
        the caller's loop, giving its awaitable; else on the client's loop thread, blocking for
        its result (callback_timeout: seconds, then TimeoutError)."""
        if asynchronous is None:
            asynchronous = self.asynchronous
        if asynchronous:
            out = func(*args, **kwargs)
            if callback_timeout is not None and inspect.isawaitable(out):
                return asyncio.wait_for(out, callback_timeout)
            return out

        async def call():
            out = func(*args, **kwargs)
            return (await out) if inspect.isawaitable(out) else out
        return self._lt.run(call(), callback_timeout)

    async def gather_async(self, futures, errors: str = "raise", direct=None, asynchronous=None, timeout=None):
        """gather() from a coroutine: waits for the futures on the loop, then fetches."""
        await self
        timeout = parse_timeout(timeout, "gather")
        flat: list = []
        flatten_futures(futures, flat)
        if errors not in ("raise", "skip"):
            raise ValueError("errors must be 'raise' or 'skip'")
        keys = list(dict.fromkeys(f.key for f in flat))
        if not await self._states.wait_async(keys, timeout, until_error=errors == "raise"):
            key = next((k for k in keys if self.future_state(k).status == "pending"), keys[0])
            raise TimeoutError(f"{key!r} not done within {timeout} s")
        # Done (or failed): the fetch, short, in a thread (the same gather, timeout and all).
        return await asyncio.wrap_future(_in_a_thread(self.gather, futures, errors, timeout=timeout))

    async def wait_keys_async(self, keys: list[str], timeout: float | None, first: bool = False,
                              until_error: bool = False) -> bool:
        return await self._states.wait_async(keys, timeout, first, until_error)


class _InfoMethod(_Awaitable):
    """scheduler_info(): from async code, a SchedulerInfo (the last info, awaitable for a fresh one)."""

    def __init__(self, func):
        super().__init__(func, "scheduler_info")

    def __get__(self, client, owner=None):
        bound = self.func.__get__(client, owner)
        if client is None or not client._asynchronous:
            return bound

        @functools.wraps(self.func)
        def call(*args, **kwargs):
            if not client.asynchronous:
                return bound(*args, **kwargs)
            fresh = client._awaitable(bound, *args, **kwargs)
            fresh.add_done_callback(lambda f: f.cancelled() or f.exception() or _keep(client, f.result()))
            return SchedulerInfo(client._last_info, fresh)
        return call


def _keep(client, info: dict) -> None:
    client._last_info = info
