"""Job states as `status` and `down` show them (issue 34): a job we retired is `retired`, not the
OUT_OF_MEMORY SLURM marks a whole job with after one of its steps was OOM-killed; a requeued
job pending again has no node, uptime or time left, and says it was requeued. No batch system:
helpers.fakes.FakeAdapter answers the polls (tests/batch/slurm/test_job_states.py: the real one)."""

from __future__ import annotations

import types

from hpc_cluster.adapters.base import JobSpec, JobStatus
from hpc_cluster.cli.views import job_event, jobs_table
from hpc_cluster.deploy.daemon.jobs import Job, JobManager, ended_retired
from hpc_cluster.scheduler.state import SchedulerState
from helpers.fakes import FakeAdapter


def lone_manager(clock) -> JobManager:
    sched = types.SimpleNamespace(state=SchedulerState(), walltime_margin=60, fail_if_stranded=lambda: None,
                                  deaths=types.SimpleNamespace(job_never_started=lambda *a: None))
    return JobManager(sched, FakeAdapter(), JobSpec("w", walltime=600), clock=clock)


def status(jid, state, raw, node=None, reason=None, elapsed=None) -> dict:
    return {jid: JobStatus(jid, state, raw, node=node, reason=reason, elapsed=elapsed)}


def test_a_job_we_retired_shows_retired_whatever_its_leftover_end_state():
    oom = Job("7", 0.0, state="out-of-memory", raw_state="OUT_OF_MEMORY", registered=True)
    assert not ended_retired(oom, "memory-batch")                     # its worker died of it: true
    assert ended_retired(oom, "retired")                              # its last worker left as asked
    oom.retiring = True
    assert ended_retired(oom, None)                                   # scale-down, down: ours
    # What happened to it whatever we asked stays the batch system's word.
    assert not ended_retired(Job("8", 0.0, state="timeout", retiring=True), "retired")
    assert not ended_retired(Job("9", 0.0, state="running", retiring=True), None)
    row = {"job_id": "7", "state": "out-of-memory", "raw_state": "OUT_OF_MEMORY", "ended_retired": True}
    assert job_event(row) == "job 7: retired"
    assert "retired" in jobs_table([row]) and "OUT_OF_MEMORY" not in jobs_table([row])
    assert "out-of-memory" not in jobs_table([row])


def test_the_table_shows_a_retired_jobs_death_not_its_batch_end():
    now = [1000.0]
    jm = lone_manager(lambda: now[0])
    jm.jobs["7"] = Job("7", 900.0, registered=True, retiring=True)
    jm.apply_statuses(["7"], status("7", "out-of-memory", "OUT_OF_MEMORY"))
    row = jm.table()["jobs"][0]
    # The batch system's word stays for scripts (cluster.jobs, status --json); `retired` beside it.
    assert (row["state"], row["raw_state"], row["ended_retired"]) == ("out-of-memory", "OUT_OF_MEMORY", True)
    assert job_event(row) == "job 7: retired"


def test_a_requeued_job_pending_again_has_no_node_uptime_or_time_left():
    now = [1000.0]
    jm = lone_manager(lambda: now[0])
    jm.jobs["5"] = Job("5", 900.0)
    jm.apply_statuses(["5"], status("5", "running", "RUNNING", node="vm", elapsed=30))
    now[0] = 1060.0
    row = jm.table()["jobs"][0]
    assert (row["node"], row["uptime"], row["time_left"]) == ("vm", 90.0, 510.0)
    # scontrol requeue: COMPLETING, then PENDING with no node (squeue's %N is empty), reason BeginTime.
    jm.apply_statuses(["5"], status("5", "pending", "PENDING", reason="BeginTime"))
    row = jm.table()["jobs"][0]
    assert (row["state"], row["node"], row["uptime"], row["time_left"], row["requeued"]) == \
        ("pending", None, None, None, 1)
    assert job_event(row) == "job 5: pending (requeued, BeginTime)"
    text = jobs_table([row])
    assert "pending (requeued, BeginTime)" in text and "vm" not in text
    # It runs again: a new start, its node again; a later requeue counts again.
    now[0] = 1200.0
    jm.apply_statuses(["5"], status("5", "running", "RUNNING", node="vm", elapsed=5))
    row = jm.table()["jobs"][0]
    assert (row["node"], row["uptime"], row["requeued"]) == ("vm", 5.0, 1)
    jm.apply_statuses(["5"], status("5", "pending", "PENDING", reason="BeginTime"))
    assert jm.table()["jobs"][0]["requeued"] == 2


def test_a_fresh_job_pending_is_not_requeued():
    jm = lone_manager(lambda: 1000.0)
    jm.jobs["6"] = Job("6", 990.0)
    jm.apply_statuses(["6"], status("6", "pending", "PENDING", reason="Priority"))
    row = jm.table()["jobs"][0]
    assert row["requeued"] == 0 and job_event(row) == "job 6: pending (Priority)"


def test_a_long_pending_reason_or_many_workers_do_not_widen_the_table():
    """Issue 34: a long pending reason widened `status` to ~190 columns. The cell is cut and the
    reason said whole under the table, wrapped; a job of many workers names a few and the count."""
    reason = "ReqNodeNotAvail, UnavailableNodes:" + ",".join(f"bignode-rack{k:02d}-[001-064]" for k in range(6))
    rows = [{"job_id": "41", "state": "pending", "reason": reason},
            {"job_id": "42", "state": "running", "node": "n1", "uptime": 60, "time_left": 540,
             "worker_names": [f"SLURMCluster-3-{k}" for k in range(12)]}]
    text = jobs_table(rows)
    table, notes = text.split("\n")[:3], text.split("\n")[3:]
    assert max(len(line) for line in table) <= 120, text
    assert "(below)" in table[1] and "12 workers: SLURMCluster-3-0," in table[2], text
    said = "".join(line.strip() for line in notes)      # wrapped anywhere: compare without spaces
    assert said.replace(" ", "") == f"job 41: pending ({reason})".replace(" ", ""), said
    assert max(len(line) for line in notes) <= 100
    # A short reason stays in its cell, nothing under the table.
    short = jobs_table([{"job_id": "43", "state": "pending", "reason": "Resources"}])
    assert short.splitlines()[1].split()[1:3] == ["pending", "(Resources)"] and len(short.splitlines()) == 2
