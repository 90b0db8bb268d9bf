"""The scheduler's state machine, driven directly: no sockets, no clocks."""

import math

import pytest

from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.scheduler.state.placement import ROOT_SATURATION
from hpc_cluster.scheduler.state import SchedulerState
from helpers.tasks import computes, sent, task


def aheads(out, worker):
    """The tasks sent ahead to `worker`, held there until their input finishes (ahead.py)."""
    return [(m["key"], m["after"]) for m in out.get(worker, []) if m["op"] == "compute" and "after" in m]


def promoted(s, key, worker):
    """`key` now runs on `worker` because its input finished there: no message needed."""
    ts = s.tasks[key]
    return ts.state == "processing" and ts.processing_on.address == worker and ts.ahead_on is None


def test_tasks_wait_at_the_scheduler_not_on_a_worker():
    s = SchedulerState(prefetch=1, queue_roots=False)
    s.add_worker("w1", nthreads=2, now=0)
    s.update_graph("c", [task(f"t{i}") for i in range(10)], [f"t{i}" for i in range(10)])
    out = s.take_outbox()
    assert computes(out, "w1") == ["t0", "t1", "t2"]          # nthreads + prefetch, in order
    assert s.counts() == {"processing": 3, "queued": 7}
    s.task_finished("w1", "t0", nbytes=8)
    out = s.take_outbox()
    assert computes(out, "w1") == ["t3"]
    assert sent(out, "c", "key-in-memory")[0]["key"] == "t0"


def test_root_tasks_wait_for_a_slot_and_their_dependents_are_prefetched():
    # dask's root-task queuing: a task without inputs goes to a worker only while it has a
    # root slot (threads x placement.ROOT_SATURATION, rounded up), so results are not made
    # faster than their dependents use them; a dependent still takes a prefetch slot, and
    # very short root tasks (learned) are prefetched as before.
    s = SchedulerState(prefetch=2)
    s.add_worker("w1", nthreads=1, now=0)
    s.update_graph("c", [task(f"r{i}") for i in range(6)] + [task("d0", deps=["r0"])],
                   [f"r{i}" for i in range(6)] + ["d0"])
    one = math.ceil(ROOT_SATURATION)
    out = s.take_outbox()
    assert computes(out, "w1") == [f"r{i}" for i in range(one)]
    assert aheads(out, "w1") == [("d0", "r0")]                        # the dependent waits there for r0
    s.task_started("w1", "r0", now=0)
    s.task_finished("w1", "r0", nbytes=8, duration=0.5)
    # The dependent, held there, runs first: no root slot until it is done (results are
    # not made faster than their dependents use them)
    assert computes(s.take_outbox(), "w1") == [] and promoted(s, "d0", "w1")
    s.task_started("w1", "d0", now=0)
    s.task_finished("w1", "d0", nbytes=8, duration=0.5)
    assert computes(s.take_outbox(), "w1") == [f"r{one}"]              # the freed root slot
    s.task_started("w1", "r1", now=0)
    assert computes(s.take_outbox(), "w1") == []
    s.add_worker("w4", nthreads=4, now=0)
    four = math.ceil(4 * ROOT_SATURATION)
    assert computes(s.take_outbox(), "w4") == [f"r{i}" for i in range(one + 1, min(6, one + 1 + four))]
    # roots learned to take under SHORT_ROOT are prefetched up to nthreads + prefetch (without
    # the deeper queue of short tasks, test_short_tasks_are_prefetched_deeply)
    s2 = SchedulerState(prefetch=2, prefetch_seconds=0)
    s2.add_worker("w1", nthreads=1, now=0)
    keys = [f"f-{i:032x}" for i in range(6)]                  # one function: one learned duration
    s2.update_graph("c", [task(keys[0])], keys[:1])
    s2.take_outbox()
    s2.task_finished("w1", keys[0], nbytes=8, duration=0.001)
    s2.update_graph("c", [task(k) for k in keys[1:]], keys[1:])
    assert computes(s2.take_outbox(), "w1") == keys[1:4]


def test_priority_then_submission_order():
    s = SchedulerState(prefetch=0)
    s.update_graph("c", [task("low"), task("high", priority=10), task("low2")], ["low", "high", "low2"])
    s.add_worker("w1", nthreads=1, now=0)
    assert computes(s.take_outbox(), "w1") == ["high"]
    s.task_finished("w1", "high", 1)
    assert computes(s.take_outbox(), "w1") == ["low"]


def test_priorities_at_the_ends_of_the_range_order_and_reach_workers_as_pairs():
    """A task's priority is one int (56 B less than a tuple per task); workers and journals
    still get [-priority, order], which must come out the same for every allowed priority."""
    from hpc_cluster.scheduler.state.records import priority_from_pair, priority_of, priority_pair
    top = 2**63 - 1
    s = SchedulerState(prefetch=0)
    s.update_graph("c", [task("low", priority=-top), task("mid"), task("high", priority=top),
                         task("mid2"), task("neg", priority=-1)], ["low", "mid", "high", "mid2", "neg"])
    s.add_worker("w1", nthreads=1, now=0)
    order = []
    for _ in range(5):
        msgs = [m for m in s.take_outbox().get("w1", []) if m["op"] == "compute"]
        assert len(msgs) == 1
        order.append(msgs[0]["key"])
        pair = msgs[0]["priority"]
        assert priority_from_pair(pair) == s.tasks[msgs[0]["key"]].priority
        assert all(-(2**63) <= v < 2**64 for v in pair)               # msgpack packs it
        s.task_finished("w1", msgs[0]["key"], 1)
    assert order == ["high", "mid", "mid2", "neg", "low"]
    for user in (top, -top, 0, 5, -5):
        for seq in (0, 1, 2**40):
            assert priority_pair(priority_of(user, seq)) == [-user, seq]
    assert priority_from_pair([3]) == priority_of(-3, 0)                # an older journal's


