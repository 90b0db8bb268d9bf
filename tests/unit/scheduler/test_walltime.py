"""Walltime awareness, pure parts: placement that fits, graceful drain, renewal, adapt sizing;
and the job manager around them (queue cap, startup failures, job log tails)."""

from __future__ import annotations

import types

from hpc_cluster.adapters.base import JobSpec
from hpc_cluster.deploy.daemon.jobs import AdaptPolicy, Job, JobManager
from hpc_cluster.scheduler.state.placement import key_prefix
from hpc_cluster.scheduler.state import SchedulerState
from helpers.fakes import FakeAdapter
from helpers.tasks import computes, task


def test_key_prefix_groups_tasks_of_one_function():
    assert key_prefix("slow-3a9c0d1e2f3a4b5c6d7e8f90") == "slow"
    assert key_prefix("my-task-name") == "my-task-name"


def test_a_long_task_is_not_started_on_a_worker_with_too_little_time():
    s = SchedulerState(prefetch=0)
    s.add_worker("old", nthreads=1, now=100, deadline=120)            # 20 s left
    s.update_graph("c", [task("long", duration=50)], ["long"])
    assert computes(s.take_outbox(), "old") == []                      # waits rather than dies
    s.add_worker("fresh", nthreads=1, now=101, deadline=161)           # a renewed job: 60 s
    assert computes(s.take_outbox(), "fresh") == ["long"]


def test_learned_durations_guide_placement():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0, deadline=1000)
    s.update_graph("c", [task("slow-aaaaaaaaaaaa")], ["slow-aaaaaaaaaaaa"])
    s.take_outbox()
    s.task_started("w", "slow-aaaaaaaaaaaa", now=0)
    s.task_finished("w", "slow-aaaaaaaaaaaa", 8, duration=50.0)
    s.set_time(960)                                                    # 40 s left on w
    s.update_graph("c", [task("slow-bbbbbbbbbbbb")], ["slow-bbbbbbbbbbbb"])
    assert computes(s.take_outbox(), "w") == []
    s.update_graph("c", [task("quick-cccccccccccc")], ["quick-cccccccccccc"])   # unknown: may run
    assert computes(s.take_outbox(), "w") == ["quick-cccccccccccc"]


def test_drain_hands_back_queued_tasks_keeps_fitting_ones_and_saves_unique_results():
    s = SchedulerState(prefetch=2, queue_roots=False)
    s.add_worker("old", nthreads=1, now=0, deadline=100, info={"job_walltime": 100})
    s.update_graph("c", [task("done"), task("running", duration=5), task("queued1"), task("queued2")],
                   ["done", "running", "queued1", "queued2"])
    s.take_outbox()
    s.task_started("old", "done", now=1)
    s.task_finished("old", "done", 8, duration=1)
    s.task_started("old", "running", now=79)
    s.take_outbox()
    assert s.workers_to_drain(now=79, walltime_margin=60) == []        # margin capped at 20 % of 100 s
    assert s.workers_to_drain(now=81, walltime_margin=60) == ["old"]
    s.add_worker("new", nthreads=1, now=81, deadline=200)
    s.take_outbox()
    s.start_drain("old")
    out = s.take_outbox()
    assert {"op": "hand-back", "keys": ["queued1", "queued2"]} in out["old"]
    assert computes(out, "new") == []                                  # the worker decides first
    s.task_started("old", "queued2", now=81.5)                         # this one had just started
    s.handed_back("old", ["queued1"])
    out = s.take_outbox()
    assert computes(out, "new") == ["queued1"]                         # handed back, runs there
    assert s.tasks["queued2"].processing_on.address == "old"           # not run twice
    s.task_finished("old", "queued2", 8, duration=0.5)
    assert s.tasks["running"].processing_on.address == "old"           # 5 s left to run: fits
    assert not s.drain_step("old")                                     # still running
    s.task_finished("old", "running", 8, duration=5)
    assert not s.drain_step("old")                                     # 'done', 'running' held only here
    copies = [m for m in s.take_outbox()["new"] if m["op"] == "fetch-replica"]
    assert sorted(m["key"] for m in copies) == ["done", "queued2", "running"]
    for key in ("done", "queued2", "running"):
        s.add_replica("new", key, 8)
    assert s.drain_step("old")                                         # nothing would be lost now
    s.remove_worker("old", now=90, death={"cause": "retired", "blame": False})
    assert s.tasks["done"].state == "memory" and s.tasks["running"].state == "memory"
    assert all(not t.attempts for t in s.tasks.values())               # nobody was charged


