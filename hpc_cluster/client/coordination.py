"""Coordination between clients and tasks, as dask.distributed's: `Lock`, `Semaphore`,
`MultiLock`, `Event`, `Variable`, `Queue` and `fire_and_forget`, with distributed 2026.8's
signatures and meaning. The scheduler keeps them (scheduler/coordination.py); each object here is
a name and a client, so it pickles as its name and works the same inside a task, where it finds
the task's client (get_client()), as in the user's process, where it uses the current Client.

Differences kept on purpose (docs/migrating-from-distributed.md, "Coordination"): a lease is
held until it is released, its client disconnects or the worker whose task took it is removed
(no lease timeout that could let two holders in); a value may be anything picklable (futures
inside it too), not only msgpack data; waits are granted in the order they came.
"""

from __future__ import annotations

import inspect
import threading
import uuid
import weakref
from collections import deque

from .dask_collections import futures_of
from .exceptions import TimeoutError
from .sharing import answer, ask, pack, parse_timeout, send, timed_out, unpack
from .subtasks import get_client
from ..protocol import context
from ..protocol.messages import Op

__all__ = ["Lock", "Semaphore", "MultiLock", "Event", "Variable", "Queue", "fire_and_forget"]


def _granted(result: dict) -> bool:
    return False if timed_out(result) else bool(answer(result))


def _no_rpc(cls: str, scheduler_rpc, loop) -> None:
    if scheduler_rpc is not None or loop is not None:
        raise TypeError(f"{cls}(scheduler_rpc=, loop=) are distributed's own connection and event loop; "
                        f"hpc_cluster's {cls} talks through the current client (or the task's): leave them out")


class _Named:
    """A name and the client it is used through, found when first needed (as distributed does)."""

    kind = "object"

    def __init__(self, name=None, client=None):
        self.name = name if name is not None else f"{self.kind}-{uuid.uuid4().hex}"
        self._client = client

    @property
    def client(self):
        if self._client is None:
            try:
                self._client = get_client()
            except ValueError:
                raise RuntimeError(f"{type(self).__name__} {self.name!r} has no client to talk through: create a "
                                   "Client first (inside a task, the task's own client is used)") from None
        return self._client

    def _ask(self, op, waits: bool = False, then=answer, **fields):
        return ask(self.client, {"op": op, "name": self.name, **fields}, waits, then)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.name}>"


class _Taken:
    """`with it:` and `async with it:` acquire and release (an asynchronous client's calls awaited)."""

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    async def __aenter__(self):
        result = self.acquire()
        if inspect.isawaitable(result):
            await result
        return self

    async def __aexit__(self, *exc):
        result = self.release()
        if inspect.isawaitable(result):
            await result


class Semaphore(_Taken, _Named):
    """At most `max_leases` holders at once of the resource `name`, across clients and tasks.

    Each `acquire()` takes a lease, each `release()` gives back the oldest this object holds
    (more releases than acquires: RuntimeError("Released too often")). A lease outlives nothing it
    belongs to: its client disconnecting, or the worker whose task took it being removed, releases
    it. `close()` removes the semaphore from the scheduler."""

    kind = "semaphore"

    def __init__(self, max_leases=1, name=None, scheduler_rpc=None, loop=None):
        _no_rpc(type(self).__name__, scheduler_rpc, loop)
        if not isinstance(max_leases, int) or isinstance(max_leases, bool) or max_leases < 1:
            raise ValueError(f"max_leases={max_leases!r}: give a whole number of leases >= 1")
        super().__init__(name)
        self.max_leases = max_leases
        self.id = uuid.uuid4().hex
        self._leases: deque[str] = deque()

    @property
    def loop(self):
        """The event loop its client talks on (distributed's Semaphore.loop)."""
        return self.client.loop

    def register(self, **kwargs):
        """Make it known to the scheduler (acquire does so too)."""
        return self._ask(Op.SEMAPHORE_REGISTER, max_leases=self.max_leases)

    def __await__(self):
        async def registered():
            result = self.register()
            if inspect.isawaitable(result):
                await result
            return self
        return registered().__await__()

    def acquire(self, timeout=None):
        """Take a lease; wait up to `timeout` (seconds, '200ms'; None: for as long as it takes) for
        one to be free. True if taken, False if the time ran out."""
        timeout = parse_timeout(timeout, f"{type(self).__name__}.acquire")
        lease = uuid.uuid4().hex

        def then(result):
            if _granted(result):
                self._leases.append(lease)
                return True
            return False
        return self._ask(Op.SEMAPHORE_ACQUIRE, True, then, max_leases=self.max_leases, lease=lease, timeout=timeout)

    def release(self):
        """Give back the oldest lease this object holds. True if the scheduler still had it (False:
        it was released before, as when its client reconnected)."""
        if not self._leases:
            raise RuntimeError("Released too often")
        return self._ask(Op.SEMAPHORE_RELEASE, lease=self._leases.popleft())

    def get_value(self):
        """How many leases are held now."""
        return self._ask(Op.SEMAPHORE_VALUE)

    def close(self):
        """Remove the semaphore from the scheduler; leases still held are dropped (with a warning
        in the scheduler's log) and waiting acquires fail."""
        return self._ask(Op.SEMAPHORE_CLOSE)

    def __getstate__(self):
        return (self.name, self.max_leases)

    def __setstate__(self, state):
        name, max_leases = state
        self.__init__(max_leases=max_leases, name=name)


