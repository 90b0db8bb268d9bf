"""Worker pools in the state machine (issue 15): placement by need, demand per pool, retry by
cause. Driven directly: no sockets, no clocks."""

import pytest

from hpc_cluster.client.exceptions import (KilledWorker, NoPoolError, TaskMemoryError, TaskTooLongError,
                                    TaskWalltimeError, error_from_record, format_death)
from hpc_cluster.scheduler.state.placement import workload
from hpc_cluster.scheduler.state import SchedulerState
from helpers.tasks import computes, task

GiB, GB = 2**30, 10**9


def erred(out, client="c"):
    return {m["key"]: m["error"] for m in out.get(client, []) if m["op"] == "task-erred"}


def pools(**extra):
    out = {"default": {"memory": 4 * GiB, "walltime": 3600, "nthreads": 2, "processes": 1},
           "bigmem": {"memory": 64 * GB, "walltime": 3600, "nthreads": 8, "processes": 1}}
    out.update(extra)
    return out


def state(allowed_failures=3, escalate=None, **extra):
    s = SchedulerState(prefetch=0, allowed_failures=allowed_failures)
    s.set_pools(pools(**extra), escalate)
    return s


def add_worker(s, name, pool="default", nthreads=1, memory_limit=None, now=0, **info):
    memory_limit = memory_limit if memory_limit is not None else (s.pools.get(pool) or {}).get("memory", 0)
    s.add_worker(name, nthreads=nthreads, now=now, memory_limit=memory_limit, info={"pool": pool, **info})


def run_and_die(s, worker, key, cause, now=1.0, final=True, **death):
    s.task_started(worker, key, now=now)
    return s.remove_worker(worker, now=now + 2, death={"cause": cause, "blame": cause.startswith("memory"),
                                                       "text": cause, **({} if final else {"final_at": None}),
                                                       **death})


# -- placement by need ------------------------------------------------------------------------
def test_memory_is_reserved_per_running_task_within_the_workers_limit_even_without_pools():
    s = SchedulerState(prefetch=0)
    s.add_worker("small", nthreads=4, now=0, memory_limit=2 * GiB)
    s.add_worker("big", nthreads=4, now=0, memory_limit=8 * GiB)
    s.update_graph("c", [task(f"m{i}", memory=3 * GiB) for i in range(3)], ["m0", "m1", "m2"])
    out = s.take_outbox()
    assert computes(out, "small") == []                  # 3 GiB never fits 2 GiB
    assert computes(out, "big") == ["m0", "m1"]          # 2 x 3 GiB of 8 GiB: the third waits
    assert s.workers["big"].used_memory == 6 * GiB
    s.task_finished("big", "m0", nbytes=8)
    assert computes(s.take_outbox(), "big") == ["m2"]    # its reservation freed
    assert s.workers["big"].used_memory == 6 * GiB
    # A task without memory= is not held back by reservations (as before pools).
    s.remove_worker("small", now=1, death={"cause": "retired", "blame": False})
    s.update_graph("c", [task("plain")], ["plain"])
    assert computes(s.take_outbox(), "big") == ["plain"]


def test_a_named_pool_and_escalation_only_pools_restrict_placement():
    s = state(bigmem=dict(pools()["bigmem"], escalation_only=True))
    add_worker(s, "d1")
    add_worker(s, "b1", pool="bigmem")
    s.update_graph("c", [task("plain"), task("named", pool="bigmem")], ["plain", "named"])
    out = s.take_outbox()
    assert computes(out, "b1") == ["named"]              # only moved tasks and those naming it
    assert computes(out, "d1") == ["plain"]
    s.update_graph("c", [task("plain2")], ["plain2"])
    assert computes(s.take_outbox(), "b1") == []         # a free bigmem thread, still not for it


def test_without_set_pools_nothing_changes_for_tasks_without_needs():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0, info={"pool": "bigmem"})
    s.update_graph("c", [task("t")], ["t"])
    assert computes(s.take_outbox(), "w") == ["t"]
    assert s.pool_demand() == {}
    assert workload(s) == workload(s, pool=None) == 1.0


