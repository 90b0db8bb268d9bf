"""The job manager: keeps the batch jobs in line with what the cluster should have.

Runs inside the cluster daemon, next to the scheduler, on its event loop. Batch commands
(sbatch, squeue, sacct ...) block, so they run in a thread and never stall the scheduler.
A job's state is what the batch system says (pending, running, finished), never assumed.
How many jobs to keep is decided apart, purely (policy.py); this module carries it out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
import time
from dataclasses import dataclass

from ...adapters.base import FINAL_STATES, BatchAdapter, BatchError, JobSpec
from ...config.pools import DEFAULT_POOL
from ...protocol.messages import Cause
from ...retry import Backoff
from ...scheduler.state.placement import workload
from .arrays import submit_array, use_array
from .policy import DEMAND_WAIT_COUNT, AdaptPolicy, JobPolicy, adaptive_jobs
from .polling import Pacer, PollSettings, poll_forever
from .untracked import Untracked, accepts
from ..remote import job_logs

UNHEARD = "SUBMITTED"          # a job's raw_state until the batch system's first word on it
STARTUP_SECONDS = 5.0          # a worker's start inside a running job, before it can take tasks
# placement.workload(state, pool=...) once the scheduler knows pools; before, the whole queue.
_WORKLOAD_BY_POOL = "pool" in inspect.signature(workload).parameters

logger = logging.getLogger("hpc_cluster.jobs")


@dataclass
class Job:
    job_id: str
    submitted: float
    state: str = "pending"
    raw_state: str = UNHEARD
    node: str | None = None
    reason: str | None = None
    started: float | None = None           # first seen running
    ended: float | None = None
    registered: bool = False               # a worker of this job joined at some point
    retiring: bool = False                 # we asked it to go (scale down, close)
    index: int = 0                         # its number in this cluster: its workers are NAME-<index>
    worker_names: tuple = ()               # adopted from a journal: the names its workers had
    ran: bool = False                      # the batch system said it runs (since its last requeue)
    requeued: int = 0                      # times seen pending again after it ran (scontrol requeue)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


# Ends that happen to a job whatever we asked of it: shown as the batch system says, also for a
# job we were retiring (its death records say the same: walltime, node-failure, preempted).
_ENDS_NOT_OURS = frozenset({"timeout", "node-fail", "preempted", "boot-fail", "deadline"})


def ended_retired(job: Job, last_death: str | None) -> bool:
    """Did the job end because we retired it (scale-down, `down`; or its last worker's death
    says `retired`)? `status` and `down` then show it `retired`, not the batch system's end
    state: SLURM marks a whole job OUT_OF_MEMORY when one of its steps was OOM-killed, so a job
    whose worker had died of memory earlier (its nanny started another) ended, retired hours
    later, as `out-of-memory`, contradicting its death records. (Its `state` stays the batch
    system's, for scripts: the table's rows say `ended_retired` beside it.)"""
    return job.final and job.state not in _ENDS_NOT_OURS and (job.retiring or last_death == Cause.RETIRED)


@dataclass
class SubmitError:
    time: float
    message: str


async def read_statuses(adapter: BatchAdapter, ids: list[str], within: float | None = None) -> dict:
    """The queue's word on `ids`: one batch command for all of them (and, for jobs the queue
    forgot, one accounting command reaching back `within` seconds, to the earliest submission
    among them, where the adapter takes it: SLURM's sacct --starttime). {} when there are
    none; BatchError when it failed."""
    if not ids:
        return {}
    if within is not None and _takes_within(adapter.status):
        return await asyncio.to_thread(adapter.status, ids, within=within)
    return await asyncio.to_thread(adapter.status, ids)


def _takes_within(method) -> bool:
    return accepts(method, "within")


class JobManager:
    def __init__(self, scheduler, adapter: BatchAdapter, spec: JobSpec, poll: PollSettings | None = None,
                 max_jobs_in_queue: int | None = None, startup_failures: int = 3, clock=time.time,
                 submit_directory: str | None = None, lifetime: float | None = None,
                 pool: str = DEFAULT_POOL, max_jobs: int | None = None, pools=None,
                 untracked: Untracked | None = None):
        self.scheduler, self.adapter, self.spec = scheduler, adapter, spec
        # One pool's jobs. `pools` (deploy/daemon/pools.py) is the cluster's set of them when there are
        # several: it hands out job indices, counts the queue and merges halts across pools.
        self.pool, self.max_jobs, self.pools = pool, max_jobs, pools
        # A job's span: its walltime, or sooner its workers' --lifetime (without restart).
        self.job_span = min(spec.walltime, lifetime) if lifetime else spec.walltime
        # When to ask the batch system (deploy/daemon/polling.py); with pools, the PoolManager's pacer.
        self.pacer = Pacer(poll or PollSettings(), clock)
        self.wakeup = asyncio.Event()
        self.poll_error: str | None = None
        self.max_jobs_in_queue = max_jobs_in_queue
        self.startup_failures = startup_failures
        self.clock = clock
        self.submit_directory = submit_directory   # where batch commands run (their cwd)
        self.jobs: dict[str, Job] = {}
        # How many jobs to keep, decided each round (policy.py); its target is scale()'s, adapt's
        # or the pool's demand's.
        self.policy = JobPolicy()
        self.scaled = 0                       # what scale() asked for
        self.errors: list[SubmitError] = []
        self.failed_starts = 0                # jobs in a row that ended before a worker joined
        self.halted: str | None = None        # why we stopped submitting
        self.adaptive: AdaptPolicy | None = None
        self._lock = asyncio.Lock()
        self.closing = False                           # close() began: nothing more is submitted
        self._poller: asyncio.Task | None = None
        self._adapter_task: asyncio.Task | None = None
        self._next_index = 0                  # the next job's number (worker names NAME-<index>)
        self.renewals = 0
        # Submissions whose answer was lost, and the lookup of the cluster's tagged jobs (untracked.py);
        # with pools, the cluster's one.
        self.untracked = untracked or Untracked(adapter, None, clock)

    # -- views -------------------------------------------------------------------------
    @property
    def target(self) -> int:
        """The jobs we keep (the policy's)."""
        return self.policy.target

    @target.setter
    def target(self, jobs: int) -> None:
        self.policy = dataclasses.replace(self.policy, target=jobs)

    def active(self) -> list[Job]:
        return [j for j in self.jobs.values() if not j.final and not j.retiring]

    def workers_of(self) -> dict[str, list[str]]:
        """job id -> worker addresses, from what workers said when they registered."""
        out: dict[str, list[str]] = {}
        for addr, ws in self.scheduler.state.workers.items():
            jid = ws.info.get("job_id")
            if jid:
                out.setdefault(str(jid), []).append(addr)
        return out

    def last_deaths(self) -> dict[str, str]:
        """job id -> the cause of its last worker's death (the scheduler's records)."""
        return {str(d["job_id"]): d.get("cause") for d in self.scheduler.state.deaths if d.get("job_id")}

    def table(self) -> dict:
        workers = self.workers_of()
        now = self.clock()
        deaths = self.last_deaths()
        rows = []
        for j in sorted(self.jobs.values(), key=lambda j: j.submitted):
            addrs = workers.get(j.job_id, [])
            wstates = [self.scheduler.state.workers[a] for a in addrs]
            # A pending job (a requeued one too) has no node, uptime or time left.
            runs = j.started is not None and not j.ended and j.state != "pending"
            rows.append({
                "job_id": j.job_id, "state": j.state, "raw_state": j.raw_state,
                "ended_retired": ended_retired(j, deaths.get(j.job_id)), "node": j.node, "reason": j.reason,
                "workers": addrs, "worker_names": [w.name for w in wstates],
                "submitted": j.submitted, "started": j.started, "ended": j.ended, "requeued": j.requeued,
                "uptime": (now - j.started) if runs else None,
                "time_left": (j.started + self.spec.walltime - now) if runs else None,
                "memory": self.spec.memory, "retiring": j.retiring, "index": j.index, "pool": self.pool,
                # what its workers use now (their last reports), results spilled to disk, paused
                "memory_used": (sum(w.memory.get("rss", 0) for w in wstates)
                                if any("rss" in w.memory for w in wstates) else None),
                "spilled": sum(w.memory.get("spilled", 0) for w in wstates),
                "paused": sum(bool(w.paused) for w in wstates),
            })
        return {"jobs": rows, "target": self.target, "halted": self.halted, "renewals": self.renewals,
                "queue_wait": self.queue_wait(),
                "errors": [{"time": e.time, "message": e.message} for e in self.errors[-5:]],
                "adaptive": [self.adaptive.minimum, self.adaptive.maximum] if self.adaptive else None}

    # -- control -------------------------------------------------------------------------
    async def start(self) -> None:
        self._poller = asyncio.create_task(self._poll_forever())

    def adopt(self, job_id: str, rec: dict) -> Job:
        """A job a daemon before us submitted (PoolManager.adopt): ours from now on."""
        now = self.clock()
        job = self.jobs[job_id] = Job(job_id, submitted=float(rec.get("submitted") or now),
                                      state=str(rec.get("state") or "pending"), started=rec.get("started"),
                                      registered=bool(rec.get("registered")), retiring=bool(rec.get("retiring")),
                                      index=int(rec.get("index") or 0),
                                      worker_names=tuple(str(n) for n in rec.get("workers") or ()))
        self._next_index = max(self._next_index, job.index + 1)
        return job

    async def scale(self, jobs: int) -> dict:
        if jobs < 0:
            raise ValueError(f"cannot scale to {jobs} jobs; give a number >= 0")
        if self.max_jobs is not None and jobs > self.max_jobs:
            raise ValueError(f"cannot scale pool {self.pool!r} to {jobs} jobs: its max_jobs is {self.max_jobs} "
                             f"(raise max_jobs in pools={{{self.pool!r}: {{'max_jobs': ...}}}})")
        self.scaled = int(jobs)
        self.policy = dataclasses.replace(self.policy, target=int(jobs), lower_rounds=0)
        self.stop_adapting()                  # an explicit size ends adapt()
        if self.halted and jobs > len(self.active()):
            logger.info("scale(%d): resuming submissions after: %s", jobs, self.halted)
            self._halt(None)
            self.failed_starts = 0
        await self.reconcile()
        return self.table()

    # -- walltime: renew jobs before they end ------------------------------------------------
    def queue_wait(self) -> float:
        """Observed seconds from submission to running (last 10 jobs; 10 s before any ran)."""
        waits = [j.started - j.submitted for j in self.jobs.values() if j.started is not None][-10:]
        return sum(waits) / len(waits) if waits else 10.0

    def expiring(self, job: Job) -> bool:
        """Will this job's walltime end before a replacement submitted now could take over?"""
        if job.started is None:
            return False
        walltime = self.job_span
        margin = min(self.scheduler.walltime_margin, 0.2 * walltime)
        lead = margin + self.queue_wait() + STARTUP_SECONDS
        return self.clock() >= job.started + walltime - lead

    # -- adapt ---------------------------------------------------------------------------
    def adapt(self, minimum: int, maximum: int | None, interval: float = 1.0, wait_count: int = 3,
              target_duration: float = 5.0) -> None:
        if minimum < 0 or (maximum is not None and maximum < minimum):
            raise ValueError(f"adapt(minimum={minimum}, maximum={maximum}): need 0 <= minimum <= maximum")
        self.adaptive = AdaptPolicy(minimum, maximum, max(0.05, interval), max(1, wait_count),
                                    max(0.001, target_duration))
        self.policy = dataclasses.replace(self.policy, lower_rounds=0)
        self.poke()
        if self._adapter_task is None or self._adapter_task.done():
            self._adapter_task = asyncio.ensure_future(self._adapt_forever())

    def stop_adapting(self) -> None:
        self.adaptive = None
        if self._adapter_task is not None:
            self._adapter_task.cancel()
            self._adapter_task = None

    async def _adapt_forever(self) -> None:
        # Decisions read the scheduler's state, which is here; the batch system is polled on
        # its own (slower) clock, so a short interval costs no squeue calls.
        while self.adaptive is not None:
            try:
                await self.reconcile()
            except Exception:
                logger.exception("adapt: could not resize; trying again")
            await asyncio.sleep(self.adaptive.interval if self.adaptive else 0)

    def threads_per_job(self) -> int:
        processes = max(1, self.spec.processes)
        return max(1, self.spec.cores // processes) * self.spec.workers_per_job

    def demand_jobs(self) -> int:
        """Jobs this pool needs for the work only it can run (the scheduler's pool_demand():
        threads per pool); 0 while the scheduler has no such call. The default pool is sized
        by scale() and adapt() alone, as without pools: its demand would be every queued
        task's, and it has no max_jobs to bound that."""
        if self.pool == DEFAULT_POOL:
            return 0
        demand = getattr(self.scheduler.state, "pool_demand", None)
        threads = (demand() or {}).get(self.pool, 0) if callable(demand) else 0
        return math.ceil(threads / self.threads_per_job()) if threads > 0 else 0

    def busy_jobs(self) -> int:
        """Active jobs with a task processing on one of their workers."""
        workers, state = self.workers_of(), self.scheduler.state
        return sum(1 for j in self.active()
                   if any(state.workers[a].processing for a in workers.get(j.job_id, []) if a in state.workers))

    def workload(self) -> float:
        """Seconds of queued work this pool could run (placement.workload)."""
        state = self.scheduler.state
        return workload(state, pool=self.pool) if _WORKLOAD_BY_POOL else workload(state)

    def update_target(self) -> int:
        """Decide this round (policy.py) and keep the decision: returns the (non-expiring) jobs
        we want now, the target or adapt()'s choice, raised to what the pool's demand needs
        (within max_jobs), lowered only after rounds agree."""
        adapt = self.adaptive
        want = adaptive_jobs(adapt, self.workload(), self.spec.cores) if adapt else self.scaled
        self.policy = self.policy.decide(want, demand=self.demand_jobs(), busy=self.busy_jobs(),
                                         max_jobs=self.max_jobs,
                                         wait_count=adapt.wait_count if adapt else DEMAND_WAIT_COUNT)
        return self.policy.target

    async def reconcile(self) -> None:
        async with self._lock:
            desired = self.update_target()
            current = [j for j in self.active() if not self.expiring(j)]
            settled = True
            if self.untracked.doubts and not self.closing and (len(current) < desired or self.untracked.mine(self)):
                # A submission whose answer was lost may be in the queue: look before submitting
                # again; and even when nothing more is wanted (its worker may have joined first and
                # been adopted, pools.py), so that the failed submission says where its job went.
                settled = await self.untracked.settle(self.pools.managers if self.pools else {self.pool: self})
                current = [j for j in self.active() if not self.expiring(j)]
            if len(current) < desired and not self.halted and not self.closing and settled:
                renewing = sum(1 for j in self.active() if self.expiring(j))
                before = len(self.jobs)
                await self._submit(desired - len(current))
                self.renewals += min(renewing, len(self.jobs) - before)
            elif len(current) > desired:
                await self._shrink(len(current) - desired, current)

    def in_queue(self) -> int:
        return sum(1 for j in self.jobs.values() if not j.final)

    async def _submit(self, n: int) -> None:
        if self.max_jobs_in_queue is not None:
            # Sites limit jobs in the queue whatever their state (SLURM's MaxSubmitJobs counts
            # pending and running ones), so count every job of ours (every pool's) not finished yet.
            in_queue = self.pools.in_queue() if self.pools else self.in_queue()
            n = min(n, max(0, self.max_jobs_in_queue - in_queue))
        if self.max_jobs is not None:
            n = min(n, max(0, self.max_jobs - len(self.active())))
        if use_array(self, n):                # job_array: one submission, n jobs (deploy/daemon/arrays.py)
            await submit_array(self, n, Job)
            return
        for _ in range(n):
            if self.closing:
                return
            index = self.pools.next_index() if self.pools else self._next_index
            script = self.adapter.render(self.spec.replace(worker_index=index))
            try:
                job_id = await asyncio.to_thread(self.adapter.submit, script, **self.untracked.submit_kwargs(index))
            except BatchError as exc:
                if self.untracked.doubt(index, self.pool, self.submit_failed(exc)):
                    self._next_index = index + 1      # it may run its workers under this index
                return
            self._next_index = index + 1
            self.jobs[job_id] = Job(job_id, self.clock(), index=index)
            logger.info("submitted job %s of pool %s (workers' index %d)", job_id, self.pool, index)
            self.poke()

    def submit_failed(self, exc: BatchError) -> SubmitError:
        error = SubmitError(self.clock(), str(exc))
        self.errors.append(error)
        logger.error("job submission failed: %s", exc)
        if len(self.errors) >= 3 and all(self.clock() - e.time < 60 for e in self.errors[-3:]):
            self._halt(f"3 submissions failed in a row; last: {exc}")
        return error

    async def _shrink(self, n: int, candidates: list[Job]) -> None:
        """Cancel pending jobs first (nothing lost), then retire the least busy running ones."""
        workers = self.workers_of()
        pending = [j for j in candidates if not workers.get(j.job_id)]
        running = [j for j in candidates if workers.get(j.job_id)]
        running.sort(key=lambda j: sum(len(self.scheduler.state.workers[a].processing)
                                       for a in workers[j.job_id]))
        victims = (pending[::-1] + running)[:n]
        to_cancel = []
        for j in victims:
            j.retiring = True
            if workers.get(j.job_id):
                # Drained, not dropped: results only its workers hold move to peers first.
                self.scheduler.drain(workers[j.job_id], "adapt" if self.adaptive else "scale-down")
            else:
                to_cancel.append(j.job_id)
        if to_cancel:
            await self._cancel(to_cancel)

    async def _cancel(self, job_ids: list[str]) -> None:
        self.poke()                           # retiring jobs are polled fast until they end
        try:
            await asyncio.to_thread(self.adapter.cancel, job_ids)
        except BatchError as exc:
            logger.warning("could not cancel jobs %s: %s", ", ".join(job_ids), exc)

    async def close(self) -> None:
        """Retire every worker, cancel every job we know that is not finished."""
        if self._poller:
            self._poller.cancel()
        self.stop_adapting()
        self.target = self.scaled = 0
        self.closing = True
        # A submission under way (a renewal, a replacement) finishes first, so its job is
        # among those cancelled: taken before it returned, it stayed in the queue (CI).
        async with self._lock:
            live = [j for j in self.jobs.values() if not j.final]
            for j in live:
                j.retiring = True
        workers = self.workers_of()
        self.scheduler.retire_workers([a for j in live for a in workers.get(j.job_id, [])], "down")
        if live:
            await self._cancel([j.job_id for j in live])
            await self._wait_final([j.job_id for j in live], timeout=60)

    async def _wait_final(self, job_ids: list[str], timeout: float) -> None:
        deadline = self.clock() + timeout
        backoff = Backoff(0.2, 2.0, factor=1.5)
        while self.clock() < deadline:
            await self.poll_once()
            if all(self.jobs[j].final for j in job_ids if j in self.jobs):
                return
            await asyncio.sleep(backoff.next())
        logger.warning("jobs still not finished after %.0f s: %s", timeout,
                       ", ".join(j for j in job_ids if not self.jobs[j].final))

    # -- watching ------------------------------------------------------------------------
    async def _poll_forever(self) -> None:
        await poll_forever(self)

    def _mark_registered(self) -> None:
        """Jobs whose worker joined: alive now, or already dead (between two polls a worker
        can join and die, say of a task that segfaults at once: a job that ran its worker)."""
        seen = set(self.workers_of())
        seen.update(str(d["job_id"]) for d in self.scheduler.state.deaths if d.get("worker") and d.get("job_id"))
        for jid in seen:
            if jid in self.jobs:
                self.jobs[jid].registered = True

    def unfinished(self) -> list[str]:
        return [j.job_id for j in self.jobs.values() if not j.final]

    def jobs_watched(self) -> list[Job]:
        return list(self.jobs.values())

    def poke(self, event: bool = False) -> None:
        """Something happened that the batch system will show soon (a submit, a cancel, a
        resize): poll now; `event` (a death): and fast for a while (deploy/daemon/polling.py)."""
        if self.pools is not None:
            self.pools.poke(event)
            return
        self.pacer.event() if event else self.pacer.wake()
        self.wakeup.set()

    def within(self, ids: list[str]) -> float | None:
        """Seconds since the earliest submission of `ids` (sacct --starttime: no scan of all history)."""
        times = [self.jobs[j].submitted for j in ids if j in self.jobs]
        return max(0.0, self.clock() - min(times)) if times else None

    async def poll_once(self) -> bool:
        """One status call for our unfinished jobs; False when the batch system failed."""
        ids = self.unfinished()
        try:
            statuses = await read_statuses(self.adapter, ids, self.within(ids))
        except BatchError as exc:
            self.poll_error = str(exc)
            return False
        if ids:
            self.apply_statuses(ids, statuses)
        return True

    def apply_statuses(self, ids: list[str], statuses: dict) -> None:
        """What the batch system said of our unfinished jobs `ids` (one status call may serve every pool)."""
        self._mark_registered()               # after the (slow) status call: judged on the latest
        now = self.clock()
        for jid in ids:
            job, st = self.jobs[jid], statuses.get(jid)
            if st is None or st.state == "unknown":
                continue
            job.state, job.raw_state, job.reason = st.state, st.raw_state, st.reason
            if st.state == "pending":
                if job.ran:
                    # Pending again after it ran: requeued (scontrol requeue, preemption with
                    # requeue), the same id. Its node and start were the last run's.
                    job.requeued += 1
                    job.ran, job.started = False, None
                job.node = st.node
            else:
                job.node = st.node or job.node
                job.ran = job.ran or st.state == "running"
            if st.state == "running" and job.started is None:
                job.started = now - (st.elapsed or 0)
            if job.final and job.ended is None:
                job.ended = now
                self._ended(job)
        if self.halted:
            self.scheduler.fail_if_stranded()    # the last job that could start a worker ended

    # -- evidence for the scheduler's diagnosis (scheduler/evidence.py: EvidenceSource) ----
    async def accounting(self, job_ids: list[str], within: float | None = None) -> dict[str, dict]:
        within = within if within is not None else self.within(job_ids)
        if within is not None and _takes_within(self.adapter.accounting):
            records = await asyncio.to_thread(self.adapter.accounting, job_ids, within=within)
        else:
            records = await asyncio.to_thread(self.adapter.accounting, job_ids)
        out = {}
        for jid, rec in records.items():
            d = dataclasses.asdict(rec)
            d["final"] = rec.final
            d["raw"] = d["raw"][-2000:]
            out[jid] = d
        return out

    def log_directory(self) -> str | None:
        """Where the job's stdout/stderr are: the log directory, or else where the batch
        system writes them by default (the job's working directory, or where we submit)."""
        return self.spec.log_directory or self.spec.working_directory or self.submit_directory

    async def log_tail(self, job_id: str, lines: int = 40) -> list[str]:
        """The last lines of the job's stdout and stderr (through the runner: maybe over SSH)."""
        directory = self.log_directory()
        if not directory:
            return []
        found = await asyncio.to_thread(job_logs, self.adapter.runner, directory, job_id, lines)
        return [line for _path, tail in found for line in tail][-2 * lines:]

    def _ended(self, job: Job) -> None:
        # An adopted job's workers will not reattach: results the journal held on them are
        # recomputed now, not after the recovery window (scheduler/state/recovery.py).
        state = self.scheduler.state
        gone = [n for n in job.worker_names if n in state.awaited_workers]
        if gone:
            lost = state.holders_missing(gone)
            logger.warning("job %s ended before its workers (%s) reattached: %d results they held are "
                           "recomputed where needed", job.job_id, ", ".join(gone), len(lost))
            self.scheduler._flush()
        if job.registered or job.retiring:
            self.failed_starts = 0
            return
        if job.state not in ("failed", "completed", "out-of-memory"):
            # Ended by the system (node failure, preemption, cancel, time limit) before its
            # worker started: not a sign that our environment is broken, so no halt for it.
            asyncio.ensure_future(self._report_startup_failure(job.job_id))
            return
        # The job ended before any worker joined: a deployment problem, not a task's fault.
        self.failed_starts += 1
        logger.warning("job %s ended (%s) before its worker registered", job.job_id, job.raw_state)
        asyncio.ensure_future(self._report_startup_failure(job.job_id))
        if self.failed_starts >= self.startup_failures and not self.halted:
            self._halt(f"{self.failed_starts} jobs in a row ended before their worker started "
                       f"(last: job {job.job_id}, {job.raw_state}); not submitting more. "
                       "Check the job logs (hpc-cluster logs JOB; client.deaths() has their last "
                       "lines), fix the environment or prologue, then scale again.")

    def _halt(self, reason: str | None) -> None:
        """Stop (or resume) submitting; the scheduler tells clients, and fails work that no
        worker is left to run instead of letting it wait forever."""
        self.halted = reason
        if reason:
            logger.error(reason if self.pool == DEFAULT_POOL else f"pool {self.pool}: {reason}")
        if self.pools:
            self.pools.halted_changed()
        else:
            self.scheduler.halt(reason)

    async def _report_startup_failure(self, job_id: str) -> None:
        try:
            rec = (await self.accounting([job_id])).get(job_id)
        except Exception as exc:
            logger.warning("no accounting for job %s: %s", job_id, exc)
            rec = None
        tail = await self.log_tail(job_id)
        self.scheduler.deaths.job_never_started(job_id, rec, tail)
