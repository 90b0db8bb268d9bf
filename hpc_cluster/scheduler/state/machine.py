"""The scheduler's state machine. Pure: events in, messages out.

No sockets, no clocks (time arrives with each event), no pickles (payloads are `Opaque`
and are only passed along). `server.py` turns wire messages into calls here and sends
what accumulates in `outbox`.

Task states
    waiting     needed, some inputs are not in memory yet
    queued      ready; waits *here* until a worker has a free slot
    processing  sent to a worker (which may be running it, or holding it as prefetch)
    memory      a result exists on one or more workers
    erred       failed; the error is kept for every future and dependent
    released    not needed now; kept (with its run_spec) while dependents may need
                it to be recomputed from lineage
    held        rebuilt from the journal: its result was on workers (by name) that have not
                come back yet (recovery.py)

A task leaves the graph (forgotten) once nobody wants it and no dependent remains.
Workers get `nthreads + prefetch` tasks, and more only of tasks known to be short, within a
few ms of queued work per thread (prefetch.py): a worker's death touches little beyond what it
was really running, and only tasks it reported as *executing* are charged for it.
"""

from __future__ import annotations

import heapq
import itertools

from ...protocol.messages import Cause, ErrorKind, Op
from .ahead import AheadMixin
from .blame import BlameMixin
from .clients import ClientsMixin
from .drain import DrainMixin
from .free import FreeWorkers
from .placing import PlacingMixin
from .pools import ESCALATE, PoolsMixin
from .reattach import ReattachMixin
from .rebalance import RebalanceMixin
from .recovery import RecoveryMixin, rebuild_into
from .replicas import ReplicaMixin
from .retrying import RetryMixin
from .restrictions import RestrictionsMixin
from .timeline import TimelineMixin
from .transitions import TransitionsMixin
from .validate import ValidateMixin
from .prefetch import PREFETCH_SECONDS, DeepWorkers, not_queued
from .placement import TaskDurations, worker_pool
from .records import EMPTY, TaskState, WorkerState, add_edge, dependency_error, drop_edge, own  # noqa: F401  (re-exported: tests and mixins use them from here)

# Plain str copies of the ops sent per task: a literal's cost, not an Enum lookup's (protocol/messages.py).
FREE_KEYS, KEY_IN_MEMORY, TASK_ERRED = Op.FREE_KEYS.value, Op.KEY_IN_MEMORY.value, Op.TASK_ERRED.value

ACTIVE = ("waiting", "queued", "processing")


