"""client.rebalance's state side (scheduler/state/rebalance.py): the plan evens out bytes held,
a move copies before it drops, and a move that cannot finish drops nothing."""

from __future__ import annotations

from hpc_cluster.protocol.messages import Cause
from hpc_cluster.scheduler.state import SchedulerState

A, B, C = "tcp://a:1", "tcp://b:1", "tcp://c:1"


def held(s: SchedulerState, where: dict[str, list[tuple[str, int]]]) -> None:
    """Results scattered onto workers: worker -> [(key, nbytes)]."""
    for address, items in where.items():
        s.scatter("client-1", {k: [address] for k, _ in items}, dict(items))


def loads(s: SchedulerState) -> dict[str, int]:
    return {a: sum(ts.nbytes for ts in ws.has_what) for a, ws in s.workers.items()}


def rebalance_state(*workers: str) -> SchedulerState:
    s = SchedulerState()
    s.add_client("client-1")
    for address in workers:
        s.add_worker(address, 2, 0.0)
    return s


def test_the_plan_moves_from_the_heaviest_to_the_lightest_until_even():
    s = rebalance_state(A, B, C)
    held(s, {A: [(f"x-{i}", 100) for i in range(6)]})
    moves = s.plan_rebalance()
    assert len(moves) == 4 and all(src == A for _, src, _ in moves)
    after = {A: 600, B: 0, C: 0}
    for _, src, dst in moves:
        after[src] -= 100
        after[dst] += 100
    assert after == {A: 200, B: 200, C: 200}


def test_a_result_too_large_to_narrow_the_gap_stays_and_smaller_ones_still_move():
    s = rebalance_state(A, B)
    held(s, {A: [("big", 300), ("small", 100)]})
    assert s.plan_rebalance() == [("small", A, B)]          # moving "big" would only swap the imbalance
    s2 = rebalance_state(A, B)
    held(s2, {A: [("big", 300)]})
    assert s2.plan_rebalance() == []


def test_the_plan_keeps_to_the_keys_and_workers_asked():
    s = rebalance_state(A, B, C)
    held(s, {A: [("x", 100), ("y", 100), ("z", 100), ("w", 100)]})
    assert {k for k, _, _ in s.plan_rebalance(keys={"x"})} == {"x"}
    assert {dst for _, _, dst in s.plan_rebalance(workers=[A, C])} == {C}


def one_move_started() -> tuple[SchedulerState, tuple[str, str, str]]:
    """Two results on A, none on B: the one move planned, started, the outbox emptied."""
    s = rebalance_state(A, B)
    held(s, {A: [("x", 100), ("y", 100)]})
    (move,) = s.plan_rebalance()
    s.take_outbox()
    s.start_moves([move])
    return s, move


def test_a_move_copies_first_and_drops_the_source_only_once_the_target_holds_it():
    s, move = one_move_started()
    key = move[0]
    assert s.take_outbox()[B] == [{"op": "fetch-replica", "key": key, "holders": [A]}]
    assert s.end_move(*move) == "pending" and {ws.address for ws in s.tasks[key].who_has} == {A}
    s.add_replica(B, key, 100)
    assert s.end_move(*move) == "done"
    assert {ws.address for ws in s.tasks[key].who_has} == {B}
    assert s.take_outbox()[A] == [{"op": "free-keys", "keys": [key]}]
    assert loads(s) == {A: 100, B: 100}
    s.validate()


def test_a_move_whose_copy_fails_drops_nothing():
    s, move = one_move_started()
    s.replica_failed(B, move[0])
    assert s.end_move(*move) == "failed"
    assert {ws.address for ws in s.tasks[move[0]].who_has} == {A}
    s.validate()


def test_a_move_whose_target_died_fails_and_the_result_stays_on_its_source():
    s, move = one_move_started()
    s.remove_worker(B, 1.0, {"cause": Cause.CONNECTION_LOST, "blame": False, "text": "gone"})
    assert s.end_move(*move) == "failed"
    assert s.tasks[move[0]].state == "memory" and {ws.address for ws in s.tasks[move[0]].who_has} == {A}
    s.validate()