def test_a_task_that_fits_no_pool_fails_at_once_naming_the_largest_pool_and_the_keyword():
    s = state()
    s.update_graph("c", [task("huge", memory=100 * GB), task("fits", memory=10 * GB),
                         task("nowhere", pool="gpu"), task("gpu", resources={"GPU": 1})],
                   ["huge", "fits", "nowhere", "gpu"])
    errors = erred(s.take_outbox())
    assert set(errors) == {"huge", "nowhere", "gpu"}     # no worker at all yet: at once all the same
    exc = error_from_record("huge", errors["huge"], load=None)
    assert isinstance(exc, NoPoolError) and exc.need == "memory" and exc.largest_pool == "bigmem"
    assert "memory=100 GB" in str(exc) and "'bigmem', has 64 GB" in str(exc)
    assert "pools={'huge': {'memory': '100GB'}}" in str(exc), str(exc)
    assert "'default', 'bigmem'" in str(error_from_record("nowhere", errors["nowhere"], load=None))
    assert "resources=" in str(error_from_record("gpu", errors["gpu"], load=None))
    assert s.tasks["fits"].state == "queued"             # bigmem holds it: a job of it is wanted
    # 10 GB of a 64 GB, 8-thread worker: 6 such tasks per worker, so each holds 8/6 threads.
    assert s.pool_demand() == {"default": 0, "bigmem": 2}


def test_a_task_longer_than_every_pool_fails_as_too_long_with_the_pool_to_add():
    s = state()
    s.update_graph("c", [task("long", duration=7200)], ["long"])
    exc = error_from_record("long", erred(s.take_outbox())["long"], load=None)
    assert isinstance(exc, TaskTooLongError) and exc.walltime == 3600
    assert "7200 s" in str(exc) and "(pool 'default';" in str(exc)
    assert "pools={'long': {'walltime': '02:15:00'}}" in str(exc), str(exc)


def test_pool_demand_counts_threads_for_work_only_that_pool_can_run_capped_by_max_jobs():
    s = state(bigmem=dict(pools()["bigmem"], max_jobs=1))
    add_worker(s, "d1", nthreads=2)
    s.update_graph("c", [task(f"p{i}") for i in range(3)] + [task(f"m{i}", memory=30 * GB) for i in range(5)],
                   [f"p{i}" for i in range(3)] + [f"m{i}" for i in range(5)])
    # 2 tasks of 30 GB per 64 GB, 8-thread worker: each holds 4 threads; 5 of them want 20,
    # but max_jobs=1 gives at most 8. Plain work: the 3 tasks of the default pool's smallest.
    assert s.pool_demand() == {"default": 3, "bigmem": 8}
    # A live worker of another pool that can hold plain tasks: they are nobody's demand.
    add_worker(s, "b1", pool="bigmem", nthreads=8)
    assert s.pool_demand()["default"] == 0
    assert s.pool_demand()["bigmem"] == 8


def test_workload_per_pool_follows_where_the_work_goes():
    s = state(long={"memory": 4 * GiB, "walltime": 86400, "nthreads": 1})
    s.update_graph("c", [task("short", duration=10), task("slow", duration=5000), task("fat", memory=10 * GB)],
                   ["short", "slow", "fat"])
    assert workload(s) == pytest.approx(10 + 5000 + 1)
    assert workload(s, pool="default") == pytest.approx(10)
    assert workload(s, pool="long") == pytest.approx(5000)
    assert workload(s, pool="bigmem") == pytest.approx(1)


# -- retry by cause -----------------------------------------------------------------------------------
def test_a_memory_death_moves_the_task_to_the_smallest_pool_that_holds_its_peak_times_the_margin():
    s = state(allowed_failures=0, mid={"memory": 8 * GB, "walltime": 3600, "nthreads": 1})
    add_worker(s, "d1")
    s.update_graph("c", [task("hog")], ["hog"])
    s.take_outbox()
    record = run_and_die(s, "d1", "hog", "memory-batch", peak_memory=int(3.9 * GiB))
    ts = s.tasks["hog"]
    # max(peak, the cgroup's limit 4 GiB) x 1.5 = 6.4 GB: 'mid' (8 GB), not bigmem (64 GB).
    assert ts.state == "queued" and ts.pool == "mid" and ts.memory == int(4 * GiB * 1.5)
    assert ts.escalation == "attempt 2 on mid (8 GB) after memory-batch at 3.9 of 4.0 GiB"
    assert record["pool"] == "default" and record["escalation"] == ts.escalation
    assert s.pool_demand() == {"default": 0, "mid": 1, "bigmem": 0}
    add_worker(s, "d2")
    assert computes(s.take_outbox(), "d2") == []         # not back where it would die again
    add_worker(s, "m1", pool="mid")
    assert computes(s.take_outbox(), "m1") == ["hog"]
    attempts = s._attempts(ts)
    assert attempts[0]["pool"] == "default" and attempts[0]["escalation"] == ts.escalation
    assert "escalation: attempt 2 on mid" in format_death(attempts[0])


