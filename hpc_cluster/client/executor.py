"""`client.get_executor()`: a `concurrent.futures.Executor` whose submit and map run on the
cluster, as distributed's ClientExecutor (code written for executors, or handed one, runs
on the cluster unchanged).

Each submit gives a `concurrent.futures.Future` tied to one of our Futures. When ours is done
its outcome is handed over by a delivery thread of the executor's own, which fetches the
results of all the futures done meanwhile in one gather: neither the client's loop nor its
callback thread waits for a fetch, and a burst of results costs one round trip, not one each.
The thread ends when nothing is left to deliver and starts again with the next result.
"""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import threading
import time
import weakref

from .exceptions import TimeoutError
from .futures import Future
from .timeouts import parse_timeout

# submit()'s own parameters that are not task keywords.
_NOT_KEYWORDS = frozenset({"self", "func", "args", "kwargs", "key"})


def task_keywords(client) -> list[str]:
    """The keywords the client's submit() takes for a task (pure, retries, resources, ...)."""
    params = inspect.signature(client.submit).parameters.values()
    return sorted(p.name for p in params if p.name not in _NOT_KEYWORDS
                  and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


class ClientExecutor(cf.Executor):
    """An Executor on a Client; `kwargs` (submit's task keywords) go with every task."""

    def __init__(self, client, **kwargs):
        known = task_keywords(client)
        unknown = sorted(set(kwargs) - set(known))
        if unknown:                       # distributed's words first: code may look for them
            raise TypeError(f"unsupported arguments to ClientExecutor: {unknown}; it takes submit's keywords: "
                            f"{', '.join(known)}")
        self._client, self._kwargs = client, kwargs
        self._pending: "weakref.WeakSet[cf.Future]" = weakref.WeakSet()   # not delivered yet
        self._shutdown = False
        self._lock = threading.Lock()
        self._done: list[tuple[Future, cf.Future]] = []                   # ours done, theirs to set
        self._delivering = False

    # -- submitting ----------------------------------------------------------------------------
    def submit(self, fn, /, *args, **kwargs) -> cf.Future:
        """Run `fn(*args, **kwargs)` on the cluster."""
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        return self._wrap(self._client.submit(fn, *args, **{**self._kwargs, **kwargs}))   # the call's keywords win

    def map(self, fn, *iterables, timeout: float | None = None, chunksize: int = 1):
        """Like builtins.map(fn, *iterables), run on the cluster: the tasks are submitted at
        once; the results come in order. `timeout` counts from this call (TimeoutError, a
        concurrent.futures.TimeoutError, past it); `chunksize` is accepted and ignored, as
        distributed's. Tasks whose result was not taken when the iterator is dropped or raises
        are cancelled."""
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        timeout = parse_timeout(timeout, "ClientExecutor.map")
        end = None if timeout is None else time.monotonic() + timeout
        futures = iter(self._client.map(fn, *iterables, **self._kwargs))

        def results():
            try:
                for f in futures:
                    left = None if end is None else max(0.0, end - time.monotonic())
                    try:
                        yield f.result(left)
                    except TimeoutError as exc:       # the type executors' callers catch
                        raise cf.TimeoutError(str(exc)) from exc
            finally:
                self._client.cancel(list(futures))   # what is left: none of it will be read
        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new tasks. `wait`: return once every task submitted here has ended and its
        future was set; `wait=False` (or `cancel_futures=True`) cancels those not done."""
        self._shutdown = True
        pending = list(self._pending)
        if not wait or cancel_futures:
            for f in pending:
                f.cancel()
        if wait:
            cf.wait(pending)

    # -- delivering -------------------------------------------------------------------------------
    def _wrap(self, future: Future) -> cf.Future:
        theirs = cf.Future()
        self._pending.add(theirs)

        def cancel_ours(done: cf.Future) -> None:
            if done.cancelled() and future.status != "cancelled":
                future.cancel()
        theirs.add_done_callback(cancel_ours)
        future.add_done_callback(lambda f: self._arrived(f, theirs))
        return theirs

    def _arrived(self, future: Future, theirs: cf.Future) -> None:
        """On the client's callback thread: queue it for the delivery thread."""
        with self._lock:
            self._done.append((future, theirs))
            if self._delivering:
                return
            self._delivering = True
        threading.Thread(target=self._deliver, name="hpc-executor", daemon=True).start()

    def _deliver(self) -> None:
        while True:
            with self._lock:
                batch, self._done = self._done, []
                if not batch:
                    self._delivering = False
                    return
            try:
                self._settle(batch)
            except BaseException as exc:      # the client closed under us: nobody waits for ever
                for _, theirs in batch:
                    _set(theirs, exception=exc)

    def _settle(self, batch: list[tuple[Future, cf.Future]]) -> None:
        finished = {i: f for i, (f, _) in enumerate(batch) if f.status == "finished"}
        values = self._client.gather(finished, errors="skip") if finished else {}
        for i, (future, theirs) in enumerate(batch):
            if i in values:
                _set(theirs, result=values[i])
            elif future.status == "cancelled":
                if theirs.cancel():               # still pending: waiters see it cancelled
                    theirs.set_running_or_notify_cancel()
            else:
                _set(theirs, exception=future._failure())


def _set(theirs: cf.Future, result=None, exception: BaseException | None = None) -> None:
    """Set a concurrent future's outcome unless the user cancelled it (or it was set) meanwhile."""
    try:
        if not theirs.set_running_or_notify_cancel():
            return
    except RuntimeError:                          # set already (a delivery that failed half way)
        return
    if exception is not None:
        theirs.set_exception(exception)
    else:
        theirs.set_result(result)

