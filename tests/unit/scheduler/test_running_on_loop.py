"""A worker dies in a task it ran on its event loop, whose start was to reach the scheduler with
its end (worker/inline.py, worker/slot.py): its nanny's report names the task (`running`), and
the death is charged to it as if its start had come, whether the report comes before the
connection closes or after. The scheduler's state and evidence collector, driven directly."""

import asyncio
import os

import pytest

from hpc_cluster.scheduler import evidence
from hpc_cluster.scheduler.state import SchedulerState
from hpc_cluster.worker.slot import SIZE, RunningSlot
from helpers.tasks import task

W = "tcp://w:1"


def _cluster(allowed_failures=0):
    state = SchedulerState(prefetch=0, allowed_failures=allowed_failures, queue_roots=False)
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    state.add_worker(W, 1, 990.0, name="w", info={"nanny_id": "n1"})
    state.update_graph("c", [task("bad")], ["bad"])
    state.take_outbox()
    assert state.tasks["bad"].processing_on.address == W and not state.tasks["bad"].executing
    return state, col


def _report(key="bad", **more):
    return {"nanny_id": "n1", "signal": 11, "exit_code": None, "ended": 999.5, "log_tail": [],
            "running": {"key": key, "started": 999.0, "memory": {"rss": 100 << 20, "managed": 0}}, **more}


def test_a_report_after_the_connection_closed_charges_the_task_it_names():
    state, col = _cluster()

    async def run():
        record = col.worker_removed(W, "closed", None)
        assert record["final_at"] is None and record["executing"] == []    # the report is awaited
        col.exit_report(_report())
        return record

    record = asyncio.run(run())
    assert record["cause"] == "crash" and record["blame"] and record["executing"] == ["bad"], record
    assert "while running 'bad'" in record["text"]
    ts = state.tasks["bad"]
    assert ts.state == "erred" and ts.attempts[0]["ran_for"] == pytest.approx(0.5)
    assert record["memory"]["task_starts"] == [[pytest.approx(999.5), "bad"]]   # on its timeline


def test_a_report_before_the_connection_closed_charges_it_too():
    state, col = _cluster()

    async def run():
        col.exit_report(_report())                   # the worker is still registered: kept
        return col.worker_removed(W, "closed", None)

    record = asyncio.run(run())
    assert record["cause"] == "crash" and record["blame"] and record["executing"] == ["bad"], record
    assert state.tasks["bad"].state == "erred"
    assert col.evidence[record["id"]].memory["start_rss"] == 100 << 20     # its start's memory


def test_a_task_the_worker_was_not_given_is_not_charged():
    state, col = _cluster()
    state.update_graph("c", [task("other")], ["other"])

    async def run():
        record = col.worker_removed(W, "closed", None)
        col.exit_report(_report(key="other"))        # not this worker's: a stale or wrong name
        col.exit_report(_report(key=["not", "a", "key"]))
        return record

    record = asyncio.run(run())
    assert record["executing"] == [] and not record["blame"], record
    assert not state.tasks["other"].attempts and state.tasks["bad"].state != "erred"


def test_a_task_finished_elsewhere_meanwhile_is_named_but_not_charged():
    state, col = _cluster(allowed_failures=3)
    state.add_worker("tcp://w:2", 1, 990.0, name="w2", info={})

    async def run():
        record = col.worker_removed(W, "closed", None)
        assert state.tasks["bad"].processing_on.address == "tcp://w:2"
        state.task_started("tcp://w:2", "bad", 1000.0)
        state.task_finished("tcp://w:2", "bad", nbytes=8)
        col.exit_report(_report())
        return record

    record = asyncio.run(run())
    assert record["executing"] == ["bad"] and record["cause"] == "crash", record
    assert state.tasks["bad"].state == "memory" and not state.tasks["bad"].attempts


def test_the_slot_names_the_running_task_to_its_nanny_until_cleared():
    nanny = RunningSlot.create()
    assert nanny is not None                         # Linux: memfd
    try:
        assert nanny.read() is None
        worker = RunningSlot.attach(os.dup(nanny.fd))   # as the worker gets it: its own descriptor
        assert worker.fd == -1                       # mapped; its descriptor closed
        assert worker.set("('x', 3)\u00e9", 12.5, {"rss": 7, "managed": 2})
        assert nanny.read() == {"key": "('x', 3)\u00e9", "started": 12.5, "memory": {"rss": 7, "managed": 2}}
        worker.clear()
        assert nanny.read() is None
        assert worker.set("short", 1.0, None) and nanny.read()["key"] == "short"
        assert not worker.set("k" * SIZE, 2.0, None)             # too long: the caller sends first
        assert not worker.set(("not", "a", "string"), 2.0, None)
        assert nanny.read()["key"] == "short"                     # and the slot is left as it was
        worker.close()
    finally:
        nanny.close()
    assert RunningSlot.attach(None) is None
