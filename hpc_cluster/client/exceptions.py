"""Exceptions users see. The scheduler sends plain error records; the client builds these."""

from __future__ import annotations

import concurrent.futures
import datetime

from ..protocol.messages import MEMORY_CAUSES, Cause, ErrorKind


class HPCClusterError(Exception):
    """Base class of this package's own errors."""


class KilledWorker(HPCClusterError):
    """A task was running on workers that died, often enough to stop retrying it.

    `cause` is the cause of the last death (the stable strings of the death-cause table in
    docs/why-did-my-worker-die.md); `attempts` lists every death while it ran, each with
    its cause, explanation, evidence and advice (and, in a cluster with pools, the pool it ran
    in and how it was moved). Subclasses say which kind of fault: TaskMemoryError,
    TaskCrashedError, TaskWalltimeError. When no pool of the cluster was big (or long) enough,
    `needed` is what the task needed (bytes, or seconds), `largest_pool` the biggest there is,
    and the message says which pool to add.
    """

    def __init__(self, key: str, attempts: list[dict], allowed_failures: int | None = None,
                 walltime: float | None = None, pools: dict | None = None):
        self.key = key
        self.attempts = attempts
        self.allowed_failures = allowed_failures
        self.walltime = walltime
        self.pools = pools
        self.needed = (pools or {}).get("needed")
        self.largest_pool = (pools or {}).get("largest_pool")
        last = attempts[-1] if attempts else {}
        self.cause = last.get("cause", Cause.UNKNOWN.value)   # a plain str, as the wire's are
        self.evidence = list(last.get("evidence") or [])
        self.advice = last.get("advice") or ""
        super().__init__(self._message())

    def _headline(self) -> str:
        n = len(self.attempts)
        return (f"Task {self.key!r} failed: {n} worker{'s' if n != 1 else ''} died while running it "
                f"(allowed failures: {self.allowed_failures}).")

    def _message(self) -> str:
        last = self.attempts[-1] if self.attempts else {}
        lines = [self._headline(), f"Cause: {self.cause}: {last.get('text') or 'no explanation recorded'}"]
        if self.evidence:
            lines.append("Evidence:")
            lines += [f"  {e}" for e in self.evidence]
        if self.advice:
            lines.append(f"Fix: {self.advice}")
        if (self.pools or {}).get("text"):
            lines.append(f"Pools: {self.pools['text']}")
        lines.append("Attempts:")
        # A cluster without pools runs everything in 'default': naming it would be noise.
        name_pools = any(a.get("escalation") or a.get("pool") not in (None, "default") for a in self.attempts)
        for i, a in enumerate(self.attempts, 1):
            when = datetime.datetime.fromtimestamp(a.get("time") or 0).strftime("%H:%M:%S")
            job = f" (job {a['job_id']})" if a.get("job_id") else ""
            pool = f" in pool {a['pool']}" if a.get("pool") and name_pools else ""
            ran = f", after {a['ran_for']:.1f} s" if a.get("ran_for") is not None else ""
            lines.append(f"  {i}. {when} {a.get('name') or a.get('worker')}{job}{pool}: {a.get('cause')}{ran}")
            if a.get("escalation"):
                lines.append(f"     then {a['escalation']}")
        return "\n".join(lines)

    def __reduce__(self):
        return (type(self), (self.key, self.attempts, self.allowed_failures, self.walltime, self.pools))


class TaskMemoryError(KilledWorker):
    """The task's memory use killed its workers (batch memory limit or the nanny's budget)."""


class TaskCrashedError(KilledWorker):
    """The task crashed its worker process (a signal like SIGSEGV, or an exit while running)."""


class TaskWalltimeError(KilledWorker):
    """The task never finished within a job's walltime: innocent deaths, but it will never fit."""

    def _headline(self) -> str:
        hits = [a for a in self.attempts if a.get("cause") == Cause.WALLTIME]
        runs = ", ".join(f"{a['ran_for']:.0f} s" for a in hits if a.get("ran_for") is not None)
        limit = f"{self.walltime:.0f} s" if self.walltime else "the walltime"
        return (f"Task {self.key!r} is too long for the job's walltime ({limit}): it was still running "
                f"when the job's time ran out {len(hits)} times (it had run {runs or '?'}).")


class TaskTooLongError(HPCClusterError):
    """The task is expected to run longer than any worker's whole walltime, so it was not
    started (it would only die at the time limit) and not left waiting forever either."""

    def __init__(self, key: str, text: str, walltime: float | None = None, expected: float | None = None):
        self.key, self.walltime, self.expected = key, walltime, expected
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.key, str(self), self.walltime, self.expected))


