"""The exceptions a distributed client's `result()` raises for a task our verdicts failed.

Each is distributed's `KilledWorker` (so `except distributed.KilledWorker` keeps working) and
ours (TaskMemoryError, TaskCrashedError, TaskWalltimeError, hpc_cluster.KilledWorker), with our
text: the cause, the evidence and the fix, every attempt, not "inspect worker logs". Work that no
worker will ever run (the cluster halted) fails with our CancelledError and the reason. They travel
pickled through distributed's scheduler; unpickling needs hpc-cluster where the client runs.
"""

from __future__ import annotations

import distributed

from ..client import exceptions as ours


class _DistributedKilledWorker(distributed.KilledWorker):
    # distributed's __init__ takes (task, last_worker, allowed_failures) and its properties read
    # them from args; ours keeps its message in args[0], so both are overridden below.
    def __init__(self, *args):
        Exception.__init__(self, *args)


class KilledWorker(ours.KilledWorker, _DistributedKilledWorker):
    """distributed.KilledWorker with hpc-cluster's diagnosis."""

    allowed_failures = None          # set per instance by ours.KilledWorker (a plain attribute)
    last_worker = None               # the address of the last worker that died running it

    @property
    def task(self):
        return self.key

    def __str__(self) -> str:
        return Exception.__str__(self)

    def __reduce__(self):
        # Ours pickles the message's ingredients; the address of the last worker travels too.
        cls, args = super().__reduce__()[:2]
        return cls, args, {"last_worker": self.last_worker}


class TaskMemoryError(ours.TaskMemoryError, KilledWorker):
    """The task's memory use killed its workers."""


class TaskCrashedError(ours.TaskCrashedError, KilledWorker):
    """The task crashed its worker processes."""


class TaskWalltimeError(ours.TaskWalltimeError, KilledWorker):
    """The task never finished within a job's walltime."""


_BY_OURS = {ours.TaskMemoryError: TaskMemoryError, ours.TaskCrashedError: TaskCrashedError,
            ours.TaskWalltimeError: TaskWalltimeError, ours.KilledWorker: KilledWorker}


def killed_worker(key, error: dict, last_worker: str | None = None) -> KilledWorker:
    """The exception for a blame module's error record (the same record our engine sends)."""
    theirs = ours.killed_worker_error(key, error)
    exc = _BY_OURS[type(theirs)](key, error.get("attempts") or [], error.get("allowed_failures"),
                                 error.get("walltime"), error.get("pools"))
    exc.last_worker = last_worker
    return exc


class CancelledError(ours.CancelledError):
    """No worker is left to run the task and none will be started (the cluster stopped
    submitting jobs whose workers never started): our CancelledError, with the reason, as on
    our engine; a concurrent.futures.CancelledError as distributed's are."""

    def __reduce__(self):
        return type(self), (self.key, self.reason)


def stranded(key, reason: str) -> CancelledError:
    return CancelledError(key, reason)
