"""The worker: runs tasks in its task threads, holds results, serves them to peers.

It executes at most `nthreads` tasks at a time and tells the scheduler when each one
*starts*, so that a death is charged only to what was really running. Inputs held by
other workers are fetched directly from them; such borrowed copies are dropped once the
local tasks that needed them are done (the scheduler never counts them as replicas).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import os
import socket
import threading
import time
import traceback as tb_module
from typing import Sequence

from ..protocol import context, serialize
from ..protocol.comm import BatchedSend, Comm, CommClosedError, Listener, connect
from ..protocol.frames import Limits, Opaque, ProtocolError
from ..protocol.messages import Op
from ..protocol.pool import ConnectionPool
from ..protocol.versions import get_versions
from . import events
from .fetch import FetchMixin
from .inline import InlineMixin, inline_allowed
from .logs import LogBuffer
from .peer_port import serve_peer
from .plugins import WorkerPlugins
from .reattach import reattach
from .sizeof import sizeof
from .memory import MemoryManager
from .store import MONITOR_INTERVAL, MemoryFractions
from .threads import TaskThreads

logger = logging.getLogger("hpc_cluster.worker")

# Plain str copies of the ops read or sent per task: a literal's cost (an Enum attribute costs
# ~75 ns, and a member misses str's fast compare; protocol/messages.py).
COMPUTE, FREE_KEYS, TASK_STARTED, TASK_FINISHED, TASK_ERRED = (
    Op.COMPUTE.value, Op.FREE_KEYS.value, Op.TASK_STARTED.value, Op.TASK_FINISHED.value, Op.TASK_ERRED.value)

# Threads beyond nthreads for tasks that seceded (each waits on its own subtasks): a task
# that starts more nested levels than this waits for a thread, as in dask's own pools.
SECEDED_THREADS = 64

class _Task:
    __slots__ = ("key", "func", "args", "deps", "priority", "state", "missing", "sizes", "fetched")

    def __init__(self, key, func, args, deps, priority, sizes=None):
        self.key, self.func, self.args, self.deps, self.priority = key, func, args, deps, priority
        self.sizes: dict = sizes or {}           # bytes of the inputs held elsewhere, as the scheduler knows them
        self.fetched = 0                         # bytes asked for this task's inputs
        self.state = "waiting"                   # inputs elsewhere, not asked for yet (_fetch_more)
        self.missing: set[str] = set()


class Worker(FetchMixin, InlineMixin):
    def __init__(self, scheduler: str, secret: bytes, nthreads: int = 1, memory_limit: int = 0,
                 name: str | None = None, host: str = "127.0.0.1", port: int | Sequence[int] = 0,
                 resources: dict | None = None, heartbeat_interval: float = 0.5,
                 limits: Limits | None = None, nanny: bool = False, extra_info: dict | None = None,
                 memory_fractions: MemoryFractions | None = None, local_directory: str | None = None,
                 security=None, reconnect_window: float = 600.0, cluster_file: str | None = None,
                 running_slot=None):
        self.scheduler_address, self.secret = scheduler, secret
        # protocol/tls.py's Security: TLS to the scheduler and peers, and a tls:// listener.
        self.security = security
        self._tls = security.client_context() if security else None
        self.reconnect_window = reconnect_window     # how long a lost scheduler is waited for (reattach.py)
        self.cluster_file = cluster_file             # re-read then: a restarted scheduler's new address
        self.nthreads, self.memory_limit = max(1, int(nthreads)), int(memory_limit or 0)
        self.name = name
        self.host, self.port = host, port
        self.resources = resources or {}
        self.heartbeat_interval = heartbeat_interval
        self._beat_floor = 0.0                     # the scheduler's least interval for the cluster's size
        self.limits = limits or Limits()
        self.nanny = nanny
        self.extra_info = extra_info or {}
        # Results, ours and borrowed, in memory or spilled to disk (worker/store.py); the
        # memory manager also decides when to pause. `nbytes`: the results that are ours.
        self.memory = MemoryManager(self.memory_limit, memory_fractions, local_directory)
        self.data = self.memory.store
        self.plugins = WorkerPlugins(self, local_directory)   # client.run, plugins, get_worker() (plugins.py)
        self.nbytes: dict[str, int] = {}
        self.borrowed: collections.Counter = collections.Counter()
        self.tasks: dict[str, _Task] = {}
        self.ready: list = []
        self.waiting: list = []                  # heap of (priority, key): fetches not started yet
        self.executing: set[str] = set()
        # Computes the scheduler sent ahead (scheduler/state/ahead.py): held, by key, until the input
        # named by "after" finishes here; the keys held on each such input, in arrival order.
        self.held_ahead: dict[str, dict] = {}
        self.ahead_of: dict[str, list[str]] = {}
        self.seceded: set[str] = set()           # running, but gave up their slot (worker_client)
        self._rejoining: collections.deque = collections.deque()   # (key, event): waiting for a slot
        self.functions = serialize.FunctionCache()
        self._unpickle_lock = threading.Lock()
        # Concurrency is bounded by nthreads below (seceded tasks do not count), not by the
        # threads: a task waiting on its subtasks in worker_client keeps its thread. Long-lived
        # threads taking started tasks from a queue, not an executor's Future per task (threads.py).
        self.executor = TaskThreads(self._execute, self.nthreads + SECEDED_THREADS, name="hpc-task",
                                    done=self._executed)
        self._done: collections.deque = collections.deque()
        self._done_scheduled = False
        # Per function (its pickle): consecutive runs quick enough to run on the loop (inline.py).
        self._quick: dict[bytes, int] = {}
        self._inline_allowed = inline_allowed()
        # Where the task on the loop is named for its nanny (slot.py's RunningSlot, mapped once
        # per process: a worker made again after a failed start gets the same); None: no nanny
        # reads one, and each such task's start is sent before it runs.
        self._slot = running_slot
        self._more_scheduled = False             # a _run_ready is due: inline runs used their turn
        self._fetching: dict[str, asyncio.Future] = {}
        self._asking: dict[str, tuple] = {}      # holder -> (future, keys, sizes): this turn's request (fetch.py)
        self._unsendable: dict[str, str] = {}      # inputs their holder cannot send: why
        self.peers = ConnectionPool(secret, {"role": "worker", "versions": get_versions()}, self.limits,
                                    tls=self._tls)
        self.address: str | None = None
        self.scheduler: BatchedSend | None = None
        self.closed = asyncio.Event()
        self.exit_code = 0
        self.logs = LogBuffer.install()

    @property
    def info(self) -> dict:
        return {"role": "worker", "versions": get_versions()}

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.listener = Listener(self._serve_peer, self.secret, self.info, self.limits, name="worker",
                                 tls=self.security.server_context() if self.security else None)
        self.address = self._listen()
        self.name = self.name or self.address
        # Before registering: the registered plugins' setup runs in _register and may call get_worker().
        context.set_worker(context.WorkerContext(self.scheduler_address, self.secret, self.address,
                                                 self._secede, self._rejoin, self.security, self.plugins.view,
                                                 log_event=events.event_sender(self)))
        await self._register()
        # dask's rule: without a memory limit there is nothing to pause or spill for, and 10 looks a
        # second cost 1.3 ms of CPU a second per worker (1,000 light workers: over a core); the
        # heartbeat's report still samples the worker's memory.
        self._monitor = asyncio.create_task(self._watch_memory()) if self.memory_limit else None
        logger.info("worker %s connected to %s with %d threads", self.address, self.scheduler_address,
                    self.nthreads)

    async def _register(self, held: dict | None = None) -> None:
        """Connect to the scheduler and register (at the start, and again after losing it, with
        `held`: the results kept and the tasks running, worker/reattach.py)."""
        comm = await connect(self.scheduler_address, self.secret, self.info, self.limits, tls=self._tls)
        try:
            await comm.write({"op": Op.REGISTER_WORKER, "address": self.address, "nthreads": self.nthreads,
                              "memory_limit": self.memory_limit, "name": self.name, "resources": self.resources,
                              "pid": os.getpid(), "host": socket.gethostname(), "nanny": self.nanny,
                              "memory_fractions": self.memory.fractions.as_dict(),
                              "spill_directory": self.data.directory, **self.extra_info, **(held or {})})
            reply = (await comm.read())[0]
            if reply.get("op") != Op.REGISTERED:
                raise ConnectionError(f"the scheduler refused this worker: {reply.get('error') or reply}")
            self._beat_floor = _seconds(reply.get("heartbeat_interval"), self._beat_floor)
        except BaseException:
            comm.close()
            raise
        self.scheduler_comm = comm
        offline, self.scheduler = self.scheduler, BatchedSend(comm)
        self.scheduler.extend(getattr(offline, "buffer", None) or [])   # what happened after `held` was made
        self._beat = asyncio.create_task(self._heartbeat())
        await self.plugins.setup_registered(reply.get("plugins"))   # before the first task: what it may import
        self._reader = asyncio.create_task(self._read_scheduler())

    async def _reconnect(self) -> None:
        """The connection to the scheduler broke: keep our results and reattach, to it or to the
        one that replaced it, for the reconnect window (worker/reattach.py). After the window:
        EXIT_LOST_SCHEDULER, which the diagnosis calls 'scheduler-lost' (never a crash) and the
        nanny does not restart."""
        if not await reattach(self) and not self.closed.is_set():
            self.exit_code = EXIT_LOST_SCHEDULER
            await self.close("lost the scheduler", report=False)

    def _listen(self) -> str:
        """Listen on the first free port of ours (--worker-port: one, or a share of a range)."""
        ports = [self.port] if isinstance(self.port, int) else list(self.port)
        error: OSError = OSError("no port to try")
        for port in ports:
            try:
                return self.listener.start_listening(self.host, port)
            except OSError as exc:
                error = exc
        shown = ports[0] if len(ports) == 1 else f"{ports[0]}-{ports[-1]}"
        raise ListenError(f"cannot listen on {self.host} port {shown}: {error.strerror or error}; "
                          "give --host an address of this node, and --worker-port free ports (or leave "
                          "it out for any free port)")

    def _lifetime_ended(self, reason: str) -> bool:
        """Was this close the scheduler's drain before our lifetime's end (not before the job's
        walltime, nor a scale-down)? The scheduler retires a worker whose deadline comes with
        the intent 'walltime drain'; the deadline was the lifetime's if that ends first."""
        end = self.extra_info.get("lifetime_end")
        if end is None or reason not in DEADLINE_DRAINS:
            return False
        start, walltime = self.extra_info.get("job_start"), self.extra_info.get("job_walltime")
        return start is None or walltime is None or end <= start + walltime

    async def close(self, reason: str = "closing", report: bool = True) -> None:
        if self.closed.is_set():
            return
        if report and self.scheduler is not None and not self.scheduler_comm.closed:
            self.scheduler.send({"op": Op.GOODBYE, "reason": reason})
            await self.scheduler.drain()
        for t in (getattr(self, "_beat", None), getattr(self, "_reader", None), getattr(self, "_monitor", None)):
            if t is not None and t is not asyncio.current_task():
                t.cancel()
        await self.plugins.close()           # teardown(), as the worker closes
        self.listener.stop()
        self.peers.close()
        if self.scheduler is not None:
            self.scheduler_comm.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.memory.close()                  # spill files go with the worker
        self.closed.set()

    async def _heartbeat(self) -> None:
        while True:
            # Ours, or the scheduler's for a cluster this size (scheduler/server.py), the longer.
            await asyncio.sleep(max(self.heartbeat_interval, self._beat_floor))
            self.scheduler.send({"op": Op.HEARTBEAT, "memory": self.memory.report()})
            self.peers.tidy()           # connections a past burst of fetches opened (protocol/pool.py)

    # -- memory: spill, pause (worker/store.py has the policy) ------------------------------
    async def _watch_memory(self) -> None:
        """dask's memory monitor: pause over the pause fraction, spill over the spill fraction."""
        while True:
            await asyncio.sleep(MONITOR_INTERVAL)
            try:
                rss = self.memory.sample()
                self._maybe_pause(rss)        # first: no task starts while we spill
                if self.memory.spill_level(rss) is not None:
                    self._maybe_pause(await self.memory.spill_down(rss))
            except Exception:  # the monitor must outlive one bad look
                logger.exception("memory monitor failed")

    def _maybe_pause(self, rss: int) -> None:
        if not self.memory.pause_changed(rss):
            return
        paused = self.memory.paused
        logger.warning("worker at %s of memory: %s", self.memory.describe(rss),
                       "pausing: no new tasks start until it falls below the pause fraction "
                       f"({self.memory.fractions.pause:g})" if paused else "resuming")
        # The scheduler stops (or resumes) sending tasks at once, not at the next heartbeat.
        self.scheduler.send({"op": Op.HEARTBEAT, "memory": self.memory.report()})
        if paused:
            # Tasks waiting here for a thread go back to the scheduler, for a worker with room
            # (or for this one once it resumes): none is stranded on a worker that stays paused.
            self._hand_back([k for k, ts in self.tasks.items() if ts.state in ("waiting", "ready")], paused=True)
        else:
            self._run_ready()

    # -- scheduler stream ----------------------------------------------------------
    async def _read_scheduler(self) -> None:
        try:
            while True:
                for msg in await self.scheduler_comm.read():
                    op = msg["op"]
                    if op == COMPUTE:
                        self._add_task(msg)
                    elif op == FREE_KEYS:
                        self._free(msg["keys"])
                    elif op == Op.FETCH_REPLICA:
                        asyncio.create_task(self._fetch_replica(msg["key"], msg["holders"]))
                    elif op == Op.HAND_BACK:
                        self._hand_back(msg["keys"])
                    elif op == Op.FREE_ALL:
                        self._free(list(self.tasks) + list(self.data))
                        self.drop_held_ahead()
                    elif op == Op.CLOSE:
                        reason = msg.get("reason", "asked by the scheduler")
                        if self._lifetime_ended(reason):
                            # Under a nanny: it starts a fresh worker (--lifetime-restart) or
                            # exits 0. Alone, the job ends cleanly.
                            logger.info("worker %s: its lifetime is over; leaving", self.address)
                            self.exit_code = EXIT_LIFETIME if self.nanny else 0
                        await self.close(reason, report=False)
                        return
                    elif op == Op.HEARTBEAT_INTERVAL:
                        self._beat_floor = _seconds(msg.get("interval"), self._beat_floor)
                    elif op == Op.REGISTERED:
                        pass
                    elif op == Op.FORWARD_LOGGING:          # client.forward_logging (worker/events.py)
                        events.forward_loggers(self, msg.get("loggers") or [])
                    else:
                        logger.warning("unknown op %r from scheduler", op)
                self._run_ready()
        except (CommClosedError, ProtocolError) as exc:
            if not self.closed.is_set():
                logger.warning("lost the scheduler connection: %s; keeping %d results and reattaching for up to "
                               "%.0f s", exc, len(self.nbytes), self.reconnect_window)
                await self._reconnect()

    def _add_task(self, msg: dict) -> None:
        key = msg["key"]
        known = self.tasks.get(key)
        if known is not None:
            if known.state == "cancelled":
                # Given up on while its thread ran, now wanted again: let that thread's
                # result count instead of running it twice. It is executing: say so.
                known.state = "executing"
                self.scheduler.send({"op": TASK_STARTED, "key": key})
                self.scheduler.flush()
            return
        if key in self.nbytes:                   # we already hold it: say so again
            self.scheduler.send({"op": TASK_FINISHED, "key": key, "nbytes": self.nbytes[key]})
            return
        after = msg.get("after")
        if after is not None and after not in self.nbytes:
            # Held until `after` finishes here; only the scheduler's free-keys drops it: it
            # counts on this worker starting it then (scheduler/state/ahead.py).
            if key not in self.held_ahead:
                self.ahead_of.setdefault(after, []).append(key)
            self.held_ahead[key] = msg
            return
        ts = _Task(key, bytes(msg["func"].data), msg["args"].data, msg.get("deps") or {}, tuple(msg.get("priority") or ()),
                   msg.get("sizes"))
        self.tasks[key] = ts
        for dep in ts.deps:
            self.borrowed[dep] += 1
            if dep not in self.data:
                ts.missing.add(dep)
        if ts.missing:
            heapq.heappush(self.waiting, (ts.priority, key))   # _run_ready, after the batch, fetches
        else:
            self._make_ready(ts)

    def _make_ready(self, ts: _Task) -> None:
        ts.state = "ready"
        if self.memory.paused:
            self._hand_back([ts.key], paused=True)
            return
        heapq.heappush(self.ready, (ts.priority, ts.key))

    def drop_held_ahead(self) -> None:
        """Forget every task held ahead (the scheduler freed all, or may no longer know them)."""
        self.held_ahead.clear()
        self.ahead_of.clear()

    def _free(self, keys) -> None:
        for key in keys:
            if self.held_ahead.pop(key, None) is not None:
                continue
            held = self.ahead_of.get(key)
            if held is not None and not any(k in self.held_ahead for k in held):
                del self.ahead_of[key]           # an input given up on, with nothing held for it
            ts = self.tasks.get(key)
            if ts is not None and ts.state != "executing":
                self._forget_task(ts)
            elif ts is not None:
                ts.state = "cancelled"           # drop the result when the thread returns
            self.nbytes.pop(key, None)           # no longer ours; a local task may still borrow it
            if key not in self.borrowed:
                self.data.pop(key, None)

    def _hand_back(self, keys, paused: bool = False) -> None:
        """Draining (or paused): give back the tasks not started yet; started ones finish here."""
        given = []
        for key in keys:
            ts = self.tasks.get(key)
            if ts is not None and ts.state in ("waiting", "fetching", "ready"):
                self._forget_task(ts)
                given.append(key)
        if given or not paused:
            self.scheduler.send({"op": Op.HANDED_BACK, "keys": given})

    def _forget_task(self, ts: _Task) -> None:
        self.tasks.pop(ts.key, None)
        for dep in ts.deps:
            self.borrowed[dep] -= 1
            if self.borrowed[dep] <= 0:
                del self.borrowed[dep]
                if dep not in self.nbytes:       # a borrowed copy, not ours to keep
                    self.data.pop(dep, None)

    # -- fetching inputs from peers -------------------------------------------------
    def _input_erred(self, ts: _Task, exc: Exception) -> None:
        self.scheduler.send({"op": TASK_ERRED, "key": ts.key, "exception": Opaque(_pickle_exception(exc)),
                             "traceback": Opaque(serialize.dumps("")), "text": str(exc)[:2000]})

    # -- execution -------------------------------------------------------------------
    def _busy(self) -> int:
        return len(self.executing) - len(self.seceded)

    def _run_ready(self) -> None:
        while self._rejoining and self._busy() < self.nthreads:
            key, event = self._rejoining.popleft()        # a seceded task first: it holds memory
            self._take_slot_again(key)
            event.set()
        self._fetch_more()                # a thread may have freed: tasks made ready here start below
        starting = []
        budget = None
        while self.ready and self._busy() < self.nthreads and not self.memory.paused and not self.memory.behind():
            _, key = heapq.heappop(self.ready)
            ts = self.tasks.get(key)
            if ts is None or ts.state != "ready":
                continue
            if not starting and self._runs_inline(ts):
                # Only with no task started for a thread and not handed to it yet (inline.py).
                budget = budget or self._inline_budget()
                if time.perf_counter() > budget:
                    heapq.heappush(self.ready, (ts.priority, key))
                    if not self._more_scheduled:   # the loop reads its messages, then more
                        self._more_scheduled = True
                        self.loop.call_soon(self._run_ready_again)
                    break
                self._run_inline(ts)
                continue
            ts.state = "executing"
            self.executing.add(key)
            if self.plugins.watching:
                self.plugins.transition(key, "ready", "executing")
            if not starting:
                start = self.memory.at_task_start()
            self.scheduler.send({"op": TASK_STARTED, "key": key, "memory": start})
            starting.append(ts)
        self._fetch_more()                # and again, with the tasks just started running
        if starting:
            # Put "started" on the wire before the task can crash this process: the
            # scheduler charges a death only to tasks it knows were executing.
            self.scheduler.flush()
            for ts in starting:
                self.executor.submit(ts)
        if budget is not None:            # results were stored here: as _drain_done does after them
            self.scheduler.flush()
            self.memory.spill_soon(then=self._run_ready)

    def _run_ready_again(self) -> None:
        self._more_scheduled = False
        self._run_ready()

    # -- secede / rejoin (worker_client) -----------------------------------------------
    def _secede(self, key: str) -> None:
        """From the task's thread: its slot is free for other tasks while it waits."""
        self.loop.call_soon_threadsafe(self._give_up_slot, key)

    def _give_up_slot(self, key: str) -> None:
        if key in self.executing and key not in self.seceded:
            self.seceded.add(key)
            self.scheduler.send({"op": Op.TASK_SECEDED, "key": key})
            self._run_ready()

    def _rejoin(self, key: str) -> None:
        """From the task's thread: block until a slot is free, then hold it again."""
        event = threading.Event()
        self.loop.call_soon_threadsafe(self._ask_to_rejoin, key, event)
        event.wait()

    def _ask_to_rejoin(self, key: str, event: threading.Event) -> None:
        if key not in self.seceded:
            event.set()
        elif self._busy() < self.nthreads:
            self._take_slot_again(key)
            event.set()
        else:
            self._rejoining.append((key, event))

    def _take_slot_again(self, key: str) -> None:
        if key in self.seceded:
            self.seceded.discard(key)
            self.scheduler.send({"op": Op.TASK_REJOINED, "key": key})

    def _execute(self, ts: _Task) -> tuple:
        """Runs in a task thread (threads.py): the outcome and how long it took."""
        start = time.time()
        context.set_task(ts.key)              # for get_client()/secede() inside the task
        try:
            # Inputs first (a spilled one is read from disk), outside the lock.
            inputs = {dep: self.data[dep] for dep in ts.deps}
            # Unpickling imports modules: two threads importing one package at once can get
            # it half initialized (dask.array without its numpy backend: "No dispatch for
            # ndarray" in 3 of 8 first computes on a 4-thread worker), so one thread at a time.
            with self._unpickle_lock:
                func = self.functions.get(ts.func)
                args, kwargs = serialize.loads_args(ts.args, inputs.__getitem__)
            result = func(*args, **kwargs)
            outcome = ("ok", result, sizeof(result))       # measured here, off the event loop
        except BaseException as exc:  # the user's exception, whatever it is, goes to the client
            outcome = ("error", exc, tb_module.format_exc())
            # The text is taken: free what the task's frames held (a MemoryError's task holds the
            # memory that ran out until its traceback goes, and the worker could not even pack a
            # heartbeat meanwhile: an h_vmem job's worker was ended as silent).
            tb_module.clear_frames(exc.__traceback__)
        finally:
            context.set_task(None)
        return outcome, time.time() - start

    def _executed(self, ts: _Task, result: tuple) -> None:
        """In the task thread, after _execute: hand the outcome back to the event loop."""
        self._done.append((ts, *result))
        if not self._done_scheduled:
            self._done_scheduled = True
            self.loop.call_soon_threadsafe(self._drain_done)

    def _drain_done(self) -> None:
        self._done_scheduled = False
        while self._done:
            ts, outcome, duration = self._done.popleft()
            self._note_run(ts.func, duration)
            self._report(ts, outcome, duration)
        self._run_ready()
        # Spilling writes files: only now, with the results reported and the next tasks
        # started, and in the spill thread, so neither the scheduler nor this worker's
        # threads wait for the disk.
        self.scheduler.flush()
        self.memory.spill_soon(then=self._run_ready)

    def _report(self, ts: _Task, outcome: tuple, duration: float) -> None:
        """A task ended (on a thread or on the loop): keep its result, tell the scheduler."""
        self.executing.discard(ts.key)
        self.seceded.discard(ts.key)
        cancelled = ts.state == "cancelled" or self.tasks.get(ts.key) is not ts
        self._forget_task(ts)
        if self.plugins.watching:
            self.plugins.transition(ts.key, "executing", "released" if cancelled else
                                    "memory" if outcome[0] == "ok" else "error")
        if cancelled:
            # The scheduler gave up on it but still counts this thread as busy.
            self.scheduler.send({"op": Op.ABANDONED_DONE, "key": ts.key})
            return
        if outcome[0] == "ok":
            self.nbytes[ts.key] = self.data.put(ts.key, outcome[1], outcome[2], spill=False)
            self.scheduler.send({"op": TASK_FINISHED, "key": ts.key, "nbytes": outcome[2],
                                 "duration": duration})
            for key in self.ahead_of.pop(ts.key, ()):
                held = self.held_ahead.pop(key, None)
                if held is not None:
                    self._add_task(held)     # as if it arrived now: started below, no round trip
        else:
            exc, text = outcome[1], outcome[2]
            self.scheduler.send({"op": TASK_ERRED, "key": ts.key, "duration": duration,
                                 "exception": Opaque(_pickle_exception(exc)),
                                 "traceback": Opaque(serialize.dumps(text)),
                                 "text": f"{type(exc).__name__}: {exc}"[:2000]})

    # -- peers and clients -------------------------------------------------------------
    async def request(self, address: str, msg: dict) -> dict:
        """One request/response with a peer worker over a pooled connection."""
        return await self.peers.request(address, msg)

    async def _serve_peer(self, comm: Comm) -> None:
        await serve_peer(self, comm)

    def _payloads(self, keys: list) -> tuple[dict, list, dict]:
        """Results for a peer or a client, as they travel (see MemoryManager.payloads)."""
        return self.memory.payloads(keys)


EXIT_LOST_SCHEDULER = 4        # no scheduler for the reconnect window (death_timeout): 0, 3 and 4 end the nanny
EXIT_LIFETIME = 5              # retired at the end of its --lifetime: restart (--lifetime-restart) or end
EXIT_CANNOT_LISTEN = 1         # its --host/--worker-port cannot be had: a startup failure

# The scheduler's intents when it retires a worker whose deadline came ('walltime drain';
# 'lifetime' if it names lifetime drains apart).
DEADLINE_DRAINS = frozenset({"walltime drain", "lifetime"})


class ListenError(Exception):
    """The worker cannot listen where it was told to (not an OSError: retrying won't help)."""


def _seconds(value, default: float) -> float:
    """A positive interval from the scheduler, capped at a minute; `default` if it is none."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return min(float(value), 60.0)
    return default


def _pickle_exception(exc: BaseException) -> bytes:
    try:
        return serialize.dumps(exc)
    except Exception:
        # Some exceptions hold unpicklable state; the client still gets type, text and traceback.
        return serialize.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
