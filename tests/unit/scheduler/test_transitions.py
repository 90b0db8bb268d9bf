"""The one place a task's state changes (scheduler/state/transitions.py): the table it checks
in debug mode, and the story it keeps of each key."""

import pytest

from hpc_cluster.scheduler.state import SchedulerState, TaskState, transitions
from hpc_cluster.scheduler.state.transitions import ALLOWED, InvalidTransition

from test_state import computes, task


def one_task_run(s: SchedulerState) -> None:
    """x submitted, run on w at t=5, finished, released: every state it goes through."""
    s.add_worker("w", nthreads=1, now=5.0)
    s.add_client("c")
    s.update_graph("c", [task("x")], ["x"])
    assert computes(s.take_outbox(), "w") == ["x"]
    s.task_finished("w", "x", nbytes=8)
    s.client_releases("c", ["x"])


def test_a_change_outside_the_table_raises_in_debug_mode_and_not_without():
    for debug in (True, False):
        s = SchedulerState(debug=debug)
        s.add_client("c")
        s.scatter("c", {"d": []}, {})                       # reached no worker: failed, kept for c
        ts = s.tasks["d"]
        assert ts.state == "erred" and "queued" not in ALLOWED["erred"]
        if debug:
            with pytest.raises(InvalidTransition, match=r"'d': erred -> queued \(test\)"):
                s._transition(ts, "queued", "test")
            assert ts.state == "erred"                      # raised before the change
        else:
            s._transition(ts, "queued", "test")
            assert ts.state == "queued"


def test_every_change_of_a_run_goes_through_the_choke_point(monkeypatch):
    """With "waiting" -> "queued" taken out of the table, an ordinary submission fails in debug
    mode at that change: the events change states through _transition, not around it."""
    monkeypatch.setitem(ALLOWED, "waiting", ALLOWED["waiting"] - {"queued"})
    with pytest.raises(InvalidTransition, match=r"'x': waiting -> queued \(inputs-ready\)"):
        one_task_run(SchedulerState(debug=True))
    one_task_run(SchedulerState())                          # without debug nothing is checked


def test_the_story_tells_each_change_in_order_with_the_state_time():
    s = SchedulerState(debug=True)
    one_task_run(s)
    assert s.story("x") == [
        ("released", "waiting", "needed", 5.0),
        ("waiting", "queued", "inputs-ready", 5.0),
        ("queued", "processing", "assigned", 5.0),
        ("processing", "memory", "task-finished", 5.0),
        ("memory", "released", "unneeded", 5.0),
        ("released", "forgotten", "unneeded", 5.0),
    ]
    assert "x" not in s.tasks and s.story("unknown") == []
    # a later event's time: the worker dies running y at t=9
    s.update_graph("c", [task("y")], ["y"])
    s.remove_worker("w", 9.0, {"cause": "crash", "blame": False})
    assert s.tasks["y"].state == "queued" and s.story("y")[-3:] == [
        ("processing", "released", "worker-lost", 9.0), ("released", "waiting", "needed", 9.0),
        ("waiting", "queued", "inputs-ready", 9.0)]


def test_the_story_is_kept_only_in_debug_mode():
    s = SchedulerState()
    one_task_run(s)
    assert s.story("x") == [] and s._stories == {}


def test_a_story_keeps_the_latest_changes_of_a_key_and_stories_of_the_latest_keys(monkeypatch):
    s = SchedulerState(debug=True, prefetch=0)
    s.add_worker("w", nthreads=1, now=0.0)
    s.add_client("c")
    s.update_graph("c", [task("x", retries=100)], ["x"])
    for i in range(30):                     # each retry: processing -> released -> waiting -> queued -> processing
        s.set_time(float(i))
        s.task_erred("w", "x", {"text": "boom"})
    story = s.story("x")
    assert len(story) == transitions.STORY_LENGTH
    assert story[-1] == ("queued", "processing", "assigned", 29.0)
    assert story[-4] == ("processing", "released", "task-erred-retry", 29.0)
    assert [old for old, *_ in story[1:]] == [new for _, new, *_ in story[:-1]]    # one chain, no gap
    # past STORY_KEYS keys, the oldest story goes first
    monkeypatch.setattr(transitions, "STORY_KEYS", 3)
    s = SchedulerState(debug=True)
    s.add_client("c")
    s.update_graph("c", [task(k) for k in "abcde"], list("abcde"))
    assert [k for k in "abcde" if s.story(k)] == ["c", "d", "e"]


def test_a_state_write_around_the_choke_point_is_caught_by_validate_in_debug_mode():
    s = SchedulerState(debug=True)
    s.add_worker("w", nthreads=1, now=0.0)
    s.add_client("c")
    s.update_graph("c", [task("x")], ["x"])
    s.validate()
    s.tasks["x"].state = "queued"             # as a new `ts.state = ...` in the state machine would
    with pytest.raises(AssertionError) as err:
        s.validate()
    assert err.value.invariant == "a task's state is the one its latest change made" and err.value.where == "x"


def test_changes_the_random_runs_seldom_make_are_in_the_table():
    """The journal's held results and a reattached thread's task, in debug mode (the fuzz runs
    in tests/unit/scheduler/test_state_fuzz.py check the common ones)."""
    s = SchedulerState(debug=True, prefetch=0, queue_roots=False)
    s.add_client("c")
    # released -> processing: a resubmitted task whose thread runs on a reattached worker
    s.add_worker("w", nthreads=1, now=0.0)
    s.worker_reattached("w", {}, ["r"], now=0.0)
    s.update_graph("c", [task("r")], ["r"])
    assert s.story("r") == [("released", "processing", "adopted-running", 0.0)]
    # erred -> memory: data scattered again under a failed key
    s.scatter("c", {"d": []}, {})
    s.scatter("c", {"d": ["w"]}, {"d": 8})
    assert [(o, n) for o, n, *_ in s.story("d")] == [("released", "erred"), ("erred", "memory")]
    s.validate()
    # held -> erred: a held result cancelled (recovery.py)
    held = TaskState("h", who_wants=frozenset({"c"}))
    s.tasks["h"] = held
    s._transition(held, "held", "rebuilt")
    held.held_by = {"w0"}
    s.cancel(["h"], "no")
    assert [(o, n) for o, n, *_ in s.story("h")] == [("released", "held"), ("held", "erred")]
