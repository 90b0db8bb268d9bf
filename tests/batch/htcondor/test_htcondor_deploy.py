"""HTCondorCluster end to end against the command-level HTCondor simulator (tests/helpers/htcondor_sim):
the daemon submits with condor_submit, reads condor_q / condor_history -json, removes with
condor_rm; real workers run in the simulated jobs, compute, and die of our walltime's
periodic_remove and of a cgroup memory hold, and the scheduler's diagnosis says so. No HTCondor
pool runs here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import condorsim  # noqa: E402
from helpers.funcs import grow, sleep_then, square  # noqa: E402
from helpers.sims import final_death, stop_simulator, use_simulator  # noqa: E402
from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client, HTCondorCluster  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def condor(isolated_home, monkeypatch):
    home = use_simulator(monkeypatch, condorsim, isolated_home / "htcondor_sim_home", "CONDOR_SIM_HOME", **{"CONDOR_SIM_PERIODIC": "1"})
    yield home
    stop_simulator(condorsim, home)


def test_htcondor_cluster_computes_and_closes(condor, isolated_home):
    cluster = HTCondorCluster(cores=1, memory="1GB", disk="1GB", walltime="00:10:00",
                              log_directory=str(isolated_home / "logs"))
    try:
        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=120)
            assert client.gather(client.map(square, range(50))) == [x * x for x in range(50)]
            jobs = cluster.jobs
            assert len(jobs) == 2 and {r["state"] for r in jobs.values()} == {"running"}
            assert all(j.endswith(".0") for j in jobs) and {r["raw_state"] for r in jobs.values()} == {"Running"}
            assert client.deaths() == []
            ids = sorted(jobs)
    finally:
        cluster.close()
    # Closed: the workers retire (JobStatus 4) or are removed (3); nothing is left in the queue.
    wait_until(lambda: all(condorsim.load(str(condor), int(i.split(".")[0]))["JobStatus"] in (3, 4) for i in ids),
               30, "jobs to leave the queue")
    wait_until(lambda: not condorsim.live_pids(str(condor)), 30, "the jobs' processes to exit")


def test_memory_hold_is_memory_batch_and_periodic_remove_is_walltime(condor, isolated_home):
    # RequestMemory 400 (MB) for the job, the workers' budget above it (memory=2GB): the cgroup
    # holds the job when the task passes 400 MB. Walltime 20 s: our periodic_remove ends the next job.
    cluster = HTCondorCluster(name="condor-deaths", cores=1, memory="2GB", disk="1GB", walltime="00:00:20",
                              job_extra_directives={"RequestMemory": 400}, allowed_failures=0,
                              log_directory=str(isolated_home / "logs"))
    try:
        assert "\nRequestMemory = 400\n" in cluster.job_script()
        cluster.scale(1)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=60)
            hog = client.submit(grow, 800 << 20, key="hog-800MB")
            err = hog.exception(timeout=90)
            death = final_death(client, lambda d: "hog-800MB" in d["executing"])
            assert (death["cause"], death["blame"]) == ("memory-batch", True), death["text"]
            assert type(err).__name__ == "TaskMemoryError", repr(err)
            assert any("Job has gone over cgroup memory limit of 400 megabytes" in line for line in death["evidence"]), \
                death["evidence"]
            client.wait_for_workers(1, timeout=60)
            long = client.submit(sleep_then, 7, 60, key="long-60s")
            death = final_death(client, lambda d: "long-60s" in d["executing"])
            assert (death["cause"], death["blame"]) == ("walltime", False), death["text"]
            assert any("PeriodicRemove" in line for line in death["evidence"]), death["evidence"]
            assert "walltime" in client.why(long)
    finally:
        cluster.close()
