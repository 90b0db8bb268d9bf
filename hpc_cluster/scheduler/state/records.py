"""What the scheduler knows of each task and each worker: plain records, no behaviour.
The state machine (state.py and its mixins) changes them."""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, field

from ...memseries import MemoryTimeline
from ...protocol.messages import ErrorKind

# Plain str copies: a failed task's every dependent gets one (a literal's cost, protocol/messages.py).
DEPENDENCY, EXCEPTION = ErrorKind.DEPENDENCY.value, ErrorKind.EXCEPTION.value

MAX_STARTS = 500                # task starts kept per worker for its death record (timeline.py)


class _NoneYet(frozenset):
    """The shared empty value of a task's sets until something goes in. An empty set() is
    216 bytes and a task has eight of them; most tasks never fill most (a map task has no
    dependencies, no copies, nothing held): 1.7 KB of a waiting task's 2.3 KB (issue 19,
    <= 1 KB per waiting task). It reads as an empty set and takes removals as no-ops; adding
    needs a set of the task's own first: `own(ts, "waiters").add(dep)`.
    """

    __slots__ = ()

    def discard(self, item) -> None:
        pass

    def clear(self) -> None:
        pass

    def difference_update(self, *others) -> None:
        pass

    def intersection_update(self, *others) -> None:
        pass

    def remove(self, item):
        raise KeyError(item)

    def pop(self):
        raise KeyError("pop from an empty set")

    def add(self, item):
        raise TypeError("a task's shared empty set: give the task a set() of its own before adding")

    def __or__(self, other):                  # ts.who_wants |= cids: the task's own set
        return set(other) if other else self

    def __sub__(self, other):                 # ts.held_by -= names: still the shared empty one
        return self

    def __and__(self, other):
        return self

    def __repr__(self) -> str:
        return "set()"


EMPTY = _NoneYet()

# The clients wanting a task, shared: a million tasks one client submitted hold one frozenset,
# not a 216-byte set each (issue 19: the RSS per waiting task of a 1,000,000-task map was
# 1,169 bytes with them). Kept while some task holds it.
_WANTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _interned(table: weakref.WeakValueDictionary, name: tuple, value: frozenset) -> frozenset:
    """`table`'s frozenset under `name`, `value` if it has none yet (kept while one is in use)."""
    found = table.get(name)
    if found is None:
        table[name] = found = value
    return found


def shared(items) -> frozenset:
    """The one frozenset of these items (EMPTY if none): tasks with the same clients share it."""
    value = frozenset(items)
    return _interned(_WANTS, tuple(sorted(value)), value) if value else EMPTY


def with_item(current: frozenset, item) -> frozenset:
    return current if item in current else shared(current | {item})


def without_item(current: frozenset, item) -> frozenset:
    return shared(current - {item}) if item in current else current


# A task's edges (its dependents and its waiters) are shared frozensets too while small: each
# of a 1,000,000-task graph's leaves had a one-element set of dependents and one of waiters,
# 432 B of its 1,976 (issue 19); its 1,000 siblings under one sum now share one. Past
# SHARED_EDGES an edge set is the task's own set (adding to a shared one copies it).
SHARED_EDGES = 8
_EDGES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _shared_edges(items: frozenset) -> frozenset:
    # Named by identity: a set of tasks keeps them alive, so no id in a live name is reused.
    return _interned(_EDGES, tuple(sorted(map(id, items))), items) if items else EMPTY


def add_edge(record, name: str, item) -> None:
    """`record.<name>` (dependents or waiters) with `item`."""
    current = getattr(record, name)
    if type(current) is set:
        current.add(item)
    elif item not in current:
        grown = frozenset(current) | {item}
        setattr(record, name, set(grown) if len(grown) > SHARED_EDGES else _shared_edges(grown))


def drop_edge(record, name: str, item) -> None:
    """`record.<name>` without `item`."""
    current = getattr(record, name)
    if type(current) is set:
        current.discard(item)
    elif item in current:
        setattr(record, name, _shared_edges(frozenset(current) - {item}))


# A task's priority is one int, not a (user's priority, submission order) tuple: 56 bytes less
# per waiting task (issue 19). Workers and journals still get the pair.
SEQ_SPAN = 2**64


def priority_of(user: int, seq: int) -> int:
    """Higher user priority first, then submission order; lower runs first."""
    return -user * SEQ_SPAN + seq


def priority_pair(priority: int) -> list[int]:
    """[-user priority, submission order]: what workers order by and journals keep."""
    return list(divmod(priority, SEQ_SPAN))


