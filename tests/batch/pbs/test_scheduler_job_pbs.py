"""The scheduler as a batch job (issue 16, point 5) through PBSCluster, against the PBS
simulator (tests/helpers/pbs_sim: qsub/qstat/qdel, walltime enforced with SIGTERM then SIGKILL): the
cluster class's path (keyword, the SchedulerJob handle in place of a Popen, close), and a
renewal under a pending gather. The real SLURM runs are tests/batch/slurm/test_scheduler_job.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client  # noqa: E402
from hpc_cluster.config import resolve  # noqa: E402
from hpc_cluster.deploy.cluster import ClusterError, PBSCluster  # noqa: E402
from hpc_cluster.deploy.launch import launch  # noqa: E402
from hpc_cluster.protocol.clusterfile import cluster_file_for  # noqa: E402
from hpc_cluster.deploy.daemon.scheduler_job import OWNER_TIMEOUT, SchedulerJob, owner_path  # noqa: E402


def qstat_states(job_ids) -> dict[str, str]:
    out = subprocess.run(["qstat", "-x", "-f", "-F", "json", *job_ids], capture_output=True, text=True,
                         check=True).stdout
    return {jid: j["job_state"] for jid, j in json.loads(out, strict=False)["Jobs"].items()}


def _slow_square(x):
    time.sleep(1.0)
    return x * x


def _gather_in_background(client, futures):
    got: dict = {}

    def gather():
        try:
            got["result"] = client.gather(futures, timeout=240)
        except BaseException as exc:          # the test reads it
            got["error"] = exc
    waiter = threading.Thread(target=gather, daemon=True)
    waiter.start()
    return waiter, got


def _scheduler_job(cluster_file) -> str | None:
    try:
        return json.loads(Path(cluster_file).read_text()).get("scheduler_job")
    except (OSError, ValueError):
        return None


def _gather_through_a_takeover(cluster, client, n: int, wait: float, before=lambda: None) -> str:
    """Map `n` tasks of 1 s on the cluster's one worker and gather them while another scheduler
    job takes over: every result comes back, some of them after the takeover, and the worker
    job is the same one. Returns the first scheduler job's id."""
    first = _scheduler_job(cluster.cluster_file)
    client.wait_for_workers(1, timeout=60)
    before()
    workers = sorted(cluster.jobs)
    futures = client.map(_slow_square, range(n))
    waiter, got = _gather_in_background(client, futures)
    wait_until(lambda: _scheduler_job(cluster.cluster_file) not in (None, first), wait,
               "another scheduler job to take over")
    done_at_takeover = sum(f.done() for f in futures)
    waiter.join(240)
    assert got.get("result") == [i * i for i in range(n)], got
    assert done_at_takeover < n, "the takeover came after the gather: it proved nothing"
    assert sorted(cluster.jobs) == workers             # the same worker job, adopted
    return first


def test_pbs_cluster_with_its_scheduler_in_a_job_computes_and_closes(sim, tmp_path):
    cluster = PBSCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp_path / "logs"),
                         scheduler_in_job=True, n_workers=1, name="sj-pbs", interface="lo")
    try:
        assert isinstance(cluster._proc, SchedulerJob) and cluster._proc.pid is None
        info = json.loads(cluster.cluster_file.read_text())
        scheduler_job = info["scheduler_job"]
        # interface= is read in the job, on its node (here lo: 127.0.0.1), not on the login node.
        assert info["address"].startswith("tls://127.0.0.1:"), info["address"]        # TLS by default
        assert qstat_states([scheduler_job]) == {scheduler_job: "R"}
        with Client(cluster) as client:
            assert client.gather(client.map(_slow_square, range(4))) == [0, 1, 4, 9]
        workers = list(cluster.jobs)
        assert len(workers) == 1 and scheduler_job not in workers
    finally:
        cluster.close()
    assert cluster._proc.poll() is not None and not cluster.cluster_file.exists()
    assert qstat_states([scheduler_job, *workers]) == {j: "F" for j in [scheduler_job, *workers]}


@pytest.mark.slow
def test_the_scheduler_job_hands_over_to_its_successor_under_a_pending_gather(sim, tmp_path):
    # PBS reads '40' as 40 seconds: the successor is submitted ~20 s after the job starts.
    cluster = PBSCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp_path / "logs"),
                         scheduler_in_job=True, scheduler_job_walltime="40", n_workers=1, name="sj-pbs-renew",
                         walltime_margin=5)
    try:
        with Client(cluster) as client:
            first = _gather_through_a_takeover(cluster, client, 40, 120)
        second = _scheduler_job(cluster.cluster_file)
        assert qstat_states([first])[first] == "F"
        assert qstat_states([second])[second] == "R"
    finally:
        cluster.close()
    assert not cluster.cluster_file.exists()


