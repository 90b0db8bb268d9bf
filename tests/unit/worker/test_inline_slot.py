"""A task run on the worker's loop (worker/inline.py) is named in the slot its nanny reads
after a death (worker/slot.py) while it runs, and its start goes to the scheduler with the
turn's other runs, one write; with no slot, each start is written before its run, as a
thread's is. A bare worker driven directly: what it sends and when it flushes is recorded."""

from __future__ import annotations

import os

import pytest

from hpc_cluster.worker.inline import INLINE_AFTER
from hpc_cluster.worker.slot import RunningSlot
from helpers.bare_worker import bare_worker, compute


def _turn(monkeypatch, slot, nanny):
    """Three tiny tasks run on the loop in one turn: for each, (key, what the nanny would read
    during its run, how many messages had been flushed when it ran), and the flushes."""
    w = bare_worker(monkeypatch)
    w.loop, w._slot = None, slot
    flushes, runs = [], []
    monkeypatch.setattr(w.scheduler, "flush", lambda: flushes.append(len(w.scheduler.sent)))

    def execute(ts):
        named = nanny.read()
        runs.append((ts.key, named and named["key"], flushes[-1] if flushes else 0))
        return ("ok", 1, 28), 0.00001

    monkeypatch.setattr(w, "_execute", execute)
    for i in range(3):
        compute(w, f"t{i}", priority=i, batch=True)
    for ts in w.tasks.values():
        w._quick[ts.func] = INLINE_AFTER                 # its function's quick runs are behind it
    w._run_ready()
    w.executor.shutdown(wait=False)
    ops = [(m["op"], m["key"]) for m in w.scheduler.sent if m["op"] in ("task-started", "task-finished")]
    return runs, flushes, ops


@pytest.fixture
def nanny_slot():
    slot = RunningSlot.create()
    yield slot
    slot.close()


def test_with_a_slot_the_runs_are_named_there_and_the_turn_is_one_write(monkeypatch, nanny_slot):
    runs, flushes, ops = _turn(monkeypatch, RunningSlot.attach(os.dup(nanny_slot.fd)), nanny_slot)
    assert runs == [("t0", "t0", 0), ("t1", "t1", 0), ("t2", "t2", 0)]    # named; nothing written yet
    assert flushes == [6] and nanny_slot.read() is None                 # one write; the slot cleared
    assert ops == [("task-started", "t0"), ("task-finished", "t0"), ("task-started", "t1"),
                   ("task-finished", "t1"), ("task-started", "t2"), ("task-finished", "t2")]


def test_without_a_slot_each_start_is_written_before_its_run(monkeypatch, nanny_slot):
    runs, flushes, ops = _turn(monkeypatch, None, nanny_slot)
    assert runs == [("t0", None, 1), ("t1", None, 3), ("t2", None, 5)]   # its start already out
    assert flushes == [1, 3, 5, 6]