def test_drain_hands_back_a_running_task_that_cannot_finish_in_time_without_charge():
    s = SchedulerState(prefetch=0)
    s.add_worker("old", nthreads=1, now=0, deadline=100, info={"job_walltime": 100})
    s.update_graph("c", [task("slow-aaaaaaaaaaaa")], ["slow-aaaaaaaaaaaa"])   # duration unknown yet
    assert computes(s.take_outbox(), "old") == ["slow-aaaaaaaaaaaa"]
    s.task_started("old", "slow-aaaaaaaaaaaa", now=75)
    s.durations.learn("slow-bbbbbbbbbbbb", 30.0)                           # now we know: 30 s
    s.add_worker("new", nthreads=1, now=81, deadline=500)
    s.start_drain("old")                                                   # 75 + 30 > 100
    out = s.take_outbox()
    assert computes(out, "new") == ["slow-aaaaaaaaaaaa"]                   # handed back at once
    assert not s.tasks["slow-aaaaaaaaaaaa"].attempts                     # and not charged
    assert "slow-aaaaaaaaaaaa" in s.workers["old"].abandoned               # its thread stays busy


def _manager(now, walltime=60, margin=60, lifetime=None):
    state = SchedulerState()
    sched = types.SimpleNamespace(state=state, walltime_margin=margin, retire_workers=lambda *a: None,
                                  drain=lambda *a: None, halt=lambda reason: None, fail_if_stranded=lambda: None)
    clock = {"t": now}
    jm = JobManager(sched, FakeAdapter(), JobSpec(worker_command="true", walltime=walltime, cores=2),
                    clock=lambda: clock["t"], lifetime=lifetime)
    return jm, state, clock


def test_renewal_runs_ahead_of_the_workers_lifetime_when_it_ends_the_job_first():
    # dask-jobqueue's recipe: --lifetime 55m --lifetime-stagger 4m in 1-hour jobs. Without
    # --lifetime-restart the job ends with its workers, at 51 minutes at the earliest.
    from hpc_cluster.deploy.plan import job_lifetime
    lifetime = job_lifetime(["--lifetime", "55m", "--lifetime-stagger", "4m"])
    assert lifetime == 51 * 60 and job_lifetime(["--lifetime", "55m", "--lifetime-restart"]) is None
    jm, _, clock = _manager(now=0, walltime=3600, lifetime=lifetime)
    job = Job("1", submitted=0, started=10)
    jm.jobs["1"] = job
    # lead = margin 60 + queue wait 10 + startup 5: renew from 10 + 3060 - 75
    clock["t"] = 2994
    assert not jm.expiring(job)
    clock["t"] = 2996
    assert jm.expiring(job)


def test_renewal_starts_ahead_of_the_deadline_using_the_observed_queue_wait():
    jm, _, clock = _manager(now=1000)
    job = Job("1", submitted=990, started=994)                        # 4 s queue wait
    jm.jobs["1"] = job
    assert jm.queue_wait() == 4.0
    # walltime 60, margin min(60, 12) = 12, lead = 12 + 4 + 5 = 21 -> renew from t = 994 + 60 - 21
    clock["t"] = 1032
    assert not jm.expiring(job)
    clock["t"] = 1033.5
    assert jm.expiring(job)


def test_adapt_grows_at_once_and_shrinks_only_when_polls_agree():
    jm, state, _ = _manager(now=0)
    jm.adaptive, jm.target = AdaptPolicy(1, 5, target_duration=30, wait_count=3), 1
    state.update_graph("c", [task(f"t{i}", duration=10) for i in range(30)], [f"t{i}" for i in range(30)])
    assert jm.update_target() == 5                                     # 300 s of work / (30 s x 2 threads)
    state.client_releases("c", [f"t{i}" for i in range(30)])
    assert [jm.update_target() for _ in range(3)] == [5, 5, 1]         # down after 3 agreeing polls


def test_adapt_follows_dasks_target_duration_wait_count_and_no_maximum():
    jm, state, _ = _manager(now=0)
    jm.adaptive, jm.target = AdaptPolicy(0, None), 0                    # dask's defaults: 5 s, 3 rounds
    state.update_graph("c", [task(f"t{i}", duration=10) for i in range(30)], [f"t{i}" for i in range(30)])
    assert jm.update_target() == 30                                    # 300 s / (5 s x 2 threads), no cap
    jm.adaptive.wait_count = 1
    state.client_releases("c", [f"t{i}" for i in range(30)])
    assert jm.update_target() == 0                                     # down at the first decision


def test_dask_keys_learn_durations_by_their_name():
    assert key_prefix("('sum-aggregate-0123456789abcdef0123456789abcdef', 0, 1)") == "sum-aggregate"
    assert key_prefix("('random_sample-0123456789abcdef', 3)") == "random_sample"
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0, deadline=1000)
    first, second = "('slow-0123456789abcdef', 0)", "('slow-0123456789abcdef', 1)"
    s.update_graph("c", [task(first)], [first])
    s.take_outbox()
    s.task_started("w", first, now=0)
    s.task_finished("w", first, 8, duration=50.0)
    s.set_time(960)                                                    # 40 s left on w
    s.update_graph("c", [task(second)], [second])
    assert computes(s.take_outbox(), "w") == []


