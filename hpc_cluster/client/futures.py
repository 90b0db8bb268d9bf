"""Futures and waiting on them: `Future`, `wait` (`as_completed` is in completion.py).

A Future is a reference to a task's result on the cluster. Its state lives in its owner
(the Client's `FutureStates`, set from the client's event-loop thread); users block in
`FutureStates.wait`.
This module knows its owner only through `FutureOwner`, the few calls a Future makes, so
it imports nothing of the client's and the client imports it, one way.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable, Protocol

from dask._task_spec import TaskRef

from ..protocol.messages import ErrorKind
from ..retry import Backoff
from .exceptions import TimeoutError
from .timeouts import parse_timeout
from .tracebacks import rebuild_traceback, shorten

logger = logging.getLogger("hpc_cluster.client")


class FutureOwner(Protocol):
    """What a Future needs from whoever holds its state (the Client)."""

    def future_state(self, key: str) -> "FutureState": ...

    def hold_key(self, key: str) -> None: ...          # one more Future refers to key

    def release_key(self, key: str) -> None: ...       # one fewer; the last one releases the result

    def future_error(self, key: str) -> BaseException: ...

    def wait_keys(self, keys: list[str], timeout: float | None, first: bool = False,
                  until_error: bool = False) -> bool: ...   # FutureStates.wait

    def on_future_done(self, future: "Future", fn: Callable[["Future"], None]) -> None: ...

    def gather(self, futures, errors: str = "raise", direct=None, asynchronous=None, timeout=None) -> Any: ...

    def cancel(self, futures, reason: str = ...) -> None: ...

    def retry(self, futures) -> None: ...

    def adopt_keys(self, keys: list[str]) -> None: ...  # futures to keys another client made: now this one's

    # From async code of an asynchronous Client (client/asynchronous.py): `asynchronous` is True
    # there, and these wait on the event loop instead of blocking it.
    async def gather_async(self, futures, errors: str = "raise", direct=None, asynchronous=None,
                           timeout=None) -> Any: ...

    async def wait_keys_async(self, keys: list[str], timeout: float | None, first: bool = False,
                              until_error: bool = False) -> bool: ...


FAILED = ("error", "cancelled")


class FutureState:
    """A key's status as its client knows it: "pending", "finished", "error" or "cancelled".

    A plain field, not a threading.Event per key: the client's loop thread made and set one
    for every finished task (an Event is a Condition and a lock; set() notifies), 17% of its
    time in a 20k-task map. Changed only under the client's lock; threads that wait hang one
    `_Countdown` on every key they wait for instead (`FutureStates.wait`)."""

    __slots__ = ("status", "error", "callbacks", "waiters", "type")

    def __init__(self):
        self.status = "pending"
        self.error: dict | None = None
        self.callbacks: list = []                    # touched on the loop thread only
        self.waiters: list | None = None             # _Countdowns, under the lock
        self.type: type | None = None                # the result's, once this client saw it (Future.type)

    def settle(self, status: str, error: dict | None) -> None:
        """Its outcome; wakes whoever waits on it. The caller holds the client's lock."""
        if status == "finished" and self.status == "cancelled" and (self.error or {}).get("here"):
            return       # cancelled here: a result already on its way does not undo it (FutureStates.cancel_now)
        self.status, self.error = status, error
        waiters = self.waiters
        if waiters:
            self.waiters = None
            for w in waiters:
                w.one_done(status)


class _Countdown:
    """One waiting thread's wake-up, counted down by the keys it waits for."""

    __slots__ = ("left", "until_error", "event")

    def __init__(self, left: int, until_error: bool):
        self.left, self.until_error = left, until_error
        self.event = threading.Event()

    def one_done(self, status: str) -> None:
        self.left -= 1
        if self.left <= 0 or (self.until_error and status in FAILED):
            self.event.set()


