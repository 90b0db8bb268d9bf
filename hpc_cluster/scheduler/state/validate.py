"""The state machine's invariants: `SchedulerState.validate()` raises InvalidState, naming the
broken invariant and the task (or worker) it broke on, if the records disagree.

What tests/unit/scheduler/test_state_fuzz.py checks after every random event, and what the
server runs after each batch it applies when $HPC_CLUSTER_DEBUG_STATE is set (server.py).
Each invariant is one line below, named in its `_fail`; a bug the fuzzing found is named in
the test that keeps it. O(tasks + edges + workers): for tests and debugging, not every event
of a production scheduler. Mixed into SchedulerState (machine.py); pure like it.
"""

from __future__ import annotations

from .prefetch import budget_us

STATES = frozenset({"waiting", "queued", "processing", "memory", "erred", "released", "held"})
ACTIVE = frozenset({"waiting", "queued", "processing"})


class InvalidState(AssertionError):
    """An invariant of the state machine does not hold: `invariant` (its name) at `where`
    (a task's key or a worker's address)."""

    def __init__(self, invariant: str, where: str, detail: object = ""):
        self.invariant, self.where = invariant, where
        super().__init__(f"{invariant}: {where!r}" + (f" ({detail})" if detail != "" else ""))


def _fail(invariant: str, where: str, detail: object = "") -> None:
    raise InvalidState(invariant, where, detail)


def validate_tasks(s) -> None:
    for key, ts in s.tasks.items():
        if ts.key != key:
            _fail("a task is filed under its own key", key, ts)
        if ts.state not in STATES:
            _fail("a task's state is a known one", key, ts.state)
        for dep in ts.dependencies:
            if s.tasks.get(dep.key) is not dep:
                _fail("a task's inputs are known tasks", key, f"input {dep.key!r} is forgotten")
            if ts not in dep.dependents:
                _fail("a task is among its inputs' dependents", key, f"input {dep.key!r}")
        for dts in ts.dependents:
            if s.tasks.get(dts.key) is not dts or ts not in dts.dependencies:
                _fail("a task's dependents are known tasks that depend on it", key, f"dependent {dts.key!r}")
        if not ts.waiters <= ts.dependents or any(w.state not in ACTIVE for w in ts.waiters):
            _fail("a task's waiters are active dependents", key, sorted(w.key for w in ts.waiters))
        if not ts.who_wants <= s.clients:
            _fail("a task is wanted only by connected clients", key, sorted(ts.who_wants - s.clients))
        for ws in ts.who_has:
            if s.workers.get(ws.address) is not ws:
                _fail("a task's holders are live workers", key, ws.address)
            if ts not in ws.has_what:
                _fail("a task's holders list it as held", key, ws.address)
        if bool(ts.who_has) != (ts.state == "memory"):
            _fail("a task has holders if and only if it is in memory", key, f"{ts.state}, {len(ts.who_has)} holders")
        if ts.state == "processing":
            ws = ts.processing_on
            if ws is None or s.workers.get(ws.address) is not ws:
                _fail("a processing task is on a live worker", key, ws)
            if ts not in ws.processing or ts.executing != (ts in ws.executing):
                _fail("a processing task's worker lists it as processing (and executing)", key, ws.address)
            if ts.executing and ts.queued_us:
                _fail("a started task is no longer queued work", key, ts.queued_us)
        elif ts.processing_on is not None or ts.executing or ts.queued_us:
            _fail("a task not processing is on no worker", key, ts.state)
        if ts.ahead_on is not None and ts.state != "waiting":
            _fail("a task is held ahead on a worker only while waiting", key, ts.state)
        if ts.state == "waiting":
            if not ts.waiting_on or not ts.waiting_on <= ts.dependencies:
                _fail("a waiting task waits on some of its inputs", key, sorted(d.key for d in ts.waiting_on))
            if any(d.state in ("memory", "erred") for d in ts.waiting_on):
                _fail("a waiting task waits only on inputs not done", key, sorted(d.key for d in ts.waiting_on))
        elif ts.waiting_on:
            _fail("only a waiting task waits on inputs", key, ts.state)
        if ts.state == "queued" or ts.state == "processing" and not ts.executing:   # a running one has its inputs
            if any(d.state != "memory" for d in ts.dependencies):
                _fail("a ready task's inputs are in memory", key, sorted(d.key for d in ts.dependencies
                                                                         if d.state != "memory"))
        if ts.state in ACTIVE and not (ts.who_wants or ts.waiters):
            _fail("an active task is computed for somebody", key, ts.state)
        if ts.state in ("released", "erred") and not (ts.who_wants or ts.dependents):
            _fail("a released or failed task is kept for something", key, ts.state)
        if ts.state == "held" and not ts.held_by:
            _fail("a held task names the workers holding it", key)
        for attempt in ts.attempts:
            if ts.key not in attempt["death"]["executing"]:
                _fail("a task is charged only for deaths it was executing in", key, attempt["death"].get("id"))


