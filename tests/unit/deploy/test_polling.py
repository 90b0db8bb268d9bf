"""How often the job manager asks the batch system (issue 18, point 4): the pacer, the
backoff, the per-cluster budget of batch calls, the events that replace polls. Pure, with
fake clocks; tests/unit/adapters/test_slurm_polling.py has SLURM's side (--only-job-state,
--starttime) and the real SLURM counts the calls in tests/batch/slurm/test_polling_slurm.py."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import types

import pytest

from hpc_cluster.adapters.base import CommandResult
from hpc_cluster.config import ConfigError, resolve
from hpc_cluster.deploy.daemon.polling import (BudgetedRunner, CallBudget, Pacer, PollSettings,
                                        needs_fast, poll_backoff, poll_forever, transient)
from hpc_cluster.deploy.daemon.pools import PoolManager
from hpc_cluster.deploy.plan import PoolPlan
from hpc_cluster.scheduler.state import SchedulerState
from helpers.fakes import FakeAdapter
from helpers.wait import wait_until, wait_until_async


class FakeClock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def watched_job(submitted=0.0, registered=False, retiring=False, state="pending"):
    """A job as the pacer looks at it."""
    return types.SimpleNamespace(submitted=submitted, registered=registered, retiring=retiring, state=state,
                                 final=state in ("completed", "failed", "cancelled"))


# -- the budget -------------------------------------------------------------------------------

def test_budget_never_lets_more_than_n_calls_into_any_60_s_window():
    clock = FakeClock()
    budget = CallBudget(10, clock=clock, sleep=clock.sleep)
    starts = []
    for _ in range(45):                      # a caller that asks as fast as it can
        budget.acquire()
        starts.append(clock())
    for i, t in enumerate(starts):
        assert sum(1 for u in starts if t <= u < t + 60) <= 10, f"window from call {i} holds more than 10"
    assert starts[9] == starts[0] and starts[10] == starts[0] + 60     # the 11th waited a full minute
    assert budget.calls == 45 and budget.waited == pytest.approx(4 * 60)


def test_budget_waits_only_when_exhausted_and_logs_long_waits(caplog):
    clock = FakeClock()
    budget = CallBudget(3, clock=clock, sleep=clock.sleep)
    assert [budget.acquire() for _ in range(3)] == [0, 0, 0]
    clock.t += 20
    with caplog.at_level(logging.WARNING, "hpc_cluster.jobs"):
        assert budget.acquire("squeue") == pytest.approx(40)        # until the first is 60 s old
    assert "squeue waited 40 s for the batch-call budget (3 per minute" in caplog.text
    clock.t += 61
    assert budget.acquire() == 0


def test_budget_holds_across_threads_on_a_real_clock():
    budget = CallBudget(20, clock=time.monotonic, sleep=time.sleep)
    starts, lock = [], threading.Lock()

    def call():
        budget.acquire()
        with lock:
            starts.append(time.monotonic())

    threads = [threading.Thread(target=call, daemon=True) for _ in range(25)]
    for t in threads:
        t.start()
    wait_until(lambda: len(starts) >= 20, 10, "the first 20 calls")                  # they go through at once
    wait_until(lambda: sum(t.is_alive() for t in threads) <= 5, 10, "the 20 to finish")
    assert sum(t.is_alive() for t in threads) == 5                 # the other 5 wait for the window
    assert len(starts) == 20 and budget.calls == 20


def test_budgeted_runner_counts_batch_commands_and_leaves_file_reads_alone():
    ran = []
    inner = types.SimpleNamespace(run=lambda argv, **kw: ran.append(argv) or CommandResult(list(argv), 0, "", ""),
                                  host="login1")
    clock = FakeClock()
    runner = BudgetedRunner(inner, CallBudget(2, clock=clock, sleep=clock.sleep))
    runner.run(["squeue", "-h"])
    runner.run(["/usr/bin/sacct", "-P"])
    runner.run(["tail", "-n", "40", "x.err"])          # a job log read over SSH: not the controller's
    assert runner.counts == {"squeue": 1, "sacct": 1} and clock() == 1000.0
    runner.run(["scancel", "5"])                       # the third batch call in a minute of 2 waits
    assert clock() == 1060.0 and len(ran) == 4 and runner.host == "login1"


# -- pacing and backoff -------------------------------------------------------------------------

def test_fast_only_while_a_job_starts_or_ends_or_just_after_an_event():
    clock = FakeClock(1000.0)
    pacer = Pacer(PollSettings(fast=2, steady=30), clock)
    running = watched_job(submitted=900, registered=True, state="running")
    assert pacer.interval([running]) == 30                             # steady: its worker reported
    assert pacer.interval([running, watched_job(submitted=990)]) == 2          # one starting
    assert pacer.interval([running, watched_job(submitted=600)]) == 30         # pending 400 s: the queue holds it
    assert pacer.interval([watched_job(registered=True, retiring=True, state="running")]) == 2   # being retired
    assert pacer.interval([watched_job(state="cancelled")]) == 30              # finished: nothing to learn
    pacer.polled()
    assert pacer.delay([running]) == 30
    clock.t += 1
    pacer.event()                                                      # a worker died
    assert pacer.delay([running]) == pytest.approx(1)                  # due at once, but 2 s after the last
    pacer.polled()
    clock.t += 19
    assert pacer.interval([running]) == 2                              # fast for the event window (20 s)
    clock.t += 2
    assert pacer.interval([running]) == 30


def test_needs_fast_ignores_finished_jobs():
    assert not needs_fast([watched_job(submitted=0, state="failed")], now=1)
    assert needs_fast([watched_job(submitted=0)], now=1)


def test_backoff_doubles_with_jitter_caps_and_resets():
    draws = iter([0.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    b = poll_backoff(2, cap=60, rng=lambda: next(draws))
    waits = [b.next() for _ in range(8)]
    assert waits[:3] == [2.0, 8.0, 12.0]           # 4 x [0.5..1], 8 x 1, 16 x 0.75
    assert max(waits) == 60 and b.count == 8
    assert b.reset() == 8 and b.count == 0
    assert b.next() == 2.0


@pytest.mark.parametrize("text", ["squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation",
                                  "Unable to contact slurm controller (connect failure)",
                                  "sacct: error: slurmdbd: Connection refused"])
def test_transient_failures_are_recognised(text):
    assert transient(text)
    assert not transient("squeue: error: Invalid user: nobody")


def test_settings_refuse_a_fast_pace_slower_than_the_steady_one():
    with pytest.raises(ValueError, match="poll_interval_fast=40 must be .* at most poll_interval=30"):
        PollSettings(fast=40, steady=30)
    with pytest.raises(ValueError, match="batch_calls_per_minute=3 is too few"):
        PollSettings(calls_per_minute=3)
    cfg = resolve(batch="slurm", poll_interval="1m", batch_calls_per_minute=20)
    assert (cfg["poll_interval"], cfg["poll_interval_fast"], cfg["batch_calls_per_minute"]) == (60, 2, 20)
    with pytest.raises(ConfigError, match="poll_interval_fast=90 .* is longer than poll_interval=30"):
        resolve(batch="slurm", poll_interval_fast=90)
    with pytest.raises(ConfigError, match="batch_calls_per_minute=2 must be a whole number >= 6"):
        resolve(batch="slurm", batch_calls_per_minute=2)


# -- the loop and the events ----------------------------------------------------------------------

def pool_manager(settings):
    state = SchedulerState()
    sched = types.SimpleNamespace(state=state, walltime_margin=60, retire_workers=lambda *a: None,
                                  halt=lambda r: None, fail_if_stranded=lambda: None, drain=lambda *a: None)
    adapter = FakeAdapter()
    job_spec = {"worker_command": "w", "cores": 1, "memory": 300_000_000, "walltime": 600}
    return PoolManager(sched, adapter, {"default": PoolPlan.from_json({"job": job_spec})}, poll=settings), adapter


def test_a_registration_marks_the_job_running_and_a_death_wakes_the_poller():
    async def run():
        pm, adapter = pool_manager(PollSettings(fast=0.2, steady=30, calls_per_minute=600))
        await pm.scale(1)
        (jid,) = pm.default.jobs
        task = asyncio.create_task(poll_forever(pm))
        await wait_until_async(lambda: adapter.status_calls, timeout=10, what="the first poll")
        assert len(adapter.status_calls) == 1                  # the submit woke it at once
        assert pm.pacer.interval(pm.jobs_watched()) == 0.2     # fast: a job is starting
        assert 0 <= adapter.status_calls[0][2] < 1             # sacct's --starttime: submitted just now
        pm.worker_event("joined", {"job_id": jid, "job_start": pm.clock() - 3})
        job_ = pm.default.jobs[jid]
        assert (job_.state, job_.registered) == ("running", True) and pm.clock() - job_.started >= 3
        adapter.states[jid] = "running"
        n = len(adapter.status_calls)
        await asyncio.sleep(1.0)
        assert len(adapter.status_calls) == n                  # steady: 30 s between polls
        adapter.states[jid] = "failed"
        t0 = time.monotonic()
        pm.worker_event("removed", {"job_id": jid})
        await wait_until_async(lambda: job_.state == "failed", timeout=15, what="the job seen failed")
        assert time.monotonic() - t0 < 15                      # at once, not in 30 s (the steady poll)
        task.cancel()

    asyncio.run(run())


def test_failing_polls_back_off_and_are_logged_once_per_streak(caplog):
    async def run():
        pm, adapter = pool_manager(PollSettings(fast=0.05, steady=0.05, calls_per_minute=6000))
        await pm.scale(1)
        adapter.fail = 4
        task = asyncio.create_task(poll_forever(pm))
        await wait_until_async(lambda: len(adapter.status_calls) >= 6, 10, "six polls")
        task.cancel()
        times = [t for t, _, _ in adapter.status_calls]
        gaps = [b - a for a, b in zip(times, times[1:])]
        # 0.05 x 2^n x [0.5, 1]: 0.05-0.1, 0.1-0.2, 0.2-0.4, 0.4-0.8, then back to the 0.05 pace
        # (not reset, the next wait would be 0.8 s or more)
        assert gaps[0] >= 0.05 and gaps[3] >= 0.39 and gaps[3] > gaps[0] and gaps[4] < 0.5, gaps

    with caplog.at_level(logging.WARNING, "hpc_cluster.jobs"):
        asyncio.run(run())
    failed = [r for r in caplog.records if "could not read job states" in r.getMessage()]
    assert len(failed) == 1 and "transient" in failed[0].getMessage()
    assert any("answers again after 4 failed polls" in r.getMessage() for r in caplog.records)


def test_a_job_submitted_during_a_poll_is_read_before_the_jobs_table_answers():
    """CI saw `jobs` show our placeholder SUBMITTED: the job was submitted while a slow squeue
    ran, so that poll did not include it, yet ended after its submission."""
    async def run():
        pm, adapter = pool_manager(PollSettings(fast=0.2, steady=30, calls_per_minute=6000))
        await pm.scale(1)
        release, inside = threading.Event(), threading.Event()
        plain = adapter.status

        def slow_status(ids, within=None):
            inside.set()
            release.wait(5)
            return plain(ids, within)
        adapter.status = slow_status
        poll = asyncio.create_task(pm.poll_once())
        await asyncio.to_thread(inside.wait, 5)
        await pm.scale(2)                                      # while squeue runs
        adapter.status = plain
        release.set()
        assert await poll
        pm.pacer.polled()                                      # as poll_forever does
        late = max(pm.default.jobs.values(), key=lambda j: j.job_id)
        assert late.raw_state == "SUBMITTED"                   # that poll did not see it
        await pm.refresh()
        assert [j.raw_state for j in pm.default.jobs.values()] == ["PENDING", "PENDING"]   # squeue's, now
        calls = len(adapter.status_calls)
        await pm.refresh()                                     # all heard, just polled: no call
        assert len(adapter.status_calls) == calls

    asyncio.run(run())