class _LoopCountdown(_Countdown):
    """A _Countdown that wakes a coroutine on `loop` instead of a thread (FutureStates.wait_async)."""

    __slots__ = ("loop", "future")

    def __init__(self, left: int, until_error: bool, loop: asyncio.AbstractEventLoop):
        super().__init__(left, until_error)
        self.loop, self.future = loop, loop.create_future()

    def one_done(self, status: str) -> None:
        super().one_done(status)
        if self.event.is_set():
            try:
                self.loop.call_soon_threadsafe(_resolve, self.future)
            except RuntimeError:          # that loop is closed: nobody waits any more
                pass


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class FutureStates(dict):
    """One client's FutureState per key; waiting on them, and their done-callbacks."""

    def __init__(self, lock):
        super().__init__()
        self.lock = lock                  # the client's: settle() is called under it
        self._callbacks = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hpc-callbacks")

    def state(self, key: str) -> FutureState:
        st = self.get(key)
        if st is None:
            st = self.setdefault(key, FutureState())
        return st

    def wait(self, keys: list[str], timeout: float | None, first: bool = False,
             until_error: bool = False) -> bool:
        """Block until every key is done (`first`: any one; `until_error`: also as soon as one
        failed). False on timeout."""
        states = [self.state(k) for k in keys]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            hung = self._hang(states, first, until_error, _Countdown)
            if hung is None:
                return True
            countdown, pending = hung
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if countdown.event.wait(left) or self._unhang(countdown, pending):
                continue                  # look again: a finished key may be recomputing meanwhile
            return False

    async def wait_async(self, keys: list[str], timeout: float | None, first: bool = False,
                         until_error: bool = False) -> bool:
        """wait() from a coroutine: the countdown wakes the event loop, no thread waits."""
        loop = asyncio.get_running_loop()
        states = [self.state(k) for k in keys]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            hung = self._hang(states, first, until_error, lambda n, e: _LoopCountdown(n, e, loop))
            if hung is None:
                return True
            countdown, pending = hung
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(asyncio.shield(countdown.future), left)
                continue
            except asyncio.TimeoutError:
                if self._unhang(countdown, pending):
                    continue
            return False

    def _hang(self, states: list[FutureState], first: bool, until_error: bool, make):
        """None if the wait is over; else a countdown made by `make(left, until_error)`, hung on
        the pending states, and those states."""
        with self.lock:
            pending = [st for st in states if st.status == "pending"]
            if (not pending or (first and len(pending) < len(states))
                    or (until_error and any(st.status in FAILED for st in states))):
                return None
            countdown = make(1 if first else len(pending), until_error)
            for st in pending:
                if st.waiters is None:
                    st.waiters = [countdown]
                else:
                    st.waiters.append(countdown)
            return countdown, pending

    def _unhang(self, countdown: _Countdown, pending: list[FutureState]) -> bool:
        """After a wait ran out of time: True if it was woken meanwhile (look again), else
        the countdown is taken off the states (none may hold on to a waiter that gave up)."""
        with self.lock:
            if countdown.event.is_set():
                return True
            for st in pending:
                if st.waiters and countdown in st.waiters:
                    st.waiters.remove(countdown)
        return False

    def cancel_now(self, keys, reason: str, call_soon) -> None:
        """`keys` cancelled by this client, at once, as distributed's futures are (not when the
        scheduler's word comes back): `cancelled()` is true as cancel() returns, and a result
        already on its way does not undo it (settle). Their callbacks run on the loop thread,
        through `call_soon` (the loop's call_soon_threadsafe), after any added meanwhile."""
        error = {"kind": ErrorKind.CANCELLED.value, "text": reason, "here": True}
        settled = []
        with self.lock:
            for key in keys:
                st = self.get(key)
                if st is not None and st.status != "cancelled":
                    st.settle("cancelled", error)
                    settled.append(st)
        if settled:
            call_soon(self._run_all_callbacks, settled)

    def _run_all_callbacks(self, states: list) -> None:
        for st in states:
            if st.callbacks:
                self.run_callbacks(st)

    def retried(self, key: str) -> None:
        """The scheduler runs `key` again (client.retry): its future is pending once more."""
        with self.lock:
            st = self.get(key)
            if st is not None and st.status in FAILED:
                st.status, st.error = "pending", None

    # Callbacks are added and taken on the client's loop thread only (no lock), and run in a
    # thread of their own, so a slow one holds up neither the loop nor the other futures.
    def add_callback(self, key: str, fn: Callable[[], None]) -> None:
        st = self.state(key)
        if st.status != "pending":
            self._callbacks.submit(_run_callback, fn)
        else:
            st.callbacks.append(fn)

    def run_callbacks(self, st: FutureState) -> None:
        callbacks, st.callbacks = st.callbacks, []
        for fn in callbacks:
            self._callbacks.submit(_run_callback, fn)

    def close(self) -> None:
        self._callbacks.shutdown(wait=False)


def _run_callback(fn) -> None:
    try:
        fn()
    except Exception:
        logger.exception("future callback failed")