def _manager_with(adapter, now=1000, **kw):
    state = SchedulerState()
    sched = types.SimpleNamespace(state=state, walltime_margin=60, retire_workers=lambda *a: None,
                                  drain=lambda *a: None, deaths=types.SimpleNamespace(never_started=[]),
                                  halted=[], fail_if_stranded=lambda: None)
    sched.halt = sched.halted.append
    sched.deaths.job_never_started = lambda jid, rec, tail: sched.deaths.never_started.append(jid)
    clock = {"t": now}
    jm = JobManager(sched, adapter, JobSpec(worker_command="true", walltime=60, cores=1),
                    clock=lambda: clock["t"], **kw)
    jm.accounting = _no_accounting
    jm.log_tail = _no_log
    return jm, state, clock


async def _no_accounting(job_ids):
    return {}


async def _no_log(job_id, lines=40):
    return []


def test_renewal_submits_replacements_before_the_deadline_and_counts_them():
    import asyncio

    adapter = FakeAdapter(state="running")
    jm, _, clock = _manager_with(adapter)

    async def run():
        await jm.scale(2)
        assert adapter.ids == ["1", "2"]
        await jm.poll_once()                             # both running from t = 1000, 60 s walltime
        clock["t"] = 1020
        await jm.reconcile()
        assert adapter.ids == ["1", "2"]           # far from the deadline: nothing to renew
        clock["t"] = 1044                                # lead = 12 s margin + 0 s wait + 5 s start
        await jm.reconcile()
        assert adapter.ids == ["1", "2", "3", "4"] and jm.renewals == 2
        await jm.reconcile()
        assert len(adapter.ids) == 4               # no second round of replacements

    asyncio.run(run())


def test_the_queue_cap_counts_pending_and_running_jobs():
    import asyncio

    adapter = FakeAdapter(state="running")
    jm, _, _ = _manager_with(adapter, max_jobs_in_queue=3)

    async def run():
        await jm.scale(2)
        await jm.poll_once()                             # two running
        await jm.scale(5)
        assert adapter.ids == ["1", "2", "3"]      # 2 running + 1 pending = the cap of 3
        adapter.states["1"] = "completed"
        await jm.poll_once()
        await jm.reconcile()
        assert adapter.ids == ["1", "2", "3", "4"]  # a finished job frees a place

    asyncio.run(run())


def test_a_worker_that_joined_and_died_between_polls_is_not_a_startup_failure():
    # Found in an audit: a worker that registered and died within one poll interval (a task
    # that segfaults at once) made its job count as "ended before its worker registered",
    # and three of those halted the cluster before the task's own KilledWorker.
    import asyncio

    adapter = FakeAdapter(state="running")
    jm, state, _ = _manager_with(adapter)

    async def run():
        await jm.scale(1)
        await jm.poll_once()
        state.add_worker("tcp://w:1", 1, 1000.5, info={"job_id": "1"})
        state.remove_worker("tcp://w:1", 1001, {"cause": "crash", "blame": True, "text": "SIGSEGV"})
        adapter.states["1"] = "failed"
        await jm.poll_once()
        await asyncio.sleep(0)
        assert jm.jobs["1"].registered and jm.failed_starts == 0
        assert jm.scheduler.deaths.never_started == []
        # A job that really never ran its worker still counts.
        await jm.reconcile()
        adapter.states["2"] = "failed"
        await jm.poll_once()
        await asyncio.sleep(0)
        assert jm.failed_starts == 1 and jm.scheduler.deaths.never_started == ["2"]

    asyncio.run(run())


def test_job_logs_are_found_without_a_log_directory(tmp_path):
    # No log_directory: SLURM writes slurm-<id>.out where sbatch ran (or in --chdir).
    import asyncio

    from hpc_cluster.runners.local import LocalRunner

    adapter = FakeAdapter(state="running")
    adapter.runner = LocalRunner()
    (tmp_path / "slurm-42.out").write_text("starting\nModuleNotFoundError: No module named 'numpyy'\n")
    (tmp_path / "slurm-420.out").write_text("another job\n")
    jm, _, _ = _manager_with(adapter, submit_directory=str(tmp_path))
    del jm.log_tail                                      # the real one, not _manager_with's stand-in
    assert jm.log_directory() == str(tmp_path)
    assert asyncio.run(jm.log_tail("42")) == ["starting", "ModuleNotFoundError: No module named 'numpyy'"]
    jm.spec = jm.spec.replace(working_directory=str(tmp_path / "work"))
    assert jm.log_directory() == str(tmp_path / "work")  # sbatch --chdir moves them there


