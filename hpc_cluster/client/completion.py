"""`as_completed`: futures in the order they finish, one by one or in batches, as
distributed's (split from futures.py, which it stands on).

Each future's done-callback (run on the client's callback thread) moves it from `futures`
(not done yet, with how many times it is still to come: a future added twice comes twice) to
`queue` (done, not handed out yet), under one lock, and wakes whoever waits: a thread in
`__next__` or a coroutine in `__anext__`. With `with_results`, the results of a batch are
fetched in one gather per client when it is handed out, not one by one as they finish.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Iterable

from .exceptions import TimeoutError
from .futures import Future
from .timeouts import parse_timeout


def _wake(waker: asyncio.Future) -> None:
    if not waker.done():
        waker.set_result(None)


class as_completed:
    """Iterate over futures in the order they finish.

    `with_results=True` yields (future, result) pairs; a failed future's error is raised
    then (`raise_errors=False`: its pair holds (type, exception, traceback), as
    distributed's; a cancelled one's holds the CancelledError). `timeout` (seconds, or a string:
    "500ms") counts from this call: a wait for the next one past it raises TimeoutError. `add`/`update` take more
    futures while iterating; `batches()` yields lists of all that finished meanwhile; `loop`
    is accepted for distributed's signature and not needed (the client has its own).
    """

    def __init__(self, futures: Iterable[Future] | None = None, loop=None, with_results: bool = False,
                 raise_errors: bool = True, *, timeout: float | None = None):
        self.futures: collections.defaultdict = collections.defaultdict(int)
        self.queue: collections.deque = collections.deque()
        self.lock = threading.Lock()
        self._arrival = threading.Condition(self.lock)
        self._waker: asyncio.Future | None = None       # set while a coroutine waits (__anext__)
        self.with_results, self.raise_errors = with_results, raise_errors
        self.timeout = timeout = parse_timeout(timeout, "as_completed")
        self._deadline = None if timeout is None else time.monotonic() + timeout
        if futures:
            self.update(futures)

    # -- adding ---------------------------------------------------------------------------
    def update(self, futures: Iterable[Future]) -> None:
        """Add several futures; each comes out once it is done."""
        futures = list(futures)
        for f in futures:
            if not isinstance(f, Future):
                raise TypeError(f"as_completed takes futures, got {type(f).__name__} {f!r}")
        with self.lock:
            for f in futures:
                self.futures[f] += 1
        for f in futures:
            f.add_done_callback(self._arrived)

    def add(self, future: Future) -> None:
        """Add a future; it comes out once it is done."""
        self.update((future,))

    def _arrived(self, future: Future) -> None:
        with self.lock:
            left = self.futures.get(future)
            if not left:
                return                          # cleared meanwhile
            if left == 1:
                del self.futures[future]
            else:
                self.futures[future] = left - 1
            self.queue.append(future)
            self._arrival.notify_all()
            waker = self._waker
        if waker is not None:
            try:
                waker.get_loop().call_soon_threadsafe(_wake, waker)
            except RuntimeError:                # its loop is closed: nobody waits any more
                pass

    # -- asking ---------------------------------------------------------------------------
    def count(self) -> int:
        """Futures still to come: not done yet, or done and not handed out yet."""
        with self.lock:
            return sum(self.futures.values()) + len(self.queue)

    def is_empty(self) -> bool:
        return not self.count()

    def has_ready(self) -> bool:
        """True if a finished future waits to be handed out."""
        return bool(self.queue)

    def clear(self) -> None:
        """Forget every future added: none of them comes out any more."""
        with self.lock:
            self.futures.clear()
            self.queue.clear()

    def __repr__(self) -> str:
        return f"<as_completed: waiting={sum(self.futures.values())} done={len(self.queue)}>"

    # -- taking -----------------------------------------------------------------------------
    def _left(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    def _timed_out(self) -> TimeoutError:
        return TimeoutError(f"as_completed: no future finished within its timeout of {self.timeout} s")

    def _await_arrival(self) -> None:
        """With the lock held: wait until a finished future is queued. StopIteration when none
        is left to come, TimeoutError past the deadline."""
        while not self.queue:
            if not self.futures:
                raise StopIteration
            left = self._left()
            if left is not None and left <= 0:
                raise self._timed_out()
            self._arrival.wait(left)

    def __iter__(self):
        return self

    def __next__(self):
        with self.lock:
            self._await_arrival()
            future = self.queue.popleft()
        return self._hand_out([future])[0]

    next = __next__

    def next_batch(self, block: bool = True) -> list:
        """The futures (or (future, result) pairs) finished since the last call; with `block`,
        waits for at least one (StopIteration when none is left to come)."""
        with self.lock:
            if block:
                self._await_arrival()
            batch = list(self.queue)
            self.queue.clear()
        return self._hand_out(batch)

    def batches(self):
        """Yield lists of all the futures finished meanwhile, until none is left to come."""
        while True:
            try:
                yield self.next_batch(block=True)
            except StopIteration:
                return

    # -- with_results -------------------------------------------------------------------------
    def _hand_out(self, batch: list[Future]) -> list:
        if not self.with_results or not batch:
            return batch
        values = _gather_finished(batch)
        out = []
        for i, f in enumerate(batch):
            if i in values:
                out.append((f, values[i]))
            elif f.status == "error" and self.raise_errors:
                self._put_back(batch[:i] + batch[i + 1:])
                raise f._failure()
            else:
                out.append((f, self._failed_result(f)))
        return out

    @staticmethod
    def _failed_result(f: Future):
        """What a failed future is paired with: (type, exception, traceback) for an error, as
        distributed's; the CancelledError for a cancelled one."""
        exc = f._failure()
        return (type(exc), exc, exc.__traceback__) if f.status == "error" else exc

    def _put_back(self, futures: list[Future]) -> None:
        """Futures of a batch not handed out (one of them raised): first out next time."""
        with self.lock:
            self.queue.extendleft(reversed(futures))

    # -- async for ------------------------------------------------------------------------------
    def __aiter__(self):
        return self

    async def __anext__(self):
        """`async for future in as_completed(futures)` (an asynchronous Client's): waits on the
        event loop, no thread."""
        loop = asyncio.get_running_loop()
        while True:
            with self.lock:
                if self.queue:
                    f = self.queue.popleft()
                    break
                if not self.futures:
                    raise StopAsyncIteration
                waker = self._waker = loop.create_future()
            left = self._left()
            try:
                if left is not None and left <= 0:
                    raise self._timed_out()
                await asyncio.wait_for(waker, left)
            except asyncio.TimeoutError:
                raise self._timed_out() from None
            finally:
                self._waker = None
        if not self.with_results:
            return f
        if f.status == "finished":
            return f, await f.client.gather_async(f)
        if f.status == "error" and self.raise_errors:
            raise f._failure()
        return f, self._failed_result(f)


def _gather_finished(batch: list[Future]) -> dict[int, object]:
    """The results of the finished futures of `batch`, by position: one gather per client."""
    by_client: dict[int, tuple] = {}
    for i, f in enumerate(batch):
        if f.status == "finished":
            by_client.setdefault(id(f.client), (f.client, {}))[1][i] = f
    values: dict[int, object] = {}
    for client, futures in by_client.values():
        values.update(client.gather(futures, errors="skip"))
    return values
