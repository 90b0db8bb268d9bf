"""A chain's next task, sent ahead to the worker running its input (scheduler/state/ahead.py).

The scheduler and the worker each apply one rule: the input finishes on the worker while the
worker holds the task => the task runs there. These tests drive both sides directly (no
sockets): the state machine for what it sends and records, a Worker for what it starts.
"""

from __future__ import annotations

import pytest

from hpc_cluster.scheduler.state.ahead import AHEAD_DEPTH
from hpc_cluster.scheduler.state import SchedulerState

from helpers.bare_worker import bare_worker, compute, finish
from helpers.tasks import sent, task


def chain_on_one_worker(length=3, **worker):
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0, **worker)
    keys = ["a", "b", "c"] if length == 3 else [f"t{i}" for i in range(length)]
    s.update_graph("c", [task(keys[0])] + [task(k, deps=[p]) for p, k in zip(keys, keys[1:])], keys[-1:])
    return s


def links(out, worker):
    return [(m["key"], m.get("after")) for m in sent(out, worker)]


# -- the scheduler --------------------------------------------------------------------
def test_the_next_links_are_sent_ahead_and_run_where_their_input_finished_without_a_message():
    n = AHEAD_DEPTH + 3
    s = chain_on_one_worker(n)
    t = [f"t{i}" for i in range(n)]
    # t0 placed; the next AHEAD_DEPTH links held on w behind it, each after the one before
    assert links(s.take_outbox(), "w") == [("t0", None)] + [(t[i], t[i - 1]) for i in range(1, AHEAD_DEPTH + 1)]
    assert all(s.tasks[k].state == "waiting" and s.tasks[k].ahead_on is s.workers["w"] for k in t[1:AHEAD_DEPTH + 1])
    assert s.tasks[t[AHEAD_DEPTH + 1]].ahead_on is None
    s.task_started("w", "t0", now=1)
    s.task_finished("w", "t0", nbytes=8)
    # t1 runs on w now, unasked; the window moves on by one link
    t1 = s.tasks["t1"]
    assert t1.state == "processing" and t1.processing_on is s.workers["w"] and t1.ahead_on is None
    assert links(s.take_outbox(), "w") == [(t[AHEAD_DEPTH + 1], t[AHEAD_DEPTH])]
    s.task_started("w", "t1", now=2)                     # the worker's own start is taken as any other
    assert t1.executing
    for i in range(1, n):
        s.task_started("w", t[i], now=2 + i)
        s.task_finished("w", t[i], nbytes=8)
    # every link after t0 ran held ahead: none was ever placed with a compute of its own
    assert all(after is not None for _, after in links(s.take_outbox(), "w"))
    assert s.tasks[t[-1]].state == "memory"


@pytest.mark.parametrize("stop", ["draining", "paused"])
def test_a_worker_that_may_not_take_tasks_has_its_held_copy_freed_and_the_task_placed_as_usual(stop):
    s = chain_on_one_worker()
    s.add_worker("v", nthreads=1, now=0)
    s.take_outbox()
    setattr(s.workers["w"], stop, True)
    s.task_finished("w", "a", nbytes=8)
    out = s.take_outbox()
    assert {"op": "free-keys", "keys": ["b"]} in out["w"]
    b = s.tasks["b"]
    assert b.ahead_on is None and b.processing_on is s.workers["v"]          # fetches a from w
    # placed there as usual, and c sent ahead behind it there
    assert [(m["key"], m.get("after")) for m in sent(out, "v")] == [("b", None), ("c", "b")]


def test_an_input_that_finishes_elsewhere_frees_the_held_copy():
    s = chain_on_one_worker()
    s.take_outbox()
    s.add_worker("v", nthreads=1, now=1)
    s.task_finished("v", "a", nbytes=8)                  # a copy that ran there first (reattached, stolen)
    out = s.take_outbox()
    assert {"op": "free-keys", "keys": ["b"]} in out["w"]
    assert s.tasks["b"].ahead_on is None and s.tasks["b"].state == "processing"


