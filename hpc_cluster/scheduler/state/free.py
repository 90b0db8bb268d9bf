"""The workers with a free slot, ordered as placement prefers them (issue 19, point 3).

`pick_worker` used to score every free worker for every task it placed. With hundreds of
workers that made each placement cost O(workers): at 500 one-thread workers running 0.1 s
tasks the scheduler scanned the whole set three times per finished task (once to place the
next root task, once more for the next one in the heap, once to learn that no worker had a
root slot left), about 1,500 scores per task, and placing fell behind the workers.

`FreeWorkers` is still the set of free workers (membership, iteration, len) but also keeps
them in two heaps, every free worker and the free workers with a root slot open, in the
order of placement's score for a task whose inputs no worker holds: (below its spill
fraction, fewest tasks per thread, most memory left, lowest address). A worker's entry is
re-pushed whenever the state machine touches it (`add`, which `_update_free` calls after every
change to its tasks, and after every memory report); older entries are stale and skipped
(a version per worker), and a heap is rebuilt when stale entries outnumber live ones.

`pick` gives exactly what a scan with `pick_worker` would (tests/unit/scheduler/test_many_workers_state.py
checks both ways on random states): the holders of the task's inputs score higher than any
other worker (their `local` bytes), so they are scored first, few as they are; otherwise the
best worker is the first entry of the heap that passes the task's own filters (resources,
pool and memory=, time before the walltime), usually the very first.
"""

from __future__ import annotations

import heapq
import itertools

from .placement import fits_worker, has_resources, has_root_slot, has_time, memory_room, pick_worker


def _order(ws) -> tuple:
    """A worker's place in the heaps: the negated score pick_worker gives a worker holding
    none of the task's inputs (a min-heap), then its address for ties, as there."""
    roomy, left = memory_room(ws)
    return (not roomy, len(ws.processing) / ws.nthreads, -left, ws.address)


class FreeWorkers:
    """A set of WorkerStates (the free ones) with a best-first order for placement."""

    def __init__(self):
        self._version: dict = {}          # member -> the version of its live heap entries
        self._root: set = set()           # members with a root slot open (placement.has_root_slot)
        self._all: list = []              # heap of (order, seq, version, ws) over every member
        self._roots: list = []            # the same over the members with a root slot
        self._seq = itertools.count()     # unique: ties never compare WorkerStates
        self.examined = 0                 # heap entries looked at by pick (tests count it)

    # -- the set -----------------------------------------------------------------
    def __contains__(self, ws) -> bool:
        return ws in self._version

    def __iter__(self):
        return iter(list(self._version))

    def __len__(self) -> int:
        return len(self._version)

    def add(self, ws) -> None:
        """Add or re-order `ws` (its tasks or memory changed): a new entry, the old ones stale."""
        # Versions come from one counter: a worker discarded and added again must not make its
        # entries from before the discard live again (a per-worker count restarted at 1 did).
        version = next(self._seq)
        self._version[ws] = version
        entry = (_order(ws), version, version, ws)
        heapq.heappush(self._all, entry)
        if has_root_slot(ws):
            self._root.add(ws)
            heapq.heappush(self._roots, entry)
        else:
            self._root.discard(ws)
        self._compact()

    def discard(self, ws) -> None:
        if self._version.pop(ws, None) is not None:
            self._root.discard(ws)
            self._compact()

    def clear(self) -> None:
        self.__init__()

    def has_root_slot(self) -> bool:
        """Is any free worker's root slot open? (What `any(map(has_root_slot, free))` asked.)"""
        return bool(self._root)

    # -- placement ---------------------------------------------------------------
    def pick(self, ts, expected: float | None, now: float, queue_root: bool = False, pools: dict | None = None,
             allowed=None, by_room=None):
        """pick_worker(ts, self, ...) without scoring every free worker; `allowed`, if given,
        narrows the free workers first (the state's prefetch room for short tasks).

        `by_room` is given when every free worker has room only for short tasks: a
        (prefetch.DeepWorkers, cost in us) pair. Then a task no worker holds inputs of goes to
        the one with the most room for it (the least work queued ahead of it), not to the first
        in placement's order, which may be far from the first with room.

        A task with workers= is placed among the free ones of those alone (restrictions.py keeps
        them), few as they are; a loose one, when none of them fits, as any task."""
        where = ts.where
        if where is not None:
            mine = [ws for ws in where.matching if ws in self._version and (allowed is None or allowed(ws))]
            best = pick_worker(ts, mine, expected, now, queue_root, pools)
            if best is not None or not where.loose:
                return best
        holders = {ws for dep in ts.dependencies for ws in dep.who_has
                   if ws in self._version and (allowed is None or allowed(ws))}
        if holders:
            best = pick_worker(ts, holders, expected, now, queue_root, pools)
            if best is not None:
                return best
        needs = ts.pool is not None or ts.memory or pools

        def fits(ws) -> bool:
            return not (ws.draining or (ts.resources and not has_resources(ts, ws))
                        or not has_time(expected, ws, now) or (needs and not fits_worker(ts, ws, pools))
                        or (allowed is not None and not allowed(ws)))
        if by_room is not None and not queue_root:
            deep, cost_us = by_room
            return deep.first(cost_us, fits)
        return self._first(self._roots if queue_root else self._all, fits)

    def _first(self, heap: list, fits):
        """The first live entry of `heap` whose worker `fits`; the live ones looked at go back."""
        passed, found = [], None
        while heap:
            entry = heapq.heappop(heap)
            ws, version = entry[3], entry[2]
            self.examined += 1
            if self._version.get(ws) != version:
                continue                              # stale: the worker changed or left
            passed.append(entry)
            if fits(ws):
                found = ws
                break
        for entry in passed:
            heapq.heappush(heap, entry)
        return found

    def _compact(self) -> None:
        """Rebuild a heap once its stale entries outnumber the live ones (amortised O(1))."""
        if len(self._all) > 2 * len(self._version) + 64:
            self._all = self._live(self._all)
        if len(self._roots) > 2 * len(self._root) + 64:
            self._roots = self._live(self._roots)

    def _live(self, heap: list) -> list:
        live = [e for e in heap if self._version.get(e[3]) == e[2]]
        heapq.heapify(live)
        return live
