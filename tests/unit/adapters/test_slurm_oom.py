"""Both cgroup OOM messages of Slurm in a job's stderr, and sacct's OUT_OF_MEMORY with exit
code 0:0, are memory-batch deaths (issue 18, point 6). Fixtures: fixtures/slurm/oom, each
from a real site's report (SOURCES.md there)."""

import dataclasses
from pathlib import Path

import pytest

from hpc_cluster.adapters.slurm_text import parse_sacct
from hpc_cluster.scheduler.diagnosis import Evidence, diagnose

OOM = Path(__file__).parent / "fixtures" / "slurm" / "oom"
STDERRS = sorted(p.name for p in OOM.glob("job_stderr_*.txt"))


def accounting(record) -> dict:
    """The record as the job manager hands it to the diagnosis (deploy/daemon/jobs.py)."""
    return dict(dataclasses.asdict(record), final=record.final)


def test_every_message_form_has_a_fixture():
    assert len(STDERRS) == 4, STDERRS       # <23.02, older step form, 23.02+, 23.02+ plural with srun


@pytest.mark.parametrize("name", STDERRS)
def test_an_oom_message_in_the_job_log_is_a_batch_memory_death_charged_to_the_task(name):
    # slurmstepd's line alone decides (srun's "task 0: Out Of Memory" beside it is left out).
    lines = [line for line in (OOM / name).read_text().splitlines() if "Out Of Memory" not in line]
    v = diagnose(Evidence(connection="closed", executing=["hog-4GB"], job_id="65138579", log_tail=lines))
    assert (v.cause, v.blame) == ("memory-batch", True), (name, v.text)
    oom_line = next(line for line in lines if "slurmstepd" in line)
    assert f"log: {oom_line}" in v.evidence, v.evidence


@pytest.mark.parametrize("name", STDERRS)
def test_the_same_lines_without_an_oom_message_are_not_memory(name):
    # The pattern must be what decides: the lines around it alone say nothing of memory.
    lines = [line for line in (OOM / name).read_text().splitlines() if "oom" not in line.lower()
             and "Out Of Memory" not in line]
    v = diagnose(Evidence(connection="closed", executing=["hog-4GB"], job_id="65138579", log_tail=lines))
    assert v.cause != "memory-batch", (name, v.text)


def test_sacct_out_of_memory_with_exit_code_0_is_a_batch_memory_death():
    records = {r.job_id: r for r in parse_sacct((OOM / "sacct_oom_exit_0.txt").read_text())}
    rec = records["65138579"]
    assert (rec.state, rec.exit_code, rec.signal) == ("out-of-memory", 0, None)
    assert rec.final and rec.requested_memory == 4 * 2**30
    v = diagnose(Evidence(connection="closed", executing=["hog-4GB"], job_id="65138579",
                          accounting=accounting(rec)))
    assert (v.cause, v.blame) == ("memory-batch", True), v.text
    assert any("OUT_OF_MEMORY" in e for e in v.evidence), v.evidence
    # The advice gives a number to ask for, above what the job had.
    assert "raise memory= to '" in v.advice, v.advice


def test_out_of_memory_0_0_on_the_batch_step_alone_is_a_batch_memory_death_with_a_nanny():
    # With a nanny, the job itself goes on after the kernel killed the worker in its cgroup:
    # only the batch step says OUT_OF_MEMORY, with exit code 0:0, and the nanny saw SIGKILL.
    text = (OOM / "sacct_oom_exit_0.txt").read_text().replace("|w-oom|OUT_OF_MEMORY|", "|w-oom|RUNNING|", 1)
    rec = parse_sacct(text)[0]
    assert rec.state != "out-of-memory" and any(s.get("state") == "out-of-memory" for s in
                                                 accounting(rec)["steps"]), accounting(rec)["steps"]
    nanny = {"pid": 1, "exit_code": None, "signal": 9, "peak_rss": 3 * 2**30, "killed_by_nanny": False,
             "cgroup_oom": False, "memory_limit": 4 * 2**30, "memory_budget": int(0.95 * 4 * 2**30)}
    v = diagnose(Evidence(connection="closed", executing=["hog-4GB"], job_id="65138579", nanny=nanny,
                          accounting=accounting(rec)))
    assert (v.cause, v.blame) == ("memory-batch", True), v.text
