"""The scheduler as a batch job on the real SLURM (issue 16, points 5 and 6).

(a) `hpc-cluster up --scheduler-in-job -n 1`: the cluster daemon runs as a SLURM job (squeue
shows it; its process is slurmstepd's child, not ours), a client computes, `status` and `why`
work, `down` ends the scheduler job and the worker job.
(b) Renewal: a scheduler job of 1 minute (the shortest SLURM has; it would end ~70-85 s after
its start) submits its successor and hands over while a client's gather of sleeping tasks
waits: every result comes back, the worker job is the same, the scheduler job id changed and
the first scheduler job ended COMPLETED, not TIMEOUT.
"""

from __future__ import annotations

import json
import os
import signal
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.funcs import square
from helpers.wait import wait_until  # noqa: E402
from slurm_jobs import cli, gather_in_background  # noqa: E402  (own_home: conftest.py)
from helpers.slurm import squeue_ids  # noqa: E402

from hpc_cluster import Client  # noqa: E402

pytestmark = pytest.mark.slurm


def squeue_row(job_id: str) -> tuple[str, str] | None:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%j"], capture_output=True, text=True).stdout
    return tuple(out.strip().split("|")) if out.strip() else None


def sacct_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                         text=True, check=True).stdout
    return out.strip().split("\n")[0] if out.strip() else ""


def _site(tmp_path: Path, name: str, extra: str = "") -> Path:
    site = tmp_path / "site.yaml"
    site.write_text(f"default: t\nsites:\n  t:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n"
                    f"    walltime: '00:15:00'\n    job_name: {name}\n    log_directory: {tmp_path / 'logs'}\n"
                    + extra)
    return site


