"""The SLURM parsers on outputs captured from a real SLURM 22.05 (tests/batch/slurm/capture_fixtures.py).

No SLURM needed. manifest.json says which job id ended which way.
"""

from __future__ import annotations

import pytest

from hpc_cluster.adapters.base import BatchError, JOB_STATES
from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.adapters.slurm_text import (STATE_MAP, accounting_disabled, map_state, parse_exit_code, parse_sacct,
                                             parse_sbatch, parse_scontrol_job, parse_slurm_duration,
                                             parse_slurm_memory, parse_squeue)
from helpers.fakes import ScriptedRunner
from helpers.fixtures import fixture, manifest

MANIFEST = manifest("slurm")
JOBS = MANIFEST["jobs"]
MiB = 2**20
GiB = 2**30


@pytest.fixture(scope="module")
def sacct():
    return {r.job_id: r for r in parse_sacct(fixture("slurm", "sacct_all.txt"))}


# -- sbatch ---------------------------------------------------------------------------
def test_sbatch_outputs():
    assert parse_sbatch(fixture("slurm", "sbatch_parsable.txt")) == JOBS["completed"]
    assert parse_sbatch(fixture("slurm", "sbatch_plain.txt")) == JOBS["plain"]
    assert parse_sbatch(fixture("slurm", "sbatch_parsable_cluster.txt")) == JOBS["cluster"]
    # Site wrappers (lua cli filters, banners) may print before the id.
    assert parse_sbatch("sbatch: info: using default account\n123\n") == "123"


def test_sbatch_without_an_id_is_an_error():
    with pytest.raises(BatchError, match="job id"):
        parse_sbatch("sbatch: error: Batch job submission failed: Invalid partition name specified\n")


# -- sacct ----------------------------------------------------------------------------
@pytest.mark.parametrize("name, state, raw, exit_code, signal", [
    ("completed", "completed", "COMPLETED", 0, None),
    ("exit3", "failed", "FAILED", 3, None),
    ("segfault", "failed", "FAILED", 0, 11),
    ("oom", "out-of-memory", "OUT_OF_MEMORY", 0, 125),
    ("timeout", "timeout", "TIMEOUT", 0, None),
    ("cancelled", "cancelled", "CANCELLED by 0", 0, None),
    ("preempted", "preempted", "PREEMPTED", 0, None),
    ("preemptor", "completed", "COMPLETED", 0, None),
    ("node_fail", "node-fail", "NODE_FAIL", 0, None),
])
def test_sacct_outcomes(sacct, name, state, raw, exit_code, signal):
    r = sacct[JOBS[name]]
    assert (r.state, r.raw_state, r.exit_code, r.signal) == (state, raw, exit_code, signal)
    assert r.final
    assert r.node == MANIFEST["node"]
    assert [s.step_id for s in r.steps] == ["batch"]
    assert r.raw.startswith(JOBS[name] + "|")


def test_sacct_cancelled_by_uid(sacct):
    assert sacct[JOBS["cancelled"]].cancelled_by == "0"
    assert all(r.cancelled_by is None for j, r in sacct.items() if j != JOBS["cancelled"])


def test_sacct_memory_from_job_and_steps(sacct):
    completed = sacct[JOBS["completed"]]
    assert completed.requested_memory == 200 * MiB
    assert completed.steps[0].max_rss == 58120 * 1024  # "58120K" on the .batch line
    assert completed.max_rss == completed.steps[0].max_rss  # the job line has none of its own
    oom = sacct[JOBS["oom"]]
    assert oom.requested_memory == 100 * MiB
    assert oom.max_rss == 72524 * 1024
    assert sacct[JOBS["preempted"]].requested_memory == 20000 * MiB


def test_sacct_extern_and_srun_steps_count_for_memory():
    # Production clusters with PrologFlags=contain add an .extern step (and srun adds .0);
    # our one-host cluster does not, so this excerpt has the shape sacct prints there.
    text = ("JobID|JobName|State|ExitCode|ReqMem|AllocCPUS|MaxRSS|Elapsed|Timelimit|NodeList|Start|End\n"
            "812|hpc-cluster|OUT_OF_MEMORY|0:125|4G|4||00:07:12|01:00:00|cn042|2026-11-20T10:00:00|"
            "2026-11-20T10:07:12\n"
            "812.batch|batch|OUT_OF_MEMORY|0:125||4|4194012K|00:07:12||cn042|2026-11-20T10:00:00|"
            "2026-11-20T10:07:12\n"
            "812.extern|extern|COMPLETED|0:0||4|1068K|00:07:12||cn042|2026-11-20T10:00:00|"
            "2026-11-20T10:07:12\n"
            "812.0|python|OUT_OF_MEMORY|0:125||4|4.10G|00:07:10||cn042|2026-11-20T10:00:02|"
            "2026-11-20T10:07:12\n")
    (rec,) = parse_sacct(text)
    assert [s.step_id for s in rec.steps] == ["batch", "extern", "0"]
    assert rec.state == "out-of-memory" and rec.requested_memory == 4 * GiB
    assert rec.max_rss == int(4.10 * GiB)                 # the largest step's, here srun's .0
    assert rec.steps[1].state == "completed" and rec.steps[1].max_rss == 1068 * 1024


