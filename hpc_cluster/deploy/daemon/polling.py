"""How often the job manager asks the batch system, and how it never asks too often.

Sites cap the RPCs a user may send to slurmctld (Slurm 23.02's `rl_enable`: a token bucket
per user, 2 per second by default) and ask users not to run squeue every few seconds. Most of
what a poll would tell us, the workers tell us first: a worker's registration says its job
runs, its nanny's exit report and its connection's close say it died. So the batch system is
asked fast only while it alone can tell us something soon:

- a job is starting (submitted, no worker registered yet, not finished): it may end before
  its worker joins (a startup failure), which only the batch system sees;
- a job is being cancelled or retired and has not ended yet (close() and scale-down wait on it);
- just after a worker was lost or its nanny reported an exit: the job's end follows within
  seconds (the diagnosis asks for its accounting on its own backoff, scheduler/evidence.py).

A submit, a cancel, a scale or adapt change wakes the poller at once without more.

Otherwise (every job running with its workers registered) the poll is steady, every
`poll_interval` (30 s by default). A failed poll backs off exponentially with jitter
(transient failures are common: "Socket timed out", slurmdbd unreachable), and every batch
command of a cluster goes through one `CallBudget`, a hard cap per minute.

Everything here is pure or takes its clock, sleep and randomness as arguments, so the unit
tests drive it with fake ones (tests/unit/deploy/test_polling.py).
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ...retry import Backoff

logger = logging.getLogger("hpc_cluster.jobs")

# Defaults (config/schema.py repeats them as the settings' defaults).
FAST_INTERVAL = 2.0          # s between polls while the batch system alone can tell us something soon
STEADY_INTERVAL = 30.0       # s between polls when every job runs with its workers registered
# Slurm's rl_enable lets a user 2 RPCs/s (120/min, bursts of 30). A cluster daemon taking
# half of that leaves the user's own squeue/sbatch room; fast polling (30/min) fits twice.
CALLS_PER_MINUTE = 60
STARTUP_WINDOW = 300.0       # s a submitted job is polled fast while no worker of it registered
EVENT_WINDOW = 20.0          # s of fast polling after a death (its job's end follows in seconds)
BACKOFF_CAP = 300.0          # s: the longest wait between tries while the batch system fails
WAIT_LOGGED = 5.0            # s: a command that waits this long for the budget is logged

# What a passing outage of the controller or of slurmdbd (or PBS's server) says.
_TRANSIENT = re.compile(r"Socket timed out|Unable to contact slurm controller|slurmdbd|Connection refused|"
                        r"Connection reset|timed out|Temporarily unavailable|try again|cannot connect|"
                        r"Communication failure|pbs_iff", re.I)


def transient(message: str) -> bool:
    """Whether a failure reads like a passing outage (worth a quiet retry) rather than a
    lasting problem. Both are retried with backoff; only the log's wording differs."""
    return bool(_TRANSIENT.search(message or ""))


@dataclass
class PollSettings:
    fast: float = FAST_INTERVAL
    steady: float = STEADY_INTERVAL
    calls_per_minute: int = CALLS_PER_MINUTE
    startup_window: float = STARTUP_WINDOW
    event_window: float = EVENT_WINDOW

    def __post_init__(self):
        if not 0 < self.fast <= self.steady:
            raise ValueError(f"poll_interval_fast={self.fast:g} must be greater than 0 and at most "
                             f"poll_interval={self.steady:g}; lower poll_interval_fast or raise poll_interval")
        if self.calls_per_minute < 6:
            raise ValueError(f"batch_calls_per_minute={self.calls_per_minute} is too few to run a cluster "
                             "(a poll, a submit and an accounting query must fit in a minute); give 6 or more")

    @classmethod
    def from_plan(cls, plan) -> "PollSettings":
        """The plan's poll_interval, poll_interval_fast and batch_calls_per_minute (deploy/plan.py)."""
        return cls(fast=float(plan.poll_interval_fast or FAST_INTERVAL),
                   steady=float(plan.poll_interval or STEADY_INTERVAL),
                   calls_per_minute=int(plan.batch_calls_per_minute or CALLS_PER_MINUTE))


