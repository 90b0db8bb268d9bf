"""LSFCluster end to end against the command-level LSF simulator (tests/helpers/lsf_sim): the daemon
submits with bsub, reads states with bjobs -json, cancels with bkill; real workers run in the
simulated jobs, compute, and die of the run limit and the memory limit the way LSF ends jobs
(TERM_RUNLIMIT, TERM_MEMLIMIT), and the scheduler's diagnosis says so. No LSF installs here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import lsfsim  # noqa: E402
from helpers.funcs import grow, sleep_then, square  # noqa: E402
from helpers.sims import final_death, stop_simulator, use_simulator  # noqa: E402
from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client, LSFCluster  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def lsf(isolated_home, monkeypatch):
    home = use_simulator(monkeypatch, lsfsim, isolated_home / "lsf_sim_home", "LSF_SIM_HOME", **{"LSF_SIM_UNITS": "mb", "LSF_SIM_MINUTE": "60"})
    yield home
    stop_simulator(lsfsim, home)


def test_lsf_cluster_computes_and_closes(lsf, isolated_home):
    cluster = LSFCluster(cores=1, memory="1GB", walltime="00:10", lsf_units="mb",
                         log_directory=str(isolated_home / "logs"))
    try:
        assert "#BSUB -W 00:10\n" in cluster.job_script() and "#BSUB -M 1000\n" in cluster.job_script()
        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=120)
            assert client.gather(client.map(square, range(50))) == [x * x for x in range(50)]
            jobs = cluster.jobs
            assert len(jobs) == 2 and {r["state"] for r in jobs.values()} == {"running"}
            assert {r["raw_state"] for r in jobs.values()} == {"RUN"}              # bjobs' own word
            assert client.deaths() == []
            ids = sorted(jobs)
    finally:
        cluster.close()
    # Closed: the workers retire (exit 0: DONE) or are bkill'd (TERM_OWNER); nothing is left running.
    wait_until(lambda: all(lsfsim.load(str(lsf), int(i))["STAT"] in ("EXIT", "DONE") for i in ids), 30, "jobs to end")
    assert {(r["STAT"], r["EXIT_REASON"]) for r in (lsfsim.load(str(lsf), int(i)) for i in ids)} <= {
        ("DONE", ""), ("EXIT", "TERM_OWNER: job killed by owner")}
    wait_until(lambda: not lsfsim.live_pids(str(lsf)), 30, "the jobs' processes to exit")


def test_run_limit_kill_is_walltime_and_memory_limit_kill_is_memory_batch(lsf, isolated_home, monkeypatch):
    monkeypatch.setenv("LSF_SIM_MINUTE", "15")          # -W 00:01 ends the job 15 s after it starts
    cluster = LSFCluster(name="lsf-deaths", cores=1, memory="2GB", mem="400MB", walltime="1", lsf_units="mb",
                         allowed_failures=0, log_directory=str(isolated_home / "logs"))
    try:
        assert "#BSUB -M 400\n#BSUB -W 00:01\n" in cluster.job_script()
        cluster.scale(1)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=60)
            # Memory: the task takes 800 MB; -M 400 (the nanny's budget is 2 GB): LSF ends the job.
            hog = client.submit(grow, 800 << 20, key="hog-800MB")
            err = hog.exception(timeout=90)
            death = final_death(client, lambda d: "hog-800MB" in d["executing"])
            assert (death["cause"], death["blame"]) == ("memory-batch", True), death["text"]
            assert type(err).__name__ == "TaskMemoryError", repr(err)
            assert any("TERM_MEMLIMIT" in line for line in death["evidence"]), death["evidence"]
            # Walltime: a fresh job; a 60 s task is running when its 15 s run limit comes.
            client.wait_for_workers(1, timeout=60)
            long = client.submit(sleep_then, 7, 60, key="long-60s")
            death = final_death(client, lambda d: "long-60s" in d["executing"])
            assert (death["cause"], death["blame"]) == ("walltime", False), death["text"]
            assert any("TERM_RUNLIMIT" in line for line in death["evidence"]), death["evidence"]
            assert "walltime" in client.why(long)
    finally:
        cluster.close()