def test_sacct_steps_carry_their_own_states(sacct):
    # A walltime kill: job TIMEOUT, its batch step CANCELLED by SIGTERM.
    step = sacct[JOBS["timeout"]].steps[0]
    assert (step.state, step.raw_state, step.signal) == ("cancelled", "CANCELLED", 15)
    assert sacct[JOBS["oom"]].steps[0].state == "out-of-memory"


def test_sacct_times(sacct):
    r = sacct[JOBS["timeout"]]
    assert (r.elapsed, r.time_limit) == (81, 60)
    assert (r.start, r.end) == ("2026-11-22T03:41:49", "2026-11-22T03:43:10")
    assert sacct[JOBS["completed"]].time_limit == 120


def test_sacct_half_written_records_do_not_break(sacct):
    # After a node failure slurmdbd had only a stub job line: JobName 'allocation',
    # ReqMem '16?', no Timelimit. What is readable is read; the rest is None.
    r = sacct[JOBS["node_fail"]]
    assert r.requested_memory is None and r.time_limit is None
    assert r.steps[0].exit_code is None


def test_sacct_while_running():
    records = {r.job_id: r for r in parse_sacct(fixture("slurm", "sacct_running.txt"))}
    # The job line still says PENDING but its batch step is RUNNING: we say running.
    r = records[JOBS["timeout"]]
    assert (r.raw_state, r.state, r.final) == ("PENDING", "running", False)
    assert r.end is None
    assert records[JOBS["exit3"]].state == "failed"


def test_sacct_without_header_and_steps_only():
    line = "7.batch|batch|CANCELLED|0:11||1|58184K|00:00:03||vm|2026-11-22T03:26:02|2026-11-22T03:26:05\n"
    (r,) = parse_sacct(line)
    assert (r.job_id, r.state, r.signal, r.max_rss) == ("7", "cancelled", 11, 58184 * 1024)


def test_sacct_malformed_line_is_an_error():
    with pytest.raises(BatchError, match="unexpected line"):
        parse_sacct("JobID|JobName|State|ExitCode\n12|x\n")


def test_sacct_job_name_with_separator():
    text = fixture("slurm", "sacct_all.txt").splitlines()
    header, line = text[0], text[1].replace("t-completed", "a|b")
    (r,) = parse_sacct(f"{header}\n{line}\n")
    assert (r.state, r.time_limit) == ("completed", 120)


# -- squeue ---------------------------------------------------------------------------
def test_squeue_mixed():
    statuses = parse_squeue(fixture("slurm", "squeue_mixed.txt"))
    assert statuses[JOBS["preemptor"]].state == "pending"
    assert statuses[JOBS["preemptor"]].reason == "Resources"
    assert statuses[JOBS["preemptor"]].node is None
    assert statuses[JOBS["timeout"]].state == "running"
    assert statuses[JOBS["timeout"]].time_limit == 60
    assert statuses[JOBS["cancelled"]].state == "running"  # COMPLETING: still winding down
    assert statuses[JOBS["cancelled"]].raw_state == "COMPLETING"
    assert statuses[JOBS["exit3"]].reason == "NonZeroExitCode"


def test_squeue_finished():
    statuses = parse_squeue(fixture("slurm", "squeue_all.txt"))
    assert {j: s.state for j, s in statuses.items()} == {
        JOBS["cancelled"]: "cancelled", JOBS["completed"]: "completed", JOBS["exit3"]: "failed",
        JOBS["segfault"]: "failed", JOBS["plain"]: "failed", JOBS["cluster"]: "failed",
        JOBS["oom"]: "out-of-memory", JOBS["timeout"]: "running", JOBS["preemptor"]: "completed",
        JOBS["preempted"]: "preempted"}
    assert statuses[JOBS["completed"]].elapsed == 3


def test_squeue_without_header():
    body = "".join(fixture("slurm", "squeue_all.txt").splitlines(keepends=True)[1:])
    assert set(parse_squeue(body)) == set(parse_squeue(fixture("slurm", "squeue_all.txt")))
    assert parse_squeue("") == {}


