"""The scheduler's garbage collection policy (scheduler/collector.py): no automatic full
collection while it runs (each one stopped it 20-70 ms at 500 workers and seconds at a
million tasks); a full one of its own once it is quiet, and at least every `every` seconds."""

import gc
import weakref

import pytest

from hpc_cluster.scheduler.collector import NEVER, Collector

from helpers.wait import wait_until


class Node:
    def __init__(self):
        self.other = None


@pytest.fixture
def collector():
    # Quiet for 1 s, not less: 'not yet' right after busy() must hold even if this process
    # is descheduled between the two calls on a loaded machine.
    c = Collector(quiet=1.0, every=3600)
    before = gc.get_threshold()
    c.start()
    yield c
    c.stop()
    assert gc.get_threshold() == before


def test_no_automatic_full_collection_while_a_scheduler_runs(collector):
    assert gc.get_threshold()[2] == NEVER
    full = gc.get_stats()[2]["collections"]
    # surviving tracked objects: what a submission's task records are
    kept = [[i] for i in range(300_000)]
    assert gc.get_stats()[2]["collections"] == full
    collector.stop()
    more = [[i] for i in range(300_000)]         # the interpreter's own rule again
    assert gc.get_stats()[2]["collections"] > full
    del kept, more


def test_a_full_collection_runs_once_quiet_and_frees_cycles(collector):
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    gc.collect(0), gc.collect(1)                 # promoted to the oldest generation
    del a, b
    collector.busy()
    assert not collector.tick()                  # busy just now: not yet
    assert gone() is not None                    # young collections do not reach it
    wait_until(collector.tick, timeout=30, what="a full collection once quiet")
    assert gone() is None and collector.collections == 1
    assert not collector.tick()                  # nothing happened since: no second one


def test_a_busy_scheduler_still_collects_every_so_often():
    c = Collector(quiet=3600, every=0.05)
    c.start()
    try:
        c.busy()
        wait_until(lambda: c.busy() or c.tick(), timeout=30, what="an overdue full collection")
    finally:
        c.stop()