def test_placement_prefers_worker_holding_inputs():
    s = SchedulerState(prefetch=0)
    s.add_worker("w1", nthreads=1, now=0)
    s.add_worker("w2", nthreads=1, now=0)
    s.update_graph("c", [task("x")], ["x"])
    out = s.take_outbox()
    holder = "w1" if computes(out, "w1") else "w2"
    s.task_finished(holder, "x", nbytes=10_000)
    s.update_graph("c", [task("y", deps=["x"])], ["y"])
    out = s.take_outbox()
    assert computes(out, holder) == ["y"]
    assert out[holder][-1]["deps"] == {"x": [holder]}


def test_a_task_with_large_inputs_waits_for_their_busy_worker_instead_of_copying_them():
    # x (100 MB) is on w1, which is busy with a task (0.5 s when nothing is known); w2 is
    # free. Copying x would take ~1 s (and a second copy in memory): y waits for w1. A small
    # input, or a long queue on the holder, is copied to the free worker as before.
    s = SchedulerState(prefetch=0)
    s.add_worker("w1", nthreads=1, now=0)
    s.update_graph("c", [task("x")], ["x"])
    s.take_outbox()
    s.task_finished("w1", "x", nbytes=100_000_000, duration=0.1)
    s.update_graph("c", [task("busy")], ["busy"])
    s.task_started("w1", "busy", now=s.now)
    s.add_worker("w2", nthreads=1, now=0)
    s.update_graph("c", [task("y", deps=["x"])], ["y"])
    out = s.take_outbox()
    assert computes(out, "w2") == [] and s.tasks["y"].state == "queued"
    s.task_finished("w1", "busy", nbytes=8, duration=0.1)
    assert computes(s.take_outbox(), "w1") == ["y"]
    # a small input moves to the free worker at once
    s.task_finished("w1", "y", nbytes=100, duration=0.1)
    s.take_outbox()
    s.update_graph("c", [task("busy2"), task("busy3")], ["busy2", "busy3"])
    s.take_outbox()
    for k in ("busy2", "busy3"):
        s.task_started(s.tasks[k].processing_on.address, k, now=s.now)
    s.add_worker("w3", nthreads=1, now=0)
    s.update_graph("c", [task("z", deps=["y"])], ["z"])
    assert computes(s.take_outbox(), "w3") == ["z"]


def test_slices_of_a_large_block_stay_with_it_while_durations_are_unknown():
    # A rechunk cuts a 143 MB block on w1 into slices. w1's slots fill with slices whose run
    # time nobody knows yet; the next slice waits for w1 instead of copying the whole block
    # to w2 (counted at dask's 0.5 s each, three unknown tasks looked longer than the 1.4 s
    # copy). Once the slices are known to take 2 s each, the queue is long: the next one moves.
    s = SchedulerState(prefetch=2)
    s.add_worker("w1", nthreads=1, now=0)
    s.update_graph("c", [task("block")], ["block"])
    s.take_outbox()
    s.add_worker("w2", nthreads=1, now=0)
    s.task_finished("w1", "block", nbytes=143_000_000, duration=0.1)
    slices = [task(f"slice-{i:016x}", deps=["block"]) for i in range(5)]
    s.update_graph("c", slices, [t["key"] for t in slices])
    out = s.take_outbox()
    assert len(computes(out, "w1")) == 3 and computes(out, "w2") == []
    first = computes(out, "w1")[0]
    s.task_started("w1", first, now=s.now)
    s.durations.learn("slice-ffffffffffffffff", 2.0)  # slices are now known to be slow
    s.add_worker("w3", nthreads=1, now=0)             # a free worker: the next slice may move there
    assert computes(s.take_outbox(), "w3") != []


def test_dependencies_and_release_of_intermediates():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [task("a"), task("b", deps=["a"])], ["b"])
    out = s.take_outbox()
    assert computes(out, "w") == ["a"] and aheads(out, "w") == [("b", "a")]
    s.task_finished("w", "a", 1)
    out = s.take_outbox()
    assert computes(out, "w") == [] and promoted(s, "b", "w")
    assert not sent(out, "c", "key-in-memory")                   # nobody wants 'a'
    s.task_finished("w", "b", 1)
    out = s.take_outbox()
    assert {"op": "free-keys", "keys": ["a"]} in out["w"]       # intermediate freed
    assert s.tasks["a"].state == "released"                     # but kept for lineage
    s.client_releases("c", ["b"])
    out = s.take_outbox()
    assert {"op": "free-keys", "keys": ["b"]} in out["w"]
    assert s.tasks == {}                                         # everything forgotten


