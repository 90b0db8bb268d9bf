"""Which deaths a task is charged with, and when they end it. Mixed into SchedulerState.

A death counts against a task only if the task was *executing* on the worker and the
verdict blames it (`memory-*`, `crash`). Verdicts are refined as evidence arrives (the
nanny's report at once, accounting seconds later), so a task is failed only on *final*
verdicts: the user sees the final cause, and a death first judged a crash but later
found to be a cancel never fails anyone. While verdicts that could end the task are still
open, the task is held back (not started again) rather than risk another worker on it.

Walltime deaths are innocent, but a task that runs into the walltime on every try will
never finish: after `walltime_failures` + 1 such final verdicts it fails with the job's
walltime and how long it ran. So does a task expected to run longer than any worker's
whole walltime: it would wait forever for a worker with enough time left.
"""

from __future__ import annotations

from ...protocol.messages import MEMORY_CAUSES, Cause, ErrorKind
from ..diagnosis import fmt_seconds
from .placement import FIT_FACTOR, FIT_SLACK, ran_at_least, seconds_for


def _final(attempt: dict) -> bool:
    return attempt["death"].get("final_at") is not None


def _settled(ts) -> tuple[list, list, int]:
    """(final charged deaths, final walltime deaths, open verdicts) of the deaths a task ran in.
    A death that moved the task to a bigger pool (pools.py) does not count against it."""
    final = [a for a in ts.attempts if _final(a)]
    counted = [a for a in final if not a.get("moved")]
    return ([a for a in counted if a["death"]["blame"]], [a for a in counted if a["death"]["cause"] == Cause.WALLTIME],
            len(ts.attempts) - len(final))


