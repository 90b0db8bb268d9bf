"""Tasks restricted to named workers in the state machine (issue 31, point 6): workers= by
address, name or host, strict or loose (allow_other_workers), waiting while none is alive,
kept through the journal, and checked on the wire. Driven directly: no sockets, no clocks."""

import random

import pytest

from hpc_cluster.protocol.frames import ProtocolError
from hpc_cluster.scheduler.checks import check_task
from hpc_cluster.scheduler.journal import snapshot, spec_record
from hpc_cluster.scheduler.state import SchedulerState
from hpc_cluster.scheduler.state.placement import pick_worker
from hpc_cluster.scheduler.state.restrictions import host_of
from helpers.tasks import computes, sent, task

A, B, C = "tcp://10.0.0.1:4001", "tcp://10.0.0.2:4002", "tcp://10.0.0.3:4003"


def three_workers(prefetch=0, nthreads=1) -> SchedulerState:
    s = SchedulerState(prefetch=prefetch)
    s.add_client("c")
    s.add_worker(A, nthreads=nthreads, now=0, name="alice", info={"host": "node-a"})
    s.add_worker(B, nthreads=nthreads, now=0, name="bob", info={"host": "node-b"})
    s.add_worker(C, nthreads=nthreads, now=0, name="carol", info={"host": "node-c"})
    return s


def placed(s) -> dict:
    out = s.take_outbox()
    return {w: computes(out, w) for w in (A, B, C) if computes(out, w)}


@pytest.mark.parametrize("name", [B, "bob", "node-b", "10.0.0.2", "10.0.0.2:4002"])
def test_a_strict_task_runs_only_on_the_worker_named_by_address_name_or_host(name):
    s = three_workers()
    keys = [f"t{i}" for i in range(3)]
    s.update_graph("c", [task(k, workers=[name]) for k in keys], keys)
    # One at a time on bob (one thread, no prefetch), while alice and carol stay idle.
    assert placed(s) == {B: ["t0"]}
    s.task_finished(B, "t0", nbytes=8)
    assert placed(s) == {B: ["t1"]}
    s.validate()


def test_tasks_with_the_same_workers_share_one_restriction():
    s = three_workers()
    s.update_graph("c", [task(f"t{i}", workers=["alice", "bob"]) for i in range(100)], [f"t{i}" for i in range(100)])
    wheres = {id(ts.where) for ts in s.tasks.values()}
    assert len(wheres) == 1
    assert {ws.name for ws in s.tasks["t0"].where.matching} == {"alice", "bob"}


def test_a_strict_task_no_live_worker_can_run_waits_and_says_so_then_runs_on_the_one_that_joins():
    s = three_workers()
    s.update_graph("c", [task("x", workers=["dave"])], ["x"])
    assert placed(s) == {} and s.tasks["x"].state == "queued"
    note = s.restriction_note(s.tasks["x"])
    assert "no live worker is one of them" in note and "alice, bob, carol" in note
    assert "allow_other_workers=True" in note                 # the way out, named
    s.add_worker("tcp://10.0.0.4:4004", nthreads=1, now=1, name="dave")
    assert computes(s.take_outbox(), "tcp://10.0.0.4:4004") == ["x"]
    assert "may run only on workers=['dave']" in s.restriction_note(s.tasks["x"])
    s.validate()


def test_a_strict_task_whose_worker_died_waits_for_it_to_come_back():
    s = three_workers()
    s.update_graph("c", [task("x", workers=["bob"])], ["x"])
    assert placed(s) == {B: ["x"]}
    s.task_started(B, "x", now=1)
    s.remove_worker(B, now=2, death={"cause": "node-failure", "blame": False})
    assert s.tasks["x"].state == "queued" and placed(s) == {}       # alice and carol are idle
    assert not s.tasks["x"].where.matching
    s.add_worker("tcp://10.0.0.2:5000", nthreads=1, now=3, name="bob")   # back, at another port
    assert computes(s.take_outbox(), "tcp://10.0.0.2:5000") == ["x"]
    s.validate()


def test_a_loose_task_prefers_its_workers_and_runs_elsewhere_when_none_of_them_is_free():
    s = three_workers()
    s.update_graph("c", [task(f"t{i}", workers=["bob"], allow_other_workers=True) for i in range(3)],
                   ["t0", "t1", "t2"])
    got = placed(s)
    assert got[B] == ["t0"] and sorted(got[A] + got[C]) == ["t1", "t2"]
    # With bob free again it is bob that gets the next one, though alice and carol are free too.
    for w, keys in got.items():
        s.task_finished(w, keys[0], nbytes=8)
    s.update_graph("c", [task("t3", workers=["bob"], allow_other_workers=True)], ["t3"])
    assert placed(s) == {B: ["t3"]}
    assert "prefers workers=['bob']" in s.restriction_note(s.tasks["t3"])


