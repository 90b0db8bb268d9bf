"""HTCondorCluster(engine="distributed") against the command-level HTCondor simulator
(tests/helpers/htcondor_sim, which runs its jobs as real processes here): the job condor_submit
receives starts the distributed engine's worker, which joins distributed's scheduler and
computes; our scheduler knows it with its job (issue 32, point 1)."""

from __future__ import annotations

import condorsim  # noqa: E402
import pytest
from helpers.distributed_engine import joins_and_computes_on_simulator
from helpers.sims import use_simulator

from hpc_cluster import HTCondorCluster

pytestmark = pytest.mark.timeout(300)


def test_an_htcondor_job_starts_a_distributed_worker(isolated_home, monkeypatch):
    home = use_simulator(monkeypatch, condorsim, isolated_home / "htcondor_sim_home", "CONDOR_SIM_HOME")
    jobs = joins_and_computes_on_simulator(condorsim, home, lambda: HTCondorCluster(
        cores=1, memory="1GB", disk="1GB", walltime="00:10:00", engine="distributed",
        log_directory=str(isolated_home / "logs")))
    assert len(jobs) == 1 and {r["state"] for r in jobs.values()} == {"running"}, jobs