class BlameMixin:
    def refine_death(self, death_id: int, cause: str, blame: bool, text: str, **more) -> None:
        """Later evidence (nanny report, batch accounting) changes a death's verdict."""
        if not 0 <= death_id < len(self.deaths):
            return
        record = self.deaths[death_id]
        record.update(cause=cause, blame=bool(blame), text=text, **more)
        if self.touched_deaths is not None:
            self.touched_deaths.add(death_id)
        for key in record["executing"]:
            ts = self.tasks.get(key)
            if ts is not None and ts.state in ("waiting", "queued", "processing"):
                self._over_limits(ts)
        self._schedule()

    def charge_running(self, death_id: int, key: str, started: float, ended: float | None) -> bool:
        """A dead worker's nanny says it was running `key` on its loop, whose start was to come
        with its end (worker/slot.py): charged with the death as if its start had come. Only a
        task that death's worker was given; one that meanwhile finished elsewhere is named in
        the record but has nothing to be charged."""
        if not 0 <= death_id < len(self.deaths) or not isinstance(key, str):
            return False
        record = self.deaths[death_id]
        if key in record["executing"] or key not in record["processing"]:
            return False
        record["executing"] = sorted([*record["executing"], key])
        ran = max(0.0, ended - started) if isinstance(ended, (int, float)) else None
        memory = record.get("memory")
        if isinstance(memory, dict) and isinstance(memory.get("task_starts"), list):
            # Its start on the death's memory timeline, in the scheduler's clock (timeline.py).
            memory["task_starts"] = sorted([*memory["task_starts"], [record["time"] - (ran or 0.0), key]])
        ts = self.tasks.get(key)
        if ts is not None and ts.state in ("waiting", "queued", "processing"):
            ts.attempts = [*ts.attempts, {"death": record, "ran_for": ran, "pool": record["pool"]}]
            self._touch(ts)
        if self.touched_deaths is not None:
            self.touched_deaths.add(death_id)
        return True

    def _over_limits(self, ts) -> bool:
        """Fail the task if its final verdicts say it must: too many caused by it, or walltime every
        time. Final verdicts that say it needs a bigger pool move it there first (pools.py)."""
        self._consider_moves(ts)
        charged, walltime, _ = _settled(ts)
        if len(charged) > self.allowed_failures:
            memory = charged[-1]["death"]["cause"] in MEMORY_CAUSES
            self._err(ts, {"kind": ErrorKind.KILLED_WORKER, "attempts": self._attempts(ts),
                           "allowed_failures": self.allowed_failures,
                           "pools": self._pool_advice(ts, "memory") if memory else None})
            return True
        if len(walltime) > self.walltime_failures:
            self._err(ts, {"kind": ErrorKind.KILLED_WORKER, "attempts": self._attempts(ts), "walltime_exceeded": True,
                           "allowed_failures": self.allowed_failures,
                           "walltime": walltime[-1]["death"].get("walltime"),
                           "ran_for": [a["ran_for"] for a in walltime],
                           "pools": self._pool_advice(ts, "walltime")})
            return True
        return False

    def _awaiting_verdict(self, ts) -> bool:
        """Could the open verdicts, once final, end this task? Then do not start it again yet.
        (An open verdict may still turn: a connection-lost is often a crash a moment later,
        when the nanny's report arrives.)"""
        if not ts.attempts:
            return False
        charged, walltime, open_ = _settled(ts)
        # Where a final verdict could move it to another pool, it waits for it (seconds, for
        # the accounting) rather than die again in the pool that was too small.
        return open_ > 0 and (len(charged) + open_ > self.allowed_failures
                              or len(walltime) + open_ > self.walltime_failures or self._moves_possible())

    def _fits_nowhere(self, ts, expected: float | None) -> bool:
        """Every worker's life is bounded (its job's walltime, or its --lifetime), and the task
        is longer than even a fresh worker's whole span: waiting for a new worker would be
        waiting forever."""
        if expected is None or not self.workers:
            return False
        spans = [_span(ws) for ws in self.workers.values()]
        if any(span is None for span in spans):
            return False
        return expected * FIT_FACTOR + FIT_SLACK > max(span for span, _ in spans)

    def _too_long_error(self, ts, expected: float) -> dict:
        walltime, by = max(_span(ws) for ws in self.workers.values())
        said = ("it already ran" if ran_at_least(ts) >= expected else
                "you said it takes" if ts.duration is not None else "tasks like it took")
        ask = fmt_seconds(seconds_for(expected))
        what, fix = (("worker's whole lifetime (--lifetime)", f"Raise --lifetime in worker_extra_args to {ask} or more")
                     if by == "lifetime" else
                     ("job's whole walltime", f"Raise walltime= (or the site's walltime) to '{ask}' or more"))
        return {"kind": ErrorKind.TOO_LONG, "walltime": walltime, "expected": expected,
                "text": f"task {ts.key!r} cannot fit in any job: {said} {expected:.0f} s, and a {what} "
                        f"is {walltime:.0f} s (a task is started only with {FIT_FACTOR:.1f} x its "
                        f"expected time + {FIT_SLACK:.0f} s left). {fix}, split the task, or correct duration=."}

    @staticmethod
    def _attempts(ts) -> list[dict]:
        keys = ("worker", "name", "time", "cause", "blame", "text", "job_id", "evidence", "advice", "walltime",
                "final_at")
        return [dict({k: a["death"].get(k) for k in keys}, ran_for=a["ran_for"], pool=a.get("pool"),
                     escalation=a.get("escalation"), peak_memory=a["death"].get("peak_memory"),
                     memory_limit=a["death"].get("memory_limit")) for a in ts.attempts]


def _span(ws) -> tuple[float, str] | None:
    """How long a fresh worker like `ws` lives at most, and what bounds it: its job's
    walltime or its --lifetime (the shorter); None when nothing does."""
    spans = [(t, what) for t, what in ((ws.info.get("job_walltime"), "walltime"),
                                        (ws.info.get("lifetime"), "lifetime")) if t]
    return min(spans) if spans else None