def validate_workers(s) -> None:
    for addr, ws in s.workers.items():
        if ws.address != addr:
            _fail("a worker is filed under its own address", addr, ws.address)
        if not ws.executing <= ws.processing:
            _fail("a worker executes only tasks it processes", addr)
        for ts in ws.processing:
            if s.tasks.get(ts.key) is not ts or ts.processing_on is not ws:
                _fail("a worker's processing tasks are known and processing on it", addr, ts.key)
        for ts in ws.has_what:
            if s.tasks.get(ts.key) is not ts or ws not in ts.who_has:
                _fail("a worker's held results are known and list it as a holder", addr, ts.key)
        # memory= is reserved while a task is on the worker, and only then (pools.py)
        if ws.used_memory != sum(ts.memory for ts in ws.processing):
            _fail("a worker's reserved memory is its tasks'", addr, ws.used_memory)
        # the expected work waiting there is that of its tasks not started yet (prefetch.py)
        if ws.queued_us != sum(ts.queued_us for ts in ws.processing):
            _fail("a worker's queued work is its tasks'", addr, ws.queued_us)
    for ws in s._free:
        if s.workers.get(ws.address) is not ws:
            _fail("only live workers are offered tasks", ws.address)
    for ws in s._deep:
        if ws not in s._free:
            _fail("a worker with room only for short tasks is a free one", ws.address)
    # the deep workers' most room is read from a heap kept current by every change (prefetch.py)
    room = max((budget_us(ws.nthreads, s.prefetch_seconds) - ws.queued_us for ws in s._deep), default=-1)
    if s._deep.most_room() != room:
        _fail("the most room among workers for short tasks is current", "", f"{s._deep.most_room()} != {room}")


def validate_restrictions(s) -> None:
    """workers= (restrictions.py): each task's Where is the state's one for its names, kept to the
    live workers it admits; a task placed (not yet running: a reattached worker's thread may
    run it anywhere) is on one of its workers unless it may run elsewhere."""
    for key, ts in s.tasks.items():
        where = ts.where
        if where is None:
            continue
        if s._wheres.get((tuple(sorted(where.names)), where.loose)) is not where:
            _fail("a task's workers= is the state's one for its names", key, sorted(where.names))
        if where.matching != {ws for ws in s.workers.values() if where.admits(ws)}:
            _fail("a workers= restriction knows the live workers it admits", key,
                  sorted(ws.address for ws in where.matching))
        if (ts.state == "processing" and not ts.executing and not where.loose
                and ts.processing_on not in where.matching):
            _fail("a task with workers= is placed on one of them", key, ts.processing_on.address)


def validate_stories(s) -> None:
    """Debug mode: a task's state is the one its latest change made, so no change went around
    `_transition` (transitions.py). Tasks with no story yet are not checked."""
    for key, ts in s.tasks.items():
        story = s._stories.get(key)
        if story:
            last = story[-1][1]
            if last != ts.state and not (last == "forgotten" and ts.state == "released"):
                _fail("a task's state is the one its latest change made", key,
                      f"it is {ts.state}; its story ends in {last}")


class ValidateMixin:
    def validate(self) -> None:
        """Raise InvalidState (an AssertionError) naming the first invariant that does not hold."""
        if self.debug:
            validate_stories(self)
        validate_tasks(self)
        validate_workers(self)
        validate_restrictions(self)
