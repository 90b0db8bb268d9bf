"""Exceptions users see. The scheduler sends plain error records; the client builds these."""

from __future__ import annotations

import datetime


class HPCClusterError(Exception):
    """Base class of this package's own errors."""


class KilledWorker(HPCClusterError):
    """A task was running on workers that died, often enough to stop retrying it.

    `attempts` lists each death: worker, time, cause (see the death-cause table in the
    docs) and what is known about it. `cause` is the cause of the last death.
    """

    def __init__(self, key: str, attempts: list[dict], allowed_failures: int | None = None):
        self.key = key
        self.attempts = attempts
        self.allowed_failures = allowed_failures
        self.cause = attempts[-1]["cause"] if attempts else "unknown"
        super().__init__(self._message())

    def _message(self) -> str:
        n = len(self.attempts)
        lines = [f"Task {self.key!r} was running on {n} worker{'s' if n != 1 else ''} that died "
                 f"(allowed failures: {self.allowed_failures}); it is not retried again."]
        for i, a in enumerate(self.attempts, 1):
            when = datetime.datetime.fromtimestamp(a.get("time") or 0).strftime("%H:%M:%S")
            text = f": {a['text']}" if a.get("text") else ""
            lines.append(f"  {i}. {when} {a.get('name') or a.get('worker')}: {a.get('cause')}{text}")
        return "\n".join(lines)

    def __reduce__(self):
        return (type(self), (self.key, self.attempts, self.allowed_failures))


class LostDataError(HPCClusterError):
    """Data that exists nowhere else (scattered, not computable) was lost with its worker."""

    def __init__(self, key: str, text: str = ""):
        self.key = key
        super().__init__(text or f"the data of {key!r} was lost with the only worker holding it; "
                         "scatter it again, and use client.replicate() to keep copies")


class CancelledError(HPCClusterError):
    """The future was cancelled (by the user, a restart, or the cluster closing)."""

    def __init__(self, key: str, reason: str = "cancelled"):
        self.key = key
        self.reason = reason
        super().__init__(f"{key!r}: {reason}")


class TimeoutError(HPCClusterError, TimeoutError):  # noqa: A001 - mirrors the builtin
    pass


def error_from_record(key: str, err: dict, load) -> BaseException:
    """Build the exception for a scheduler error record. `load` unpickles payloads."""
    kind = err.get("kind")
    if kind == "dependency":
        return error_from_record(err.get("origin", key), err.get("cause") or {}, load)
    if kind == "exception":
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
    if kind == "killed-worker":
        return KilledWorker(key, err.get("attempts") or [], err.get("allowed_failures"))
    if kind == "lost-data":
        return LostDataError(key, err.get("text", ""))
    if kind == "cancelled":
        return CancelledError(key, err.get("text", "cancelled"))
    return HPCClusterError(f"{key!r}: {err.get('text') or err}")
