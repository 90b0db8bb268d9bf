"""A scale-down never loops (issue 34, point 2), pure: a drain we chose (scale-down, adapt:
keep=True) keeps a worker that alone holds results still wanted until a peer has them or
they are released, as distributed's retire_workers does; a walltime drain still leaves when
no peer is left (lineage recomputes). Before, adapt's target falling 3 -> 0 drained every
worker at once, each left with nowhere to save its results, the held futures were recomputed,
the cluster grew back, and the cycle repeated."""

from __future__ import annotations

from hpc_cluster.scheduler.state import SchedulerState
from helpers.tasks import sent, task


def three_holding() -> SchedulerState:
    """Three workers, each alone holding one result the client 'c' still wants."""
    s = SchedulerState(prefetch=0, queue_roots=False)
    for w in ("a", "b", "c"):
        s.add_worker(w, nthreads=1, now=0, deadline=10_000, info={"job_walltime": 10_000})
    keys = ["ka", "kb", "kc"]
    s.update_graph("c", [task(k, workers=[k[1]]) for k in keys], keys)
    s.take_outbox()
    for k in keys:
        s.task_started(k[1], k, now=1)
        s.task_finished(k[1], k, 8, duration=1)
    s.take_outbox()
    assert all(s.tasks[k].who_has == {s.workers[k[1]]} for k in keys)
    return s


def drain_all(s: SchedulerState, keep: bool) -> dict:
    for w in ("a", "b", "c"):
        s.start_drain(w, keep=keep)
    return {w: s.drain_step(w) for w in ("a", "b", "c")}


def test_a_scale_down_of_every_worker_keeps_them_while_they_alone_hold_wanted_results():
    s = three_holding()
    assert drain_all(s, keep=True) == {"a": False, "b": False, "c": False}
    assert [s.kept_without_peer(w) for w in ("a", "b", "c")] == [1, 1, 1]      # what the scheduler logs
    out = s.take_outbox()
    assert not any(sent(out, w, "fetch-replica") for w in ("a", "b", "c"))    # no draining worker is a target
    assert all(s.workers[w].draining for w in ("a", "b", "c"))              # still no new tasks for them
    # The client lets go of two results: those two workers may leave, the third still may not.
    s.client_releases("c", ["ka", "kb"])
    assert (s.drain_step("a"), s.drain_step("b"), s.drain_step("c")) == (True, True, False)
    s.client_releases("c", ["kc"])
    assert s.drain_step("c")


def test_a_walltime_drain_with_no_peer_left_still_leaves():
    s = three_holding()
    s2 = three_holding()
    for w in ("a", "b", "c"):
        s2.start_drain(w)
    assert [s2.kept_without_peer(w) for w in ("a", "b", "c")] == [0, 0, 0]
    assert drain_all(s, keep=False) == {"a": True, "b": True, "c": True}     # nowhere to save: lineage will


def test_a_kept_worker_gives_its_results_to_a_worker_that_joins_then_leaves():
    s = three_holding()
    drain_all(s, keep=True)
    s.take_outbox()
    s.add_worker("new", nthreads=1, now=50, deadline=10_000)
    s.take_outbox()
    assert s.kept_without_peer("a") == 0          # a peer again
    assert not s.drain_step("a")
    [fetch] = sent(s.take_outbox(), "new", "fetch-replica")
    assert fetch == {"op": "fetch-replica", "key": "ka", "holders": ["a"]}
    assert not s.drain_step("a")                  # the copy is on its way: it waits for it
    s.add_replica("new", "ka", 8)
    assert s.drain_step("a")                      # a peer has it now


def test_a_kept_worker_waits_for_its_copy_even_when_the_target_starts_draining_too():
    s = three_holding()
    s.add_worker("new", nthreads=1, now=50, deadline=10_000)
    s.start_drain("a", keep=True)
    assert not s.drain_step("a")                  # a copy of ka to 'new' starts
    s.start_drain("new", keep=True)               # then the target is scaled down as well
    assert not s.drain_step("a")                  # was: left at once, ka only on its way
    s.add_replica("new", "ka", 8)
    # Both hold ka and both are draining: one goes, the other stays (each saying 'the other
    # has it', both left). Here 'a' goes ('new' keeps it and comes after it), whichever asks first.
    assert not s.drain_step("new") and s.drain_step("a") and not s.drain_step("new")


def test_a_kept_worker_leaves_when_its_walltime_margin_comes():
    s = three_holding()
    drain_all(s, keep=True)
    assert s.workers_to_drain(now=100, walltime_margin=60) == []
    assert s.workers_to_drain(now=9_950, walltime_margin=60) == ["a", "b", "c"]
    s.start_drain("a")                            # what the deadline watch does: a walltime drain
    assert s.drain_step("a")                      # it must go before SLURM ends it; lineage will
    assert not s.drain_step("b")
    assert s.workers_to_drain(now=9_950, walltime_margin=60) == ["b", "c"]   # 'a' is draining for walltime now


def test_a_scale_down_does_not_make_a_walltime_drain_keep():
    s = three_holding()
    for w in ("a", "b", "c"):
        s.start_drain(w)                          # their walltime's
    s.start_drain("a", keep=True)                 # then a scale-down picks 'a'
    assert s.drain_step("a") is True              # it leaves as for walltime: no peer to save to