def test_a_loose_task_whose_workers_are_all_gone_runs_anywhere():
    s = three_workers()
    s.update_graph("c", [task("x", workers=["dave"], allow_other_workers=True)], ["x"])
    assert sum(len(v) for v in placed(s).values()) == 1


def test_a_strict_task_fetches_its_input_rather_than_run_beside_it_on_another_worker():
    s = three_workers()
    s.update_graph("c", [task("big", workers=["alice"])], ["big"])
    s.take_outbox()
    s.task_finished(A, "big", nbytes=10**9)                  # a GB on alice, which then stays busy
    s.update_graph("c", [task("busy", workers=["alice"])], ["busy"])
    s.update_graph("c", [task("use", deps=["big"], workers=["carol"])], ["use"])
    assert placed(s) == {A: ["busy"], C: ["use"]}


def test_a_chains_next_link_is_not_sent_ahead_to_a_worker_it_may_not_run_on():
    s = three_workers()
    s.update_graph("c", [task("a", workers=["alice"]), task("b", deps=["a"], workers=["bob"]),
                         task("c2", deps=["b"], workers=["bob"])], ["c2"])
    out = s.take_outbox()
    assert [m["key"] for m in sent(out, A)] == ["a"]          # b is not held on alice behind a
    s.task_finished(A, "a", nbytes=8)
    out = s.take_outbox()
    assert computes(out, B) == ["b"] and [(m["key"], m.get("after")) for m in sent(out, B)] == [("b", None),
                                                                                               ("c2", "b")]
    s.validate()


def test_placement_by_the_free_heaps_is_what_a_scan_of_every_free_worker_gives():
    rng = random.Random(7)
    for _ in range(30):
        s = SchedulerState(prefetch=1)
        s.add_client("c")
        workers = [f"tcp://10.0.0.{i}:1" for i in range(8)]
        for i, w in enumerate(workers):
            s.add_worker(w, nthreads=rng.randint(1, 2), now=0, name=f"w{i}")
        keys = [f"t{i}" for i in range(rng.randint(1, 30))]
        s.update_graph("c", [task(k, workers=rng.sample([f"w{i}" for i in range(10)], 2),
                                  allow_other_workers=rng.random() < 0.5) for k in keys], keys)
        for ts in s.tasks.values():
            free = list(s._free)
            assert s._free.pick(ts, None, 0) is pick_worker(ts, free, None, 0), ts


def test_strict_tasks_are_no_demand_for_a_pool_but_loose_ones_are():
    s = SchedulerState(prefetch=0)
    s.set_pools({"default": {"memory": 2**32, "nthreads": 1}})
    s.add_client("c")
    s.update_graph("c", [task("strict", workers=["dave"]), task("loose", workers=["dave"], allow_other_workers=True)],
                   ["strict", "loose"])
    assert s.pool_demand() == {"default": 1}                 # a new job would not be dave


def test_a_rebuilt_state_keeps_the_restrictions_and_an_older_journal_has_none():
    s = three_workers()
    s.update_graph("c", [task("x", workers=["dave", "erin"], allow_other_workers=False), task("y")], ["x", "y"])
    assert spec_record(s.tasks["x"])[8] == {"workers": ["dave", "erin"], "allow_other_workers": False}
    assert spec_record(s.tasks["y"])[8] is None                # as every journal wrote before
    rebuilt = SchedulerState.rebuild(snapshot(s), now=10)
    assert sorted(rebuilt.tasks["x"].where.names) == ["dave", "erin"] and rebuilt.tasks["y"].where is None
    rebuilt.add_worker("tcp://10.0.0.9:1", nthreads=1, now=11, name="erin")
    assert rebuilt.tasks["x"].where.matching == {rebuilt.workers["tcp://10.0.0.9:1"]}
    rebuilt.validate()


def test_the_wire_check_refuses_malformed_workers_and_sorts_another_clients_order():
    def spec(**fields):
        return task("k", **fields)

    for bad in ([], "bob", [1], [""], None):
        with pytest.raises(ProtocolError, match="workers must be a non-empty list"):
            check_task(dict(spec(), workers=bad))
    with pytest.raises(ProtocolError, match="allow_other_workers a bool"):
        check_task(spec(workers=["bob"], allow_other_workers="yes"))
    assert check_task(spec(workers=["carol", "bob", "bob"]))["workers"] == ["bob", "carol"]
    assert "workers" not in check_task(spec())                # unrestricted tasks travel as before


def test_host_of_an_address():
    assert host_of("tcp://10.0.0.5:40321") == "10.0.0.5"
    assert host_of("tls://[::1]:5") == "::1"
    assert host_of("inproc://node7") == "node7"