def test_the_move_waits_for_the_final_verdict_and_innocent_deaths_retry_in_the_same_pool():
    s = state()
    add_worker(s, "d1")
    s.update_graph("c", [task("t")], ["t"])
    s.take_outbox()
    record = run_and_die(s, "d1", "t", "connection-lost", final=False)
    add_worker(s, "d2")
    assert computes(s.take_outbox(), "d2") == []         # held: the verdict may still move it
    s.refine_death(record["id"], "preempted", False, "preempted", final_at=5)
    assert computes(s.take_outbox(), "d2") == ["t"]      # innocent: same pool, not moved
    assert s.tasks["t"].pool is None and s.tasks["t"].escalation is None
    record = run_and_die(s, "d2", "t", "connection-lost", now=6, final=False)
    s.refine_death(record["id"], "memory-nanny", True, "over budget", peak_memory=int(3.8 * GiB), final_at=9)
    assert s.tasks["t"].pool == "bigmem"
    assert s.tasks["t"].escalation == "attempt 3 on bigmem (64 GB) after memory-nanny at 3.8 of 4.0 GiB"


def test_with_no_bigger_pool_a_memory_death_counts_and_the_error_says_what_pool_to_add():
    s = state(allowed_failures=1)
    add_worker(s, "b1", pool="bigmem")
    s.update_graph("c", [task("hog", pool="bigmem")], ["hog"])
    s.take_outbox()
    run_and_die(s, "b1", "hog", "memory-batch", peak_memory=60 * GB)
    assert s.tasks["hog"].state == "queued"              # charged once of one allowed, as before pools
    add_worker(s, "b2", pool="bigmem")
    s.take_outbox()
    run_and_die(s, "b2", "hog", "memory-batch", now=5, peak_memory=63 * GB)
    err = s.tasks["hog"].error
    exc = error_from_record("hog", err, load=None)
    assert isinstance(exc, TaskMemoryError) and isinstance(exc, KilledWorker)
    assert exc.largest_pool == "bigmem" and exc.needed == int(64 * GB * 1.5)
    assert "add a pool with memory >= 100GB: pools={'huge': {'memory': '100GB'}}" in str(exc), str(exc)


def test_a_margin_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        state(escalate={"margin": 0.5})


def test_escalation_off_leaves_memory_deaths_charged_where_they_died():
    s = state(allowed_failures=0, escalate={"memory": False})
    add_worker(s, "d1")
    s.update_graph("c", [task("hog")], ["hog"])
    s.take_outbox()
    run_and_die(s, "d1", "hog", "memory-batch", peak_memory=4 * GiB)
    assert s.tasks["hog"].state == "erred" and s.tasks["hog"].pool is None


def test_the_largest_pool_takes_a_task_whose_peak_times_margin_no_pool_holds():
    s = state(allowed_failures=0)
    add_worker(s, "d1", memory_limit=4 * GiB)
    s.pools["bigmem"]["memory"] = 5 * GB
    s.update_graph("c", [task("hog")], ["hog"])
    s.take_outbox()
    run_and_die(s, "d1", "hog", "memory-nanny", peak_memory=int(3.9 * GiB))
    ts = s.tasks["hog"]
    assert ts.state == "queued" and ts.pool == "bigmem" and ts.memory == 5 * GB
    assert "the largest pool" in ts.escalation