class Lock(Semaphore):
    """A lock across clients and tasks by name (a semaphore of one lease, as distributed's).

    `Lock('x').acquire(timeout=1)`, `with Lock('x'): ...`; inside a task `Lock('x')` (or a Lock
    passed to it) is the same lock."""

    kind = "lock"

    def __init__(self, name=None, scheduler_rpc=None, loop=None):
        super().__init__(max_leases=1, name=name, scheduler_rpc=scheduler_rpc, loop=loop)

    def acquire(self, blocking=True, timeout=None):
        """Take the lock: wait up to `timeout` (seconds, '200ms'; None: for as long as it takes), or
        not at all with blocking=False. True if taken, False if not."""
        if not blocking:
            if timeout is not None:
                raise ValueError("can't specify a timeout for a non-blocking call")
            timeout = 0
        return super().acquire(timeout=timeout)

    def locked(self):
        """Is the lock held now (by anyone)?"""
        value = self.get_value()
        if inspect.isawaitable(value):
            async def held():
                return await value == 1
            return held()
        return value == 1

    def __reduce__(self):
        return (_lock_named, (self.name,))


# Locks unpickled in this process, by name, while a copy lives (see _lock_named).
_unpickled: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_unpickled_guard = threading.Lock()


def _lock_named(name) -> Lock:
    """A Lock from its pickle: the process's one Lock of that name while any copy lives, as the
    copies of an xarray SerializableLock share one threading.Lock. xarray's CombinedLock takes its
    locks in the order of their identities (id()): two tasks of one worker, each with its own copy
    of the file's Lock beside the process's netCDF lock, took them in opposite orders and
    deadlocked (each held one). One object per name keeps one order. Its leases are the holders':
    a Lock has one holder at a time, whose lease is the one released."""
    with _unpickled_guard:
        lock = _unpickled.get(name)
        if lock is None:
            lock = _unpickled[name] = Lock(name)
        return lock


class MultiLock(_Taken, _Named):
    """Several named locks taken together (all of them, or `num_locks` of them), without the
    deadlock of taking them one by one: a request waits in every lock's queue at once."""

    kind = "multi-lock"

    def __init__(self, names=None, client=None):
        super().__init__("multi-lock", client)
        self.names = list(names or [])
        self.id = uuid.uuid4().hex
        self._locked = False

    def acquire(self, blocking=True, timeout=None, num_locks=None):
        """Take the locks (`num_locks` of `names`; None: all): wait up to `timeout` (None: for as
        long as it takes), or not at all with blocking=False. True if taken, False if not."""
        timeout = parse_timeout(timeout, "MultiLock.acquire")
        if not blocking:
            if timeout is not None:
                raise ValueError("can't specify a timeout for a non-blocking call")
            timeout = 0
        if num_locks is not None and not 0 < num_locks <= len(set(self.names)):
            raise ValueError(f"num_locks={num_locks!r}: give between 1 and the {len(set(self.names))} names")

        def then(result):
            self._locked = _granted(result)
            return self._locked
        msg = {"op": Op.MULTI_LOCK_ACQUIRE, "id": self.id, "names": self.names, "timeout": timeout,
               "num_locks": num_locks or len(set(self.names))}
        return ask(self.client, msg, True, then)

    def release(self):
        """Give the locks back."""
        if not self.locked():
            raise ValueError("Lock is not yet acquired")
        self._locked = False
        return ask(self.client, {"op": Op.MULTI_LOCK_RELEASE, "id": self.id})

    def locked(self):
        return self._locked

    def __reduce__(self):
        return (type(self), (self.names,))


class Event(_Named):
    """A flag across clients and tasks, as asyncio.Event: wait() until someone set()s it."""

    kind = "event"

    def __await__(self):
        async def itself():
            return self
        return itself().__await__()

    def wait(self, timeout=None):
        """Wait until the event is set, up to `timeout` (None: for as long as it takes). True if it
        was set, False if the time ran out."""
        timeout = parse_timeout(timeout, "Event.wait")
        return self._ask(Op.EVENT_WAIT, True, _granted, timeout=timeout)

    def set(self):
        """Set the flag: every waiter goes on."""
        return self._ask(Op.EVENT_SET)

    def clear(self):
        """Clear the flag: waiters from now on wait."""
        return self._ask(Op.EVENT_CLEAR)

    def is_set(self):
        return self._ask(Op.EVENT_IS_SET)

    def __reduce__(self):
        return (Event, (self.name,))


