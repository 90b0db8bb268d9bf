"""Workers and clients that come back to a restarted scheduler (issue 16, points 3-4).
Mixed into SchedulerState (state.py); pure like it: time comes in with the events.

A worker that lost its scheduler keeps its results and registers again saying what it holds
(key -> nbytes) and what its threads still run (`worker_reattached`). A held result of a task
the scheduler knows is taken as if it had just finished there. One of a task it does not know
(yet: a scheduler restarted without a journal learns its tasks again from the clients that
reattach) is kept *unclaimed* for `claim_window` seconds on that worker, so that a client
resubmitting the task, or wanting the key again (`client_wants`), finds it done instead of
computing it again; after the window the worker is told to drop it. A key a reattached client
wants that neither the scheduler nor any worker knows is *awaited* as long, for a worker that
has not come back yet, and then failed as lost data.

`hold_placement(until)` keeps every task where it is (no placement) until then, or until
`release_placement()`: a restarted scheduler gives its workers that long to report what they
hold before anything is computed again.
"""

from __future__ import annotations

from ...protocol.messages import ErrorKind, Op
from .records import add_edge, own, shared, TaskState

# Plain str copies of the ops sent per key: a literal's cost, not an Enum lookup's (protocol/messages.py).
FREE_KEYS, KEY_IN_MEMORY, TASK_ERRED = Op.FREE_KEYS.value, Op.KEY_IN_MEMORY.value, Op.TASK_ERRED.value