def test_error_propagates_to_dependents_and_keeps_exception():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [task("a"), task("b", deps=["a"]), task("c2", deps=["b"])], ["a", "c2"])
    s.take_outbox()
    s.task_erred("w", "a", {"exception": Opaque(b"E"), "traceback": Opaque(b"T"), "text": "ZeroDivisionError"})
    out = s.take_outbox()
    erred = {m["key"]: m["error"] for m in sent(out, "c", "task-erred")}
    assert erred["a"]["kind"] == "exception" and erred["a"]["exception"] == Opaque(b"E")
    assert erred["c2"]["kind"] == "dependency" and erred["c2"]["origin"] == "a"
    assert s.tasks["b"].state == "erred"


def test_retries_rerun_before_failing():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [task("a", retries=1)], ["a"])
    s.take_outbox()
    s.task_erred("w", "a", {"text": "boom"})
    out = s.take_outbox()
    assert computes(out, "w") == ["a"] and not sent(out, "c", "task-erred")
    s.task_erred("w", "a", {"text": "boom"})
    assert sent(s.take_outbox(), "c", "task-erred")


def test_worker_death_charges_only_executing_tasks():
    s = SchedulerState(prefetch=2, allowed_failures=0, queue_roots=False)
    s.add_worker("w1", nthreads=1, now=0)
    s.update_graph("c", [task("run"), task("queued1"), task("queued2")], ["run", "queued1", "queued2"])
    s.take_outbox()
    s.task_started("w1", "run")
    record = s.remove_worker("w1", now=5, death={"cause": "crash", "blame": True, "text": "SIGSEGV"})
    assert record["executing"] == ["run"] and sorted(record["processing"]) == ["queued1", "queued2", "run"]
    out = s.take_outbox()
    killed = sent(out, "c", "task-erred")
    assert [m["key"] for m in killed] == ["run"]
    assert killed[0]["error"]["kind"] == "killed-worker"
    assert killed[0]["error"]["attempts"][0]["cause"] == "crash"
    assert s.tasks["queued1"].state == "queued" and not s.tasks["queued1"].attempts


def test_innocent_deaths_are_not_charged_and_verdict_can_be_refined():
    s = SchedulerState(prefetch=0, allowed_failures=1)
    for i in range(3):
        s.add_worker(f"w{i}", nthreads=1, now=i)
        s.update_graph("c", [task("t")], ["t"]) if i == 0 else None
        s.take_outbox()
        s.task_started(f"w{i}", "t")
        s.remove_worker(f"w{i}", now=i + 0.5, death={"cause": "connection-lost", "blame": False})
    assert s.tasks["t"].state == "queued"
    assert len(s.tasks["t"].attempts) == 3
    # Later evidence says two of those deaths were the task's fault: now it fails.
    s.refine_death(0, "memory-nanny", True, "over budget")
    assert s.tasks["t"].state == "queued"
    s.refine_death(1, "crash", True, "SIGSEGV")
    assert s.tasks["t"].state == "erred"
    err = s.tasks["t"].error
    assert err["kind"] == "killed-worker" and [a["cause"] for a in err["attempts"]] == [
        "memory-nanny", "crash", "connection-lost"]


def test_lost_result_is_recomputed_from_lineage():
    s = SchedulerState(prefetch=0)
    s.add_worker("w1", nthreads=1, now=0)
    s.update_graph("c", [task("a"), task("b", deps=["a"])], ["b"])
    s.take_outbox()
    s.task_finished("w1", "a", 1)
    s.task_finished("w1", "b", 1)
    s.take_outbox()
    assert s.tasks["a"].state == "released"
    s.add_worker("w2", nthreads=1, now=1)
    s.remove_worker("w1", now=2, death={"cause": "connection-lost", "blame": False})
    out = s.take_outbox()
    assert computes(out, "w2") == ["a"]                         # recompute the input first
    assert aheads(out, "w2") == [("b", "a")]
    assert sent(out, "c", "key-recomputing")[0]["key"] == "b"
    s.task_finished("w2", "a", 1)
    assert computes(s.take_outbox(), "w2") == [] and promoted(s, "b", "w2")
    s.task_finished("w2", "b", 1)
    assert sent(s.take_outbox(), "c", "key-in-memory")[0]["key"] == "b"


def test_scattered_data_lost_with_its_only_holder():
    s = SchedulerState()
    s.add_worker("w1", nthreads=1, now=0)
    s.scatter("c", {"d": ["w1"]}, {"d": 10})
    s.update_graph("c", [task("use", deps=["d"])], ["use"])
    s.take_outbox()
    s.remove_worker("w1", now=1, death={"cause": "connection-lost", "blame": False})
    out = s.take_outbox()
    errs = {m["key"]: m["error"] for m in sent(out, "c", "task-erred")}
    assert errs["d"]["kind"] == "lost-data" and "replicate" in errs["d"]["text"]
    assert errs["use"]["kind"] == "dependency" and errs["use"]["origin"] == "d"


