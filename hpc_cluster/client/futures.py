"""Futures and waiting on them: `Future`, `wait`, `as_completed`.

A Future is a reference to a task's result on the cluster. Its state lives in its owner
(the Client's `FutureStates`, set from the client's event-loop thread); users block in
`FutureStates.wait`.
This module knows its owner only through `FutureOwner`, the few calls a Future makes, so
it imports nothing of the client's and the client imports it, one way.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterable, Protocol

from dask._task_spec import TaskRef

from .exceptions import TimeoutError

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

    def gather(self, futures, errors: str = "raise", timeout: float | None = None) -> Any: ...

    def cancel(self, futures, reason: str = ...) -> None: ...


FAILED = ("error", "cancelled")


class FutureState:
    """A key's status as its client knows it: "pending", "finished", "error" or "cancelled".

    A plain field, not a threading.Event per key: the client's loop thread made and set one
    for every finished task (an Event is a Condition and a lock; set() notifies), 17% of its
    time in a 20k-task map. Changed only under the client's lock; threads that wait hang one
    `_Countdown` on every key they wait for instead (`FutureStates.wait`)."""

    __slots__ = ("status", "error", "callbacks", "waiters")

    def __init__(self):
        self.status = "pending"
        self.error: dict | None = None
        self.callbacks: list = []                    # touched on the loop thread only
        self.waiters: list | None = None             # _Countdowns, under the lock

    def settle(self, status: str, error: dict | None) -> None:
        """Its outcome; wakes whoever waits on it. The caller holds the client's lock."""
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
            with self.lock:
                pending = [st for st in states if st.status == "pending"]
                if (not pending or (first and len(pending) < len(states))
                        or (until_error and any(st.status in FAILED for st in states))):
                    return True
                countdown = _Countdown(1 if first else len(pending), until_error)
                for st in pending:
                    if st.waiters is None:
                        st.waiters = [countdown]
                    else:
                        st.waiters.append(countdown)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if countdown.event.wait(left):
                continue                  # look again: a finished key may be recomputing meanwhile
            with self.lock:
                if countdown.event.is_set():
                    continue
                for st in pending:        # none may hold on to a waiter that gave up
                    if st.waiters and countdown in st.waiters:
                        st.waiters.remove(countdown)
            return False

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

    __slots__ = ("_hpc_key", "client", "__weakref__")
    __dask_future__ = True

    def __init__(self, key: str, client: FutureOwner):
        super().__init__(key)
        self._hpc_key = key                 # recognised by the pickler as a task reference
        self.client = client
        client.hold_key(key)

    def __dask_tokenize__(self):
        return ("hpc_cluster.Future", self.key)

    @property
    def _state(self) -> FutureState:
        return self.client.future_state(self.key)

    @property
    def status(self) -> str:
        return self._state.status

    def done(self) -> bool:
        return self._state.status != "pending"

    def result(self, timeout: float | None = None) -> Any:
        return self.client.gather(self, timeout=timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.client.wait_keys([self.key], timeout):
            raise TimeoutError(f"{self.key!r} not done within {timeout} s")
        return self.client.future_error(self.key) if self._state.status in FAILED else None

    def cancel(self, reason: str = "cancelled by the user") -> None:
        self.client.cancel([self], reason=reason)

    def cancelled(self) -> bool:
        return self._state.status == "cancelled"

    def add_done_callback(self, fn: Callable[["Future"], None]) -> None:
        self.client.on_future_done(self, fn)

    def release(self) -> None:
        pass                                 # kept for dask compatibility; `del` releases

    def __del__(self):
        try:
            self.client.release_key(self.key)
        except Exception:  # interpreter shutdown
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
        elif hasattr(x, "__dask_graph__") and hasattr(x, "__dask_keys__"):
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
    """Block until all (or, with FIRST_COMPLETED, any) futures are done."""
    flat: list[Future] = []
    flatten_futures(futures, flat)
    deadline = None if timeout is None else time.monotonic() + timeout
    if return_when == "FIRST_COMPLETED":
        queue = as_completed(flat, timeout=timeout)
        next(iter(queue), None)
    elif return_when == "ALL_COMPLETED":
        by_owner: dict[int, tuple[FutureOwner, dict]] = {}     # one wait per client
        for f in flat:
            by_owner.setdefault(id(f.client), (f.client, {}))[1][f.key] = None
        for owner, keys in by_owner.values():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not owner.wait_keys(list(keys), left):
                raise TimeoutError(f"futures not done within {timeout} s")
    else:
        raise ValueError("return_when must be 'ALL_COMPLETED' or 'FIRST_COMPLETED'")
    done = {f for f in flat if f.done()}
    return _Waited(done, set(flat) - done)


class as_completed:
    """Iterate over futures in the order they finish (optionally with their results)."""

    def __init__(self, futures: Iterable[Future] = (), with_results: bool = False,
                 timeout: float | None = None):
        self._queue: queue.Queue = queue.Queue()
        self.with_results = with_results
        self.timeout = timeout
        self._count = 0
        for f in futures:
            self.add(f)

    def add(self, future: Future) -> None:
        self._count += 1
        future.add_done_callback(self._queue.put)

    def __iter__(self):
        return self

    def __next__(self):
        if self._count == 0:
            raise StopIteration
        try:
            f = self._queue.get(timeout=self.timeout)
        except queue.Empty:
            raise TimeoutError(f"no future finished within {self.timeout} s") from None
        self._count -= 1
        if self.with_results:
            return f, f.client.gather(f, errors="raise") if f.status == "finished" else f.exception()
        return f
