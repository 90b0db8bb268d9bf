"""Which distributed tasks a final verdict charges, and when one fails (pure: no I/O, no clock).

Our engine keeps each task's attempts in its state machine (scheduler/state/blame.py);
distributed's scheduler knows nothing of verdicts, so its `allowed-failures` is set out of reach
in the daemon and this ledger decides instead, with the same rules: only a final verdict counts;
only memory and crash deaths (BLAMED causes) charge the tasks that were *executing* (the nanny's
list, not every task queued on the worker); more than `allowed_failures` of them fail the task;
walltime deaths are innocent, but more than `walltime_failures` of them mean the task never fits.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..protocol.messages import MEMORY_CAUSES, Cause, ErrorKind
from ..scheduler.state.blame import BlameMixin

MAX_TASKS = 100_000          # tasks with a death on record; the oldest go first past this


class Ledger:
    def __init__(self, allowed_failures: int = 3, walltime_failures: int = 3):
        self.allowed_failures = allowed_failures
        self.walltime_failures = walltime_failures
        self.attempts: dict = {}             # task key -> [{"death": record, "ran_for": s, "pool": name}]

    def charge(self, record: dict, executing: dict) -> list[tuple[object, dict]]:
        """A death's final verdict, with the tasks executing on it (key -> seconds it had run,
        or None): the tasks it fails now, each with its error record."""
        failed = []
        for key, ran_for in executing.items():
            attempts = self.attempts.pop(key, [])
            attempts.append({"death": record, "ran_for": ran_for, "pool": record.get("pool")})
            self.attempts[key] = attempts               # re-inserted: the most recent last
            error = self._over_limits(key, attempts)
            if error is not None:
                failed.append((key, error))
                del self.attempts[key]
        while len(self.attempts) > MAX_TASKS:
            self.attempts.pop(next(iter(self.attempts)))
        return failed

    def forget(self, key) -> None:
        self.attempts.pop(key, None)

    def _over_limits(self, key, attempts: list[dict]) -> dict | None:
        charged = [a for a in attempts if a["death"].get("blame")]
        walltime = [a for a in attempts if a["death"].get("cause") == Cause.WALLTIME]
        shown = BlameMixin._attempts(SimpleNamespace(attempts=attempts))
        if len(charged) > self.allowed_failures:
            return {"kind": ErrorKind.KILLED_WORKER, "attempts": shown, "allowed_failures": self.allowed_failures,
                    "memory": charged[-1]["death"].get("cause") in MEMORY_CAUSES}
        if len(walltime) > self.walltime_failures:
            return {"kind": ErrorKind.KILLED_WORKER, "attempts": shown, "walltime_exceeded": True,
                    "allowed_failures": self.allowed_failures,
                    "walltime": walltime[-1]["death"].get("walltime"),
                    "ran_for": [a["ran_for"] for a in walltime]}
        return None