def test_data_scattered_again_to_no_live_worker_stays_where_it_is():
    # A key already in memory, scattered again (same key: same data) by a client whose worker
    # just died: the copy on w1 is still there. It used to go memory -> erred with w1 still
    # holding it (an invalid transition: debug mode raises on it, validate() would not pass).
    s = SchedulerState(debug=True)
    s.add_client("c")
    s.add_client("c2")
    s.add_worker("w1", nthreads=1, now=0)
    s.scatter("c", {"d": ["w1"]}, {"d": 10})
    s.take_outbox()
    s.scatter("c2", {"d": ["gone"]}, {"d": 10})
    assert s.tasks["d"].state == "memory" and [w.address for w in s.tasks["d"].who_has] == ["w1"]
    assert sent(s.take_outbox(), "c2", "key-in-memory")[0]["key"] == "d"
    s.validate()


def test_resources_restrict_placement():
    s = SchedulerState(prefetch=0)
    s.add_worker("cpu", nthreads=2, now=0)
    s.add_worker("gpu", nthreads=2, now=0, resources={"GPU": 1})
    s.update_graph("c", [task("g1", resources={"GPU": 1}), task("g2", resources={"GPU": 1})], ["g1", "g2"])
    out = s.take_outbox()
    assert computes(out, "gpu") == ["g1"] and computes(out, "cpu") == []
    s.task_finished("gpu", "g1", 1)
    assert computes(s.take_outbox(), "gpu") == ["g2"]


def test_missing_input_reported_by_worker_is_refetched_or_recomputed():
    s = SchedulerState(prefetch=0)
    s.add_worker("w1", nthreads=1, now=0)
    s.add_worker("w2", nthreads=1, now=0)
    s.update_graph("c", [task("a")], ["a"])
    out = s.take_outbox()
    holder = "w1" if computes(out, "w1") else "w2"
    other = "w2" if holder == "w1" else "w1"
    s.task_finished(holder, "a", 1)
    s.take_outbox()
    s.remove_worker(holder, 1, {"cause": "connection-lost", "blame": False})
    s.take_outbox()
    s.task_finished(other, "a", 1)
    s.update_graph("c", [task("b", deps=["a"])], ["b"])
    s.take_outbox()
    s.missing_data(other, "b", "a", [other])                   # its own copy vanished
    out = s.take_outbox()
    assert computes(out, other) == ["a"] and aheads(out, other) == [("b", "a")]


def test_cancel_marks_task_and_dependents():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [task("a"), task("b", deps=["a"])], ["a", "b"])
    s.take_outbox()
    s.cancel(["a"], "cancelled by the user")
    out = s.take_outbox()
    assert {"op": "free-keys", "keys": ["a"]} in out["w"]
    kinds = {m["key"]: m["error"]["kind"] for m in sent(out, "c", "task-erred")}
    assert kinds == {"a": "cancelled", "b": "dependency"}


def test_heartbeat_silence_is_detected_by_time_passed_in():
    s = SchedulerState()
    s.add_worker("w", nthreads=1, now=100.0)
    assert s.silent_workers(now=102.0, ttl=5) == []
    s.heartbeat("w", now=104.0)
    assert s.silent_workers(now=108.0, ttl=5) == []
    assert s.silent_workers(now=109.5, ttl=5) == ["w"]


def test_client_disconnect_releases_its_work():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [task("a"), task("b")], ["a", "b"])
    s.take_outbox()
    s.remove_client("c")
    out = s.take_outbox()
    assert {"op": "free-keys", "keys": ["a"]} in out["w"]
    assert s.tasks == {}


def test_a_cancelled_task_still_running_keeps_its_slot_until_the_thread_is_free():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [task("long"), task("next")], ["long", "next"])
    s.take_outbox()
    s.task_started("w", "long", now=1)
    s.cancel(["long"], "cancelled by the user")
    out = s.take_outbox()
    assert computes(out, "w") == []                      # the thread is still busy with 'long'
    s.abandoned_done("w", "long")
    assert computes(s.take_outbox(), "w") == ["next"]


def test_a_task_released_while_running_and_submitted_again_is_finished_by_the_running_thread():
    # Found in an audit: the same key submitted again while its abandoned thread still ran
    # went back to that worker, which ignored the compute; the task stayed processing forever.
    s = SchedulerState(prefetch=1)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [task("pure")], ["pure"])
    s.take_outbox()
    s.task_started("w", "pure", now=1)
    s.client_releases("c", ["pure"])                     # the future was dropped
    assert "pure" not in s.tasks and s.workers["w"].abandoned == {"pure"}
    s.update_graph("c", [task("pure")], ["pure"])        # ... and the same key submitted again
    assert computes(s.take_outbox(), "w") == ["pure"]    # the worker takes over its running thread
    s.task_started("w", "pure", now=2)
    s.task_finished("w", "pure", 8, duration=3.0)
    out = s.take_outbox()
    assert [m["key"] for m in sent(out, "c", "key-in-memory")] == ["pure"]
    assert s.workers["w"].abandoned == set()             # its slot is free again
    assert s.workers["w"] in s._free


