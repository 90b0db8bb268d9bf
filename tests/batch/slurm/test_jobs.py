"""Real jobs on the real cluster, each ending one way, each read back by the adapter.

All jobs are submitted at once and waited on together: the time-limit job alone takes
70-80 s (limits are whole minutes, checked every ~30 s) and the others ride along.
"""

from __future__ import annotations

import subprocess

import pytest

from slurm_jobs import scenarios, wait_final, wait_for, wait_running

pytestmark = [pytest.mark.slurm]

MiB = 2**20


@pytest.fixture(scope="module")
def outcomes(adapter, submitted, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("slurm-logs")
    specs = scenarios(str(log_dir))
    ids = {}
    for name in ("completed", "exit3", "segfault", "oom", "timeout", "cancelled", "preempted"):
        ids[name] = adapter.submit(adapter.render(specs[name]))
        submitted.append(ids[name])
    wait_running(adapter, ids["cancelled"])
    adapter.cancel([ids["cancelled"]])
    wait_running(adapter, ids["preempted"])
    ids["preemptor"] = adapter.submit(adapter.render(specs["preemptor"]))
    submitted.append(ids["preemptor"])
    records = wait_final(adapter, list(ids.values()), timeout=240)
    return {name: records[job_id] for name, job_id in ids.items()}, log_dir


def test_completed(outcomes):
    records, log_dir = outcomes
    r = records["completed"]
    assert (r.state, r.raw_state, r.exit_code, r.signal) == ("completed", "COMPLETED", 0, None)
    assert r.requested_memory == 200 * MiB
    assert r.time_limit == 120  # 90 s asked, rounded up to SLURM's whole minutes
    assert r.elapsed is not None and r.elapsed >= 2
    assert r.node and r.start and r.end
    batch = {s.step_id: s for s in r.steps}["batch"]
    assert batch.state == "completed"
    # 50 MB held for 3 s: the sampler must have seen it, and the job-level max is the steps' max.
    assert 45 * MiB < batch.max_rss < 150 * MiB
    assert r.max_rss == max(s.max_rss for s in r.steps if s.max_rss is not None)


def test_job_environment_reaches_the_script(outcomes):
    records, log_dir = outcomes
    r = records["completed"]
    out = (log_dir / f"t-completed-{r.job_id}.out").read_text()
    assert f"job={r.job_id} walltime=120 start=" in out
    start = int(out.split("start=")[1].split()[0])
    assert start > 1_600_000_000


def test_exit_code_3(outcomes):
    r = outcomes[0]["exit3"]
    assert (r.state, r.exit_code, r.signal) == ("failed", 3, None)


def test_segfault_reports_signal_11(outcomes):
    # The template execs the worker, so the batch step *is* the crashing process and
    # SLURM reports its signal rather than a shell's 139.
    r = outcomes[0]["segfault"]
    assert (r.state, r.exit_code, r.signal) == ("failed", 0, 11)


def test_over_memory_is_out_of_memory(outcomes):
    r = outcomes[0]["oom"]
    assert (r.state, r.raw_state, r.exit_code, r.signal) == ("out-of-memory", "OUT_OF_MEMORY", 0, 125)
    assert r.requested_memory == 100 * MiB
    batch = {s.step_id: s for s in r.steps}["batch"]
    assert batch.state == "out-of-memory"


@pytest.mark.slow
def test_time_limit_is_timeout(outcomes):
    records, log_dir = outcomes
    r = records["timeout"]
    assert r.state == "timeout" and r.raw_state == "TIMEOUT"
    assert r.time_limit == 60
    assert 60 <= r.elapsed < 150
    batch = {s.step_id: s for s in r.steps}["batch"]
    # Two endings are both real SLURM: slurmd reports the batch step killed by SIGTERM
    # (CANCELLED 0:15), or slurmctld records the job's end first and slurmdbd stamps the
    # still-open step with the job's state (TIMEOUT, no signal). CI saw both.
    assert (batch.state, batch.signal) in {("cancelled", 15), ("timeout", None)}
    err = (log_dir / f"t-timeout-{r.job_id}.err").read_text()
    assert f"JOB {r.job_id} ON" in err and "DUE TO TIME LIMIT" in err


def test_scancel_is_cancelled_by_root(outcomes):
    r = outcomes[0]["cancelled"]
    assert (r.state, r.cancelled_by) == ("cancelled", "0")
    assert r.raw_state == "CANCELLED by 0"


def test_preemption(outcomes):
    records, _ = outcomes
    assert records["preempted"].state == "preempted"
    assert records["preemptor"].state == "completed"


def test_status_of_finished_jobs_falls_back_to_accounting(adapter, outcomes):
    records, _ = outcomes
    done = records["exit3"].job_id
    # Poll until the controller forgets the job (MinJobAge), then status must still know it.
    def gone_from_squeue():
        out = subprocess.run(["squeue", "-h", "-t", "all", "-j", done, "-o", "%i"],
                             capture_output=True, text=True)
        return done not in out.stdout.split()
    wait_for(gone_from_squeue, 180, f"job {done} to leave squeue")
    status = adapter.status([done, records["completed"].job_id, "999999999"])
    assert status[done].state == "failed" and status[done].raw_state == "FAILED"
    assert status[records["completed"].job_id].state == "completed"
    assert status["999999999"].state == "unknown"


def test_status_while_running(adapter, submitted, tmp_path):
    spec = scenarios(str(tmp_path))["cancelled"].replace(job_name="t-status")
    job_id = adapter.submit(adapter.render(spec))
    submitted.append(job_id)
    wait_running(adapter, job_id)
    status = adapter.status([job_id])[job_id]
    assert status.state == "running" and status.raw_state == "RUNNING"
    assert status.node and status.time_limit == 300
    adapter.cancel([job_id])
    r = wait_final(adapter, [job_id], timeout=60)[job_id]
    assert r.state == "cancelled"


def test_cancel_of_finished_and_unknown_jobs_is_quiet(adapter, outcomes):
    adapter.cancel([outcomes[0]["completed"].job_id])
    adapter.cancel(["999999999"])


def test_accounting_falls_back_to_scontrol_when_accounting_is_off(adapter, submitted, tmp_path):
    """Some sites run without slurmdbd: sacct says so, and scontrol must answer instead.

    A copy of slurm.conf with accounting_storage/none (via SLURM_CONF) makes sacct say
    exactly what it says on such a site, while scontrol still reaches our controller.
    """
    from pathlib import Path

    from hpc_cluster.adapters.slurm import SLURMAdapter
    from hpc_cluster.runners.local import LocalRunner

    conf = tmp_path / "slurm.conf"
    conf.write_text(Path("/etc/slurm/slurm.conf").read_text().replace(
        "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageType=accounting_storage/none"))
    no_accounting = SLURMAdapter(LocalRunner(env={"SLURM_CONF": str(conf)}))
    probe = LocalRunner(env={"SLURM_CONF": str(conf)}).run(["sacct", "-j", "1"], check=False)
    assert "accounting storage is disabled" in probe.stderr

    job_id = adapter.submit(adapter.render(scenarios(str(tmp_path))["exit3"]))
    submitted.append(job_id)
    wait_final(adapter, [job_id], timeout=60)
    record = no_accounting.accounting([job_id, "999999999"])[job_id]
    assert (record.state, record.exit_code, record.requested_memory) == ("failed", 3, 200 * MiB)
    assert record.steps == [] and record.raw.startswith(f"JobId={job_id} ")


def test_many_jobs_take_one_command_each_for_status_and_accounting(outcomes):
    # Real commands, counted: a poll of N jobs must not become N squeue or sacct calls.
    from hpc_cluster.runners.local import LocalRunner
    from hpc_cluster.adapters.slurm import SLURMAdapter

    class Counting(LocalRunner):
        def __init__(self):
            super().__init__()
            self.commands = []

        def run(self, argv, *args, **kwargs):
            self.commands.append(argv[0])
            return super().run(argv, *args, **kwargs)

    records, _ = outcomes
    ids = [r.job_id for r in records.values()]
    runner = Counting()
    adapter = SLURMAdapter(runner)
    # The version (for squeue --only-job-state) is read once per adapter, never per poll.
    assert adapter.version() is not None and runner.commands == ["squeue"]
    runner.commands.clear()
    statuses = adapter.status(ids)
    assert sorted(statuses) == sorted(ids) and all(s.state != "unknown" for s in statuses.values())
    # squeue once; the jobs it has already forgotten come from one sacct call
    assert runner.commands in (["squeue"], ["squeue", "sacct"]), runner.commands
    runner.commands.clear()
    assert sorted(adapter.accounting(ids)) == sorted(ids)
    assert runner.commands == ["sacct"]
    runner.commands.clear()
    statuses = adapter.status(ids, within=3600)      # jobs squeue forgot: sacct from an hour (+10 min) ago
    assert runner.commands in (["squeue"], ["squeue", "sacct"]) and all(s.state != "unknown" for s in statuses.values())