def format_death(d: dict, indent: str = "  ") -> str:
    """One worker death as the user reads it: when, who, cause, blame, explanation, evidence, fix."""
    when = datetime.datetime.fromtimestamp(d.get("time") or 0).strftime("%Y-%m-%d %H:%M:%S")
    job = f" (job {d['job_id']})" if d.get("job_id") else ""
    charged = "charged to the task" if d.get("blame") else "not charged to any task"
    named = d.get("pool") and (d["pool"] != "default" or d.get("escalation"))
    pool = f" in pool {d['pool']}" if named else ""
    lines = [f"{when} {d.get('name') or d.get('worker')}{job}{pool}: {d.get('cause')} ({charged})",
             f"{indent}{d.get('text', '')}"]
    if d.get("escalation"):
        # The task was moved, not charged: where it went and why.
        lines[0] = lines[0].replace("(charged to the task)", "(moved, not charged)")
        lines.append(f"{indent}escalation: {d['escalation']}")
    if d.get("ran_for") is not None:
        lines.append(f"{indent}the task had run {d['ran_for']:.1f} s")
    lines += [f"{indent}{e}" for e in d.get("evidence") or []]
    if d.get("advice"):
        lines.append(f"{indent}fix: {d['advice']}")
    tail = d.get("log_tail") or []
    if tail:
        lines.append(f"{indent}last log lines:")
        lines += [f"{indent}  {line}" for line in tail[-8:]]
    return "\n".join(lines)


def killed_worker_error(key: str, err: dict) -> KilledWorker:
    attempts = err.get("attempts") or []
    cause = attempts[-1].get("cause") if attempts else None
    if err.get("walltime_exceeded"):
        cls = TaskWalltimeError
    elif cause in MEMORY_CAUSES:
        cls = TaskMemoryError
    elif cause == Cause.CRASH:
        cls = TaskCrashedError
    else:
        cls = KilledWorker
    return cls(key, attempts, err.get("allowed_failures"), err.get("walltime"), err.get("pools"))


class NoPoolError(HPCClusterError):
    """The task needs what no pool of the cluster has (memory=, resources=, pool=): it was not
    started, and not left waiting for a worker no job will bring. `need` names the keyword
    ('memory', 'resources', 'pool'), `needed` its value, `largest_pool` the biggest pool there is."""

    def __init__(self, key: str, text: str, need: str | None = None, needed=None, largest_pool: str | None = None):
        self.key, self.need, self.needed, self.largest_pool = key, need, needed, largest_pool
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.key, str(self), self.need, self.needed, self.largest_pool))


class LostDataError(HPCClusterError):
    """Data that exists nowhere else (scattered, not computable) was lost with its worker."""

    def __init__(self, key: str, text: str = ""):
        self.key = key
        super().__init__(text or f"the data of {key!r} was lost with the only worker holding it; "
                         "scatter it again, and use client.replicate() to keep copies")


class CancelledError(HPCClusterError, concurrent.futures.CancelledError):
    """The future was cancelled (by the user, a restart, or the cluster closing). A
    concurrent.futures.CancelledError too, as distributed's (code that catches that one, or gets
    it paired with the future from as_completed(raise_errors=False), sees ours the same way)."""

    def __init__(self, key: str, reason: str = "cancelled"):
        self.key = key
        self.reason = reason
        super().__init__(f"{key!r}: {reason}")


class TimeoutError(HPCClusterError, TimeoutError):  # noqa: A001 - mirrors the builtin
    pass


def is_cancellation(err: dict | None) -> bool:
    """The record says the task was cancelled, or failed because an input it needs was: its
    future is "cancelled", as distributed's dependents of a cancelled future are (not "error")."""
    while err and err.get("kind") == ErrorKind.DEPENDENCY:
        err = err.get("cause")
    return bool(err) and err.get("kind") == ErrorKind.CANCELLED


def error_from_record(key: str, err: dict, load) -> BaseException:
    """Build the exception for a scheduler error record. `load` unpickles payloads."""
    kind = err.get("kind")
    if kind == ErrorKind.DEPENDENCY:
        return error_from_record(err.get("origin", key), err.get("cause") or {}, load)
    if kind == ErrorKind.EXCEPTION:
        try:
            exc = load(err["exception"])
        except Exception as inner:
            exc = RuntimeError(f"{err.get('text')} (the exception could not be unpickled here: {inner})")
        try:
            tb = load(err["traceback"]) if err.get("traceback") is not None else ""
        except Exception:
            tb = ""
        if tb:
            exc.remote_traceback = tb
            if hasattr(exc, "add_note"):
                exc.add_note(f"Remote traceback (task {key!r} on {err.get('worker', 'a worker')}):\n{tb}")
        return exc
    if kind == ErrorKind.KILLED_WORKER:
        return killed_worker_error(key, err)
    if kind == ErrorKind.LOST_DATA:
        return LostDataError(key, err.get("text", ""))
    if kind == ErrorKind.TOO_LONG:
        return TaskTooLongError(key, err.get("text", ""), err.get("walltime"), err.get("expected"))
    if kind == ErrorKind.NO_POOL:
        return NoPoolError(key, err.get("text", ""), err.get("need"), err.get("needed"), err.get("largest_pool"))
    if kind == ErrorKind.CANCELLED:
        return CancelledError(key, err.get("text", "cancelled"))
    return HPCClusterError(f"{key!r}: {err.get('text') or err}")


# Users catch these as `hpc_cluster.KilledWorker` and see them so in tracebacks: the name they
# import, not the room the class happens to live in (which may move, as it did in issue 30).
for _cls in (HPCClusterError, KilledWorker, TaskMemoryError, TaskCrashedError, TaskWalltimeError,
             TaskTooLongError, NoPoolError, LostDataError, CancelledError, TimeoutError):
    _cls.__module__ = "hpc_cluster"
del _cls
