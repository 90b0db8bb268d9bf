"""Collects the evidence about each death and keeps its verdict up to date.

At the moment of a death we know our intent, how the connection ended, and sometimes
already the nanny's exit report. The batch system's accounting and the job's log come
later: they are asked for in the background, batched for all recently lost jobs, with
backoff, until the record is final. Each new piece re-runs `diagnose` and refines the
death's verdict (and so the blame of the tasks it was running). The scheduler never waits.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Protocol

from ..protocol.messages import Cause
from .diagnosis import Evidence, diagnose, needs_accounting, peak_memory
from .node_view import on_node
from .state.machine import SchedulerState

logger = logging.getLogger("hpc_cluster.evidence")

BACKOFF = (0.5, 1, 1, 2, 2, 4, 4, 8, 8, 15, 15, 30)     # ~90 s in all, then we stop asking
# ... unless the job still RUNS and nobody reported on the worker: its node or the network to
# it went quiet, and the batch system declares a node down only after its own timeout (SLURM's
# SlurmdTimeout, 300 s by default). Keep asking every 30 s for this long, so that the verdict
# becomes node-failure then rather than stay "connection lost" (issue 33).
QUIET_NODE_WAIT = 600
COALESCE = 0.25     # deaths due this soon are asked about in the same batch command
# sacct's first final record of a job can still lack ReqMem and Timelimit (seen on the
# real cluster), which the explanation quotes ("MaxRSS 1.02 GiB of 1.00 GiB requested");
# ask up to this many rounds for a record that has them.
FINAL_ROUNDS = 3


def _complete(record: dict) -> bool:
    return record.get("requested_memory") is not None and record.get("time_limit") is not None


def memory_evidence(state: SchedulerState, ws) -> dict:
    """What the scheduler knows of a worker's memory as it is lost: its limit and fractions,
    its last report, its memory when the oldest running task started, and the results the
    whole cluster holds. The diagnosis tells what a task allocated from what was held with it."""
    out = {"limit": ws.memory_limit or None, "fractions": ws.info.get("memory_fractions") or {},
           **ws.memory, "workers": len(state.workers),
           "stored_total": sum(ts.nbytes for ts in state.tasks.values() if ts.state == "memory")}
    started = [ts for ts in ws.executing if ts.start_memory]
    if started:
        first = min(started, key=lambda ts: ts.started_at or 0)
        out["start_rss"] = first.start_memory.get("rss")
        out["start_managed"] = first.start_memory.get("managed")
        # A task that started after the last heartbeat knows more recent numbers.
        latest = max(started, key=lambda ts: ts.started_at or 0)
        if ws.memory_at is None or (latest.started_at or 0) > ws.memory_at:
            out["managed"] = latest.start_memory.get("managed", out.get("managed"))
            out["rss"] = max(out.get("rss") or 0, latest.start_memory.get("rss") or 0)
    # The results it holds as the scheduler counts them (each task-finished says its size) are
    # newer than its last heartbeat: a worker stopped between two quick tasks, after storing
    # results no heartbeat has reported yet, still held them. Less what it says it spilled.
    known = sum(ts.nbytes or 0 for ts in ws.has_what) - (ws.memory.get("spilled") or 0)
    if known > (out.get("managed") or 0):
        out["managed"] = known
    return out


_QUIET_ROUNDS = QUIET_NODE_WAIT // BACKOFF[-1]
# The batch system's accounting does not answer (slurmdbd down): a death its nanny reported is
# made final on the nanny's evidence this long after it (the user's TaskMemoryError waited
# ~90 s for sacct before), and corrected if the accounting, once back, says otherwise.
ACCOUNTING_DOWN_GRACE = 6.0


def _quiet_node(rec: dict | None, ev) -> bool:
    """The worker is gone, its job runs on, and its nanny did not say a word: see QUIET_NODE_WAIT.
    (A worker without a nanny has no one to speak for it: a stopped one and a cut-off node look
    the same, and its verdict is final after the usual ~90 s, as before.)"""
    return (rec is not None and not rec.get("final") and ev.had_nanny and ev.nanny is None
            and ev.reattached_after is None)


def _running(report: dict | None) -> dict | None:
    """A nanny report's `running` (the task its worker ran on its loop), if well formed."""
    running = (report or {}).get("running")
    if (isinstance(running, dict) and isinstance(running.get("key"), str)
            and isinstance(running.get("started"), (int, float))):
        memory = running.get("memory")
        return dict(running, memory=memory if isinstance(memory, dict) else None)
    return None