def priority_from_pair(pair) -> int:
    """The inverse of priority_pair (a journal written before the pair had one number)."""
    pair = list(pair) + [0] * (2 - len(pair))
    return pair[0] * SEQ_SPAN + pair[1]


def own(record, name: str) -> set:
    """`record.<name>`, made a set of its own if it still is the shared EMPTY: to add to."""
    value = getattr(record, name)
    if value is EMPTY:
        value = set()
        setattr(record, name, value)
    return value


@dataclass(eq=False, slots=True)
class TaskState:
    key: str
    func: object = None                     # Opaque, None for scattered data
    args: object = None                     # Opaque
    priority: int = 0                                # priority_of(the user's, submission order): lower runs first
    retries: int = 0
    resources: dict | None = None
    state: str = "released"
    dependencies: set = EMPTY
    dependents: set = EMPTY                          # shared while small: change with records.add_edge/drop_edge
    waiting_on: set = EMPTY
    waiters: set = EMPTY                             # active dependents needing our result (as dependents)
    who_wants: frozenset = EMPTY                     # client ids, shared: change with records.with_item/without_item
    who_has: set = EMPTY                             # WorkerStates
    processing_on: "WorkerState | None" = None
    ahead_on: "WorkerState | None" = None            # a worker holding it until its input finishes there (ahead.py)
    executing: bool = False
    queued_us: int = 0                               # its share of processing_on.queued_us (prefetch.py)
    nbytes: int = 0
    error: dict | None = None
    attempts: list | tuple = ()                      # {"death": record, "ran_for": s} per death while it ran (a list once one)
    started_at: float | None = None
    start_memory: dict | None = None                 # the worker's memory as it started ({rss, managed})
    duration: float | None = None                    # seconds, as the user said (submit(duration=))
    replicas: int = 1                                # copies to keep (replicate); pinned
    copying: set = EMPTY                             # workers fetching a replica now
    memory: int = 0                                  # bytes it needs (submit(memory=), or learned by escalation)
    pool: str | None = None                          # the only pool it may run on (named, or moved to)
    where: object = None                             # workers= (restrictions.Where, shared), or None
    escalated: bool = False                          # `pool` and `memory` were set by a retry by cause
    escalation: str | None = None                    # the latest move, as the user reads it
    # state "held": rebuilt from a journal, its result on these workers (names) until they come
    # back and confirm it, or are known gone (recovery.py)
    held_by: set = EMPTY

    def __repr__(self) -> str:
        return f"<Task {self.key!r} {self.state}>"


@dataclass(eq=False)
class WorkerState:
    address: str
    nthreads: int = 1
    memory_limit: int = 0
    name: str = ""
    resources: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    processing: set = field(default_factory=set)
    executing: set = field(default_factory=set)
    has_what: set = field(default_factory=set)
    used_resources: dict = field(default_factory=dict)
    used_memory: int = 0                                 # memory= of the tasks it was given, reserved
    abandoned: set = field(default_factory=set)          # keys we gave up on that a thread still runs
    queued_us: int = 0                                   # expected us of its tasks not started yet (prefetch.py)
    seceded: set = field(default_factory=set)            # running tasks that gave up their slot (worker_client)
    joined: float = 0.0
    last_seen: float = 0.0
    deadline: float | None = None                    # when its job's walltime ends
    draining: bool = False                           # leaving before the deadline: no new tasks
    drain_keeps: bool = False                        # a scale-down drain: stays while it alone holds wanted results
    # What its heartbeats say of its memory: rss, peak_rss (since the last), managed (results
    # in memory), spilled / spilled_disk / spilled_count (results on disk), paused.
    memory: dict = field(default_factory=dict)
    memory_at: float | None = None                   # when that report came
    paused: bool = False                             # over its pause fraction: no new tasks
    # Its memory over its whole life and the latest tasks it started, (time, key): what its
    # death record shows (timeline.py); both bounded.
    timeline: MemoryTimeline = field(default_factory=MemoryTimeline)
    task_starts: deque = field(default_factory=lambda: deque(maxlen=MAX_STARTS))

    def __repr__(self) -> str:
        return f"<Worker {self.address} {len(self.processing)}/{self.nthreads}>"


def dependency_error(failed: TaskState) -> dict:
    """The error of a task whose input `failed` erred: the first failure's, passed down."""
    err = failed.error or {"kind": EXCEPTION}
    if err.get("kind") == DEPENDENCY:
        return err
    return {"kind": DEPENDENCY, "origin": failed.key, "cause": err}
