"""How many tasks a worker is sent beyond its threads: pure arithmetic for the state machine.

Every worker has `prefetch` slots beyond its threads whatever its tasks take (the *base*
slots, 2 by default): a thread that ends its task finds the next one there, without a round
trip to the scheduler. For tiny tasks two are not enough: the round trip (a `task-finished`
read, a `compute` written, about one socket write per task) costs more than the task, and
BENCHMARKS.md measured a map of no-op tasks 40-50 % faster with 8 to 32 prefetched per thread.
For tasks of a second, though, a deep queue only means more work to move when the worker dies
or a new worker joins idle.

So a worker is also sent tasks *known* to be short (their expected duration: what the user
said with duration=, or what tasks of the same key prefix took, placement.TaskDurations)
while the expected work waiting there, not started yet, stays within PREFETCH_SECONDS per
thread, and its tasks stay within MAX_PREFETCH_PER_THREAD per thread beyond its base slots.
A task of unknown duration waiting there counts as a whole thread's budget: until tasks like
it have run once, nothing is queued deeply behind it. Blame does not change: only tasks a
worker reported as *executing* are charged for its death; queued ones are just placed again.

The state keeps, per worker, the expected microseconds (an int: adding and taking away the
same ints never drifts) of its tasks not started yet (WorkerState.queued_us), each task its
share (TaskState.queued_us) until it starts or leaves the worker.
"""

from __future__ import annotations

import heapq
import itertools
import math

# Expected work kept waiting per worker thread, beyond the base slots (seconds).
PREFETCH_SECONDS = 0.005
# Tasks beyond the base slots a worker may hold per thread, however short they are.
MAX_PREFETCH_PER_THREAD = 32


def queued_cost_us(expected: float | None, budget_seconds: float = PREFETCH_SECONDS) -> int:
    """What a task waiting at a worker counts against that worker's budget, in microseconds:
    its expected duration, or a whole thread's budget when nothing is known of it."""
    if expected is None:
        return max(1, math.ceil(budget_seconds * 1e6))
    return max(1, math.ceil(min(expected, 1e6) * 1e6))


def budget_us(nthreads: int, budget_seconds: float = PREFETCH_SECONDS) -> int:
    return math.ceil(nthreads * budget_seconds * 1e6)


def base_slots(ws, prefetch: int) -> int:
    """Tasks a worker may hold whatever they take: its threads (and those freed by seceded
    tasks, which wait on subtasks in worker_client) plus `prefetch`."""
    return ws.nthreads + len(ws.seceded) + prefetch


def load(ws) -> int:
    """Its slots in use: tasks sent to it, and threads still running tasks we gave up on."""
    return len(ws.processing) + len(ws.abandoned)


def has_base_slot(ws, prefetch: int) -> bool:
    return load(ws) < base_slots(ws, prefetch)


def has_deep_room(ws, prefetch: int, budget_seconds: float) -> bool:
    """Room beyond the base slots for *some* short task (which one fits: fits_deep)."""
    return (budget_seconds > 0 and load(ws) < base_slots(ws, prefetch) + ws.nthreads * MAX_PREFETCH_PER_THREAD
            and ws.queued_us < budget_us(ws.nthreads, budget_seconds))


def fits_deep(ws, cost_us: int, expected: float | None, prefetch: int, budget_seconds: float) -> bool:
    """May a task expected to take `expected` seconds (cost `cost_us`) wait at `ws` beyond its
    base slots? Only a task of known duration whose cost keeps the worker within its budget."""
    return (expected is not None and has_deep_room(ws, prefetch, budget_seconds)
            and ws.queued_us + cost_us <= budget_us(ws.nthreads, budget_seconds))


def short_enough(state, cost_us: int, expected: float | None):
    """Which free workers may take a task of this cost: those with a base slot, and those with
    room only for short tasks (state._deep) if it fits their room. A predicate, for
    FreeWorkers.pick."""
    deep, prefetch, seconds = state._deep, state.prefetch, state.prefetch_seconds
    return lambda w: w not in deep or fits_deep(w, cost_us, expected, prefetch, seconds)


def not_queued(ts) -> None:
    """`ts` no longer waits at its worker (it started, or left it): its expected time leaves
    that worker's queued work."""
    if ts.queued_us:
        if ts.processing_on is not None:
            ts.processing_on.queued_us -= ts.queued_us
        ts.queued_us = 0


class DeepWorkers:
    """The free workers with room only for short tasks (has_deep_room), as a set, that also
    answers "does any of them have room for `cost_us`?" without looking at each: with every
    free worker deep and the next task too long for all, the scheduler asked that at every
    event, and 500 workers made it 30% of its time (BENCHMARKS.md, "Many workers").

    A max-heap of (-room, version, ws); an entry is current while its version is the
    worker's latest. The state calls `add` after every change of a worker's queued work
    (state._update_free), so the top current entry is the most room there is."""

    def __init__(self, budget_seconds: float):
        self.budget_seconds = budget_seconds
        self._version: dict = {}                      # ws -> its current entry's version
        self._heap: list = []
        self._count = itertools.count()

    def __contains__(self, ws) -> bool:
        return ws in self._version

    def __len__(self) -> int:
        return len(self._version)

    def __iter__(self):
        return iter(self._version)

    def add(self, ws) -> None:
        version = next(self._count)
        self._version[ws] = version
        room = budget_us(ws.nthreads, self.budget_seconds) - ws.queued_us
        heapq.heappush(self._heap, (-room, version, id(ws), ws))
        if len(self._heap) > 2 * len(self._version) + 64:     # stale entries: rebuilt, amortised O(1)
            self._heap = [e for e in self._heap if self._version.get(e[3]) == e[1]]
            heapq.heapify(self._heap)

    def discard(self, ws) -> None:
        self._version.pop(ws, None)

    def first(self, cost_us: int, fits):
        """The worker with the most room among those with room for `cost_us` that `fits`
        (the task's other filters), or None. Entries come in order of room, so the walk
        ends at the first without room for the task: with every free worker deep, picking
        by their placement order instead asked each one ahead of a worker with room, up to
        all 500 per task (12% of the scheduler's samples at 500 workers)."""
        heap, passed, found = self._heap, [], None
        while heap:
            entry = heapq.heappop(heap)
            if self._version.get(entry[3]) != entry[1]:
                continue                                  # stale: its room changed, or it left
            passed.append(entry)
            if -entry[0] < cost_us:
                break
            if fits(entry[3]):
                found = entry[3]
                break
        for entry in passed:
            heapq.heappush(heap, entry)
        return found

    def most_room(self) -> int:
        """The most room, in microseconds of expected work, among them (negative: none)."""
        heap = self._heap
        while heap and self._version.get(heap[0][3]) != heap[0][1]:
            heapq.heappop(heap)
        return -heap[0][0] if heap else -1
