"""The state machine's side of reattaching (scheduler/state/reattach.py), driven directly: workers that
come back with results and running threads, clients that want their keys again, the windows."""

from hpc_cluster.scheduler.state import SchedulerState
from helpers.tasks import computes, sent, task


def restarted(claim_window=10.0):
    s = SchedulerState(prefetch=0, queue_roots=False, debug=True)     # every change checked (transitions.py)
    s.claim_window = claim_window
    s.add_client("c")
    return s


def test_held_results_of_known_tasks_are_taken_and_failed_ones_dropped():
    s = restarted()
    s.update_graph("c", [task("a"), task("b", deps=["a"]), task("bad")], ["b", "bad"])
    s.cancel(["bad"], "gone")
    s.take_outbox()
    s.add_reattached_worker("w", 1, 1, {"a": 8, "bad": 8}, [])
    out = s.take_outbox()
    assert computes(out, "w") == ["b"]                      # a is not computed again: b runs on it
    assert s.tasks["a"].state == "memory"
    assert [ws.address for ws in s.tasks["a"].who_has] == ["w"]
    assert sent(out, "w", "free-keys") == [{"op": "free-keys", "keys": ["bad"]}]


def test_unknown_results_wait_unclaimed_for_a_resubmission_then_go():
    s = restarted(claim_window=10)
    s.add_worker("w", nthreads=1, now=0)
    s.worker_reattached("w", {"x": 8, "y": 8}, [], now=0)
    assert s.take_outbox() == {}                            # kept: a client may want them back
    s.update_graph("c", [task("x"), task("z", deps=["x"])], ["z"])
    out = s.take_outbox()
    assert computes(out, "w") == ["z"]                      # x is in memory already
    s.tick(5)
    assert s.take_outbox() == {}
    s.tick(10.5)                                            # y's window ended: the worker drops it
    assert sent(s.take_outbox(), "w", "free-keys") == [{"op": "free-keys", "keys": ["y"]}]
    assert s.unclaimed == {}


def test_a_thread_running_through_the_restart_keeps_its_slot_and_its_task():
    s = restarted()
    s.add_worker("w", nthreads=1, now=0)
    s.worker_reattached("w", {}, ["r"], now=0)
    s.update_graph("c", [task("other")], ["other"])
    assert computes(s.take_outbox(), "w") == []             # its one thread is busy with r
    s.update_graph("c", [task("r")], ["r"])                 # the client resubmits r: adopted, not sent
    assert s.tasks["r"].state == "processing" and s.tasks["r"].executing
    assert computes(s.take_outbox(), "w") == []
    s.task_finished("w", "r", nbytes=8)
    out = s.take_outbox()
    assert sent(out, "c", "key-in-memory")[0]["key"] == "r" and computes(out, "w") == ["other"]


def test_a_finished_thread_of_an_unknown_task_is_kept_for_the_client_that_wants_it():
    s = restarted()
    s.add_worker("w", nthreads=1, now=0)
    s.worker_reattached("w", {}, ["r"], now=0)
    s.task_finished("w", "r", nbytes=8)
    assert s.take_outbox() == {}                            # not dropped: unclaimed
    s.client_wants("c", ["r"], now=1)
    assert sent(s.take_outbox(), "c", "key-in-memory") == [{"op": "key-in-memory", "key": "r", "nbytes": 8}]


def test_a_wanted_key_waits_for_its_worker_then_fails_as_lost():
    s = restarted(claim_window=10)
    s.client_wants("c", ["late", "never"], now=0)
    assert s.take_outbox() == {}
    s.add_worker("w", nthreads=1, now=3)
    s.worker_reattached("w", {"late": 16}, [], now=3)
    assert sent(s.take_outbox(), "c", "key-in-memory") == [{"op": "key-in-memory", "key": "late", "nbytes": 16}]
    s.tick(11)
    [err] = sent(s.take_outbox(), "c", "task-erred")
    assert err["key"] == "never" and err["error"]["kind"] == "lost-data"


def test_placement_is_held_while_workers_report():
    s = restarted()
    s.hold_placement(5.0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [task("t")], ["t"])
    assert computes(s.take_outbox(), "w") == []
    s.tick(4)
    assert computes(s.take_outbox(), "w") == []
    s.tick(5)
    assert computes(s.take_outbox(), "w") == ["t"]