def test_startup_failures_halt_submissions_and_tell_the_scheduler():
    import asyncio

    adapter = FakeAdapter(state="running")
    jm, _, _ = _manager_with(adapter)

    async def run():
        await jm.scale(1)
        for n in range(3):
            adapter.states[adapter.ids[-1]] = "failed"
            await jm.poll_once()
            await jm.reconcile()
        assert jm.failed_starts == 3 and adapter.ids == ["1", "2", "3"]   # no 4th job
        assert jm.scheduler.halted[-1].startswith("3 jobs in a row ended before their worker started")
        await jm.scale(1)                                # the user fixed it and scales again
        assert jm.scheduler.halted[-1] is None and adapter.ids[-1] == "4"

    asyncio.run(run())


def test_a_halted_cluster_with_no_worker_coming_fails_waiting_work_saying_why():
    from hpc_cluster.scheduler.server import Scheduler

    sched = Scheduler(b"s" * 32)
    sched.state.add_client("c")
    sched.state.update_graph("c", [task("t")], ["t"])
    jobs_alive = {"n": 1}
    sched.expecting_workers = lambda: jobs_alive["n"] > 0
    sched.halt("3 jobs in a row ended before their worker started")
    assert sched.state.tasks["t"].state == "queued"      # a job still in the queue may start one
    jobs_alive["n"] = 0
    sched.fail_if_stranded()                             # the job manager saw the last job end
    err = sched.state.tasks["t"].error
    assert sched.state.tasks["t"].state == "erred" and err["kind"] == "cancelled"
    assert "none will be started: 3 jobs in a row ended" in err["text"]


def test_a_task_cut_off_by_the_walltime_needs_more_than_it_already_ran():
    # Found on the real cluster: a 50 s task (no duration given, none learned) cut off after
    # 43 s was restarted on a worker with 30 s left and cut off again.
    s = SchedulerState(prefetch=0)
    s.add_worker("old", nthreads=1, now=0, deadline=60, info={"job_walltime": 60})
    s.update_graph("c", [task("long-x")], ["long-x"])
    assert computes(s.take_outbox(), "old") == ["long-x"]
    s.task_started("old", "long-x", now=17)
    s.add_worker("half", nthreads=1, now=30, deadline=90, info={"job_walltime": 60})
    s.remove_worker("old", now=60, death={"cause": "walltime", "blame": False})
    assert computes(s.take_outbox(), "half") == []               # 30 s left < 43 s it already ran
    s.add_worker("fresh", nthreads=1, now=61, deadline=120, info={"job_walltime": 60})
    assert computes(s.take_outbox(), "fresh") == ["long-x"]      # 59 s left >= 43 x 1.1 + 1


def test_a_task_that_ran_longer_than_a_jobs_walltime_can_hold_fails_saying_so():
    s = SchedulerState(prefetch=0)
    s.add_worker("old", nthreads=1, now=0, deadline=60, info={"job_walltime": 60})
    s.update_graph("c", [task("long-y")], ["long-y"])
    s.take_outbox()
    s.task_started("old", "long-y", now=2)
    s.add_worker("fresh", nthreads=1, now=59, deadline=119, info={"job_walltime": 60})
    s.remove_worker("old", now=60, death={"cause": "walltime", "blame": False})    # ran 58 s
    out = s.take_outbox()
    assert computes(out, "fresh") == []
    err = [m for m in out.get("c", []) if m["op"] == "task-erred"][0]["error"]
    assert err["kind"] == "too-long" and "it already ran 58 s" in err["text"], err


def test_a_job_submitted_while_the_cluster_closes_is_cancelled_too():
    """A renewal's sbatch under way when the cluster closed returned after close() had listed
    the jobs to cancel: its job stayed in the queue (CI, test_walltime_ops lifetime case)."""
    import asyncio
    import threading

    class SlowSubmit(FakeAdapter):
        def __init__(self):
            super().__init__(state="running")
            self.entered, self.release = threading.Event(), threading.Event()

        def submit(self, script):
            self.entered.set()
            assert self.release.wait(10)
            return super().submit(script)

    adapter = SlowSubmit()
    jm, _, _ = _manager_with(adapter)

    async def run():
        scaling = asyncio.create_task(jm.scale(1))
        assert await asyncio.to_thread(adapter.entered.wait, 10)
        closing = asyncio.create_task(jm.close())
        while not jm.closing:
            await asyncio.sleep(0)
        adapter.release.set()
        await asyncio.wait_for(asyncio.gather(scaling, closing), 30)
        assert adapter.ids == ["1"] and adapter.cancelled == ["1"]

    asyncio.run(run())