# -- pacing ---------------------------------------------------------------------------------
def needs_fast(jobs: Iterable, now: float, startup_window: float = STARTUP_WINDOW) -> bool:
    """Does a job wait on news only the batch system has? (jobs.py's Job: submitted,
    registered, retiring, final). A job pending longer than the startup window is one the
    queue holds: polled at the steady pace, its worker's registration still wakes us."""
    for job in jobs:
        if job.final:
            continue
        if job.retiring or (not job.registered and now - job.submitted < startup_window):
            return True
    return False


class Pacer:
    """When the next poll is due. `wake()` (an event) makes it due now and fast for a while."""

    def __init__(self, settings: PollSettings, clock: Callable[[], float] = time.time):
        self.settings, self.clock = settings, clock
        self.last_event = float("-inf")
        self.last_poll = float("-inf")
        self.woken = False

    def event(self) -> None:
        """A worker died or its nanny reported: poll now, and fast for the event window."""
        self.last_event = self.clock()
        self.woken = True

    def wake(self) -> None:
        """A submit, cancel or resize: poll now; the jobs' own states set the pace after."""
        self.woken = True

    def polled(self) -> None:
        self.last_poll = self.clock()
        self.woken = False

    def interval(self, jobs: Iterable) -> float:
        now = self.clock()
        s = self.settings
        fast = now - self.last_event < s.event_window or needs_fast(jobs, now, s.startup_window)
        return s.fast if fast else s.steady

    def delay(self, jobs: Iterable) -> float:
        """Seconds until the next poll: at once after an event, but never sooner than the
        fast interval after the last one (a burst of deaths is one poll, not one each)."""
        now = self.clock()
        since = now - self.last_poll
        if self.woken:
            return max(0.0, self.settings.fast - since)
        return max(0.0, self.interval(jobs) - since)


def poll_backoff(fast: float, cap: float = BACKOFF_CAP, rng: Callable[[], float] = random.random) -> Backoff:
    """The wait between tries of a failing status call: 2 x fast, doubling up to `cap`, each
    drawn in [half, all] of it (so daemons of many users do not retry in step)."""
    return Backoff(2 * fast, cap, jitter=0.5, rng=rng)


# -- the budget -----------------------------------------------------------------------------
class CallBudget:
    """At most `per_minute` batch commands in any 60 s window, for one cluster.

    A sliding window of the last `per_minute` start times, not a token bucket: a bucket
    refilled at N/60 per second lets up to 2N through in a minute (a full bucket, then its
    refill); the window never does. Adapter calls run in threads (asyncio.to_thread), so it
    is locked; a call over the budget waits (sleeps in its thread) until the oldest of the
    window is a minute old."""

    WINDOW = 60.0

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if per_minute < 1:
            raise ValueError(f"batch_calls_per_minute={per_minute} must be at least 1")
        self.per_minute, self.clock, self.sleep = int(per_minute), clock, sleep
        self._starts: deque[float] = deque()
        self._lock = threading.Lock()
        self.calls = 0
        self.waited = 0.0

    def acquire(self, what: str = "") -> float:
        """Take one call from the budget, waiting as long as needed; returns the wait."""
        waited = 0.0
        while True:
            with self._lock:
                now = self.clock()
                while self._starts and now - self._starts[0] >= self.WINDOW:
                    self._starts.popleft()
                if len(self._starts) < self.per_minute:
                    self._starts.append(now)
                    self.calls += 1
                    self.waited += waited
                    if waited >= WAIT_LOGGED:
                        logger.warning("%s waited %.0f s for the batch-call budget (%d per minute: "
                                       "batch_calls_per_minute)", what or "a batch command", waited, self.per_minute)
                    return waited
                pause = self._starts[0] + self.WINDOW - now
            self.sleep(pause)
            waited += pause