class Variable(_Named):
    """One value shared by name between clients and tasks: a Future (kept computed while it is
    the value), or any picklable object, kept by the scheduler (share large data as a future)."""

    kind = "variable"

    def set(self, value, timeout="30 s", **kwargs):
        """Make `value` the variable's (`timeout`: accepted as distributed's; the scheduler knows
        every future this client sent it, so nothing waits)."""
        parse_timeout(timeout, "Variable.set")
        return self._ask(Op.VARIABLE_SET, value=pack(value, f"the value for Variable {self.name!r}"))

    def get(self, timeout=None, **kwargs):
        """The value; wait up to `timeout` (None: for as long as it takes) for one to be set. A
        future comes back as a Future of this client. TimeoutError if the time ran out."""
        timeout = parse_timeout(timeout, "Variable.get")
        client = self.client

        def then(result):
            if timed_out(result):
                raise _timeout_error(f"Variable {self.name!r} was not set within {timeout} s")
            return unpack(client, answer(result))
        return self._ask(Op.VARIABLE_GET, True, then, timeout=timeout)

    def delete(self):
        """Remove the variable (for every client that uses it)."""
        if self.client.status == "running":
            send(self.client, {"op": Op.VARIABLE_DELETE, "name": self.name})

    def __reduce__(self):
        return (Variable, (self.name,))


class Queue(_Named):
    """A first-in first-out queue shared by name between clients and tasks, of futures or any
    picklable objects (small ones: they pass through the scheduler; share large data as futures).
    `maxsize` > 0 bounds it: a put then waits for room."""

    kind = "queue"

    def __init__(self, name=None, client=None, maxsize=0):
        if not isinstance(maxsize, int) or maxsize < 0:
            raise ValueError(f"maxsize={maxsize!r}: give a whole number >= 0 (0: no limit)")
        super().__init__(name, client)
        self.maxsize = maxsize
        self._created = False
        if client is not None or _has_client():
            self._create()

    def _create(self):
        # Made known (counted) on first use: a copy unpickled inside a task counts as one more
        # user of the queue only once it is used, and creating it never waits inside unpickling.
        if not self._created:
            self._created = True
            send(self.client, {"op": Op.QUEUE_CREATE, "name": self.name, "maxsize": self.maxsize})

    def __await__(self):
        async def itself():
            return self
        return itself().__await__()

    def put(self, value, timeout=None, **kwargs):
        """Add `value` at the end; wait up to `timeout` (None: as long as it takes) for room in a
        bounded queue. TimeoutError if the time ran out."""
        timeout = parse_timeout(timeout, "Queue.put")
        self._create()

        def then(result):
            if timed_out(result):
                raise _timeout_error(f"Queue {self.name!r} stayed full for {timeout} s")
            return answer(result)
        return self._ask(Op.QUEUE_PUT, True, then, value=pack(value, f"the value put in Queue {self.name!r}"),
                         timeout=timeout, maxsize=self.maxsize)

    def get(self, timeout=None, batch=False, **kwargs):
        """The first value; wait up to `timeout` (None: as long as it takes) for one. batch=True:
        every value there is now (perhaps none); batch=n: the next n, waiting for them all.
        TimeoutError if the time ran out."""
        timeout = parse_timeout(timeout, "Queue.get")
        if batch is not True and batch is not False and timeout is not None:
            raise NotImplementedError("Dask queues don't support simultaneous use of integer batch sizes and timeouts")
        if batch is not True and batch is not False and (not isinstance(batch, int) or batch < 1):
            raise ValueError(f"batch={batch!r}: give True (all there is), False (one) or a number of items >= 1")
        self._create()
        client = self.client

        def then(result):
            if timed_out(result):
                raise _timeout_error(f"Queue {self.name!r} had nothing to get within {timeout} s")
            values = [unpack(client, wire) for wire in answer(result)]
            return values if batch is not False else values[0]
        return self._ask(Op.QUEUE_GET, batch is not True, then, timeout=timeout, batch=batch, maxsize=self.maxsize)

    def qsize(self, **kwargs):
        """How many values are in the queue now."""
        return self._ask(Op.QUEUE_SIZE)

    def close(self):
        """This user is done with the queue: it goes (its values with it) once every user that
        made it known has closed it."""
        if self._created and self.client.status == "running":
            send(self.client, {"op": Op.QUEUE_CLOSE, "name": self.name})

    def __reduce__(self):
        return (_unpickled_queue, (self.name, self.maxsize))


def _unpickled_queue(name, maxsize):
    """A Queue made from its pickle: it makes itself known on first use (Queue._create)."""
    q = Queue.__new__(Queue)
    _Named.__init__(q, name)
    q.maxsize, q._created = maxsize, False
    return q


def _has_client() -> bool:
    if context.worker() is not None:
        return False                      # inside a worker: made known on first use (see _create)
    try:
        get_client()
        return True
    except ValueError:
        return False


def _timeout_error(text: str) -> TimeoutError:
    return TimeoutError(text)


def fire_and_forget(obj):
    """Run these futures' tasks (a Future, a collection of them, a persisted dask collection) to the
    end even when no future to them is left; their results are not kept (for side effects)."""
    by_client: dict[int, tuple[object, list[str]]] = {}
    for future in futures_of(obj):
        by_client.setdefault(id(future.client), (future.client, []))[1].append(future.key)
    for client, keys in by_client.values():
        send(client, {"op": Op.FIRE_AND_FORGET, "keys": keys})
