"""A cluster's worker pools: one JobManager per pool (its spec, jobs, target, adapt policy,
max_jobs) under one coordinator that the daemon talks to.

The coordinator polls the batch system once for every pool's jobs, hands out job indices
(workers are NAME-<index>, unique across pools), counts the queue for max_jobs_in_queue
across pools, tells the scheduler of a halted pool, and is the diagnosis' evidence source
(scheduler/evidence.py) for jobs of every pool: job ids are unique, so a job's pool is
found from its id.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ...adapters.base import BatchAdapter, BatchError
from ...config.pools import DEFAULT_POOL
from ..plan import PoolPlan
from .jobs import UNHEARD, JobManager, read_statuses
from .polling import Pacer, PollSettings, budget_adapter, poll_forever
from .untracked import Untracked

logger = logging.getLogger("hpc_cluster.jobs")


def announce(state, pools: dict[str, PoolPlan], escalate: dict | None) -> bool:
    """Tell the scheduler's state of the pools (`state.set_pools(table, escalate)`, the table's
    rows as plan.pool_table makes them); False when this scheduler has no such call."""
    set_pools = getattr(state, "set_pools", None)
    if not callable(set_pools):
        return False
    set_pools({name: p.scheduler for name, p in pools.items() if p.scheduler is not None}, escalate)
    return True


class PoolManager:
    def __init__(self, scheduler, adapter: BatchAdapter, pools: dict[str, PoolPlan], poll: PollSettings | None = None,
                 max_jobs_in_queue: int | None = None, startup_failures: int = 3, clock=time.time,
                 submit_directory: str | None = None, cluster: str | None = None):
        """`pools`: name -> the plan's PoolPlan (its job spec, max_jobs, job_lifetime; deploy/plan.py).
        `cluster`: its id, which tags its jobs so that one whose submission's answer was lost is
        found in the queue (untracked.py)."""
        if DEFAULT_POOL not in pools:
            raise ValueError("the pools must include 'default', the cluster's own job spec")
        self.scheduler, self.adapter, self.clock = scheduler, adapter, clock
        poll = poll or PollSettings()
        # Every batch command of the cluster (status, accounting, submit, cancel) under one
        # budget per minute; one pacer and one wake-up for every pool (deploy/daemon/polling.py).
        self.runner = budget_adapter(adapter, poll.calls_per_minute)
        self.pacer = Pacer(poll, clock)
        self.wakeup = asyncio.Event()
        self.poll_error: str | None = None
        self.escalation_only = {name: bool(p.escalation_only) for name, p in pools.items()}
        self.untracked = Untracked(adapter, cluster, clock)
        self.managers: dict[str, JobManager] = {
            name: JobManager(scheduler, adapter, p.job, poll=poll,
                             max_jobs_in_queue=max_jobs_in_queue, startup_failures=startup_failures, clock=clock,
                             submit_directory=submit_directory, lifetime=p.job_lifetime, pool=name,
                             max_jobs=p.max_jobs, pools=self, untracked=self.untracked)
            for name, p in pools.items()}
        self._index = 0
        self._poller: asyncio.Task | None = None

    # -- shared among the pools' managers ------------------------------------------------------
    def next_index(self) -> int:
        index = self._index
        self._index += 1
        return index

    def in_queue(self) -> int:
        return sum(m.in_queue() for m in self.managers.values())

    def halted_changed(self) -> None:
        reasons = [(name, m.halted) for name, m in self.managers.items() if m.halted]
        reason = None
        if reasons:
            name, why = reasons[0]
            reason = why if name == DEFAULT_POOL else f"pool {name}: {why}"
        self.scheduler.halt(reason)

    # -- views ---------------------------------------------------------------------------------
    @property
    def default(self) -> JobManager:
        return self.managers[DEFAULT_POOL]

    def get(self, pool: str | None) -> JobManager:
        name = pool or DEFAULT_POOL
        if name not in self.managers:
            raise ValueError(f"no pool named {name!r}; this cluster's pools: {', '.join(self.managers)}")
        return self.managers[name]

    def active(self) -> list:
        return [j for m in self.managers.values() for j in m.active()]

    def owner(self, job_id: str) -> JobManager:
        return next((m for m in self.managers.values() if str(job_id) in m.jobs), self.default)

    def table(self, demand: bool = True) -> dict:
        """The default pool's table (as without pools), with every pool's jobs (rows carry
        "pool") and a summary per pool under "pools". Without `demand`, no "demand_jobs" (a
        pass over every task per pool: the dashboard, which asks every few seconds, leaves it)."""
        tables = {name: m.table() for name, m in self.managers.items()}
        out = dict(tables[DEFAULT_POOL])
        out["jobs"] = sorted((r for t in tables.values() for r in t["jobs"]), key=lambda r: r["submitted"])
        out["target"] = sum(t["target"] for t in tables.values())
        out["renewals"] = sum(t["renewals"] for t in tables.values())
        out["halted"] = next((t["halted"] if name == DEFAULT_POOL else f"pool {name}: {t['halted']}"
                              for name, t in tables.items() if t["halted"]), None)
        out["errors"] = sorted((e for t in tables.values() for e in t["errors"]), key=lambda e: e["time"])[-5:]
        # The batch commands this cluster ran, by name (the budget: deploy/daemon/polling.py).
        out["batch_calls"] = dict(self.runner.counts)
        out["pools"] = {}
        for name, m in self.managers.items():
            t, spec = tables[name], m.spec
            out["pools"][name] = {
                "target": t["target"], "adaptive": t["adaptive"], "halted": t["halted"], "max_jobs": m.max_jobs,
                "escalation_only": self.escalation_only.get(name, False),
                "demand_jobs": m.demand_jobs() if demand else None,
                "cores": spec.cores, "memory": spec.memory, "processes": spec.processes,
                "nodes": spec.nodes, "walltime": spec.walltime, "queue": spec.queue,
                "jobs": [r["job_id"] for r in t["jobs"]]}
        return out

    # -- control -------------------------------------------------------------------------------
    def adopt(self, jobs: dict) -> dict[str, int]:
        """Take over the jobs a daemon of this cluster left (its journal's jobs record: job id ->
        pool, index, state, times) instead of submitting new ones; the next poll reads their
        real states (a job that ended meanwhile is handled as any that ends). Returns the
        number adopted per pool."""
        counts: dict[str, int] = {}
        for jid, rec in jobs.items():
            rec = rec if isinstance(rec, dict) else {}
            pool = rec.get("pool") or DEFAULT_POOL
            if pool not in self.managers:
                logger.warning("job %s of pool %r, which this cluster's configuration no longer has: "
                               "adopted into pool %r", jid, pool, DEFAULT_POOL)
                pool = DEFAULT_POOL
            counts[pool] = counts.get(pool, 0) + (0 if rec.get("retiring") else 1)
            self._index = max(self._index, int(rec.get("index") or 0) + 1)
            self.managers[pool].adopt(str(jid), rec)
        for pool, n in counts.items():
            m = self.managers[pool]
            m.target = m.scaled = max(m.target, n)
        return counts

    async def start(self) -> None:
        self._poller = asyncio.create_task(poll_forever(self))

    async def scale(self, jobs: int, pool: str | None = None) -> dict:
        await self.get(pool).scale(jobs)
        return self.table()

    def adapt(self, minimum: int, maximum: int | None, pool: str | None = None, **policy) -> None:
        self.get(pool).adapt(minimum, maximum, **policy)

    def stop_adapting(self, pool: str | None = None) -> None:
        self.get(pool).stop_adapting()

    async def reconcile(self) -> None:
        for m in self.managers.values():
            await m.reconcile()

    def jobs_watched(self) -> list:
        return [j for m in self.managers.values() for j in m.jobs.values()]

    def poke(self, event: bool = False) -> None:
        """Something the batch system will show soon: poll now; `event` (a death): and fast
        for a while (deploy/daemon/polling.py)."""
        self.pacer.event() if event else self.pacer.wake()
        self.wakeup.set()

    def worker_event(self, kind: str, info: dict) -> None:
        """The scheduler's word on a worker (Scheduler.worker_events): "joined" tells that its
        job runs, with no poll; "removed" and "exit-report" that the job may end and its
        accounting is wanted: poll now and fast for a while."""
        job_id = str(info.get("job_id") or "")
        job = self.owner(job_id).jobs.get(job_id) if job_id else None
        if kind == "joined":
            if job is None and job_id:
                job = self._adopt_joined(job_id, info)
            if job is not None and not job.final:
                job.registered = True
                if job.state == "pending":
                    now = self.clock()
                    job.state, job.raw_state = "running", getattr(self.adapter, "running_state", "RUNNING")
                    start = info.get("job_start")
                    job.started = float(start) if isinstance(start, (int, float)) and start <= now else now
            return
        if job is not None or kind == "exit-report":
            self.poke(event=True)

    def _adopt_joined(self, job_id: str, info: dict):
        """A worker registered from a job no pool knows (a submission whose answer was lost and
        that the lookups missed): the job is ours, counted, shown and cancelled by `down`."""
        manager = self.managers.get(str(info.get("pool") or DEFAULT_POOL)) or self.default
        logger.warning("a worker registered from job %s, which this cluster did not track (a submission whose "
                       "answer was lost?): adopted into pool %s", job_id, manager.pool)
        return manager.adopt(job_id, {"state": "pending", "registered": True})

    async def poll_once(self) -> bool:
        """One status call for the unfinished jobs of every pool; False when it failed."""
        ids = {name: m.unfinished() for name, m in self.managers.items()}
        every = [jid for some in ids.values() for jid in some]
        within = [m.within(ids[name]) for name, m in self.managers.items() if ids[name]]
        within = [w for w in within if w is not None]
        try:
            statuses = await read_statuses(self.adapter, every, max(within) if within else None)
        except BatchError as exc:
            self.poll_error = str(exc)
            return False
        for name, m in self.managers.items():
            if ids[name]:
                m.apply_statuses(ids[name], statuses)
        return True

    async def refresh(self) -> None:
        """Before answering `jobs`: a poll, if the table may be stale, that is while the
        pacer polls fast anyway (jobs starting or ending) or a job has no word from the batch
        system yet; in steady state the events and the steady poll keep it current, and a
        client asking every second costs nothing."""
        for _ in range(2):
            jobs = self.jobs_watched()
            # A job the batch system has not reported on shows our placeholder, not its state:
            # ask. Judged by the job, not by times: a job submitted while a poll was already
            # running was not in that poll, though the poll ended after it (CI saw that).
            now = self.clock()
            unheard = any(j.raw_state == UNHEARD and not j.final and now - j.submitted < 60 for j in jobs)
            stale = self.pacer.interval(jobs) <= self.pacer.settings.fast and now - self.pacer.last_poll >= 0.5
            if not (unheard or stale) or not await self.poll_once():
                return
            self.pacer.polled()
            if not unheard:
                return

    def stop_watching(self) -> None:
        """Leave the jobs as they are (no poll, no adapt, no cancel): another daemon takes them
        over from the journal's jobs record (a scheduler job's handover, deploy/daemon/scheduler_job.py)."""
        if self._poller:
            self._poller.cancel()
        for m in self.managers.values():
            m.stop_adapting()

    async def close(self) -> None:
        if self._poller:
            self._poller.cancel()
        for m in self.managers.values():
            m.closing = True                   # no submission from here on, so the lookup sees them all
        try:
            # Every job tagged with this cluster's id is cancelled, tracked or not (untracked.py).
            await self.untracked.find(self.managers)
        except BatchError as exc:
            logger.warning("could not look up the cluster's jobs before cancelling them (%s): jobs whose "
                           "submission's answer was lost may stay in the queue", exc)
        await asyncio.gather(*(m.close() for m in self.managers.values()))

    # -- evidence for the scheduler's diagnosis (scheduler/evidence.py: EvidenceSource) -----------
    async def accounting(self, job_ids: list[str]) -> dict[str, dict]:
        # One adapter serves every pool; sacct from the earliest submission among them.
        within = [m.within([j for j in job_ids if j in m.jobs]) for m in self.managers.values()]
        within = [w for w in within if w is not None]
        return await self.default.accounting(job_ids, within=max(within) if within else None)

    def log_directory(self) -> str | None:
        return self.default.log_directory()

    async def log_tail(self, job_id: str, lines: int = 40) -> list[str]:
        return await self.owner(job_id).log_tail(job_id, lines)
