"""Fakes of the things the deploy side talks to: a batch system in memory (FakeAdapter) and a
runner that answers commands from a table (ScriptedRunner). One of each, parametrised where
tests need different answers."""

from __future__ import annotations

import time

from hpc_cluster.adapters.base import JobStatus
from hpc_cluster.runners.base import BatchError, CommandResult

# What squeue says when slurmctld is too busy to answer: the error a failing status call raises.
STATUS_ERROR = "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation"


def _script(spec) -> str:
    return f"{spec.worker_command} #{spec.worker_index} mem={spec.memory}"


class FakeAdapter:
    """A batch system in memory, for the job manager and the pools (duck-typed BatchAdapter).

    Numbers submissions from `first_id` (`ids`, and their scripts in `scripts`); a submit
    raises BatchError(`refuse`) when that is set. `status` reports each job as `states` says,
    else as `state`, records each call in `status_calls` as (monotonic time, ids, within), and
    the next `fail` calls raise BatchError(STATUS_ERROR). A cancel is recorded in `cancelled`
    and its jobs then report "cancelled". `script(spec)` renders a job script."""

    name = "fake"
    template_name = "fake.sh.j2"
    array_index_variable = "FAKE_TASK"

    def __init__(self, state: str = "pending", first_id: int = 1, script=_script, refuse: str | None = None,
                 supports_arrays: bool = True):
        self.state, self.first_id, self.script, self.refuse = state, first_id, script, refuse
        self.supports_arrays = supports_arrays
        self.scripts: list[str] = []
        self.ids: list[str] = []
        self.cancelled: list[str] = []
        self.states: dict[str, str] = {}
        self.status_calls: list[tuple[float, list[str], float | None]] = []
        self.fail = 0

    def render(self, spec) -> str:
        return self.script(spec)

    def submit(self, script: str) -> str:
        if self.refuse:
            raise BatchError(self.refuse)
        self.scripts.append(script)
        self.ids.append(str(self.first_id + len(self.ids)))
        return self.ids[-1]

    def array_element_ids(self, array_id: str, count: int) -> list[str]:
        return [f"{array_id}_{i}" for i in range(count)]

    def cancel(self, job_ids) -> None:
        self.cancelled += list(job_ids)
        self.states.update(dict.fromkeys(job_ids, "cancelled"))

    def status(self, job_ids, within: float | None = None) -> dict[str, JobStatus]:
        self.status_calls.append((time.monotonic(), list(job_ids), within))
        if self.fail:
            self.fail -= 1
            raise BatchError(STATUS_ERROR)
        return {j: JobStatus(j, self.states.get(j, self.state), self.states.get(j, self.state).upper())
                for j in job_ids}


class ScriptedRunner:
    """A runner (runners/base.py's interface) that answers commands from a table and records
    what it was asked. `answers`: (argv prefix, (returncode, stdout, stderr)) pairs, the first
    matching prefix answers; any other command fails the test."""

    def __init__(self, answers):
        self.answers = answers
        self.calls: list[tuple[list[str], str | None]] = []     # (argv, input) per command

    @property
    def commands(self) -> list[list[str]]:
        return [argv for argv, _ in self.calls]

    def run(self, argv, input=None, timeout=None, check=True) -> CommandResult:
        self.calls.append((list(argv), input))
        for prefix, result in self.answers:
            if list(argv[:len(prefix)]) == prefix:
                return CommandResult(list(argv), *result)
        raise AssertionError(f"unexpected command {argv}")


class FixedAccounting:
    """An EvidenceSource (scheduler/evidence.py) holding fixed accounting records: what sacct
    would answer for those jobs, and no job log."""

    def __init__(self, records):
        self.records = records

    async def accounting(self, job_ids):
        return {j: self.records[j] for j in job_ids if j in self.records}

    async def log_tail(self, job_id):
        return []