def _up(site: Path, name: str, ours: set[str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`hpc-cluster up --scheduler-in-job -n 1`; every job id it names goes into `ours` (for the
    cleanup) before anything is asserted. Returns the output and the worker jobs it started."""
    up = cli("up", "--config", str(site), "-n", "1", "--name", name, "--scheduler-in-job", "--timeout", "240")
    ours |= set(re.findall(r"scheduler job (\d+) submitted", up.stdout))
    workers = set(re.findall(r"^job (\d+): (?:pending|running)", up.stdout, re.M))
    ours |= workers
    assert up.returncode == 0, up.stdout + up.stderr
    assert len(workers) == 1, up.stdout
    return up, workers


def _parent_command(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    return Path(f"/proc/{ppid}/comm").read_text().strip()


def _cleanup(name: str, cluster_file: Path, job_ids: set[str]) -> None:
    """Whatever the test left: the cluster (down), then any of its jobs still queued."""
    if cluster_file.exists():
        cli("down", name, timeout=240)
    left = [j for j in job_ids if j in squeue_ids()]
    if left:
        subprocess.run(["scancel", *left], check=False)
    wait_until(lambda: not (job_ids & squeue_ids()), 90, "the test's jobs to leave squeue")


def test_up_with_the_scheduler_in_a_job_status_why_down(slurm_cluster, own_home, tmp_path):
    name = "t-sj-up"
    site = _site(tmp_path, name)
    cluster_file = Path(own_home["XDG_CONFIG_HOME"]) / "hpc-cluster" / "clusters" / f"{name}.json"
    ours: set[str] = set()
    try:
        up, workers = _up(site, name, ours)
        info = json.loads(cluster_file.read_text())
        scheduler_job = info["scheduler_job"]
        assert re.search(rf"daemon pid \d+ in scheduler job {scheduler_job} listening", up.stdout), up.stdout
        assert scheduler_job not in workers, up.stdout
        # The daemon is a SLURM job: squeue shows it, and its process is slurmstepd's, not ours.
        assert squeue_row(scheduler_job) == ("RUNNING", f"{name}-scheduler")
        assert _parent_command(info["pid"]) == "slurmstepd"
        assert info["pid"] != os.getpid()

        with Client(name) as client:
            assert client.gather(client.map(square, range(10))) == [i * i for i in range(10)]

        status = cli("status", name)
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"in scheduler job {scheduler_job})" in status.stdout
        assert re.search(rf"^\s*{next(iter(workers))}\s+.*running", status.stdout, re.M), status.stdout
        why = cli("why", name)
        assert why.returncode == 0 and "no worker has died" in why.stdout, why.stdout + why.stderr
        listed = cli("list")
        assert name in listed.stdout and "1 running" in listed.stdout, listed.stdout + listed.stderr

        down = cli("down", name, timeout=240)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not (ours & squeue_ids()), "down left the scheduler job or the worker job in the queue"
        assert not cluster_file.exists()
        assert sacct_state(scheduler_job) == "COMPLETED"    # the daemon exited: not cancelled, not killed
    finally:
        _cleanup(name, cluster_file, ours)


def _sleepy(i):
    time.sleep(2.0)
    return i * 10


N_TASKS = 45          # 90 s of work on one 1-thread worker: the 1-minute scheduler job hands over midway


@pytest.mark.slow
def test_the_scheduler_job_renews_itself_under_a_pending_gather(slurm_cluster, own_home, tmp_path):
    name = "t-sj-renew"
    site = _site(tmp_path, name, "    scheduler_job_walltime: '1'\n")       # SLURM: 1 minute
    cluster_file = Path(own_home["XDG_CONFIG_HOME"]) / "hpc-cluster" / "clusters" / f"{name}.json"
    ours: set[str] = set()

    def current() -> str | None:
        try:
            return json.loads(cluster_file.read_text()).get("scheduler_job")
        except (OSError, ValueError):
            return None
    try:
        up, workers = _up(site, name, ours)
        first = current()
        with Client(name) as client:
            futures = client.map(_sleepy, range(N_TASKS))
            waiter, got = gather_in_background(client, futures)
            wait_until(lambda: current() not in (None, first), 150, "a successor scheduler job to take over")
            second = current()
            ours.add(second)
            done_at_handover = sum(f.done() for f in futures)
            waiter.join(600)
            assert not waiter.is_alive(), "the client's gather did not return"
            assert "error" not in got, repr(got.get("error"))
            assert got["result"] == [i * 10 for i in range(N_TASKS)]
            assert done_at_handover < N_TASKS, "the handover came after the gather: it proved nothing"
        # The first scheduler job let go before its walltime, and the worker job was adopted.
        wait_until(lambda: sacct_state(first) not in ("", "RUNNING", "COMPLETING"), 90, "the first job to end")
        assert sacct_state(first) == "COMPLETED"
        named = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True,
                               check=True).stdout.split()
        assert set(named) == workers, (named, workers)
        status = cli("status", name, "--json")
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert {str(j["job_id"]) for j in shown["jobs"]} == workers
        assert shown["scheduler_job"] not in (None, first)
        ours.add(current() or second)          # a later renewal may have happened meanwhile
    finally:
        ours |= {j for j in [current()] if j}
        _cleanup(name, cluster_file, ours)


def test_a_killed_scheduler_job_is_resumed_by_up_and_a_silent_one_is_cancelled_by_down(slurm_cluster, own_home,
                                                                                        tmp_path):
    name = "t-sj-kill"
    site = _site(tmp_path, name)
    cluster_file = Path(own_home["XDG_CONFIG_HOME"]) / "hpc-cluster" / "clusters" / f"{name}.json"
    ours: set[str] = set()
    try:
        up, workers = _up(site, name, ours)
        first = json.loads(cluster_file.read_text())["scheduler_job"]
        with Client(name) as client:
            x = client.submit(square, 7)
            assert x.result(timeout=60) == 49
        # The scheduler job's daemon dies without a word (SIGKILL; here its node is ours): the job
        # ends, the cluster is stopped, not gone.
        os.kill(json.loads(cluster_file.read_text())["pid"], signal.SIGKILL)
        wait_until(lambda: sacct_state(first) not in ("", "RUNNING", "COMPLETING"), 60, "the scheduler job to end")
        status = cli("status", name)
        assert status.returncode == 3 and "resumes it" in status.stderr, status.stdout + status.stderr
        again, shown = _up(site, name, ours)
        assert shown == workers                       # the worker job, adopted (squeue below: no other)
        assert f"resuming cluster {name!r} from its journal" in again.stdout, again.stdout
        second = json.loads(cluster_file.read_text())["scheduler_job"]
        assert second != first
        with Client(name) as client:
            assert client.submit(square, 8).result(timeout=120) == 64
        named = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True,
                               check=True).stdout.split()
        assert set(named) == workers                  # the worker job adopted, none submitted
        # A daemon that does not answer (stopped): `down` cancels its scheduler job, then its jobs.
        os.kill(json.loads(cluster_file.read_text())["pid"], signal.SIGSTOP)
        down = cli("down", name, "--timeout", "120", timeout=300)
        assert f"cancelling its scheduler job(s) {second}" in down.stderr, down.stdout + down.stderr
        wait_until(lambda: not (ours & squeue_ids()), 90, "the scheduler job and the worker job to leave squeue")
        assert not cluster_file.exists()
    finally:
        _cleanup(name, cluster_file, ours)
