"""The Client, shaped like dask.distributed's: its connection to the scheduler, the queue of
what it sends, submit/map, gather, cancel, and the states of its futures.

The client runs its connections on one background event-loop thread per process (loop.py);
the user's thread blocks until that thread settles the futures' states (futures.FutureStates).
Futures are reference counted: when the last Future for a key is garbage collected, the
scheduler is told to release it. Its other methods are mixed in from data.py (results to and
from workers), tools.py (looking after the cluster) and dask_collections.py (dask's
scheduler); futures.py knows it through `FutureOwner`, reattach.py through `Reattachable`.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import itertools
import logging
import threading
import time
import uuid
from typing import Any

from .exceptions import TimeoutError, error_from_record, is_cancellation
from .loop import LoopThread
from .asynchronous import AsyncClientMixin
from .starting import StartingMixin, check_asynchronous, check_start_arguments, parse_timeout
from .timeouts import parse_timeout as parse_wait
from .tracebacks import shorten
from .identity import IdentityMixin
from .seceding import seceded_while_waiting
from .reattach import DEFAULT_RECONNECT, SpecKeeper, reattach_or_give_up
from .data import WorkerDataMixin
from .datasets import DatasetsMixin
from .looking import LookingMixin
from .tools import ClusterToolsMixin
from .workers import WorkersMixin
from .dask_collections import CollectionsMixin
from .future_ops import FutureOpsMixin
from .html import ClientHTMLMixin
from .futures import FAILED, Future, FutureState, FutureStates, flatten_futures, replace_futures
from .graph import placement_keywords, task_needs, task_where
from ..protocol import context, serialize
from ..protocol.comm import BatchedSend, CommClosedError, HandshakeClosed, connect
from ..protocol.frames import Limits, Opaque
from ..protocol.messages import ErrorKind, Op
from ..protocol.pool import ConnectionPool
from ..protocol.versions import get_versions
from ..retry import Backoff
from .submission import CHUNK_TASKS, check_fits, gc_paused, release_messages, split_submission

logger = logging.getLogger("hpc_cluster.client")

# Plain str copies of the ops read per task: a literal's cost (an Enum attribute costs ~75 ns;
# protocol/messages.py).
KEY_IN_MEMORY, TASK_ERRED = Op.KEY_IN_MEMORY.value, Op.TASK_ERRED.value


def _funcname(func) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    return "lambda" if name == "<lambda>" else name


# AsyncClientMixin first: its `asynchronous` is the one dask reads (client/asynchronous.py).
class Client(AsyncClientMixin, StartingMixin, CollectionsMixin, LookingMixin, ClusterToolsMixin, WorkerDataMixin, WorkersMixin,
             DatasetsMixin, FutureOpsMixin, ClientHTMLMixin, IdentityMixin):
    """Connect to a cluster and run work on it.

    `Client()` or `Client(n_workers=2, processes=False, ...)` (a LocalCluster of its own, closed
    with it; the keywords are LocalCluster's), `Client(cluster)`, `Client("tcp://host:port")`
    (secret from $HPC_CLUSTER_SECRET or `secret=`), `Client(scheduler_file=path)`,
    `Client(cluster_file=path)`, or `Client("name")` for a cluster started with
    `hpc-cluster up --name name`. With `asynchronous=True`, `await Client(...)` in async code
    and await its methods and futures (client/asynchronous.py). A tls:// cluster needs its certificates: the cluster
    and its cluster file carry them, else pass `security=` (a Security, or dask's, with the
    cluster's CA, a certificate and its key). It becomes dask's default scheduler (so
    `x.compute()` runs on the cluster) unless `set_as_default=False`.

    A client that loses its scheduler reconnects in the background for `reconnect` seconds
    (default 10 minutes; 0: cancel its futures at once, as before), to the same address or to
    the one its cluster file names then, and its futures resume (client/reattach.py).
    """

    def __init__(self, address=None, loop=None, timeout=30.0, set_as_default: bool = True, scheduler_file=None,
                 security=None, asynchronous: bool = False, name: str | None = None, heartbeat_interval=None,
                 serializers=None, deserializers=None, extensions=None, direct_to_workers=None,
                 connection_limit: int = 512, *, cluster_file: str | None = None, secret: bytes | str | None = None,
                 reconnect: float = DEFAULT_RECONNECT, **kwargs):
        # distributed's signature. loop, heartbeat_interval, serializers, deserializers, extensions,
        # direct_to_workers and connection_limit tune parts ours does not have: taken, unused
        # (docs/migrating-from-distributed.md). Without an address, cluster, scheduler_file or
        # cluster_file it starts a LocalCluster of its own with **kwargs (client/starting.py).
        context.refuse_on_loop("Client()")               # worker/inline.py
        self._asynchronous = bool(asynchronous)           # read first: the awaitable methods look at it
        check_asynchronous(asynchronous, loop)
        check_start_arguments(address, scheduler_file, cluster_file, kwargs)
        self.direct_to_workers = direct_to_workers        # distributed's attribute; ours always go direct
        self.timeout = parse_timeout(timeout)
        self.name = name
        self.cluster = None
        self.scheduler_file = scheduler_file
        self.scheduler_address = None                     # found by _begin (client/starting.py)
        self._cluster_file = None                         # re-read when reconnecting: a new address
        self.reconnect = float(reconnect)
        self._closed_by_scheduler: str | None = None      # why, if it shut down (no reattach then)
        self._specs = SpecKeeper()                        # unfinished work, for a scheduler that lost it
        self.security, self._tls = None, None
        self._lt = LoopThread.get()
        self._loop = self._lt.loop
        self._lock = threading.RLock()
        self._states = FutureStates(self._lock)
        self._refs: collections.Counter = collections.Counter()
        self._outq: list = []
        self._flush_scheduled = False
        self._rids = itertools.count()
        self._replies: dict[int, asyncio.Future] = {}
        self._pool: ConnectionPool | None = None          # to workers, made on the loop
        self._funcs: collections.OrderedDict = collections.OrderedDict()
        self._versions_seen: set[str] = set()             # workers whose versions were checked
        self.halted: str | None = None                    # the cluster stopped starting workers: why
        self.status = "newly-created"
        where = {"address": address, "scheduler_file": scheduler_file, "cluster_file": cluster_file,
                 "secret": secret, "security": security, "keywords": kwargs}
        if asynchronous:
            self._start_in_background(self._begin, where, set_as_default)   # `await client` waits for it
        else:
            self._begin(where, set_as_default)

    # -- connection --------------------------------------------------------------
    @property
    def _info(self) -> dict:
        return {"role": "client", "versions": get_versions()}

    async def _start(self, timeout: float | None = None) -> None:
        backoff, deadline = Backoff(0.1, 2.0, jitter=0.5), time.monotonic() + (timeout or 30) * 0.8
        while True:
            try:
                self._comm = await connect(self.scheduler_address, self._secret, self._info, tls=self._tls)
                break
            except (HandshakeClosed, builtins.TimeoutError) as exc:
                # A scheduler that is there but cannot finish our handshake now (hundreds of
                # workers registering at once, protocol/admission.py): again, as dask's client
                # retries its connect, within most of Client(timeout=), so that the last
                # error's advice is what the user reads. A refused connection or proof is final.
                if time.monotonic() + backoff.peek() > deadline:
                    raise
                logger.info("the scheduler at %s did not finish the handshake (%s); trying again",
                            self.scheduler_address, exc or type(exc).__name__)
                await asyncio.sleep(backoff.next())
        self._pool = ConnectionPool(self._secret, self._info, tls=self._tls)
        first = (await self._comm.read())[0]
        self.scheduler_versions = first.get("versions") or self._comm.peer_info.get("versions")
        self.adopt_connection(self.scheduler_address, self._comm, first)     # as a reattach does
        self._connected = asyncio.Event()
        self._connected.set()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                for msg in await self._comm.read():
                    self._handle(msg)
        except (CommClosedError, ConnectionError) as exc:
            if self.status != "closing":
                busy = self._replies or any(st.status == "pending" for st in self._states.values())
                (logger.warning if busy else logger.info)("lost the connection to the scheduler: %s", exc)
        finally:
            for fut in self._replies.values():          # their answers will not come
                if not fut.done():
                    fut.set_exception(ConnectionError("the connection to the scheduler was lost"))
            if self.status == "running" and self.reconnect > 0 and not self._closed_by_scheduler:
                self.status = "reconnecting"             # futures stay pending (client/reattach.py)
                self._connected.clear()
                asyncio.ensure_future(reattach_or_give_up(self))
            else:
                self._lost(self._closed_by_scheduler or "the connection to the scheduler was lost")

    def _lost(self, text: str) -> None:
        self.status = "closed" if self.status == "closing" else "disconnected"
        self._connected.set()                             # requests waiting for it fail now
        for key, st in list(self._states.items()):
            if st.status == "pending":
                self._set(key, st, "cancelled", {"kind": ErrorKind.CANCELLED, "text": text})

    # -- the seam client/reattach.py works through (reattach.Reattachable): these, and the
    # public status, reconnect, cluster and scheduler_address; nothing private of the Client --
    @property
    def cluster_file(self) -> str | None:
        """The cluster file this client was made from, if any: it names a restarted scheduler's address."""
        return self._cluster_file

    async def open_connection(self, address: str):
        """A new connection to the scheduler at `address`, with this client's secret, identity and TLS."""
        return await connect(address, self._secret, self._info, tls=self._tls)

    def adopt_connection(self, address: str, comm, welcome: dict) -> None:
        """Talk through `comm` (whose first message was `welcome`) from now on; nothing queued goes
        before run_again()."""
        self.scheduler_address, self._comm, self.id = address, comm, welcome.get("client")
        self.halted = welcome.get("halted")
        self.services = welcome.get("services") or {}     # the dashboard's URL (tools.dashboard_link)
        self._stream = BatchedSend(comm)

    def holdings(self) -> tuple[dict[str, int], set[str], list[dict], list]:
        """At once: the keys held (-> their references), those whose future failed or was
        cancelled, the kept specs of unfinished work, and the queue, taken out (see requeue)."""
        with self._lock:
            failed = {k for k in self._refs
                      if getattr(self._states.get(k), "status", None) in ("error", "cancelled")}
            queued, self._outq = self._outq, []
            return dict(self._refs), failed, self._specs.pending(), queued

    def requeue(self, items: list) -> None:
        """Put `items` back at the head of the queue, before anything queued since holdings()."""
        with self._lock:
            self._outq[:0] = items

    def send_now(self, msgs: list[dict]) -> None:
        """Send each message at once as a wire message of its own, ahead of the queue."""
        for msg in msgs:
            self._stream.send(msg)
            self._stream.flush()

    def run_again(self) -> None:
        """Back to running on the adopted connection: requests waiting for it go, then the queue."""
        self.status = "running"
        self._connected.set()
        self._reader = asyncio.create_task(self._read())
        self._flush_out()

    def give_up(self, text: str) -> None:
        """The scheduler did not come back: the futures still pending are cancelled, saying `text`."""
        self._lost(text)

    def _handle(self, msg: dict) -> None:
        op = msg["op"]
        if op == KEY_IN_MEMORY:
            st = self._states.get(msg["key"])
            if st is not None:
                self._set(msg["key"], st, "finished", None)
        elif op == TASK_ERRED:
            st = self._states.get(msg["key"])
            if st is not None:
                err = msg["error"]
                self._set(msg["key"], st, "cancelled" if is_cancellation(err) else "error", err)
        elif op == Op.KEY_RECOMPUTING:
            st = self._states.get(msg["key"])
            if st is not None and st.status == "finished":
                st.status = "pending"
        elif op == Op.TASK_RETRIED:                         # client.retry (future_ops.py)
            self._states.retried(msg["key"])
        elif op == Op.SCHEDULER_CLOSED:                     # shut down, not crashed: nothing to reattach to
            self._closed_by_scheduler = msg.get("reason") or "the scheduler was shut down"
        elif op == Op.CLUSTER_HALTED:                       # reason None: it starts them again
            self.halted = msg.get("reason")
            if self.halted:
                logger.error("the cluster stopped starting workers: %s", self.halted)
        elif op == Op.EVENT:                                # a topic it hears (looking.py)
            self._on_event(msg)
        elif op == Op.REPLY:
            fut = self._replies.pop(msg.get("rid"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg.get("result"))

    def _set(self, key: str, st: FutureState, status: str, error) -> None:
        with self._lock:
            self._specs.done(key)                         # its spec goes with the result
            st.settle(status, error)
        if st.callbacks:
            self._states.run_callbacks(st)

    async def _request(self, msg: dict, timeout: float | None = None):
        async def ask():
            if self.status == "reconnecting":
                await self._connected.wait()         # asked during an outage: after the reattach
            if self.status not in ("running", "connecting"):
                raise ConnectionError(f"the client is {self.status}")
            rid = next(self._rids)
            fut = self._loop.create_future()
            self._replies[rid] = fut
            self._flush_out()                    # anything the user queued goes first
            self._stream.send(dict(msg, rid=rid))
            return await fut
        return await asyncio.wait_for(ask(), timeout or self.timeout)

    def _submit(self, specs: list[dict], wanted: list[str]) -> None:
        """Send a submission in messages the scheduler accepts (see client/submission.py)."""
        limits = self.limits
        for spec in specs:
            check_fits(spec, limits)
        msgs, carried = split_submission(specs, wanted, limits)
        with self._lock:
            self._specs.add(specs, wanted)
            self._outq.extend(msgs)       # at once: no other thread's message between the parts
            self._outq.extend(carried)    # released after the last part (unless a future holds one)
            if self._flush_scheduled or self.status not in ("running", "connecting"):
                return
            self._flush_scheduled = True
        self._loop.call_soon_threadsafe(self._flush_out)

    @property
    def limits(self) -> Limits:
        """What the scheduler reads with, as it announced in the handshake."""
        return getattr(getattr(self, "_comm", None), "peer_limits", None) or Limits()

    def _send(self, msg: dict | None, release: str | None = None) -> None:
        """Queue a message (or a key to release) from any thread, keeping their order.

        Releases and submissions share one queue so a release can never overtake the
        submission of a task that depends on the released key.
        """
        with self._lock:
            self._outq.append(msg if msg is not None else release)
            if self._flush_scheduled or self.status not in ("running", "connecting"):
                return
            self._flush_scheduled = True
        self._loop.call_soon_threadsafe(self._flush_out)

    def _flush_out(self) -> None:
        with self._lock:
            self._flush_scheduled = False
            if self.status == "reconnecting":
                return                       # kept for the scheduler that comes back (client/reattach.py)
            items, self._outq = self._outq, []
            msgs, release = [], []
            for item in items:
                if isinstance(item, str):
                    if self._refs.get(item, 0) <= 0:
                        release.append(item)
                        self._states.pop(item, None)
                    continue
                if release:
                    msgs.extend(release_messages(release))
                    release = []
                msgs.append(item)
            if release:
                msgs.extend(release_messages(release))
        if self.status == "running" or self.status == "connecting":
            # Many submissions queued at once (a large map's parts, or thousands of submit()
            # calls in one loop turn) go as several wire messages, each within the limits.
            group, tasks = [], 0
            for msg in msgs:
                n = len(msg.get("tasks") or msg.get("keys") or ())
                if group and tasks + n > CHUNK_TASKS:
                    self._stream.extend(group)
                    self._stream.flush()
                    group, tasks = [], 0
                group.append(msg)
                tasks += n
            self._stream.extend(group)

    # -- references ------------------------------------------------------------------
    def future_state(self, key: str) -> FutureState:
        return self._states.state(key)

    def wait_keys(self, keys: list[str], timeout: float | None, first: bool = False,
                  until_error: bool = False) -> bool:
        return self._states.wait(keys, timeout, first, until_error)

    def hold_key(self, key: str) -> None:
        with self._lock:
            self._refs[key] += 1
        self.future_state(key)

    def release_key(self, key: str) -> None:
        with self._lock:
            self._refs[key] -= 1
            if self._refs[key] > 0:
                return
            del self._refs[key]
            self._specs.done(key)
        self._send(None, release=key)

    # -- submitting --------------------------------------------------------------------
    def _func_blob(self, func) -> bytes:
        entry = self._funcs.get(id(func))
        if entry is None or entry[0] is not func:
            entry = (func, serialize.dumps_function(func))
            self._funcs[id(func)] = entry
            if len(self._funcs) > 64:
                self._funcs.popitem(last=False)
        return entry[1]

    def _task_maker(self, func, kwargs, pure, retries, priority, resources, needs: dict, many: bool = False):
        """make(args, key) -> a task's spec. What the tasks of one call share is made once: the
        function's payload and the hash of it, the common fields; for a map (`many`), one
        ArgsPickler, used inside local_modules_by_value() (a 1,000,000-task map took 23 s to
        submit, dask's 13)."""
        if not callable(func):
            raise TypeError(f"{'map' if many else 'submit'}() needs a callable first, got {type(func).__name__}")
        fblob = self._func_blob(func)
        payload, name, start = Opaque(fblob), _funcname(func), serialize.token_start(fblob)
        common = {"priority": int(priority), "retries": int(retries), "resources": resources or {}, **needs}
        dumps = serialize.ArgsPickler().dumps if many else serialize.dumps_args
        states = self._states

        def make(args: tuple, key: str | None) -> dict:
            ablob, deps = dumps(args, kwargs)
            if key is None:
                key = f"{name}-{serialize.tokenize(fblob, ablob, start) if pure else uuid.uuid4().hex}"
            for d in deps:
                if d not in states:
                    raise ValueError(f"argument refers to future {d!r} that this client does not hold")
            return {"key": key, "func": payload, "args": Opaque(ablob), "deps": sorted(deps) if deps else [],
                    **common}
        return make

    def submit(self, func, *args, key: str | None = None, workers=None, resources: dict | None = None,
               retries: int | None = None, priority: int = 0, fifo_timeout="100 ms", allow_other_workers: bool = False,
               actor: bool = False, actors: bool = False, pure: bool = True, duration: str | float | None = None,
               memory: str | int | None = None, pool: str | None = None, batch_size: int | None = None,
               **kwargs) -> Future:
        """Run `func(*args, **kwargs)` on the cluster; returns a Future. The keywords named here,
        distributed's and ours, are never passed to `func` (docs/migrating-from-distributed.md).

        `workers` (addresses, names or hosts) runs it only there, or, with
        `allow_other_workers=True`, there by preference; it waits while none of them is alive.
        `duration` ("5m", "90s", 300) says how long the task will run, so it is never
        started on a worker whose job would hit its walltime first. `memory` ("20GB") is
        reserved for it on a worker whose memory_limit holds it; `pool` ("bigmem") runs it
        only on that pool's workers. A task no pool can hold fails at once, saying which.
        """
        if allow_other_workers and workers is None:
            raise ValueError("allow_other_workers=True goes with workers=: it lets the task leave those workers")
        placement_keywords(fifo_timeout, batch_size, actor, actors)
        needs = {**task_needs(duration, memory, pool), **task_where(workers, allow_other_workers)}
        spec = self._task_maker(func, kwargs, pure, retries or 0, priority, resources, needs)(args, key)
        check_fits(spec, self.limits)
        fut = Future(spec["key"], self)
        with self._lock:
            self._specs.add([spec], [spec["key"]])
        self._send({"op": Op.UPDATE_GRAPH, "tasks": [spec], "keys": [spec["key"]]})
        return fut

    def map(self, func, *iterables, key: str | list | None = None, workers=None, retries: int | None = None,
            resources: dict | None = None, priority: int = 0, allow_other_workers: bool = False,
            fifo_timeout="100 ms", actor: bool = False, actors: bool = False, pure: bool = True,
            batch_size: int | None = None, duration: str | float | None = None, memory: str | int | None = None,
            pool: str | None = None, **kwargs) -> list[Future]:
        """`submit` for each element (zip of several iterables); one message for all tasks, or
        several of bounded size for a long map (at most `batch_size` tasks each, if given)."""
        if allow_other_workers and workers is None:
            raise ValueError("allow_other_workers=True goes with workers=: it lets the tasks leave those workers")
        batch = placement_keywords(fifo_timeout, batch_size, actor, actors)
        argsets = list(zip(*iterables))
        if isinstance(key, (list, tuple)):
            if len(key) != len(argsets):
                raise ValueError(f"map() got {len(key)} keys for {len(argsets)} tasks")
            keys = list(key)
        else:
            keys = [None] * len(argsets)
        specs = []
        needs = {**task_needs(duration, memory, pool), **task_where(workers, allow_other_workers)}
        make = self._task_maker(func, kwargs, pure, retries or 0, priority, resources, needs, many=True)
        with gc_paused():
            with serialize.local_modules_by_value():
                for args, k in zip(argsets, keys):
                    spec = make(args, k)
                    if isinstance(key, str):
                        spec["key"] = f"{key}-{spec['key'].rsplit('-', 1)[-1]}"
                    specs.append(spec)
            futures = [Future(s["key"], self) for s in specs]
            for part in (specs[i:i + batch] for i in range(0, len(specs), batch)) if batch else [specs]:
                self._submit(part, [s["key"] for s in part])      # batch_size: a submission per batch
        return futures

    # -- results -------------------------------------------------------------------------
    def future_error(self, key: str) -> BaseException:
        st = self._states.get(key)
        err = st.error if st is not None else None
        return error_from_record(key, err or {"kind": ErrorKind.CANCELLED, "text": "released"},
                                 lambda o: serialize.loads(o.data if isinstance(o, Opaque) else o))

    def gather(self, futures, errors: str = "raise", direct=None, asynchronous=None, timeout=None):
        """Results of a Future or of a (nested) list/tuple/set/dict of them, in the same shape.

        errors="skip" leaves failed (or cancelled) futures out: from lists, tuples and sets
        at any depth, and their entries from dicts; a lone failed Future gives None. A task's
        exception is raised with the task's frames as its traceback. Inside a task, waiting for
        its own cluster gives up the task's thread slot meanwhile. `timeout` (ours): seconds or
        a string ("10s"). `direct` and `asynchronous` are distributed's: results always come
        straight from the workers here, and an asynchronous client's gather is awaitable in
        async code whatever `asynchronous` says (client/asynchronous.py).
        """
        timeout = parse_wait(timeout, "gather")
        try:
            with seceded_while_waiting(self.scheduler_address):
                return self._gather(futures, errors, timeout)
        except Exception as exc:
            if not shorten(exc):
                raise
            raise exc                     # from here, with the task's frames (tracebacks.shorten)

    def _gather(self, futures, errors: str, timeout: float | None):
        if errors not in ("raise", "skip"):
            raise ValueError("errors must be 'raise' or 'skip'")
        flat: list[Future] = []
        flatten_futures(futures, flat)
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        values: dict[str, Any] = {}
        skipped: set[str] = set()
        pending = list(dict.fromkeys(f.key for f in flat))
        backoff = Backoff(0.01, 0.5)
        while pending:
            # One wait for all the keys, ended by the first failure when that is raised (as
            # distributed's gather does), not by the keys before it in the list.
            if not self.wait_keys(pending, left(), until_error=errors == "raise"):
                key = next((k for k in pending if self.future_state(k).status == "pending"), pending[0])
                raise TimeoutError(f"{key!r} not done within {timeout} s")
            failed = [k for k in pending if self.future_state(k).status in FAILED]
            if failed and errors == "raise":
                raise self.future_error(failed[0])
            skipped.update(failed)
            fetch = [k for k in pending if k not in failed]
            # The timeout holds while fetching and refetching too, not only while waiting.
            try:
                got, missing = self._lt.run(self._fetch(fetch), left()) if fetch else ({}, [])
            except TimeoutError:
                raise TimeoutError(f"{len(fetch)} results not fetched within {timeout} s (first: "
                                   f"{fetch[0]!r})") from None
            except (ConnectionError, builtins.TimeoutError):
                if self.status not in ("reconnecting", "running"):
                    raise
                got, missing = {}, fetch     # the scheduler went away meanwhile: ask again after the reattach
            values.update(got)
            pending = missing
            if any(self.future_state(k).status == "error" for k in missing):
                continue                 # a result that cannot travel: its error, at once
            if missing:                  # lost in flight: the scheduler recomputes and tells us
                if deadline is not None and time.monotonic() + backoff.peek() >= deadline:
                    raise TimeoutError(f"{len(missing)} results not fetched within {timeout} s (first: "
                                       f"{missing[0]!r}: lost in flight, being recomputed)")
                time.sleep(backoff.next())
        if isinstance(futures, Future) and futures.key in skipped:
            return None
        return replace_futures(futures, values, skipped)

    def cancel(self, futures, reason: str = "cancelled by the user") -> None:
        flat: list[Future] = []
        flatten_futures(futures, flat)
        self._send({"op": Op.CANCEL, "keys": [f.key for f in flat], "reason": reason})
        self._states.cancel_now([f.key for f in flat], reason, self._loop.call_soon_threadsafe)   # at once, as distributed's

    def on_future_done(self, fut: Future, fn) -> None:
        self._loop.call_soon_threadsafe(self._states.add_callback, fut.key, lambda: fn(fut))

    def close(self, timeout=None) -> None:
        """Close this client, and the cluster it started (Client() without an address)."""
        if self.status in ("closed", "closing"):
            return
        self.status = "closing"
        self._stop_being_default()

        async def _close():
            await self._stream.drain()
            self._comm.close()
            if self._pool is not None:
                self._pool.close()
        try:
            self._lt.run(_close(), 10 if timeout is None else parse_timeout(timeout))
        except Exception:
            pass                                          # never connected, or the connection is gone
        self._states.close()
        self.status = "closed"
        self._close_own_cluster()
