"""client.retry on the state machine (scheduler/state/retrying.py): failed tasks run again from
the root of their failure, their clients told first; what cannot be cured is left failed."""

from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.scheduler.state import SchedulerState
from helpers.tasks import computes, sent, task

ERROR = {"exception": Opaque(b"E"), "traceback": Opaque(b"T"), "text": "ValueError: no"}


def failed_chain() -> SchedulerState:
    """a -> b -> c, c wanted by client c1 and b by c2; a failed on worker w, so b and c failed
    with it. In debug mode: every change is checked against the transition table."""
    s = SchedulerState(prefetch=0, debug=True)
    s.add_worker("w", nthreads=1, now=0)
    for cid in ("c1", "c2"):
        s.add_client(cid)
    s.update_graph("c1", [task("a"), task("b", deps=["a"]), task("c", deps=["b"])], ["c"])
    s.update_graph("c2", [], ["b"])
    assert computes(s.take_outbox(), "w") == ["a"]
    s.task_erred("w", "a", ERROR)
    s.take_outbox()
    assert [s.tasks[k].state for k in "abc"] == ["erred"] * 3
    return s


def test_a_retry_runs_the_root_of_the_failure_again_and_tells_every_client_first():
    s = failed_chain()
    assert s.retry("c1", ["c"]) == ["a", "b", "c"]
    out = s.take_outbox()
    assert [m["key"] for m in sent(out, "c1", "task-retried")] == ["c"]
    assert [m["key"] for m in sent(out, "c2", "task-retried")] == ["b"]       # another client's future too
    assert computes(out, "w") == ["a"]
    assert [s.tasks[k].state for k in "abc"] == ["processing", "waiting", "waiting"]
    assert all(s.tasks[k].error is None for k in "abc")
    out = {}
    for key in "abc":                                 # each runs on w in turn (b, c sent ahead there)
        assert s.tasks[key].state == "processing" and s.tasks[key].processing_on.address == "w"
        s.task_finished("w", key, nbytes=8)
        for peer, msgs in s.take_outbox().items():
            out.setdefault(peer, []).extend(msgs)
    assert [m["key"] for m in sent(out, "c1", "key-in-memory")] == ["c"]
    assert [m["key"] for m in sent(out, "c2", "key-in-memory")] == ["b"]
    s.validate()


def test_the_story_says_retry():
    s = failed_chain()
    s.retry("c1", ["a"])
    assert ("erred", "released", "retry") in [(old, new, why) for old, new, why, _ in s.story("a")]


def test_a_retry_that_fails_again_fails_its_dependents_again():
    s = failed_chain()
    s.retry("c2", ["b"])
    s.take_outbox()
    s.task_erred("w", "a", ERROR)
    out = s.take_outbox()
    assert {m["key"] for m in sent(out, "c1", "task-erred")} == {"c"}
    assert s.tasks["c"].error["kind"] == "dependency" and s.tasks["c"].error["origin"] == "a"
    s.validate()


def test_a_killed_worker_retried_gets_its_allowed_failures_again():
    s = SchedulerState(prefetch=0, allowed_failures=0, debug=True)
    s.add_client("c")
    s.add_worker("w1", nthreads=1, now=0)
    s.update_graph("c", [task("x")], ["x"])
    s.take_outbox()
    s.task_started("w1", "x")
    s.remove_worker("w1", now=1, death={"cause": "crash", "blame": True, "text": "SIGSEGV"})
    assert s.tasks["x"].state == "erred" and s.tasks["x"].error["kind"] == "killed-worker"
    s.add_worker("w2", nthreads=1, now=2)
    s.take_outbox()
    assert s.retry("c", ["x"]) == ["x"]
    assert s.tasks["x"].attempts == () and computes(s.take_outbox(), "w2") == ["x"]
    s.task_finished("w2", "x", nbytes=8)
    assert s.tasks["x"].state == "memory"
    s.validate()


def test_what_no_retry_can_cure_and_what_is_not_failed_are_left_as_they_are():
    s = SchedulerState(prefetch=0, debug=True)
    s.add_client("c")
    s.add_worker("w", nthreads=1, now=0)
    # an input released before its dependent was submitted: the dependent has no edge to it
    s.update_graph("c", [task("orphan", deps=["gone"])], ["orphan"])
    assert s.tasks["orphan"].error["kind"] == "missing"
    s.update_graph("c", [task("done")], ["done"])
    s.take_outbox()
    s.task_finished("w", "done", nbytes=8)
    s.take_outbox()
    assert s.retry("c", ["orphan", "done", "unknown"]) == []
    out = s.take_outbox()
    assert s.tasks["orphan"].state == "erred"
    # a key in memory is told again to the client that asked (its future may have been
    # cancelled on the client's side only), and to no one else
    assert [m["op"] for m in out["c"]] == ["task-retried", "key-in-memory"]
    assert [m["key"] for m in out["c"]] == ["done", "done"]
    assert s.retry("someone-else", ["done"]) == [] and not s.take_outbox()
    s.validate()


def test_a_cancelled_task_runs_when_retried():
    s = SchedulerState(prefetch=0, debug=True)
    s.add_client("c")
    s.update_graph("c", [task("x")], ["x"])
    s.cancel(["x"], "cancelled by the user")
    assert s.tasks["x"].error["kind"] == "cancelled"
    s.take_outbox()
    assert s.retry("c", ["x"]) == ["x"]
    s.add_worker("w", nthreads=1, now=0)
    assert computes(s.take_outbox(), "w") == ["x"]
    s.validate()
