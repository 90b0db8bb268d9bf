"""Blame on the distributed engine (engines/blame.py's Ledger, and the bridge that feeds it final
verdicts): only memory and crash verdicts charge the tasks that were executing; walltime deaths
are counted apart (a task that never fits fails with the walltime, not as a fault); innocent
deaths never charge; a verdict counts once, and only once it is final; a task that finished is
forgotten."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpc_cluster.engines.blame import Ledger
from hpc_cluster.engines.bridge import Bridge
from hpc_cluster.protocol.messages import BLAMED_CAUSES, Cause, ErrorKind

INNOCENT = [c for c in Cause if c not in BLAMED_CAUSES]


def verdict(death_id: int, cause: Cause, final: bool = True, **more) -> dict:
    """A death record as our collector writes it (the fields the ledger and the user read)."""
    return {"id": death_id, "worker": f"tcp://10.0.0.{death_id}:4000", "name": f"w-{death_id}",
            "time": 1_700_000_000.0 + death_id, "cause": cause.value, "blame": cause in BLAMED_CAUSES,
            "text": f"death {death_id}: {cause.value}", "evidence": [f"evidence of {death_id}"],
            "advice": f"advice for {cause.value}", "job_id": str(100 + death_id), "pool": "default",
            "final_at": 1_700_000_010.0 + death_id if final else None, **more}


def test_blamed_causes_are_the_memory_and_crash_ones():
    assert set(BLAMED_CAUSES) == {Cause.MEMORY_BATCH, Cause.MEMORY_NANNY, Cause.CRASH}


@pytest.mark.parametrize("cause", [Cause.MEMORY_BATCH, Cause.MEMORY_NANNY, Cause.CRASH])
def test_a_task_fails_on_one_more_blamed_verdict_than_allowed(cause):
    ledger = Ledger(allowed_failures=2)
    for i in range(2):
        assert ledger.charge(verdict(i, cause), {"t": 1.5 + i}) == []
    assert len(ledger.attempts["t"]) == 2
    ((key, error),) = ledger.charge(verdict(2, cause), {"t": 3.5})
    assert key == "t" and error["kind"] == ErrorKind.KILLED_WORKER and error["allowed_failures"] == 2
    assert error["memory"] is (cause != Cause.CRASH)
    assert [a["cause"] for a in error["attempts"]] == [cause.value] * 3
    assert [a["ran_for"] for a in error["attempts"]] == [1.5, 2.5, 3.5]
    assert [a["job_id"] for a in error["attempts"]] == ["100", "101", "102"]
    assert error["attempts"][-1]["evidence"] == ["evidence of 2"]
    assert "t" not in ledger.attempts            # failed: nothing more to count


@pytest.mark.parametrize("cause", INNOCENT, ids=[c.value for c in INNOCENT])
def test_innocent_deaths_never_charge(cause):
    ledger = Ledger(allowed_failures=0, walltime_failures=1_000)
    for i in range(5):
        assert ledger.charge(verdict(i, cause), {"t": 1.0}) == []
    # one blamed verdict after them fails the task at once: the innocent ones were not counted
    ((key, error),) = ledger.charge(verdict(9, Cause.CRASH), {"t": 1.0})
    assert key == "t" and len(error["attempts"]) == 6 and "walltime_exceeded" not in error


def test_walltime_deaths_are_counted_apart_and_fail_a_task_that_never_fits():
    ledger = Ledger(allowed_failures=1, walltime_failures=2)
    walltime = {"walltime": 60.0}
    assert ledger.charge(verdict(0, Cause.WALLTIME, **walltime), {"long": 58.0}) == []
    assert ledger.charge(verdict(1, Cause.CRASH), {"long": 3.0}) == []       # one charged: allowed
    assert ledger.charge(verdict(2, Cause.WALLTIME, **walltime), {"long": 59.0}) == []
    ((key, error),) = ledger.charge(verdict(3, Cause.WALLTIME, **walltime), {"long": 57.5})
    assert key == "long" and error["walltime_exceeded"] is True and error["walltime"] == 60.0
    assert error["ran_for"] == [58.0, 59.0, 57.5]             # the walltime runs only
    assert len(error["attempts"]) == 4 and error["allowed_failures"] == 1


def test_only_the_tasks_named_executing_are_charged_each_on_its_own_count():
    ledger = Ledger(allowed_failures=1)
    assert ledger.charge(verdict(0, Cause.MEMORY_NANNY), {"a": 1.0, ("b", 0): 2.0}) == []
    failed = ledger.charge(verdict(1, Cause.MEMORY_NANNY), {("b", 0): None})
    assert [k for k, _ in failed] == [("b", 0)]
    assert failed[0][1]["attempts"][-1]["ran_for"] is None     # no start time known: said so
    assert [a["death"]["id"] for a in ledger.attempts["a"]] == [0]          # 'a' was not running then


def test_a_finished_task_is_forgotten():
    ledger = Ledger(allowed_failures=1)
    ledger.charge(verdict(0, Cause.CRASH), {"t": 1.0})
    ledger.forget("t")
    ledger.forget("never-charged")                  # nothing to forget: no error
    assert ledger.attempts == {}
    # its next run starts from nothing: one more charge is within allowed_failures again
    assert ledger.charge(verdict(1, Cause.CRASH), {"t": 1.0}) == []


def bridge_with(ledger: Ledger) -> Bridge:
    """A bridge with no distributed scheduler (a failed task has nowhere to go: the ledger's
    count is what is looked at) and the little of our scheduler on_verdict reads: no evidence
    for any death, one pool, no escalation."""
    ours = SimpleNamespace(deaths=SimpleNamespace(evidence={}), state=SimpleNamespace(pools={}, escalate={}))
    return Bridge(ours, ledger)


def test_a_verdict_counts_only_once_final_and_only_once():
    ledger = Ledger(allowed_failures=3)
    bridge = bridge_with(ledger)
    record = verdict(0, Cause.CRASH, final=False)
    bridge.last_executing[record["worker"]] = {("x", 1): record["time"] - 4.0}   # its last heartbeat's list
    bridge.on_verdict(record)
    assert ledger.attempts == {}                    # an open verdict may still turn (a cancel)
    record["final_at"] = record["time"] + 10
    bridge.on_verdict(record)
    bridge.on_verdict(record)                       # told again (a refinement): not counted twice
    assert [a["ran_for"] for a in ledger.attempts[("x", 1)]] == [4.0]
    innocent = verdict(1, Cause.CANCELLED)
    bridge.last_executing[innocent["worker"]] = {("x", 1): innocent["time"] - 1.0}
    bridge.on_verdict(innocent)
    assert len(ledger.attempts[("x", 1)]) == 1 and 1 in bridge.charged