def test_walltime_moves_and_tasks_too_long_for_their_pool():
    s = SchedulerState(prefetch=0, walltime_failures=1)
    s.set_pools({"default": {"memory": 0, "walltime": 60, "nthreads": 1},
                 "long": {"memory": 0, "walltime": 300, "nthreads": 1, "escalation_only": True}})
    s.add_worker("d1", nthreads=1, now=0, deadline=60, info={"pool": "default", "job_walltime": 60})
    s.update_graph("c", [task("t")], ["t"])
    s.take_outbox()
    s.task_started("d1", "t", now=2)
    s.remove_worker("d1", now=20, death={"cause": "walltime", "blame": False, "text": "time limit"})
    assert s.tasks["t"].pool is None                     # cut after 18 s of 60: a fresh job of its pool
    s.add_worker("d2", nthreads=1, now=20, deadline=80, info={"pool": "default", "job_walltime": 60})
    assert computes(s.take_outbox(), "d2") == ["t"]
    s.task_started("d2", "t", now=21)
    s.remove_worker("d2", now=79, death={"cause": "walltime", "blame": False, "text": "time limit"})
    ts = s.tasks["t"]
    assert ts.state == "queued" and ts.pool == "long"    # 58 s of 60: longer jobs; not counted
    assert ts.escalation == "attempt 3 on long (00:05:00 walltime) after walltime at 00:00:58 of 00:01:00"
    assert s.pool_demand() == {"default": 0, "long": 1}
    # Expected longer than any job of the pools it may use: moved at once to one with longer jobs.
    s.update_graph("c", [task("slow", duration=100)], ["slow"])
    assert s.tasks["slow"].pool == "long" and "too long for the jobs of default" in s.tasks["slow"].escalation
    # Without walltime moves, the same task fails at once, naming the longest pool it may use.
    s2 = SchedulerState(prefetch=0)
    s2.set_pools(s.pools, {"walltime": False})
    s2.update_graph("c", [task("slow", duration=100)], ["slow"])
    exc = error_from_record("slow", erred(s2.take_outbox())["slow"], load=None)
    assert isinstance(exc, TaskTooLongError) and "pool 'default'" in str(exc)


def test_with_no_longer_pool_walltime_deaths_count_and_the_error_says_what_to_add():
    s = SchedulerState(prefetch=0, walltime_failures=0)
    s.set_pools({"default": {"memory": 0, "walltime": 60, "nthreads": 1}})
    s.add_worker("d1", nthreads=1, now=0, deadline=60, info={"job_walltime": 60})
    s.update_graph("c", [task("t")], ["t"])
    s.take_outbox()
    s.task_started("d1", "t", now=1)
    s.remove_worker("d1", now=59, death={"cause": "walltime", "blame": False, "text": "time limit"})
    exc = error_from_record("t", s.tasks["t"].error, load=None)
    assert isinstance(exc, TaskWalltimeError) and exc.largest_pool == "default"
    assert "add a pool with walltime >= 00:05:00" in str(exc), str(exc)


# -- evidence, the wire and the user's view --------------------------------------------------------
def test_the_nannys_peak_reaches_the_death_record_and_moves_the_task():
    import asyncio

    from hpc_cluster.scheduler import evidence

    s = state(allowed_failures=0)
    col = evidence.EvidenceCollector(s, clock=lambda: 1000.0, flush=lambda: None)
    add_worker(s, "tcp://w:1", nanny_id="n1")
    s.update_graph("c", [task("hog")], ["hog"])
    s.task_started("tcp://w:1", "hog", now=999.0)

    async def run():
        record = col.worker_removed("tcp://w:1", "closed", None)
        assert record["final_at"] is None and s.tasks["hog"].pool is None     # the report may still come
        col.exit_report({"nanny_id": "n1", "signal": 9, "exit_code": None, "killed_by_nanny": True,
                         "peak_rss": int(3.9 * GiB), "memory_limit": 4 * GiB, "memory_budget": int(3.8 * GiB)})
        return record

    record = asyncio.run(run())
    assert record["cause"] == "memory-nanny" and record["final_at"] == 1000.0
    assert record["peak_memory"] == int(3.9 * GiB) and record["memory_limit"] == 4 * GiB
    assert record["pool"] == "default"
    assert record["escalation"] == "attempt 2 on bigmem (64 GB) after memory-nanny at 3.9 of 4.0 GiB"
    assert s.tasks["hog"].state == "queued" and s.tasks["hog"].pool == "bigmem"


def test_the_wire_takes_memory_in_bytes_and_a_pool_by_name():
    from hpc_cluster.protocol.comm import ProtocolError
    from hpc_cluster.scheduler.checks import check_task

    assert check_task(task("t", memory=2 * GiB, pool="bigmem"))["memory"] == 2 * GiB
    for bad in ({"memory": "2GB"}, {"memory": -1}, {"memory": True}, {"pool": 3}):
        with pytest.raises(ProtocolError):
            check_task({**task("t"), **bad})