def test_a_scheduler_job_that_ends_before_its_daemon_listens_is_an_error_quoting_its_output(sim, tmp_path):
    with pytest.raises(ClusterError) as info:
        PBSCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp_path / "logs"),
                   scheduler_in_job=True, name="sj-pbs-broken",
                   job_script_prologue=["echo 'module python/9 not found' >&2", "false"])
    text = str(info.value)
    assert re.search(r"the scheduler job \S+ ended \(failed\) before its daemon listened", text), text
    assert "module python/9 not found" in text                  # the job's own stderr, quoted
    assert not cluster_file_for("sj-pbs-broken").exists()
    job = re.search(r"the scheduler job (\S+) ended", text).group(1)
    assert qstat_states([job]) == {job: "F"}


def test_a_scheduler_job_that_does_not_start_in_time_is_cancelled_and_said_so(sim, tmp_path):
    # A prologue that outlasts the wait stands for a queue that does not start the job in time.
    cfg = resolve(batch="pbs", cores=1, memory="1GB", walltime="00:10:00", scheduler_in_job=True,
                  log_directory=str(tmp_path / "logs"), job_script_prologue=["sleep 30"], jobqueue=False)
    lines = []
    with pytest.raises(ClusterError, match=r"did not start its daemon within 2 s .*it was cancelled") as info:
        launch(cfg, "sj-pbs-slow", detach=True, progress=lines.append, job_timeout=2)
    job = re.search(r"the scheduler job (\S+) did not", str(info.value)).group(1)
    assert lines[0].startswith(f"scheduler job {job} submitted")  # progress names the job
    wait_until(lambda: qstat_states([job]) == {job: "F"}, 30, "the cancelled job to finish")
    assert not cluster_file_for("sj-pbs-slow").exists()


@pytest.mark.slow
def test_a_successor_that_starts_after_the_old_jobs_walltime_resumes_from_the_journal(sim, tmp_path):
    # The first successor's prologue waits 30 s (the marker, made once the first daemon runs, is
    # taken by the first job that sees it), so the first job (40 s) reaches its walltime before
    # anyone took over: its SIGTERM must keep the journal and the worker job, and the successor
    # resumes from them as after a crash (then hands over in time to the next one).
    marker = tmp_path / "slow-start"
    cluster = PBSCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp_path / "logs"),
                         scheduler_in_job=True, scheduler_job_walltime="40", n_workers=1, name="sj-pbs-late",
                         walltime_margin=5, job_script_prologue=[f"if rm {marker} 2>/dev/null; then sleep 30; fi"])
    try:
        with Client(cluster) as client:
            first = _gather_through_a_takeover(cluster, client, 60, 150, before=marker.touch)
        log = Path(json.loads(cluster.cluster_file.read_text())["daemon_log"]).read_text()
        assert "reached its walltime before a successor took over" in log
        assert f"taking over from scheduler job {first} (gone)" in log
    finally:
        marker.unlink(missing_ok=True)
        cluster.close()
    assert not cluster.cluster_file.exists()


OWNER = """
import sys, time
from hpc_cluster.deploy.cluster import PBSCluster
cluster = PBSCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=sys.argv[1], scheduler_in_job=True,
                     n_workers=1, name="sj-pbs-owner")
print(cluster.cluster_file, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_sigkilled_python_owner_ends_its_scheduler_job_cluster(sim, tmp_path):
    # The daemon runs on "another node": it cannot watch its owner's pid, so it watches the
    # owner's heartbeat file and shuts the cluster down when it stands still (OWNER_TIMEOUT).
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "logs")], stdout=subprocess.PIPE,
                             text=True)
    try:
        cluster_file = Path(owner.stdout.readline().strip())
        info = json.loads(cluster_file.read_text())
        assert info["address"] and info["scheduler_job"]
        wait_until(lambda: len(qstat_states([])) >= 2, 60, "the worker job to be submitted")
        jobs = sorted(qstat_states([]))
        owner.kill()
        owner.wait()
        wait_until(lambda: not cluster_file.exists(), OWNER_TIMEOUT + 45, "the daemon to shut the cluster down")
        wait_until(lambda: set(qstat_states(jobs).values()) == {"F"}, 30, "every job to finish")
        assert not owner_path(cluster_file).exists()
    finally:
        if owner.poll() is None:
            owner.kill()