def test_replicas_are_restored_when_a_new_worker_joins():
    s = SchedulerState()
    s.add_worker("w1", nthreads=1, now=0)
    s.add_worker("w2", nthreads=1, now=0)
    s.scatter("c", {"d": ["w1"]}, {"d": 10})
    s.replicate(["d"], 2)
    assert [m["key"] for m in sent(s.take_outbox(), "w2", "fetch-replica")] == ["d"]
    s.add_replica("w2", "d", 10)
    s.remove_worker("w1", now=1, death={"cause": "connection-lost", "blame": False})
    assert not sent(s.take_outbox(), "w2", "fetch-replica")        # no spare worker: one copy left
    s.add_worker("w3", nthreads=1, now=2)                         # a replacement joins
    fetch = sent(s.take_outbox(), "w3", "fetch-replica")
    assert fetch and fetch[0]["key"] == "d" and fetch[0]["holders"] == ["w2"]
    s.add_replica("w3", "d", 10)
    assert {ws.address for ws in s.tasks["d"].who_has} == {"w2", "w3"}


def test_a_task_is_failed_only_on_final_verdicts_and_held_back_until_then():
    s = SchedulerState(prefetch=0, allowed_failures=0)
    s.add_worker("w1", nthreads=1, now=0)
    s.add_worker("w2", nthreads=1, now=0)
    s.update_graph("c", [task("t")], ["t"])
    first = [w for w, msgs in s.take_outbox().items() if any(m["op"] == "compute" for m in msgs)][0]
    other = "w2" if first == "w1" else "w1"
    s.task_started(first, "t", now=1)
    # The nanny said SIGSEGV at once; accounting is still to come (final_at None).
    s.remove_worker(first, now=2, death={"cause": "crash", "blame": True, "text": "SIGSEGV",
                                         "final_at": None})
    out = s.take_outbox()
    assert s.tasks["t"].state == "queued" and not sent(out, "c", "task-erred")
    assert computes(out, other) == []                    # held back: not started on another worker yet
    # sacct: the job was cancelled by a user; the task did nothing wrong.
    s.refine_death(0, "cancelled", False, "job 5 was cancelled by uid 0", final_at=3)
    assert computes(s.take_outbox(), other) == ["t"]
    s.task_started(other, "t", now=4)
    s.remove_worker(other, now=5, death={"cause": "crash", "blame": True, "text": "SIGSEGV", "final_at": None})
    assert s.tasks["t"].state == "queued"
    s.refine_death(1, "crash", True, "signal 11 (SIGSEGV), sacct FAILED 0:11", final_at=6)
    err = s.tasks["t"].error
    assert s.tasks["t"].state == "erred" and err["kind"] == "killed-worker"
    assert [(a["cause"], a["blame"]) for a in err["attempts"]] == [("cancelled", False), ("crash", True)]
    assert err["attempts"][1]["text"] == "signal 11 (SIGSEGV), sacct FAILED 0:11"


def test_a_task_that_meets_the_walltime_every_time_fails_with_the_walltime():
    from hpc_cluster.client.exceptions import TaskWalltimeError, error_from_record

    s = SchedulerState(prefetch=0, walltime_failures=1)
    s.update_graph("c", [task("long")], ["long"])
    for i, cause in enumerate(["crash-free", "walltime", "walltime"]):
        w = f"w{i}"
        s.add_worker(w, nthreads=1, now=100 * i, info={"job_walltime": 60})
        s.take_outbox()
        s.task_started(w, "long", now=100 * i)
        death = ({"cause": "connection-lost", "blame": False} if cause == "crash-free"
                 else {"cause": "walltime", "blame": False, "text": "job reached its time limit"})
        s.remove_worker(w, now=100 * i + 58, death=death)
        if i < 2:
            assert s.tasks["long"].state == "queued"     # innocent: retried without charge
    err = s.tasks["long"].error
    assert err["walltime_exceeded"] and err["walltime"] == 60 and err["ran_for"] == [58, 58]
    exc = error_from_record("long", err, load=None)
    assert isinstance(exc, TaskWalltimeError)
    # Three deaths, of which two were the walltime: the message counts those two.
    assert "(60 s)" in str(exc) and "ran out 2 times" in str(exc) and "58 s, 58 s" in str(exc), str(exc)


def test_a_task_longer_than_any_jobs_walltime_fails_instead_of_waiting_forever():
    from hpc_cluster.client.exceptions import TaskTooLongError, error_from_record

    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0, deadline=60, info={"job_walltime": 60})
    s.update_graph("c", [{**task("huge"), "duration": 600}, {**task("fits"), "duration": 30}], ["huge", "fits"])
    out = s.take_outbox()
    assert computes(out, "w") == ["fits"]
    err = sent(out, "c", "task-erred")[0]["error"]
    assert err["kind"] == "too-long" and err["walltime"] == 60 and err["expected"] == 600
    exc = error_from_record("huge", err, load=None)
    assert isinstance(exc, TaskTooLongError) and "walltime=" in str(exc) and "600 s" in str(exc)
    # Where a worker without a walltime exists (or may come), a long task waits for it instead.
    s2 = SchedulerState(prefetch=0)
    s2.add_worker("w", nthreads=1, now=0, deadline=60, info={"job_walltime": 60})
    s2.add_worker("local", nthreads=1, now=0)
    s2.update_graph("c", [{**task("huge"), "duration": 600}], ["huge"])
    assert computes(s2.take_outbox(), "local") == ["huge"]