class SchedulerState(ClientsMixin, RetryMixin, BlameMixin, DrainMixin, ReplicaMixin, RebalanceMixin, PoolsMixin, ReattachMixin,
                     RecoveryMixin, TimelineMixin, AheadMixin, PlacingMixin, TransitionsMixin, ValidateMixin,
                     RestrictionsMixin):
    def __init__(self, allowed_failures: int = 3, prefetch: int = 2, walltime_failures: int = 3,
                 queue_roots: bool = True, prefetch_seconds: float = PREFETCH_SECONDS, debug: bool = False):
        """`debug`: check every state change against transitions.ALLOWED and keep each task's
        story (transitions.py); the server also runs validate() after each batch then."""
        self.tasks: dict[str, TaskState] = {}
        self.workers: dict[str, WorkerState] = {}
        self.clients: set[str] = set()
        self.allowed_failures = allowed_failures
        self.walltime_failures = walltime_failures       # innocent, but never going to fit
        self.prefetch = prefetch                     # slots beyond the threads, for any task
        self.prefetch_seconds = prefetch_seconds     # and short tasks' queued work per thread (0: none)
        self.queue_roots = queue_roots               # root tasks wait for a thread (placement.SHORT_ROOT)
        self.outbox: dict[str, list[dict]] = {}
        self.deaths: list[dict] = []
        self.replicated: set[str] = set()            # keys client.replicate() asked copies of
        self.copying: set[TaskState] = set()         # tasks with a copy being fetched (may hold a few done)
        self._ready: list = []                       # heap of (priority, key): tasks with inputs
        self._roots: list = []                       # the same for tasks without (they may wait for a thread)
        self._seq = itertools.count()
        # Workers with a free slot, kept in placement's order so that placing a task does not
        # score every worker (free.py; issue 19: 500 workers)
        self._free = FreeWorkers()
        self._deep = DeepWorkers(self.prefetch_seconds)   # those of them with room only for short tasks (prefetch.py)
        # Tasks placement may still place in this turn of the server's loop, over all its passes
        # (None: no bound). The server refills it each turn (placing.py, server.PLACE_PER_TURN).
        self.place_limit: int | None = None
        self.more_to_place = False
        self.durations = TaskDurations()
        self.now = 0.0                               # the latest time an event brought
        self.pools: dict[str, dict] = {}             # set_pools (pools.py); none: placement as before pools
        self.escalate = dict(ESCALATE)
        self._unchecked: list = []                   # queued since placeability was last checked (pools)
        self._init_reattach()                        # results of reattached workers (reattach.py)
        self._init_restrictions()                    # tasks' workers= (restrictions.py)
        # What changed that a journal must record (journal.py's Recorder sets these to sets and
        # reads them at each flush); None: no journal, nothing noted.
        self.touched: set | None = None
        self.touched_deaths: set | None = None
        self.debug = debug
        self._stories: dict = {}                     # key -> its latest changes, in debug mode (transitions.py)

    @classmethod
    def rebuild(cls, recovered, now: float, **kwargs) -> "SchedulerState":
        """A state rebuilt from a journal (journal.load()): recovery.py says what it holds."""
        return rebuild_into(cls(**kwargs), recovered, now)

    def _touch(self, ts: TaskState) -> None:
        if self.touched is not None:
            self.touched.add(ts.key)

    # -- helpers ---------------------------------------------------------------
    def _send(self, to: str, msg: dict) -> None:
        box = self.outbox.get(to)
        if box is None:
            self.outbox[to] = [msg]
        else:
            box.append(msg)

    def take_outbox(self) -> dict[str, list[dict]]:
        out, self.outbox = self.outbox, {}
        return out

    def _tell_clients(self, ts: TaskState, msg: dict) -> None:
        for cid in ts.who_wants:
            self._send(cid, msg)

    # -- workers ---------------------------------------------------------------
    def add_worker(self, address: str, nthreads: int, now: float, memory_limit: int = 0,
                   name: str = "", resources: dict | None = None, info: dict | None = None,
                   deadline: float | None = None) -> None:
        if address in self.workers:
            self.remove_worker(address, now, {"cause": Cause.CONNECTION_LOST, "blame": False,
                                              "text": "the worker registered again"})
        ws = WorkerState(address, max(1, int(nthreads)), int(memory_limit or 0), name or address,
                         dict(resources or {}), dict(info or {}), joined=now, last_seen=now, deadline=deadline)
        self.set_time(now)
        self.workers[address] = ws
        self._where_joined(ws)
        self._update_free(ws)
        self._restore_replicas()
        self._schedule()

    def heartbeat(self, address: str, now: float) -> None:
        ws = self.workers.get(address)
        if ws is not None:
            ws.last_seen = now

    def worker_memory(self, address: str, memory: dict, now: float | None = None) -> None:
        """A worker's memory report. A paused worker (over its pause fraction) gets no new
        tasks until it says it resumed, as in dask; it handed back those it had not started."""
        ws = self.workers.get(address)
        if ws is None:
            return
        ws.memory, ws.memory_at = memory, now
        self._note_memory(ws, memory, now)
        paused = bool(memory.get("paused"))
        changed, ws.paused = paused != ws.paused, paused
        self._update_free(ws)            # its memory is part of its place among the free (free.py)
        if changed:
            self._schedule()

    def silent_workers(self, now: float, ttl: float) -> list[str]:
        return [a for a, ws in self.workers.items() if now - ws.last_seen > ttl]

    def remove_worker(self, address: str, now: float, death: dict) -> dict | None:
        """A worker is gone. `death` has 'cause', 'blame' (charge executing tasks) and 'text'."""
        ws = self.workers.pop(address, None)
        if ws is None:
            return None
        self.set_time(now)
        self._free.discard(ws)
        self._deep.discard(ws)
        self._where_left(ws)
        self.outbox.pop(address, None)
        record = {"id": len(self.deaths), "worker": address, "name": ws.name, "time": now,
                  "cause": death.get("cause", Cause.UNKNOWN),
                  "blame": bool(death.get("blame")), "text": death.get("text", ""),
                  "executing": sorted(ts.key for ts in ws.executing),
                  "processing": sorted(ts.key for ts in ws.processing),
                  "job_id": ws.info.get("job_id"), "walltime": ws.info.get("job_walltime"),
                  # The node it ran on, as it said when it registered: known even when the
                  # batch system's accounting is not (a nanny's verdict, a site without sacct).
                  "host": ws.info.get("host"),
                  # Where it died and how big it was: a memory verdict moves the task by these (pools.py).
                  "pool": worker_pool(ws), "memory_limit": ws.memory_limit or None,
                  "peak_memory": death.get("peak_memory"),
                  "evidence": death.get("evidence") or [], "advice": death.get("advice", ""),
                  # None while more evidence may change the verdict; only final verdicts end tasks.
                  "final_at": death.get("final_at", now),
                  "memory": self._memory_record(ws, now)}       # its whole life's memory (timeline.py)
        self.deaths.append(record)
        self._summarise_old_deaths()
        # Its tasks leave it first (charged if they were executing), so that what follows
        # sends nothing to the dead worker.
        running = sorted(ws.processing, key=lambda t: t.priority)
        for ts in running:
            if ts.executing:
                # The record is shared: a later verdict updates it in place.
                ran = now - ts.started_at if ts.started_at is not None else None
                ts.attempts = [*ts.attempts, {"death": record, "ran_for": ran, "pool": record["pool"]}]
                self._touch(ts)
            ts.processing_on, ts.queued_us = None, 0
        self._forget_holds(ws, running)          # what it held ahead (ahead.py): nothing to tell it now
        executing = set(ws.executing)
        ws.processing.clear()
        ws.executing.clear()
        lost = []
        for ts in ws.has_what:
            ts.who_has.discard(ws)
            self._touch(ts)
            if not ts.who_has and ts.state == "memory":
                lost.append(ts)
        short = [ts for ts in ws.has_what if ts.replicas > 1 and ts.who_has]
        ws.has_what.clear()
        for ts in lost:
            self._data_lost(ts)
        # Copies it was fetching will never arrive. Only the tasks being copied are looked at
        # (replicas.py's copying set), not every task: retiring 500 workers of a cluster holding
        # a million tasks scanned all of them 500 times (issue 19).
        for ts in list(self.copying):
            ts.copying.discard(address)
            if not ts.copying or self.tasks.get(ts.key) is not ts:
                self.copying.discard(ts)
        for ts in short:
            self._ensure_replicas(ts)
        for ts in running:
            ts.executing = False
            if ts.state != "processing":
                # Failed or released meanwhile by the cascade of an earlier one's failure (found
                # by tests/unit/scheduler/test_state_fuzz.py: it was started again, for nobody).
                continue
            if not (ts in executing and self._over_limits(ts)):
                self._transition(ts, "released", "worker-lost")
                self._activate(ts)
        self._schedule()
        return record

    def add_death(self, record: dict) -> dict:
        """A death with no worker behind it (a job that never started its worker)."""
        record = dict(record, id=len(self.deaths))
        record.setdefault("executing", [])
        record.setdefault("processing", [])
        self.deaths.append(record)
        self._summarise_old_deaths()
        return record

    def _data_lost(self, ts: TaskState) -> None:
        """The last copy of a result is gone: recompute it if anyone needs it."""
        self._transition(ts, "released", "data-lost")
        self._touch(ts)
        for dep in ts.dependents:
            if dep.state == "processing" and not dep.executing:
                # Its worker would ask the dead holder in vain (a missing-data round trip): it
                # waits here for the recomputed input instead (found by tests/unit/scheduler/test_state_fuzz.py).
                # A running one has its inputs.
                self._abandon(dep)
                self._transition(dep, "waiting", "input-lost")
            elif dep.state == "queued":
                self._transition(dep, "waiting", "input-lost")
            elif dep.state != "waiting":
                continue
            own(dep, "waiting_on").add(ts)
        if ts.who_wants or ts.waiters:
            self._tell_clients(ts, {"op": Op.KEY_RECOMPUTING, "key": ts.key})
            if ts.func is None:
                self._err(ts, {"kind": ErrorKind.LOST_DATA, "text": f"the only worker holding scattered data "
                               f"{ts.key!r} died; use client.replicate() to keep copies"})
            else:
                self._activate(ts)

    # -- worker reports ----------------------------------------------------------
    def task_started(self, address: str, key: str, now: float | None = None, memory: dict | None = None) -> None:
        ts = self.tasks.get(key)
        ws = self.workers.get(address)
        if ts is not None and ws is not None and ts.processing_on is ws:
            not_queued(ts)
            ts.executing = True
            ts.started_at, ts.start_memory = now, memory
            ws.executing.add(ts)
            self._note_start(ws, key, now, memory)
            # Room for more short tasks, used at the next event (its task-finished follows soon).
            self._update_free(ws)
        elif ws is not None and key not in ws.abandoned:
            # Given up on (cancelled, released) while this start was on its way: a thread runs
            # it all the same, as for an abandoned task, until the worker says it ended (its
            # task-finished, task-erred or abandoned-done). Freeing the slot at once sent a
            # 1-thread-left worker more tasks than it had threads (tests/integration/test_client.py
            # waited 30 s behind two cancelled slow_inc(1, 30) on one worker).
            ws.abandoned.add(key)
            self._update_free(ws)

    def task_seceded(self, address: str, key: str, seceded: bool = True) -> None:
        """A running task gave up its thread slot (secede), or took one again (rejoin)."""
        ws, ts = self.workers.get(address), self.tasks.get(key)
        if ws is None or ts is None or ts.processing_on is not ws:
            return
        (ws.seceded.add if seceded else ws.seceded.discard)(ts)
        self._update_free(ws)
        self._schedule()

    def set_time(self, now: float) -> None:
        """Time comes in with events; placement uses the latest."""
        self.now = max(self.now, now)

    def task_finished(self, address: str, key: str, nbytes: int, duration: float | None = None) -> None:
        ws = self.workers.get(address)
        ts = self.tasks.get(key)
        if ws is None:
            return
        if duration is not None:
            self.durations.learn(key, float(duration))
        freed = self._thread_done(ws, key)
        if ts is None and self._finished_unclaimed(address, key, nbytes):
            return
        if ts is None or ts.state in ("released", "erred") and ts.processing_on is not ws:
            self._send(address, {"op": FREE_KEYS, "keys": [key]})
            if freed:
                self._schedule()
            return
        if ts.processing_on is ws:
            self._unassign(ts)
        elif ts.processing_on is not None:
            # Another worker's thread finished it first (one that ran it before it was given up
            # on and sent elsewhere): the copy now sent to this other worker is not needed.
            self._abandon(ts)
        own(ts, "who_has").add(ws)
        ws.has_what.add(ts)
        self._touch(ts)
        if ts.state == "memory":                     # a duplicate result: one more copy
            if freed:
                self._schedule()
            return
        if ts.ahead_on is ws:
            ts.ahead_on = None           # held there ahead and run there (ahead.py): not to be freed
        self._clear_ahead(ts)
        ts.nbytes, ts.error = int(nbytes), None
        self._transition(ts, "memory", "task-finished")
        ts.waiting_on = EMPTY        # a waiting task done after all (a reattached worker's thread, reattach.py)
        for dep in ts.dependencies:
            drop_edge(dep, "waiters", ts)
        for dts in ts.dependents:
            if dts.state == "waiting" and ts in dts.waiting_on:
                dts.waiting_on.discard(ts)
                if not dts.waiting_on and not (dts.ahead_on is not None and self._promote(dts, ws)):
                    self._queue(dts)
                elif dts.waiting_on and dts.ahead_on is ws:
                    self._clear_ahead(dts)   # the worker starts it now, but another input is missing (ahead.py)
        self._tell_clients(ts, {"op": KEY_IN_MEMORY, "key": key, "nbytes": ts.nbytes})
        for dep in list(ts.dependencies):
            self._maybe_release(dep)
        self._maybe_release(ts)
        self._schedule()

    def task_erred(self, address: str, key: str, error: dict) -> None:
        ws = self.workers.get(address)
        ts = self.tasks.get(key)
        if ws is None or ts is None or ts.processing_on is not ws:
            if ts is None:
                self.unclaimed_running.pop(key, None)
            if ws is not None and self._thread_done(ws, key):
                self._schedule()
            return
        self._thread_done(ws, key)
        self._unassign(ts)
        if ts.retries > 0:
            ts.retries -= 1
            self._touch(ts)
            self._transition(ts, "released", "task-erred-retry")
            self._activate(ts)
        else:
            self._err(ts, dict(error, kind=ErrorKind.EXCEPTION, worker=address))
        self._schedule()

    def missing_data(self, address: str, key: str, dep: str, holders: list[str]) -> None:
        """A worker could not fetch input `dep` from `holders`: believe it and retry."""
        dts = self.tasks.get(dep)
        if dts is not None:
            for h in holders:
                hws = self.workers.get(h)
                if hws is not None and hws in dts.who_has:
                    dts.who_has.discard(hws)
                    self._touch(dts)
                    hws.has_what.discard(dts)
            if not dts.who_has and dts.state == "memory":
                self._data_lost(dts)
        ts = self.tasks.get(key)
        ws = self.workers.get(address)
        if ts is not None and ws is not None and ts.processing_on is ws:
            self._unassign(ts)
            self._transition(ts, "released", "missing-data")
            self._activate(ts)
        self._schedule()

    # -- transitions -------------------------------------------------------------
    def _activate(self, root: TaskState) -> None:
        """Make `root` (and, from lineage, any released inputs) compute again."""
        stack = [root]
        while stack:
            ts = stack.pop()
            if ts.state != "released" or not (ts.who_wants or ts.waiters):
                # (an input pushed for a dependent that an earlier one's failure has failed since:
                # found by tests/unit/scheduler/test_state_fuzz.py, it was computed for nobody)
                continue
            if ts.func is None:
                self._err(ts, {"kind": ErrorKind.LOST_DATA, "text": f"data {ts.key!r} is lost and has no lineage"})
                continue
            self._transition(ts, "waiting", "needed")
            ts.waiting_on = EMPTY
            # A failed input fails it before any released input is computed again for it
            # (found by tests/unit/scheduler/test_state_fuzz.py: they were, for nobody). The first by key,
            # so the error names the same input every time.
            failed = min((d for d in ts.dependencies if d.state == "erred"), key=lambda d: d.key, default=None)
            if failed is not None:
                self._err(ts, dependency_error(failed))
                continue
            for dep in ts.dependencies:
                add_edge(dep, "waiters", ts)
                if dep.state == "memory":
                    continue
                own(ts, "waiting_on").add(dep)
                if dep.state == "released":
                    stack.append(dep)
            if not ts.waiting_on:
                self._queue(ts)
            elif len(ts.waiting_on) == 1:
                dep = next(iter(ts.waiting_on))
                if dep.state == "processing" or dep.ahead_on is not None:
                    self._send_ahead(ts, dep)        # a chain's next link (ahead.py)

    def _queue(self, ts: TaskState) -> None:
        self._clear_ahead(ts)
        self._transition(ts, "queued", "inputs-ready")
        if self.pools:
            self._unchecked.append(ts)               # one no pool can hold fails at once (_schedule)
        heapq.heappush(self._roots if not ts.dependencies else self._ready, (ts.priority, ts.key))

    def _unassign(self, ts: TaskState) -> None:
        ws = ts.processing_on
        not_queued(ts)
        ts.processing_on, ts.executing = None, False
        if ws is not None:
            ws.processing.discard(ts)
            ws.executing.discard(ts)
            ws.seceded.discard(ts)
            for r, n in (ts.resources or {}).items():
                ws.used_resources[r] = ws.used_resources.get(r, 0) - n
            ws.used_memory -= ts.memory
            self._update_free(ws)

    def _abandon(self, ts: TaskState) -> None:
        """Stop wanting a processing task. A thread already running it cannot be stopped, so
        its slot stays taken until the worker says the thread is free (abandoned_done)."""
        ws, was_executing = ts.processing_on, ts.executing
        self._unassign(ts)
        if ws is not None:
            if was_executing:
                ws.abandoned.add(ts.key)
                self._update_free(ws)
            self._send(ws.address, {"op": FREE_KEYS, "keys": [ts.key]})

    def abandoned_done(self, address: str, key: str) -> None:
        ws = self.workers.get(address)
        if ws is not None and self._thread_done(ws, key):
            self._schedule()

    def _thread_done(self, ws: WorkerState, key: str) -> bool:
        """The thread running `key` on `ws` is free. A key given up on and then submitted
        again may be taken over by the thread still running it: its result ends it then."""
        if key not in ws.abandoned:
            return False
        ws.abandoned.discard(key)
        self._update_free(ws)
        return True

    def _err(self, root: TaskState, error: dict) -> None:
        """Fail `root` and every active task that depends on it."""
        stack = [(root, error)]
        while stack:
            ts, err = stack.pop()
            if ts.state == "erred":
                continue
            if ts.state == "processing":
                self._abandon(ts)
            self._clear_ahead(ts)
            self._transition(ts, "erred", err.get("kind") or "error")
            ts.error = err
            self._touch(ts)
            ts.waiting_on = EMPTY
            for dep in ts.dependencies:
                drop_edge(dep, "waiters", ts)
            self._tell_clients(ts, {"op": TASK_ERRED, "key": ts.key, "error": err})
            child_err = dependency_error(ts)
            for dts in ts.dependents:
                if dts.state in ACTIVE:
                    stack.append((dts, child_err))
            for dep in list(ts.dependencies):
                self._maybe_release(dep)

    def _maybe_release(self, root: TaskState) -> None:
        """Drop what nobody needs: free its data, stop computing it, forget it if we can."""
        self._drop([("release", root)])

    def _maybe_forget(self, root: TaskState) -> None:
        self._drop([("forget", root)])

    def _drop(self, stack: list) -> None:
        """Release and forget along the graph with a stack of our own, not by recursion:
        releasing a 3,000-task waiting chain recursed per level and raised RecursionError
        half way, leaving every record behind (issue 14, point 3)."""
        while stack:
            step, ts = stack.pop()
            if step == "forget":
                if (ts.who_wants or ts.dependents or ts.state not in ("released", "erred")
                        or self.tasks.get(ts.key) is not ts):
                    continue
                del self.tasks[ts.key]
                self._touch(ts)
                if self.debug:
                    self._tell_story(ts.key, ts.state, "forgotten", "unneeded")
                for dep in ts.dependencies:
                    drop_edge(dep, "dependents", ts)
                    drop_edge(dep, "waiters", ts)
                    stack.append(("release" if not dep.who_wants and not dep.waiters and dep.state == "memory"
                                  and not dep.dependents else "forget", dep))
                ts.dependencies = EMPTY
                continue
            if ts.who_wants or ts.waiters:
                continue
            stack.append(("forget", ts))             # after its inputs (a stack: pushed first, runs last)
            if ts.state == "memory":
                for ws in ts.who_has:
                    ws.has_what.discard(ts)
                    self._send(ws.address, {"op": FREE_KEYS, "keys": [ts.key]})
                ts.who_has.clear()
                self._transition(ts, "released", "unneeded")
                self._touch(ts)
            elif ts.state == "held":                 # wanted by nobody now: its holders free it if they come back
                ts.held_by.clear()
                self._transition(ts, "released", "unneeded")
                self._touch(ts)
            elif ts.state in ACTIVE:
                if ts.state == "processing":
                    self._abandon(ts)
                self._clear_ahead(ts)
                self._transition(ts, "released", "unneeded")
                ts.waiting_on = EMPTY
                for dep in ts.dependencies:
                    drop_edge(dep, "waiters", ts)
                    stack.append(("release", dep))

    # -- inspection --------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ts in self.tasks.values():
            out[ts.state] = out.get(ts.state, 0) + 1
        return out