def test_why_and_the_killed_worker_error_show_each_move():
    import pickle

    from hpc_cluster.client.tools import ClusterToolsMixin

    s = state(allowed_failures=0, mid={"memory": 8 * GB, "walltime": 3600, "nthreads": 1})
    add_worker(s, "d1")
    s.update_graph("c", [task("hog")], ["hog"])
    s.take_outbox()
    run_and_die(s, "d1", "hog", "memory-batch", peak_memory=int(3.9 * GiB))
    add_worker(s, "m1", pool="mid")
    run_and_die(s, "m1", "hog", "memory-batch", now=5, peak_memory=int(7.5 * GB))
    add_worker(s, "b1", pool="bigmem")
    run_and_die(s, "b1", "hog", "memory-batch", now=9, peak_memory=int(63 * GB))
    ts = s.tasks["hog"]
    assert ts.state == "erred"                           # no pool bigger than bigmem: charged, allowed 0

    class Stub(ClusterToolsMixin):
        class _lt:
            @staticmethod
            def run(coro, timeout):
                return coro

        timeout = 1

        def _request(self, msg):
            return {"state": ts.state, "error": {"kind": "exception", "text": "x"},
                    "attempts": s._attempts(ts), "pool": ts.pool, "escalation": ts.escalation}

    text = Stub().why(type("F", (), {"key": "hog"})())
    assert "in pool default: memory-batch (moved, not charged)" in text, text
    assert "escalation: attempt 2 on mid (8 GB) after memory-batch at 3.9 of 4.0 GiB" in text
    assert "escalation: attempt 3 on bigmem (64 GB) after memory-batch at 7.0 of 7.5 GiB" in text, text
    exc = error_from_record("hog", ts.error, load=None)
    assert isinstance(exc, TaskMemoryError) and exc.largest_pool == "bigmem"
    assert "then attempt 2 on mid" in str(exc) and "Pools: the largest pool, 'bigmem', has 64 GB" in str(exc)
    again = pickle.loads(pickle.dumps(exc))
    assert str(again) == str(exc) and again.needed == exc.needed


def test_with_only_the_default_pool_open_verdicts_hold_nothing_back_as_before_pools():
    s = SchedulerState(prefetch=0)
    s.set_pools({"default": pools()["default"]})
    add_worker(s, "d1")
    s.update_graph("c", [task("t")], ["t"])
    s.take_outbox()
    run_and_die(s, "d1", "t", "connection-lost", final=False)
    add_worker(s, "d2")
    assert computes(s.take_outbox(), "d2") == ["t"]      # no pool to move to: no reason to wait


def test_the_workers_table_and_a_job_that_never_started_name_their_pool():
    from hpc_cluster.scheduler.server import Scheduler

    sched = Scheduler(b"s" * 32)
    sched.state.add_worker("tcp://a:1", 1, 0.0, memory_limit=4 * GiB)
    sched.state.add_worker("tcp://b:1", 1, 0.0, memory_limit=4 * GiB, info={"pool": "bigmem"})
    sched.state.update_graph("c", [task("t", memory=GiB, pool="bigmem")], ["t"])
    rows = {r["address"]: r for r in sched.worker_table()}
    assert rows["tcp://a:1"]["pool"] == "default" and rows["tcp://b:1"]["pool"] == "bigmem"
    assert rows["tcp://b:1"]["reserved_memory"] == GiB and rows["tcp://a:1"]["reserved_memory"] == 0
    record = sched.deaths.job_never_started("7", None, ["ImportError: no module"], pool="bigmem")
    assert record["pool"] == "bigmem" and record["cause"] == "startup"


def test_a_cgroup_kill_above_the_sampled_peak_says_it_ended_at_the_limit():
    # The nanny samples at 10 Hz: an allocation of 700 MB in a 286 MiB job is killed by the
    # kernel between two samples (SLURM, benchmarks/escalation.py: "101 of 286 MiB"). The move
    # is sized from the limit, and says so.
    s = state(allowed_failures=0, mid={"memory": 8 * GB, "walltime": 3600, "nthreads": 1})
    add_worker(s, "d1")
    s.update_graph("c", [task("hog")], ["hog"])
    run_and_die(s, "d1", "hog", "memory-batch", peak_memory=int(0.5 * GiB))
    ts = s.tasks["hog"]
    assert ts.escalation == "attempt 2 on mid (8 GB) after memory-batch at its 4.0 GiB limit (0.5 GiB sampled)"


def test_the_walltime_advised_for_a_long_task_lets_a_fresh_worker_start_it():
    # Issue 34: the advice named a walltime still too short (no room for the worker's start,
    # and not a whole number of minutes, which SLURM rounds anyway).
    from hpc_cluster.scheduler.state.placement import FIT_FACTOR, FIT_SLACK, STARTUP_ALLOWANCE, seconds_for
    for expected in (1, 58, 116, 3599, 7200):
        advised = seconds_for(expected)
        assert advised % 60 == 0
        assert advised - STARTUP_ALLOWANCE >= expected * FIT_FACTOR + FIT_SLACK    # started by a worker up late