def test_a_task_longer_than_every_workers_lifetime_fails_and_says_raise_lifetime():
    # --lifetime bounds a worker as a walltime does (here: in 1-hour jobs, or in no job at all).
    from hpc_cluster.client.exceptions import error_from_record

    for info in ({"job_walltime": 3600, "lifetime": 120}, {"lifetime": 120}):
        s = SchedulerState(prefetch=0)
        s.add_worker("w", nthreads=1, now=0, deadline=120, info=dict(info, lifetime_end=120))
        s.update_graph("c", [{**task("huge"), "duration": 600}], ["huge"])
        err = sent(s.take_outbox(), "c", "task-erred")[0]["error"]
        assert err["kind"] == "too-long" and err["walltime"] == 120, info
        text = str(error_from_record("huge", err, load=None))
        assert "a worker's whole lifetime (--lifetime) is 120 s" in text and "Raise --lifetime" in text


def test_an_open_verdict_that_could_still_turn_blamed_holds_the_task_at_its_limit():
    # Seen in the memory benchmark: the 4th death read connection-lost until the nanny's
    # report came; the task was started again meanwhile and killed a 5th worker.
    s = SchedulerState(prefetch=0, allowed_failures=1)
    s.add_worker("w1", nthreads=1, now=0)
    s.update_graph("c", [task("hog")], ["hog"])
    s.take_outbox()
    s.task_started("w1", "hog", now=1)
    s.remove_worker("w1", now=2, death={"cause": "memory-nanny", "blame": True})            # final
    s.add_worker("w2", nthreads=1, now=2)
    assert computes(s.take_outbox(), "w2") == ["hog"]                  # one charge left: try again
    s.task_started("w2", "hog", now=3)
    s.remove_worker("w2", now=4, death={"cause": "connection-lost", "blame": False, "final_at": None})
    s.add_worker("w3", nthreads=1, now=4)
    assert computes(s.take_outbox(), "w3") == []                       # held: it may be the 2nd charge
    s.refine_death(1, "memory-nanny", True, "over budget", final_at=5)
    assert s.tasks["hog"].state == "erred"
    # Had the verdict stayed innocent, it would have run again at once.
    s2 = SchedulerState(prefetch=0, allowed_failures=1)
    s2.add_worker("w1", nthreads=1, now=0)
    s2.update_graph("c", [task("t")], ["t"])
    s2.take_outbox()
    s2.task_started("w1", "t", now=1)
    s2.remove_worker("w1", now=2, death={"cause": "connection-lost", "blame": False, "final_at": None})
    s2.add_worker("w2", nthreads=1, now=2)
    assert computes(s2.take_outbox(), "w2") == ["t"]                   # 0 + 1 open <= 1: no need to wait


def test_a_compute_message_carries_the_sizes_of_the_inputs_the_worker_must_fetch():
    # The worker fetches large inputs only for a task a thread is free for (worker.py,
    # FETCH_AHEAD_BYTES): it needs their sizes, which only the scheduler knows.
    s = SchedulerState(prefetch=2, queue_roots=False)
    s.add_worker("w1", nthreads=1, now=0)
    s.add_worker("w2", nthreads=1, now=0)
    s.update_graph("c", [task("a"), task("b")], ["a", "b"])
    out = s.take_outbox()
    on = {k: w for w in ("w1", "w2") for k in computes(out, w)}
    s.task_finished(on["a"], "a", nbytes=80_000_000)
    s.task_finished(on["b"], "b", nbytes=1_000)
    s.update_graph("c", [task("m", deps=["a", "b"])], ["m"])
    out = s.take_outbox()
    msg = next(m for w in ("w1", "w2") for m in out.get(w, []) if m["op"] == "compute" and m["key"] == "m")
    here = "a" if computes(out, on["a"]) else "b"
    elsewhere = {"a": "b", "b": "a"}[here]
    assert msg["sizes"] == {elsewhere: {"a": 80_000_000, "b": 1_000}[elsewhere]}


def _short_map(s, n, duration):
    """A map of `n` tasks of one function, after one of them ran for `duration` seconds (learned)."""
    keys = [f"f-{i:032x}" for i in range(n + 1)]
    s.update_graph("c", [task(keys[0])], keys[:1])
    w = next(iter(s.take_outbox()))
    s.task_started(w, keys[0], now=0)
    s.task_finished(w, keys[0], nbytes=8, duration=duration)
    s.update_graph("c", [task(k) for k in keys[1:]], keys[1:])
    return keys[1:]


