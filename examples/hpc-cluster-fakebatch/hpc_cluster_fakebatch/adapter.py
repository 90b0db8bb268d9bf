"""The hpc-cluster adapter for fakebatch (commands.py): what a third party's adapter looks like.

It is found by name because pyproject.toml registers it in the `hpc_cluster.adapters`
entry-point group (`batch: fakebatch` in a site, or get_adapter("fakebatch")); its template
is beside it (`template_dir`). Its own setting, `fakebatch_grace`, is declared in `keywords`:
hpc-cluster then takes it as a cluster keyword, a site's YAML key, an HPC_CLUSTER_FAKEBATCH_GRACE
variable and a jobqueue.fakebatch key, checks it with `check_grace`, and hands it to the
adapter in JobSpec.batch_options. The parser is a pure function over fbstat's real output, tested
with hpc-cluster's adapter kit on outputs captured from real runs (tests/fixtures/).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

from hpc_cluster.adapters.base import (AccountingRecord, BatchAdapter, BatchError, JobSpec, JobStatus,
                                      check_env_names, kept_directives)
from hpc_cluster.adapters.options import AdapterOption

FIELDS = ("ID", "NAME", "STATE", "EXIT", "SIGNAL", "ELAPSED", "LIMIT", "START", "END", "NODE")
# fakebatch's states are already ours (hpc_cluster.adapters.base.JOB_STATES).
STATES = {"pending", "running", "completed", "failed", "timeout", "cancelled"}


def _int(text: str) -> int | None:
    return int(text) if text.strip().lstrip("-").isdigit() else None


def parse_fbstat(text: str) -> list[AccountingRecord]:
    """`fbstat ID...` -> records. A line that is not ten '|'-separated fields is an error
    naming the line: a changed fbstat must not be read as jobs in some other state."""
    records = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("ID|"):
            continue
        cells = line.split("|")
        if len(cells) != len(FIELDS):
            raise BatchError(f"fbstat printed a line of {len(cells)} fields, want {len(FIELDS)} "
                             f"({'|'.join(FIELDS)}): {line!r}")
        row = dict(zip(FIELDS, cells))
        state = row["STATE"] if row["STATE"] in STATES else "unknown"
        records.append(AccountingRecord(
            job_id=row["ID"], state=state, raw_state=row["STATE"], exit_code=_int(row["EXIT"]),
            signal=_int(row["SIGNAL"]), elapsed=_int(row["ELAPSED"]), time_limit=_int(row["LIMIT"]),
            node=row["NODE"] or None, start=row["START"] or None, end=row["END"] or None, raw=line))
    return records


def check_grace(key: str, value) -> int:
    """fakebatch_grace: whole seconds, 1 to 300 (fbsub's #FB --grace). Raises with what to write."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 300:
        raise ValueError(f"{key}={value!r} must be a whole number of seconds from 1 to 300: how long fakebatch "
                         "lets a job at its time limit end after SIGTERM before SIGKILL (e.g. 30)")
    return value


def parse_fbsub(text: str) -> str:
    last = text.strip().splitlines()[-1:] or [""]
    if not last[0].isdigit():
        raise BatchError(f"fbsub printed no job id: {text.strip()!r}")
    return last[0]


class FakeBatchAdapter(BatchAdapter):
    name = "fakebatch"
    template_name = "fakebatch.sh.j2"
    template_dir = Path(__file__).resolve().parent / "templates"
    submit_command = "fbsub"
    cancel_command = "fbdel"
    cluster_name = "FakeBatchCluster"          # `from hpc_cluster import FakeBatchCluster`, made from this adapter
    keywords = (
        AdapterOption("fakebatch_grace", "seconds 1-300", "seconds a job at its time limit has between SIGTERM "
                      "and SIGKILL (#FB --grace); unset: fakebatch's 5", check=check_grace, example=30),
    )

    def template_context(self, spec: JobSpec) -> dict:
        check_env_names(spec.env)
        ours = [(f"#FB --name={spec.job_name}",), (f"#FB --time={int(spec.walltime)}",)]
        if spec.batch_options.get("fakebatch_grace"):
            ours.append((f"#FB --grace={spec.batch_options['fakebatch_grace']}",))
        if spec.log_directory:
            ours.append((f"#FB --output={spec.log_directory.rstrip('/')}/{spec.job_name}-%j.out",))
        # fakebatch has no queues, accounts or memory limits: say so in the script, not silently.
        notes = [f"# fakebatch ignores {k}={v!r}" for k, v in (("queue", spec.queue), ("account", spec.account)) if v]
        extra = [d if d.startswith("#FB") else f"#FB {d.strip()}" for d in spec.extra_directives]
        return {"directives": kept_directives(ours, spec.directives_skip) + extra + notes}

    def submit(self, script: str) -> str:
        result = self.runner.run(["fbsub"], input=script, timeout=60, check=False)
        if result.returncode != 0:
            raise BatchError(f"fbsub refused the job (exit {result.returncode}): {result.stderr.strip()}")
        return parse_fbsub(result.stdout)

    def cancel(self, job_ids: Sequence[str]) -> None:
        if not job_ids:
            return
        result = self.runner.run(["fbdel", *job_ids], timeout=60, check=False)
        problems = [line for line in result.stderr.splitlines() if line.strip() and "already finished" not in line]
        if problems:
            raise BatchError(f"fbdel {' '.join(map(shlex.quote, job_ids))}: {'; '.join(problems)}")

    def accounting(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord]:
        if not job_ids:
            return {}
        result = self.runner.run(["fbstat", *job_ids], timeout=60, check=False)
        if result.returncode != 0 and "unknown job" not in result.stderr:
            raise BatchError(f"fbstat failed (exit {result.returncode}): {result.stderr.strip()}")
        return {r.job_id: r for r in parse_fbstat(result.stdout) if r.job_id in job_ids}

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        records = self.accounting(job_ids)
        return {jid: JobStatus(jid, r.state, r.raw_state, node=r.node, elapsed=r.elapsed, time_limit=r.time_limit)
                if (r := records.get(jid)) else JobStatus(jid, "unknown", "") for jid in job_ids}
