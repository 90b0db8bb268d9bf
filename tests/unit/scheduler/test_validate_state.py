"""SchedulerState.validate() (scheduler/state/validate.py): each kind of broken state it is
built to catch, named by invariant and key."""

import pytest

from hpc_cluster.scheduler.state import SchedulerState, TaskState
from hpc_cluster.scheduler.state.records import EMPTY, drop_edge
from hpc_cluster.scheduler.state.validate import InvalidState

from test_state import task


def world() -> SchedulerState:
    """a in memory on w; b (needs a) and x processing on w; y waiting on x; w2 idle."""
    s = SchedulerState(prefetch=0, queue_roots=False)
    s.add_worker("w", nthreads=2, now=0.0)
    s.add_client("c")
    s.update_graph("c", [task("a"), task("x"), task("b", deps=["a"])], ["b", "x"])
    s.task_finished("w", "a", nbytes=8)
    s.update_graph("c", [task("y", deps=["x"])], ["y"])
    s.add_worker("w2", nthreads=1, now=0.0)
    assert {k: ts.state for k, ts in s.tasks.items()} == {
        "a": "memory", "x": "processing", "b": "processing", "y": "waiting"}
    return s


def held_without_holders(s):
    s.tasks["h"] = TaskState("h", state="held", who_wants=frozenset({"c"}))


def charged_elsewhere(s):
    s.tasks["x"].attempts = [{"death": {"id": 0, "executing": []}, "ran_for": 1.0}]


def started_but_queued(s):
    s.task_started("w", "x", 1.0)
    s.tasks["x"].queued_us = 7


CORRUPTIONS = {
    "unknown state": (lambda s: setattr(s.tasks["x"], "state", "bogus"), "a task's state is a known one", "x"),
    "filed under another key": (lambda s: s.tasks.__setitem__("a2", s.tasks.pop("a")),
                                "a task's inputs are known tasks", "b"),
    "one-sided edge": (lambda s: s.tasks["b"].dependencies.discard(s.tasks["a"]),
                       "a task's dependents are known tasks that depend on it", "a"),
    "a waiter not a dependent": (lambda s: drop_edge(s.tasks["a"], "dependents", s.tasks["b"]),
                                 "a task's waiters are active dependents", "a"),
    "memory without holders": (lambda s: (s.tasks["a"].who_has.clear(), s.workers["w"].has_what.clear()),
                               "a task has holders if and only if it is in memory", "a"),
    "processing unknown to its worker": (lambda s: s.workers["w"].processing.discard(s.tasks["x"]),
                                         "a processing task's worker lists it as processing (and executing)", "x"),
    "waiting on nothing": (lambda s: setattr(s.tasks["y"], "waiting_on", EMPTY),
                           "a waiting task waits on some of its inputs", "y"),
    "wanted by a gone client": (lambda s: s.clients.discard("c"), "a task is wanted only by connected clients", "x"),
    "computed for nobody": (lambda s: setattr(s.tasks["b"], "who_wants", EMPTY),
                            "an active task is computed for somebody", "b"),
    "started yet queued work": (started_but_queued, "a started task is no longer queued work", "x"),
    "charged for a death it did not run in": (charged_elsewhere,
                                              "a task is charged only for deaths it was executing in", "x"),
    "held by nobody": (held_without_holders, "a held task names the workers holding it", "h"),
    "memory reserved for nothing": (lambda s: setattr(s.workers["w"], "used_memory", 5),
                                    "a worker's reserved memory is its tasks'", "w"),
    "a dead worker offered tasks": (lambda s: s.workers.pop("w2"), "only live workers are offered tasks", "w2"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_validate_names_the_broken_invariant_and_the_key(name):
    corrupt, invariant, where = CORRUPTIONS[name]
    s = world()
    s.validate()                                   # sound before
    corrupt(s)
    with pytest.raises(InvalidState) as err:
        s.validate()
    assert (err.value.invariant, err.value.where) == (invariant, where)
    assert isinstance(err.value, AssertionError) and repr(where) in str(err.value)