def test_a_failed_input_or_a_cancelled_chain_frees_the_held_copy():
    s = chain_on_one_worker()
    s.take_outbox()
    s.task_erred("w", "a", {"text": "boom"})
    assert {"op": "free-keys", "keys": ["b"]} in s.take_outbox()["w"]
    assert s.tasks["b"].state == "erred" and s.tasks["b"].ahead_on is None
    s = chain_on_one_worker()
    s.take_outbox()
    s.client_releases("c", ["c"])
    assert {"op": "free-keys", "keys": ["b"]} in s.take_outbox()["w"]


def test_only_chains_go_ahead_and_never_into_a_task_that_would_fetch():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.add_worker("v", nthreads=1, now=0)
    # a fan-out: its dependents are spread by placement, not all held on a's worker
    s.update_graph("c", [task("a")] + [task(f"d{i}", deps=["a"]) for i in range(3)], [f"d{i}" for i in range(3)])
    out = s.take_outbox()
    assert not [m for w in out for m in sent(out, w) if "after" in m]
    # another input held by a different worker: it would fetch, so placement decides
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.add_worker("v", nthreads=1, now=0)
    s.scatter("c", {"x": ["v"]}, {"x": 8})
    s.worker_memory("v", {"paused": True}, now=0)       # so a goes to w
    s.update_graph("c", [task("a"), task("b", deps=["a", "x"])], ["b"])
    out = s.take_outbox()
    assert [m["key"] for m in sent(out, "w")] == ["a"]
    assert s.tasks["b"].ahead_on is None


def test_a_dead_worker_forgets_what_it_held_and_charges_only_its_running_task():
    s = chain_on_one_worker()
    s.add_worker("v", nthreads=1, now=0)
    s.take_outbox()
    s.task_started("w", "a", now=1)
    death = s.remove_worker("w", now=2, death={"cause": "crash", "blame": True, "text": "segfault"})
    assert death["executing"] == ["a"]
    assert not s.tasks["b"].attempts
    out = s.take_outbox()
    # a goes to v, and the chain ahead behind it there
    assert links(out, "v") == [("a", None), ("b", "a"), ("c", "b")]


# -- the worker -----------------------------------------------------------------------
@pytest.fixture
def worker(monkeypatch):
    """A 1-thread worker whose task starts are recorded, not run."""
    w = bare_worker(monkeypatch)
    w.started = []
    monkeypatch.setattr(w.executor, "submit", lambda ts: w.started.append(ts.key))
    yield w
    w.executor.shutdown(wait=False)


def worker_ops(w):
    """(op, key) of what the worker sent the scheduler, in order."""
    return [(m["op"], m["key"]) for m in w.scheduler.sent if "key" in m]


def test_the_worker_starts_a_held_task_as_it_reports_the_input_no_round_trip(worker):
    compute(worker, "a")
    compute(worker, "b", deps=["a"], after="a")
    assert worker.started == ["a"] and "b" not in worker.tasks        # held, not fetching a
    finish(worker, "a")
    assert worker.started == ["a", "b"]
    # the input's result first, then the start: the scheduler promotes b on the first
    assert worker_ops(worker)[-2:] == [("task-finished", "a"), ("task-started", "b")]


def test_a_held_task_whose_input_is_already_here_starts_at_once(worker):
    compute(worker, "a")
    finish(worker, "a")                  # finished before the message sent ahead arrived
    compute(worker, "b", deps=["a"], after="a")
    assert worker.started == ["a", "b"]


def test_free_keys_drops_a_held_task_and_a_failed_input_does_not_start_it(worker):
    compute(worker, "a")
    compute(worker, "b", deps=["a"], after="a")
    worker._free(["b"])
    finish(worker, "a")
    assert worker.started == ["a"] and not worker.held_ahead and not worker.ahead_of
    compute(worker, "c")
    compute(worker, "d", deps=["c"], after="c")
    worker._done.append((worker.tasks["c"], ("error", ValueError("x"), "tb"), 0.001))
    worker._drain_done()
    # still held: only the scheduler decides (it frees d as it fails c)
    assert worker.started == ["a", "c"] and "d" in worker.held_ahead
    worker._free(["d"])
    assert not worker.held_ahead