def test_short_tasks_are_prefetched_deeply():
    # Lever 1 of BENCHMARKS.md: tasks known to take ~100 us are sent beyond the base slots, up to
    # PREFETCH_SECONDS of expected work per thread waiting (bounded by MAX_PREFETCH_PER_THREAD);
    # tasks of a second stay at nthreads + prefetch, so a death touches few of them.
    from hpc_cluster.scheduler.state.prefetch import MAX_PREFETCH_PER_THREAD, PREFETCH_SECONDS
    s = SchedulerState(prefetch=2)
    s.add_worker("w1", nthreads=1, now=0)
    keys = _short_map(s, 100, 0.0001)
    sent = computes(s.take_outbox(), "w1")
    expected = 1 + 2 + min(MAX_PREFETCH_PER_THREAD, round(PREFETCH_SECONDS / 0.0001) - 3)
    assert sent == keys[:expected] and len(sent) > 10, len(sent)
    # a task starting frees its share of the queued work: one more goes at the next event
    s.task_started("w1", keys[0], now=1)
    s.task_finished("w1", keys[0], nbytes=8, duration=0.0001)
    assert computes(s.take_outbox(), "w1") == [keys[expected]]

    long = SchedulerState(prefetch=2, queue_roots=False)        # (long roots would wait for a thread)
    long.add_worker("w1", nthreads=1, now=0)
    keys = _short_map(long, 100, 1.0)
    assert computes(long.take_outbox(), "w1") == keys[:3]          # nthreads + prefetch, as before
    # unknown durations (nothing learned yet) take the base slots only
    unknown = SchedulerState(prefetch=2, queue_roots=False)
    unknown.add_worker("w1", nthreads=2, now=0)
    unknown.update_graph("c", [task(f"u{i}") for i in range(50)], [f"u{i}" for i in range(50)])
    assert len(computes(unknown.take_outbox(), "w1")) == 4


def test_deep_prefetch_is_bounded_and_holds_nothing_back_from_a_new_worker():
    from hpc_cluster.scheduler.state.prefetch import MAX_PREFETCH_PER_THREAD
    s = SchedulerState(prefetch=2)
    s.add_worker("w1", nthreads=2, now=0)
    keys = _short_map(s, 1000, 0.000001)                     # 1 us tasks: the count bound applies
    assert len(computes(s.take_outbox(), "w1")) == 2 + 2 + 2 * MAX_PREFETCH_PER_THREAD
    # a long task of another function waiting there closes the deep room: no more short ones go
    s2 = SchedulerState(prefetch=1, queue_roots=False)
    s2.add_worker("w1", nthreads=1, now=0)
    slow = [f"slow-{i:032x}" for i in range(3)]
    s2.update_graph("c", [task(k, priority=1) for k in slow[:2]], slow[:2])
    s2.take_outbox()
    s2.task_started("w1", slow[0], now=0)
    s2.task_finished("w1", slow[0], nbytes=8, duration=5.0)
    s2.update_graph("c", [task(slow[2], priority=1)], slow[2:])      # waits at w1 (expected 5 s)
    keys = _short_map(s2, 20, 0.0001)
    assert computes(s2.take_outbox(), "w1") == []
    assert s2.workers["w1"].queued_us >= 5_000_000
    # a death: only the executing task is charged; the queued short ones go back to the queue
    s = SchedulerState(prefetch=2)
    s.add_worker("w1", nthreads=1, now=0)
    keys = _short_map(s, 50, 0.0001)
    s.take_outbox()
    s.task_started("w1", keys[0], now=1)
    s.remove_worker("w1", 1, {"cause": "crash", "blame": True, "text": "segfault"})
    charged = [k for k in keys if s.tasks[k].attempts]
    assert charged == [keys[0]]
    assert s.counts() == {"queued": 51}                      # and the learned one, lost with w1
    s.add_worker("w2", nthreads=1, now=3)
    assert len(computes(s.take_outbox(), "w2")) > 10          # deep again at once (durations known)
    assert s.workers["w2"].queued_us == sum(s.tasks[k].queued_us for k in s.tasks)


def test_a_waiting_task_costs_the_scheduler_under_1_kb():
    """Issue 19: <= 1 KB of scheduler memory per waiting task. Eight empty sets per task were
    1.7 KB of 2.3 KB: they are now one shared empty value until something goes in. Measured
    by allocation (tracemalloc), not time: the keys and payloads the client sends are counted."""
    import tracemalloc
    n = 5_000
    st = SchedulerState()
    st.add_client("c")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        specs = [{"key": f"noop-{i:032x}", "func": Opaque(b"f" * 40), "args": Opaque(b"a" * 20), "deps": ()}
                 for i in range(n)]
        st.update_graph("c", specs, [s["key"] for s in specs])
        del specs
        per_task = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert {ts.state for ts in st.tasks.values()} == {"queued"} and len(st.tasks) == n
    # 889 bytes with a set of wanting clients and an attempts list per task; 625 with the
    # priority a (priority, order) tuple; 573 with it one int
    assert per_task < 600, f"{per_task:.0f} bytes per waiting task"
    assert all(type(ts.priority) is int for ts in st.tasks.values())
    # The shared empty value stays empty. The tasks one client wants share one frozenset of
    # wanting clients (a 216-byte set each before), and a release changes only its task's.
    from hpc_cluster.scheduler.state.records import EMPTY
    assert len(EMPTY) == 0 and all(ts.who_wants == {"c"} for ts in st.tasks.values())
    assert len({id(ts.who_wants) for ts in st.tasks.values()}) == 1
    st.add_client("d")
    st.update_graph("d", [], ["noop-" + "0" * 32])
    st.client_releases("c", ["noop-" + "0" * 32, "noop-" + "0" * 31 + "1"])
    assert st.tasks["noop-" + "0" * 32].who_wants == {"d"} and "noop-" + "0" * 31 + "1" not in st.tasks
    assert all(st.tasks[f"noop-{i:032x}"].who_wants == {"c"} for i in range(2, n))
    with pytest.raises(TypeError, match="of its own"):
        EMPTY.add(1)