# Commands a runner may run that are not the batch system's (job logs read over SSH, the
# login node's directories): they cost the controller nothing, so the budget leaves them.
NOT_BATCH = frozenset({"ls", "tail", "cat", "mkdir", "chmod", "rm", "sh", "test", "true"})


class BudgetedRunner:
    """A runner whose batch commands each take one call from a `CallBudget` first, and are
    counted by name. Wrapping the adapter's runner covers every command of every adapter
    (sbatch, squeue, sacct, scancel, scontrol, qsub, qstat, ...) without touching them."""

    def __init__(self, runner, budget: CallBudget):
        self.runner, self.budget = runner, budget
        self.counts: dict[str, int] = {}

    def run(self, argv: Sequence[str], input: str | None = None, timeout: float | None = None,
            check: bool = True):
        name = str(argv[0]).rsplit("/", 1)[-1] if argv else ""
        if name not in NOT_BATCH:
            self.budget.acquire(name)
            self.counts[name] = self.counts.get(name, 0) + 1
        return self.runner.run(argv, input=input, timeout=timeout, check=check)

    def __getattr__(self, attr):                 # write_file, close, host ... as the runner has them
        return getattr(self.runner, attr)


def budget_adapter(adapter, per_minute: int) -> BudgetedRunner:
    """Put `adapter`'s commands under a budget of `per_minute` (once); returns its runner.
    An adapter without a runner (the tests' fakes) is left alone, with an unused budget."""
    runner = getattr(adapter, "runner", None)
    if isinstance(runner, BudgetedRunner):
        return runner
    budgeted = BudgetedRunner(runner, CallBudget(per_minute))
    if runner is not None:
        adapter.runner = budgeted
    return budgeted


# -- the loop -------------------------------------------------------------------------------
async def poll_forever(owner) -> None:
    """The job manager's loop (a JobManager's, or deploy/daemon/pools.py's PoolManager's for every
    pool at once). `owner` has: pacer, wakeup (an asyncio.Event its events set), jobs_watched(),
    poll_once() -> bool (False: the batch system failed; owner.poll_error says how), reconcile().

    The jobs are brought in line (reconcile: submit, renew, shrink, pools' demand, no batch
    call unless it acts) every fast interval as before; the batch system is asked only when
    the pacer says a poll is due, and while it fails, after a growing, jittered wait."""
    import asyncio

    pacer = owner.pacer
    backoff = poll_backoff(pacer.settings.fast)
    retry_at = float("-inf")
    while True:
        owner.wakeup.clear()                       # before the checks: an event from now on wakes us
        now = pacer.clock()
        watched = [j for j in owner.jobs_watched() if not j.final]
        # No unfinished job: nothing to ask (and no poll counted, so a submit is asked about at once).
        if watched and now >= retry_at and pacer.delay(watched) <= 0:
            try:
                ok = await owner.poll_once()
            except Exception as exc:               # a parser's surprise must not end the loop
                logger.exception("job poll failed")
                owner.poll_error, ok = str(exc), False
            pacer.polled()
            if ok:
                streak = backoff.reset()
                if streak:
                    logger.warning("the batch system answers again after %d failed polls", streak)
                retry_at = float("-inf")
            else:
                wait = backoff.next()
                retry_at = pacer.clock() + wait
                if backoff.count == 1:          # once per streak, not per attempt
                    error = getattr(owner, "poll_error", "") or ""
                    logger.warning("could not read job states (%s): %s; retrying with backoff (%.0f s, "
                                   "doubling up to %.0f s) until it answers", "transient" if transient(error)
                                   else "failed", error, wait, backoff.cap)
        try:
            await owner.reconcile()
        except Exception:
            logger.exception("could not bring the jobs in line; trying again")
        wait = min(pacer.settings.fast, max(pacer.delay(owner.jobs_watched()), retry_at - pacer.clock()))
        try:
            await asyncio.wait_for(owner.wakeup.wait(), max(0.05, wait))
        except asyncio.TimeoutError:
            pass