class ReattachMixin:
    claim_window: float = 120.0

    def _init_reattach(self) -> None:
        self.unclaimed: dict[str, dict[str, tuple[int, float]]] = {}    # key -> {worker: (nbytes, until)}
        self.unclaimed_running: dict[str, str] = {}                     # key -> worker whose thread runs it
        self.awaited: dict[str, tuple[set, float]] = {}                 # key -> (client ids, until)
        self.placement_held_until: float | None = None

    # -- events ------------------------------------------------------------------
    def add_reattached_worker(self, address: str, nthreads: int, now: float, held: dict[str, int],
                              running: list[str], **kwargs) -> None:
        """add_worker and worker_reattached as one event (what the server calls for a worker that
        registers with results): nothing is placed in between, so a task whose result the worker
        brings is not sent to it, or to another, to be computed again."""
        hold, self.placement_held_until = self.placement_held_until, float("inf")
        try:
            self.add_worker(address, nthreads, now, **kwargs)
        finally:
            self.placement_held_until = hold
        self.worker_reattached(address, held, running, now)

    def worker_reattached(self, address: str, held: dict[str, int], running: list[str], now: float) -> None:
        """A worker registered again (after add_worker) with the results it kept and the tasks its
        threads still run. Held results of known tasks are in memory there, as if just finished;
        of failed tasks, dropped; of unknown ones, unclaimed for `claim_window`. A running thread
        keeps its slot; a queued task it runs is adopted (processing and executing there)."""
        ws = self.workers.get(address)
        if ws is None:
            return
        self.set_time(now)
        until = now + self.claim_window
        drop, confirmed = [], []
        for key, nbytes in held.items():
            ts = self.tasks.get(key)
            if ts is None:
                self.unclaimed.setdefault(key, {})[address] = (int(nbytes), until)
                if key in self.awaited:
                    self._adopt_held(key, self.awaited.pop(key)[0])
            elif ts.state == "erred":
                drop.append(key)
            elif ts.state == "held":
                confirmed.append(key)                # a journal's rebuilt state waited for it (recovery.py)
            else:
                self.task_finished(address, key, int(nbytes))     # as if it had just finished there
        if confirmed:
            self.confirm_held(address, confirmed)
        if ws.name in self.awaited_workers:
            self.holders_missing([ws.name])          # what it was said to hold and no longer does
        for key in running:
            ts = self.tasks.get(key)
            if ts is not None and ts.state == "queued" and ts.processing_on is None:
                self._adopt_running(ts, ws, now)
                continue
            if ts is None:
                self.unclaimed_running[key] = address
            # The thread is busy until the worker reports it done (task_finished or abandoned-done
            # free the slot): otherwise the worker would get more tasks than threads.
            ws.abandoned.add(key)
        if drop:
            self._send(address, {"op": FREE_KEYS, "keys": drop})
        self._update_free(ws)
        self._schedule()

    def client_wants(self, cid: str, keys, now: float) -> None:
        """A reattached client holds futures to `keys` (finished ones too: their results may be on
        reattached workers). Known keys get the client as a wanter (and their state sent); unknown
        ones held unclaimed by a worker are taken; the rest are awaited for `claim_window`."""
        self.set_time(now)
        for key in keys:
            ts = self.tasks.get(key)
            if ts is None:
                if self._adopt_held(key, {cid}) is None:
                    cids, _ = self.awaited.get(key, (set(), 0.0))
                    cids.add(cid)
                    self.awaited[key] = (cids, now + self.claim_window)
                continue
            self._want(cid, ts)
            if ts.state == "released":
                self._activate(ts)
        self._schedule()

    def tick(self, now: float) -> None:
        """Time passed: unclaimed results and awaited keys whose window ended are dropped (the
        worker is told) or failed (the clients are told); a placement hold that ended ends."""
        self.set_time(now)
        for key, holders in list(self.unclaimed.items()):
            for addr, (_, until) in list(holders.items()):
                if addr not in self.workers:
                    del holders[addr]
                elif until <= now:
                    del holders[addr]
                    self._send(addr, {"op": FREE_KEYS, "keys": [key]})
            if not holders:
                del self.unclaimed[key]
        for key, addr in list(self.unclaimed_running.items()):
            if addr not in self.workers:
                del self.unclaimed_running[key]
        for key, (cids, until) in list(self.awaited.items()):
            if key in self.tasks:
                del self.awaited[key]                   # known by now (a resubmission): not lost
            elif until <= now:
                del self.awaited[key]
                error = {"kind": ErrorKind.LOST_DATA, "text": f"the scheduler restarted and no worker came back holding "
                         f"{key!r} within {self.claim_window:g} s; submit it again"}
                for cid in cids & self.clients:
                    self._send(cid, {"op": TASK_ERRED, "key": key, "error": error})
        if self.placement_held_until is not None and now >= self.placement_held_until:
            self.release_placement()

    def hold_placement(self, until: float) -> None:
        """Place no task before `until` (a restarted scheduler waits for its workers' reports)."""
        self.placement_held_until = until

    def release_placement(self) -> None:
        self.placement_held_until = None
        self._schedule()

    # -- hooks from the state machine ----------------------------------------------
    def _claim_held(self, new: list) -> None:
        """update_graph: new tasks whose results a reattached worker holds, or whose thread
        still runs there, are taken over instead of being computed again."""
        for ts in new:
            if ts.error is not None:
                continue
            ts.who_wants = shared(ts.who_wants | (self.awaited.pop(ts.key, (set(), 0.0))[0] & self.clients))   # resubmitted after all
            if ts.key in self.unclaimed:
                holders = [(self.workers[a], n) for a, (n, _) in self.unclaimed.pop(ts.key).items()
                           if a in self.workers]
                if holders:
                    self._transition(ts, "memory", "claimed-held")
                    ts.nbytes, ts.error = holders[0][1], None
                    self._touch(ts)
                    for ws, _ in holders:
                        own(ts, "who_has").add(ws)
                        ws.has_what.add(ts)
                    continue
            addr = self.unclaimed_running.pop(ts.key, None)
            ws = self.workers.get(addr) if addr is not None else None
            # Adopted only if its inputs are here too (processing means they are); else its
            # thread's result, when it comes, is taken as any worker's (task_finished).
            if ws is not None and ts.key in ws.abandoned and all(d.state == "memory" for d in ts.dependencies):
                ws.abandoned.discard(ts.key)
                for dep in ts.dependencies:
                    add_edge(dep, "waiters", ts)
                self._adopt_running(ts, ws, self.now)

    def _finished_unclaimed(self, address: str, key: str, nbytes: int) -> bool:
        """task_finished for a key the scheduler does not know: a thread that ran through the
        restart finished it. Kept unclaimed (a client may resubmit it) instead of dropped."""
        if self.unclaimed_running.get(key) != address:
            return False
        del self.unclaimed_running[key]
        self.unclaimed.setdefault(key, {})[address] = (int(nbytes), self.now + self.claim_window)
        if key in self.awaited:
            self._adopt_held(key, self.awaited.pop(key)[0])
        return True

    def _adopt_held(self, key: str, cids: set) -> TaskState | None:
        """An unknown key held unclaimed by live workers becomes a result in memory (no lineage:
        lost again, it is lost data, as scattered data is)."""
        cids = cids & self.clients                      # clients that left want nothing
        if not cids:
            return None
        holders = [(self.workers[a], n) for a, (n, _) in self.unclaimed.pop(key, {}).items() if a in self.workers]
        if not holders:
            return None
        ts = self.tasks[key] = TaskState(key, nbytes=holders[0][1])
        self._transition(ts, "memory", "adopted-held")
        ts.who_wants = shared(ts.who_wants | cids)
        self._touch(ts)
        for ws, _ in holders:
            own(ts, "who_has").add(ws)
            ws.has_what.add(ts)
        self._tell_clients(ts, {"op": KEY_IN_MEMORY, "key": key, "nbytes": ts.nbytes})
        return ts

    def _adopt_running(self, ts: TaskState, ws, now: float) -> None:
        """A task the worker's thread already runs: processing and executing there, not sent."""
        self._transition(ts, "processing", "adopted-running")
        ts.processing_on, ts.executing = ws, True
        ts.started_at = now
        ws.processing.add(ts)
        ws.executing.add(ts)
        for r, n in (ts.resources or {}).items():
            ws.used_resources[r] = ws.used_resources.get(r, 0) + n
        ws.used_memory += ts.memory
        self._update_free(ws)