def test_a_graphs_leaves_share_their_small_edge_sets():
    """Issue 19: each leaf of a 1,000,000-task graph had a one-element set of dependents and
    one of waiters (432 B of its 1,976). Leaves under one sum now share one frozenset."""
    import tracemalloc
    from hpc_cluster.scheduler.state.records import SHARED_EDGES
    st = SchedulerState()
    st.add_client("c")
    leaves, sums = 4_000, 4
    specs = [{"key": f"leaf-{i}", "func": Opaque(b"f"), "args": Opaque(b"a"), "deps": ()} for i in range(leaves)]
    specs += [{"key": f"sum-{j}", "func": Opaque(b"f"), "args": Opaque(b"a"),
               "deps": [f"leaf-{i}" for i in range(j, leaves, sums)]} for j in range(sums)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        st.update_graph("c", specs, [f"sum-{j}" for j in range(sums)])
        edges = sum(s.size for s in tracemalloc.take_snapshot().statistics("filename")
                    if s.traceback[0].filename.endswith("records.py")) / leaves
        per_task = (tracemalloc.get_traced_memory()[0] - before) / (leaves + sums)
    finally:
        tracemalloc.stop()
    leaf = [st.tasks[f"leaf-{i}"] for i in range(leaves)]
    assert all(ts.dependents == {st.tasks[f"sum-{i % sums}"]} == ts.waiters for i, ts in enumerate(leaf))
    assert len({id(ts.dependents) for ts in leaf}) == sums           # one per sum, not per leaf
    assert edges < 50, f"{edges:.0f} bytes of records per leaf (432 with a set each)"
    assert per_task < 700, f"{per_task:.0f} bytes per task"
    # A sum that finishes drops out of its leaves' waiters: still shared, now empty.
    st.update_graph("c", [{"key": "more", "func": Opaque(b"f"), "args": Opaque(b"a"),
                           "deps": ["leaf-0"]}], ["more"])
    assert st.tasks["leaf-0"].dependents == {st.tasks["sum-0"], st.tasks["more"]}
    assert st.tasks["leaf-4"].dependents == {st.tasks["sum-0"]}        # its siblings' unchanged
    assert SHARED_EDGES >= 2


def test_edge_sets_past_the_shared_size_are_the_tasks_own():
    from hpc_cluster.scheduler.state.records import EMPTY, SHARED_EDGES, TaskState, add_edge, drop_edge
    a, b = TaskState("a"), TaskState("b")
    others = [TaskState(f"o{i}") for i in range(SHARED_EDGES + 1)]
    for o in others[:SHARED_EDGES]:
        add_edge(a, "dependents", o)
        add_edge(b, "dependents", o)
    assert isinstance(a.dependents, frozenset) and a.dependents is b.dependents
    add_edge(a, "dependents", others[-1])                 # one past: its own set, b's unchanged
    assert type(a.dependents) is set and len(a.dependents) == SHARED_EDGES + 1
    assert len(b.dependents) == SHARED_EDGES
    drop_edge(a, "dependents", others[0])
    drop_edge(b, "dependents", others[0])
    assert others[0] not in a.dependents and others[0] not in b.dependents and len(b.dependents) == SHARED_EDGES - 1
    for o in others:
        drop_edge(b, "dependents", o)
    assert b.dependents is EMPTY


def test_small_payloads_are_copied_out_of_their_message_and_a_shared_function_kept_once():
    from hpc_cluster.scheduler.checks import COPY_BELOW, compact_payloads
    body = bytearray(b"F" * 40 + b"a" * 20 + b"b" * 20 + b"L" * (COPY_BELOW + 1))
    view = memoryview(body)
    func = view[:40]
    tasks = [{"key": "x", "func": Opaque(func), "args": Opaque(view[40:60])},
             {"key": "y", "func": Opaque(func), "args": Opaque(view[60:80])},
             {"key": "z", "func": Opaque(func), "args": Opaque(view[80:])}]
    compact_payloads(tasks)
    assert tasks[0]["func"] is tasks[1]["func"] is tasks[2]["func"] and tasks[0]["func"].data == b"F" * 40
    assert [type(t["args"].data) for t in tasks] == [bytes, bytes, memoryview]     # a large one stays a view
    assert tasks[1]["args"].data == b"b" * 20


def test_a_start_that_arrives_after_its_cancel_keeps_the_thread_busy_until_it_ends():
    # The cancel crossed the worker's task-started: its thread runs the task all the same, so
    # the worker has no free thread for another task until that one ends.
    s = SchedulerState(prefetch=0, queue_roots=False)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [task("slow")], ["slow"])
    assert computes(s.take_outbox(), "w") == ["slow"]
    s.cancel(["slow"], "cancelled by the user")
    s.take_outbox()
    s.task_started("w", "slow", now=1)                  # it had started before the cancel came
    s.update_graph("c", [task("next")], ["next"])
    assert computes(s.take_outbox(), "w") == []         # the one thread is still busy
    s.abandoned_done("w", "slow")                        # the worker: its thread is free
    assert computes(s.take_outbox(), "w") == ["next"]
