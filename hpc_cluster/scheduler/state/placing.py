"""The placement pass: which queued task goes to which free worker, now (part of SchedulerState).

Where a task *may* run and how workers compare is placement.py's (pure functions); how many
tasks a worker may hold is prefetch.py's; this module walks the ready heaps and assigns. One
`place_limit` is what placement may still place in this turn of the server's loop, shared by
every pass of the turn (the server refills it each turn, so 10,000 tasks for 500 workers do
not hold its loop for a second, nor do 50 finished-task reports in one turn place 50 x 200);
a pass that meets it says `more_to_place`, and the server calls `place()` on its next turn.
"""

from __future__ import annotations

import heapq

from .placement import expected_duration, is_queued_root, wait_for_holder
from .prefetch import has_base_slot, has_deep_room, queued_cost_us, short_enough
from ...protocol.messages import Op
from .records import priority_pair, TaskState, WorkerState

COMPUTE = Op.COMPUTE.value              # a plain str: a literal's cost per task (protocol/messages.py)


class PlacingMixin:
    def _update_free(self, ws: WorkerState) -> None:
        # A task that seceded (waits on its own subtasks in worker_client) frees its slot (prefetch.base_slots).
        if ws.address in self.workers and not ws.draining and not ws.paused:
            if has_base_slot(ws, self.prefetch):
                self._free.add(ws)
                self._deep.discard(ws)
                return
            if has_deep_room(ws, self.prefetch, self.prefetch_seconds):
                self._free.add(ws)
                self._deep.add(ws)
                return
        self._free.discard(ws)
        self._deep.discard(ws)

    def place(self) -> None:
        """A placement pass: what the server calls to place what a bounded pass left."""
        self._schedule()

    def _schedule(self) -> None:
        self.more_to_place = False         # set again if this pass stops at place_limit
        if self._unchecked:
            self._check_placeable()
        if self.placement_held_until is not None:
            return                         # reattaching workers report what they hold first (reattach.py)
        deferred, left = [], self.place_limit
        roots_open = True                  # False once root tasks wait for a thread, for this pass
        while self._free:
            if left is not None and left <= 0:
                self.more_to_place = True
                break
            heap = self._next_ready(roots_open)
            if heap is None:
                break
            prio, key = heapq.heappop(heap)
            ts = self.tasks.get(key)
            if ts is None or ts.state != "queued" or ts.priority != prio:
                continue
            if self._awaiting_verdict(ts):
                deferred.append((heap, prio, key))          # refine_death schedules it again
                continue
            expected = expected_duration(ts, self.durations)
            queue_root = self.queue_roots and is_queued_root(ts, expected)
            cost = queued_cost_us(expected, self.prefetch_seconds)
            allowed = by_room = None
            if self._deep:
                # Some free workers have room only for short tasks (prefetch.py): this task
                # may go there only if it is short enough for them.
                allowed = short_enough(self, cost, expected)
                if len(self._deep) == len(self._free):
                    if expected is None or self._deep.most_room() < cost:
                        # No base slot anywhere and this one is not short enough: it and the
                        # tasks after it wait (popping a long queue at every event is O(n)).
                        deferred.append((heap, prio, key))
                        break
                    by_room = (self._deep, cost)
            ws = self._free.pick(ts, expected, self.now, queue_root, self.pools, allowed, by_room)
            if ws is None and queue_root and not self._free.has_root_slot():
                # Every free worker's threads are taken: root tasks wait (placement.SHORT_ROOT);
                # tasks with inputs may still take prefetch slots. No need to pop every root.
                deferred.append((heap, prio, key))
                roots_open = False
                continue
            if ws is None:
                error = self._unplaceable(ts, expected)
                if error is not None:
                    self._err(ts, error)
                else:
                    deferred.append((heap, prio, key))      # waits for a worker with time (or a slot) for it
                continue
            if wait_for_holder(ts, ws, self.durations, self.now, self.pools):
                deferred.append((heap, prio, key))          # its inputs' worker takes it when a slot frees
                continue
            self._assign(ts, ws, cost)
            if left is not None:
                left -= 1
        if left is not None:
            self.place_limit = left            # what the turn's next passes may still place
        for heap, prio, key in deferred:
            heapq.heappush(heap, (prio, key))

    def _assign(self, ts: TaskState, ws: WorkerState, cost_us: int, send: bool = True) -> None:
        self._transition(ts, "processing", "assigned")
        ts.processing_on, ts.queued_us = ws, cost_us
        ws.processing.add(ts)
        ws.queued_us += cost_us
        for r, n in (ts.resources or {}).items():
            ws.used_resources[r] = ws.used_resources.get(r, 0) + n
        ws.used_memory += ts.memory
        self._update_free(ws)
        if send:
            self._send(ws.address, self._compute_msg(ts, ws))
        if len(ts.dependents) == 1:                  # after it: the chain's next links wait there (ahead.py)
            for dts in ts.dependents:
                self._send_ahead(dts, ts, 1)

    def _compute_msg(self, ts: TaskState, ws: WorkerState) -> dict:
        """The message that has `ws` run `ts` (ahead.py's adds "after": held until that input is done)."""
        deps = {dep.key: [w.address for w in dep.who_has] for dep in ts.dependencies}
        msg = {"op": COMPUTE, "key": ts.key, "func": ts.func, "args": ts.args, "deps": deps,
               "priority": priority_pair(ts.priority)}
        # The sizes of the inputs it must fetch: it fetches large ones only for a task a thread
        # is free for, not ahead (worker.py, FETCH_AHEAD_BYTES).
        sizes = {dep.key: dep.nbytes for dep in ts.dependencies if dep.nbytes and ws not in dep.who_has}
        if sizes:
            msg["sizes"] = sizes
        return msg

    def _next_ready(self, roots_open: bool) -> list | None:
        """The heap whose first task comes first (the roots' only while they may go)."""
        heaps = [h for h in (self._ready, self._roots if roots_open else None) if h]
        return min(heaps, key=lambda h: h[0]) if heaps else None