class EvidenceSource(Protocol):
    """What the batch layer offers (deploy's job manager); the scheduler imports no batch system."""

    async def accounting(self, job_ids: list[str]) -> dict[str, dict]: ...

    async def log_tail(self, job_id: str) -> list[str]: ...


class EvidenceCollector:
    def __init__(self, state: SchedulerState, clock: Callable[[], float], flush: Callable[[], None]):
        self.state, self.clock, self.flush = state, clock, flush
        self.source: EvidenceSource | None = None
        self.evidence: dict[int, Evidence] = {}             # death id -> what we know
        self._death_of_nanny: dict[str, int] = {}            # nanny id -> its worker's latest death
        self._early_reports: dict[str, dict] = {}            # reports that beat the connection close
        self._waiting: dict[int, int] = {}                   # death id -> accounting attempts so far
        self._due: dict[int, float] = {}                     # death id -> when to ask next (loop time)
        self._wake = asyncio.Event()                         # a new death may be due sooner
        self._final_rounds: dict[int, int] = {}              # death id -> final records seen so far
        self._gave_up: set[int] = set()                      # deaths we stopped asking about
        self._silent: dict[str, int] = {}                    # address -> death of a worker removed as silent
        self._asked_since: dict[int, float] = {}             # death id -> when we began asking (loop time)
        self._provisional: set[int] = set()                  # final on the nanny's word, accounting down
        self._accounting_down: str | None = None             # the error of the last failed query
        # The address of a lost worker whose job then ended (accounting's final state): that
        # process, should it come back, is a leftover (scheduler/links.py refuses it). By
        # address, not job id: a requeued job runs again under its id with new workers.
        self.ended_workers: dict[str, str] = {}
        self._task: asyncio.Task | None = None
        # Who hears of every verdict as it is made or refined (the distributed engine's bridge:
        # its tasks are not in our state): fn(death record).
        self.verdicts: list[Callable[[dict], None]] = []

    # -- events ----------------------------------------------------------------------
    def worker_removed(self, addr: str, connection: str, intent: str | None) -> dict | None:
        ws = self.state.workers.get(addr)
        if ws is None:
            return None
        nanny_id = ws.info.get("nanny_id")
        early = self._early_reports.pop(nanny_id, None) if nanny_id else None
        running = _running(early)
        if running:
            # The task it ran on its loop, whose start was to come with its end (worker/slot.py).
            ended = early.get("ended")
            ago = max(0.0, ended - running["started"]) if isinstance(ended, (int, float)) else 0.0
            self.state.task_started(addr, running["key"], self.clock() - ago, running.get("memory"))
        ev = Evidence(connection=connection, intent=intent, executing=sorted(t.key for t in ws.executing),
                      had_nanny=bool(nanny_id), nanny=early,
                      job_id=str(ws.info["job_id"]) if ws.info.get("job_id") else None,
                      memory=memory_evidence(self.state, ws), host=ws.info.get("host"))
        if ev.nanny:
            ev.log_tail = list(ev.nanny.get("log_tail") or [])
        verdict = diagnose(ev)
        asking = self.source is not None and needs_accounting(ev)
        awaiting_nanny = bool(nanny_id) and ev.nanny is None
        now = self.clock()
        # The state needs to know at once whether this verdict may still change: only final
        # verdicts end a task.
        record = self.state.remove_worker(addr, now, {
            "cause": verdict.cause, "blame": verdict.blame, "text": verdict.text,
            "evidence": verdict.evidence, "advice": verdict.advice, "peak_memory": peak_memory(ev),
            "final_at": None if asking or awaiting_nanny else now})
        if ev.nanny:
            record["log_tail"] = ev.log_tail[-40:]
            self.state.refine_death_memory(record["id"], nanny=ev.nanny)
        self.evidence[record["id"]] = ev
        if awaiting_nanny:
            self._death_of_nanny[nanny_id] = record["id"]
        if connection == Cause.HEARTBEAT_LOST and record["final_at"] is None:
            self._silent[addr] = record["id"]          # it may come back (reattached)
        if asking:
            self._ask(record["id"])
        logger.info("worker %s removed: %s: %s", addr, record["cause"], record["text"])
        self._announce(record)
        return record

    def _ask(self, death_id: int) -> None:
        """Ask the batch system about this death's job until its record is final (the loop below)."""
        self._waiting[death_id] = 0
        self._asked_since[death_id] = asyncio.get_running_loop().time()
        self._due[death_id] = self._asked_since[death_id] + BACKOFF[0]
        self._wake.set()
        self._ensure_loop()

    def exit_report(self, report: dict) -> None:
        """The nanny says how its worker ended."""
        nanny_id = report.get("nanny_id")
        death_id = self._death_of_nanny.pop(nanny_id, None)
        if death_id is None:
            if any(ws.info.get("nanny_id") == nanny_id for ws in self.state.workers.values()):
                self._early_reports[nanny_id] = report       # its connection close is on its way
            return
        ev = self.evidence[death_id]
        ev.nanny = report
        running = _running(report)
        if running and self.state.charge_running(death_id, running["key"], running["started"], report.get("ended")):
            # It died in a task run on its loop, whose start had not come yet (worker/slot.py).
            ev.executing = sorted({*ev.executing, running["key"]})
            start = running.get("memory") or {}
            if ev.memory.get("start_rss") is None and start.get("rss"):
                ev.memory["start_rss"], ev.memory["start_managed"] = start["rss"], start.get("managed")
        # The worker's own last lines (a traceback, "Segmentation fault") are evidence too;
        # the job log, once read, replaces them.
        if not ev.log_tail:
            ev.log_tail = list(report.get("log_tail") or [])
        self.state.deaths[death_id]["log_tail"] = (report.get("log_tail") or [])[-40:]
        # Its 10 Hz samples of the last seconds join the heartbeats' timeline.
        self.state.refine_death_memory(death_id, nanny=report)
        self._refine(death_id)

    def nanny_gone(self, nanny_id: str) -> None:
        """A nanny's connection closed: a report it still owed will never come."""
        self._early_reports.pop(nanny_id, None)
        death_id = self._death_of_nanny.pop(nanny_id, None)
        if death_id is not None:
            self._refine(death_id)

    def nanny_unanswered(self, nanny_id: str) -> None:
        """A silent worker's nanny did not answer a ping either (scheduler/links.py)."""
        death_id = self._death_of_nanny.get(nanny_id)
        if death_id is not None:
            self.evidence[death_id].nanny_silent = True
            self._refine(death_id)

    def reattached(self, address: str) -> None:
        """A worker removed as silent registered again (the same process: its address): the
        silence is over. Its death record says so, and is final once the batch system is asked
        one last time, at once: a node that came back after SLURM declared it failed has a
        NODE_FAIL job whose worker lives on a moment longer (the accounting's verdict wins);
        otherwise the job runs on and its nanny has no report to send."""
        death_id = self._silent.pop(address, None)
        if death_id is None or self.state.deaths[death_id].get("final_at") is not None:
            return
        for nanny_id in [n for n, d in self._death_of_nanny.items() if d == death_id]:
            del self._death_of_nanny[nanny_id]
        self.evidence[death_id].reattached_after = self.clock() - self.state.deaths[death_id]["time"]
        if death_id in self._waiting:
            self._due[death_id] = asyncio.get_running_loop().time()
            self._wake.set()
        else:
            self._refine(death_id)

    def job_never_started(self, job_id: str, accounting: dict | None, log_tail: list[str],
                          pool: str | None = None) -> dict:
        """A job ended before its worker registered: a deployment problem, charged to no task.
        `pool`: the pool the job was of (a bad setting of one pool's jobs shows as that pool's)."""
        ev = Evidence(registered=False, job_id=job_id, accounting=accounting, log_tail=log_tail)
        v = diagnose(ev)
        now = self.clock()
        # The job left the queue, but accounting may not have its end yet (sacct still said
        # RUNNING, its batch step FAILED): asked again until final, as for a worker's death.
        asking = self.source is not None and not (accounting or {}).get("final")
        record = self.state.add_death({
            "worker": None, "name": f"job {job_id}", "host": (accounting or {}).get("node"),
            "time": now, "cause": v.cause, "blame": False,
            "text": v.text, "evidence": v.evidence, "advice": v.advice, "job_id": job_id,
            "log_tail": log_tail[-40:], "final_at": None if asking else now, "pool": pool or "default"})
        self.evidence[record["id"]] = ev
        if asking:
            self._ask(record["id"])
        logger.warning("job %s: %s", job_id, v.text)
        return record

    # -- refining ----------------------------------------------------------------------
    def _refine(self, death_id: int) -> None:
        ev = self.evidence[death_id]
        v = diagnose(ev)
        record = self.state.deaths[death_id]
        changed = (v.cause, v.blame, v.text) != (record["cause"], record["blame"], record["text"])
        final = not self._expecting(death_id) or death_id in self._provisional
        if ev.accounting:
            self.state.refine_death_memory(death_id, batch_limit=ev.accounting.get("requested_memory"))
        self.state.refine_death(death_id, v.cause, v.blame, v.text, evidence=v.evidence, advice=v.advice,
                                peak_memory=peak_memory(ev),
                                final_at=(record.get("final_at") or self.clock()) if final else None)
        if final and self._silent.get(record.get("worker")) == death_id:
            del self._silent[record["worker"]]
        if changed:
            logger.info("death of %s refined: %s: %s", record.get("name"), v.cause, v.text)
        self._announce(record)
        self.flush()

    def _announce(self, record: dict) -> None:
        for listener in self.verdicts:
            try:
                listener(record)
            except Exception:
                logger.exception("a verdict listener failed on the death of %s", record.get("name"))

    def _expecting(self, death_id: int) -> bool:
        """Is more evidence still to come for this death?

        A nanny's report is awaited only while its job may be alive: once the batch system
        says the job ended (a node failure, a cancel: the nanny died with its worker) or we
        gave up asking, nothing will report. A report that still comes refines the verdict.
        """
        if death_id in self._waiting:
            return True
        if death_id in self._death_of_nanny.values():
            acct = self.evidence[death_id].accounting
            return not (acct and acct.get("final")) and death_id not in self._gave_up
        return False

    def _ensure_loop(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._accounting_loop())

    async def _accounting_loop(self) -> None:
        """Ask the batch system about recently lost jobs: one call per round for every death
        that is due, each death on its own backoff (a new death is asked about in 0.5 s even
        while an older one waits 30 s for its next try)."""
        loop = asyncio.get_running_loop()
        while self._waiting:
            self._wake.clear()
            wait = min(self._due[d] for d in self._waiting) - loop.time()
            if wait > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                    continue                              # a new death: recompute who is due
                except asyncio.TimeoutError:
                    pass
            now = loop.time()
            due = [d for d in self._waiting if self._due[d] <= now + COALESCE]
            jobs = {self.evidence[d].job_id for d in due}
            failed = None
            try:
                records = await self.source.accounting(sorted(jobs))
            except Exception as exc:  # the batch system may be slow or down: try again later
                failed, records = str(exc) or type(exc).__name__, {}
                # Once per outage, not once per query (a stopped slurmdbd failed every second).
                (logger.debug if self._accounting_down else logger.warning)(
                    "the batch system's accounting does not answer (%s): deaths their nannies reported "
                    "are judged on that after %.0f s, and corrected when it answers again", failed,
                    ACCOUNTING_DOWN_GRACE)
            if failed is None and self._accounting_down:
                logger.warning("the batch system's accounting answers again")
            self._accounting_down = failed
            for death_id in due:
                ev = self.evidence[death_id]
                rec = on_node(records.get(ev.job_id), ev.host)      # its own node's part of the job
                self._waiting[death_id] += 1
                tries = self._waiting[death_id]
                final = rec is not None and bool(rec.get("final"))
                ev.accounting_error = failed if rec is None else None
                if rec is not None:
                    ev.accounting = rec
                    worker = self.state.deaths[death_id].get("worker")
                    if final and worker and rec.get("state") not in ("running", "pending"):
                        self.ended_workers[worker] = f"job {ev.job_id} {rec.get('raw_state') or rec.get('state')}"
                elif failed and ev.nanny is not None and death_id not in self._provisional \
                        and now - self._asked_since.get(death_id, now) >= ACCOUNTING_DOWN_GRACE:
                    self._provisional.add(death_id)       # judged now on the nanny's evidence
                if final:
                    self._final_rounds[death_id] = self._final_rounds.get(death_id, 0) + 1
                    try:
                        ev.log_tail = await self.source.log_tail(ev.job_id) or ev.log_tail
                    except Exception as exc:
                        logger.warning("could not read the log of job %s: %s", ev.job_id, exc)
                # Done when the record is final (and complete, or we asked enough); or when the
                # job lives on after a nanny restart (its state will not explain this death);
                # or when we gave up.
                done = (final and (_complete(rec) or self._final_rounds[death_id] >= FINAL_ROUNDS)) \
                    or (rec is not None and not final and (ev.nanny is not None or ev.reattached_after is not None)) \
                    or tries >= len(BACKOFF) + (_QUIET_ROUNDS if _quiet_node(rec, ev)
                                                or (failed and death_id in self._provisional) else 0)
                if done:
                    del self._waiting[death_id], self._due[death_id]
                    self._asked_since.pop(death_id, None)
                    self._final_rounds.pop(death_id, None)
                    if rec is None or not (rec.get("final") or ev.nanny is not None):
                        self._gave_up.add(death_id)
                else:
                    self._due[death_id] = loop.time() + BACKOFF[min(tries, len(BACKOFF) - 1)]
                if rec is not None or done or death_id in self._provisional:
                    self._refine(death_id)