class Future(TaskRef):
    """A task's result, somewhere on the cluster.

    To dask it is a reference to a task (a `TaskRef`, as distributed's Future is): put in a
    dask graph, or in a `delayed` call, it becomes that task's input by its key, and the
    graph's tasks wait for it instead of computing it again.
    """

    __slots__ = ("_hpc_key", "client", "_released", "__weakref__")
    __dask_future__ = True

    def __init__(self, key: str, client: FutureOwner):
        super().__init__(key)
        self._hpc_key = key                 # recognised by the pickler as a task reference
        self.client = client
        self._released = False              # release() let go of its reference already
        client.hold_key(key)

    def __dask_tokenize__(self):
        return ("hpc_cluster.Future", self.key)

    @property
    def _state(self) -> FutureState:
        return self.client.future_state(self.key)

    @property
    def status(self) -> str:
        return self._state.status

    @property
    def executor(self) -> FutureOwner:
        """The client that runs it (distributed's name for it)."""
        return self.client

    @property
    def type(self) -> type | None:
        """The result's type, once this client has seen it (scattered here, or fetched by
        result()); None before. distributed's scheduler unpickles the type its workers report;
        ours never unpickles anything of the user's, so it is not known sooner."""
        return self._state.type

    def done(self) -> bool:
        return self._state.status != "pending"

    def result(self, timeout: float | None = None) -> Any:
        """Its value (waiting for it); the task's exception raised with the task's own frames as
        its traceback (tracebacks.shorten). `timeout`: seconds or a string ("1s")."""
        try:
            value = self.client.gather(self, timeout=timeout)
        except Exception as exc:
            if not shorten(exc):
                raise
            raise exc
        if not getattr(self.client, "asynchronous", False):
            self._state.type = type(value)
        return value

    def _wait_done(self, timeout, what: str = "Future.exception") -> None:
        timeout = parse_timeout(timeout, what)
        if not self.client.wait_keys([self.key], timeout):
            raise TimeoutError(f"{self.key!r} not done within {timeout} s")

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The exception its task raised, with the task's traceback as its __traceback__ (as
        distributed's), or the error that ended it (KilledWorker, CancelledError, ...); None if
        it finished."""
        if getattr(self.client, "asynchronous", False):
            return self._exception_async(timeout)         # an awaitable, as distributed's
        self._wait_done(timeout)
        return self._failure() if self._state.status in FAILED else None

    def _failure(self) -> BaseException:
        """Its error as exception() gives it (the future failed)."""
        exc = self.client.future_error(self.key)
        shorten(exc)
        return exc

    def traceback(self, timeout: float | None = None):
        """The traceback of its task's exception as a traceback object (`traceback.format_tb`
        reads it), rebuilt from the text its worker sent; None if it did not fail with one."""
        if getattr(self.client, "asynchronous", False):
            return self._traceback_async(timeout)         # an awaitable, as distributed's
        self._wait_done(timeout, "Future.traceback")
        return self._remote_traceback()

    def _remote_traceback(self):
        if self._state.status != "error":
            return None
        return rebuild_traceback(getattr(self.client.future_error(self.key), "remote_traceback", None))

    async def _traceback_async(self, timeout: float | None):
        timeout = parse_timeout(timeout, "Future.traceback")
        if not await self.client.wait_keys_async([self.key], timeout):
            raise TimeoutError(f"{self.key!r} not done within {timeout} s")
        return self._remote_traceback()

    def retry(self) -> None:
        """Run it again if it failed (client.retry)."""
        return self.client.retry([self])

    def bind_client(self, client: FutureOwner) -> None:
        """Make it `client`'s future: that client holds the key (the scheduler tells it the
        state) before this one lets go of it, so the result is not released in between."""
        if client is self.client:
            return
        client.hold_key(self.key)
        client.adopt_keys([self.key])
        old, self.client = self.client, client
        if self._released:
            self._released = False          # held again, by its new client
        else:
            old.release_key(self.key)

    async def _exception_async(self, timeout: float | None) -> BaseException | None:
        timeout = parse_timeout(timeout, "Future.exception")
        if not await self.client.wait_keys_async([self.key], timeout):
            raise TimeoutError(f"{self.key!r} not done within {timeout} s")
        return self._failure() if self._state.status in FAILED else None

    def __await__(self):
        """`await future` in async code: its result, waited for on the event loop."""
        return self.client.gather_async(self).__await__()

    def cancel(self, reason: str = "cancelled by the user") -> None:
        return self.client.cancel([self], reason=reason)   # awaitable from async code, as distributed's

    def cancelled(self) -> bool:
        return self._state.status == "cancelled"

    def add_done_callback(self, fn: Callable[["Future"], None]) -> None:
        self.client.on_future_done(self, fn)

    def release(self) -> None:
        """Let go of its result now, as dropping the last reference to it does (distributed's):
        this Future no longer keeps the result on the cluster; other Futures of the key still do."""
        if not self._released:
            self._released = True
            self.client.release_key(self.key)

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown, or made only half (no client)
            pass

    def __repr__(self) -> str:
        return f"<Future {self.key!r} {self.status}>"


def flatten_futures(obj, out: list) -> None:
    """Append the Futures in `obj`: a Future, lists, tuples, sets and dicts of them at any
    depth, and persisted dask collections (whose graphs hold them). No recursion: a deep
    nesting cannot overflow the stack."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, Future):
            out.append(x)
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(reversed(list(x)))
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
        elif hasattr(x, "__dask_graph__") and hasattr(x, "__dask_keys__") and not isinstance(x, type):
            # (a collection's class, futures_of([da.Array]), has the methods but no graph)
            stack.extend(reversed([v for v in dict(x.__dask_graph__()).values() if isinstance(v, Future)]))


_NESTS = (list, tuple, set, dict)


def _items(obj, dropped) -> list:
    """(dict key or None, value) of a container, without the dropped futures."""
    pairs = obj.items() if isinstance(obj, dict) else ((None, o) for o in obj)
    return [(k, v) for k, v in pairs if not (isinstance(v, Future) and v.key in dropped)]


def replace_futures(obj, values: dict, dropped: frozenset | set = frozenset()):
    """`obj` with each Future replaced by its value; futures whose keys are in `dropped`
    are left out of the lists, tuples, sets and dicts that hold them, at any depth.
    A stack of our own, not recursion: gather() of a nesting 3,000 deep must not overflow."""
    if isinstance(obj, Future):
        return values[obj.key]
    if not isinstance(obj, _NESTS):
        return obj
    stack = [(obj, iter(_items(obj, dropped)), [])]      # (container, items left, items done)
    while True:
        node, items, done = stack[-1]
        for key, value in items:
            if isinstance(value, _NESTS):
                done.append((key, None))                  # filled in when the child is built
                stack.append((value, iter(_items(value, dropped)), []))
                break
            done.append((key, values[value.key] if isinstance(value, Future) else value))
        else:
            stack.pop()
            built = dict(done) if isinstance(node, dict) else type(node)(v for _, v in done)
            if not stack:
                return built
            parent_done = stack[-1][2]
            parent_done[-1] = (parent_done[-1][0], built)


class _Waited(collections.namedtuple("_Waited", "done not_done")):
    pass


def wait(futures, timeout: float | None = None, return_when: str = "ALL_COMPLETED") -> _Waited:
    """Block until all (or, with FIRST_COMPLETED, any) futures are done. From async code of an
    asynchronous Client, an awaitable of the same (`await wait(futures)`, as distributed's)."""
    timeout = parse_timeout(timeout, "wait")
    flat: list[Future] = []
    flatten_futures(futures, flat)
    if return_when not in ("ALL_COMPLETED", "FIRST_COMPLETED"):
        raise ValueError("return_when must be 'ALL_COMPLETED' or 'FIRST_COMPLETED'")
    if any(getattr(f.client, "asynchronous", False) for f in flat):
        return _wait_async(flat, timeout, return_when)
    deadline = None if timeout is None else time.monotonic() + timeout
    if return_when == "FIRST_COMPLETED":
        _wait_first(_by_owner(flat), deadline, timeout)
    else:
        for owner, keys in _by_owner(flat):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not owner.wait_keys(keys, left):
                raise TimeoutError(f"futures not done within {timeout} s")
    done = {f for f in flat if f.done()}
    return _Waited(done, set(flat) - done)


def _wait_first(owners: list, deadline: float | None, timeout: float | None) -> None:
    """Until one of the owners' keys is done. Futures of one client (nearly always): one wait;
    of several: each asked in turn, a moment each, until one says so."""
    backoff = Backoff(0.005, 0.1)
    while owners:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if len(owners) == 1:
            if owners[0][0].wait_keys(owners[0][1], left, first=True):
                return
        elif any(owner.wait_keys(keys, 0, first=True) for owner, keys in owners):
            return
        elif left is None or left > 0:
            time.sleep(backoff.next() if left is None else min(left, backoff.next()))
            continue
        raise TimeoutError(f"no future finished within {timeout} s")


def _by_owner(flat: list[Future]) -> list[tuple[FutureOwner, list[str]]]:
    """(client, its keys) for the futures: one wait per client."""
    by_owner: dict[int, tuple[FutureOwner, dict]] = {}
    for f in flat:
        by_owner.setdefault(id(f.client), (f.client, {}))[1][f.key] = None
    return [(owner, list(keys)) for owner, keys in by_owner.values()]


async def _wait_async(flat: list[Future], timeout: float | None, return_when: str) -> _Waited:
    owners = _by_owner(flat)
    if return_when == "FIRST_COMPLETED" and owners:
        waits = [asyncio.ensure_future(owner.wait_keys_async(keys, timeout, first=True)) for owner, keys in owners]
        finished, unfinished = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in unfinished:
            w.cancel()
        if flat and not any(w.result() for w in finished):
            raise TimeoutError(f"no future finished within {timeout} s")
    elif return_when == "ALL_COMPLETED":
        deadline = None if timeout is None else time.monotonic() + timeout
        for owner, keys in owners:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not await owner.wait_keys_async(keys, left):
                raise TimeoutError(f"futures not done within {timeout} s")
    done = {f for f in flat if f.done()}
    return _Waited(done, set(flat) - done)