# -- scontrol -------------------------------------------------------------------------
def test_scontrol_multiline():
    records = {r.job_id: r for r in parse_scontrol_job(fixture("slurm", "scontrol_show_job.txt"))}
    oom = records[JOBS["oom"]]
    assert (oom.state, oom.exit_code, oom.signal) == ("out-of-memory", 0, 125)
    assert oom.requested_memory == 100 * MiB and oom.time_limit == 300
    assert oom.end == "2026-11-22T03:41:50"
    running = records[JOBS["timeout"]]
    assert running.state == "running" and running.end is None  # EndTime there is a forecast


def test_scontrol_oneline_matches_sacct(sacct):
    records = {r.job_id: r for r in parse_scontrol_job(fixture("slurm", "scontrol_show_job_oneline.txt"))}
    for name in ("completed", "exit3", "segfault", "oom", "cancelled", "preempted", "preemptor"):
        a, b = records[JOBS[name]], sacct[JOBS[name]]
        assert (a.state, a.exit_code, a.requested_memory, a.node, a.start) == \
               (b.state, b.exit_code, b.requested_memory, b.node, b.start), name
    assert records["38"].state == "node-fail"


# -- accounting switched off: sacct's complaint sends the adapter to scontrol --------------
def test_accounting_disabled_is_read_from_sacct_stderr():
    assert accounting_disabled(fixture("slurm", "sacct_disabled_stderr.txt"))
    # Other sacct failures are errors to report, not a reason to give up on accounting.
    assert not accounting_disabled("sacct: error: Problem talking to the database: Connection refused\n")
    assert not accounting_disabled("sacct: error: Invalid job id specified\n")
    assert not accounting_disabled("")


def sacct_refused(sacct_stderr: str) -> ScriptedRunner:
    """sacct fails with `sacct_stderr`; scontrol answers with its captured output."""
    return ScriptedRunner([(["sacct"], (1, "", sacct_stderr)),
                           (["scontrol"], (0, fixture("slurm", "scontrol_show_job_oneline.txt"), ""))])


def test_adapter_falls_back_to_scontrol_only_when_accounting_is_disabled():
    runner = sacct_refused(fixture("slurm", "sacct_disabled_stderr.txt"))
    records = SLURMAdapter(runner).accounting([JOBS["oom"], JOBS["completed"]])
    assert [argv[0] for argv in runner.commands] == ["sacct", "scontrol"]
    assert records[JOBS["oom"]].state == "out-of-memory" and records[JOBS["completed"]].state == "completed"
    broken = sacct_refused("sacct: error: Problem talking to the database: Connection refused\n")
    with pytest.raises(BatchError, match="sacct failed.*Connection refused"):
        SLURMAdapter(broken).accounting([JOBS["oom"]])
    assert [argv[0] for argv in broken.commands] == ["sacct"]


# -- pieces ---------------------------------------------------------------------------
@pytest.mark.parametrize("raw, state, by", [
    ("COMPLETED", "completed", None), ("CANCELLED by 1000", "cancelled", "1000"),
    ("CANCELLED+", "cancelled", None), ("OUT_OF_MEMORY", "out-of-memory", None),
    ("BOOT_FAIL", "boot-fail", None), ("DEADLINE", "deadline", None),
    ("REQUEUED", "pending", None), ("CONFIGURING", "pending", None), ("COMPLETING", "running", None),
    ("CG", "running", None), ("PD", "pending", None), ("OOM", "out-of-memory", None),
    ("SOMETHING_NEW", "unknown", None), ("", "unknown", None),
])
def test_map_state(raw, state, by):
    assert map_state(raw) == (state, by)


def test_state_map_targets_are_known_states():
    assert set(STATE_MAP.values()) <= set(JOB_STATES)


@pytest.mark.parametrize("text, expected", [
    ("0:0", (0, None)), ("3:0", (3, None)), ("0:15", (0, 15)), ("0:9", (0, 9)),
    ("0:125", (0, 125)), ("11:0", (11, None)), ("", (None, None)), ("x:y", (None, None)),
])
def test_exit_codes(text, expected):
    assert parse_exit_code(text) == expected


@pytest.mark.parametrize("text, cpus, expected", [
    ("300M", None, 300 * MiB), ("1G", None, 2**30), ("1023456K", None, 1023456 * 1024),
    ("4000Mn", None, 4000 * MiB), ("4000Mc", 4, 16000 * MiB), ("4000Mc", None, None),
    ("0", None, 0), ("", None, None), ("16?", None, None), ("1.5G", None, int(1.5 * 2**30)),
])
def test_memory(text, cpus, expected):
    assert parse_slurm_memory(text, cpus) == expected


@pytest.mark.parametrize("text, expected", [
    ("00:01:13", 73), ("1-00:00:00", 86400), ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
    ("1-12", 86400 + 12 * 3600), ("5:00", 300), ("0:00", 0), ("30", 1800),
    ("UNLIMITED", None), ("INVALID", None), ("Partition_Limit", None), ("", None),
])
def test_durations(text, expected):
    assert parse_slurm_duration(text) == expected
