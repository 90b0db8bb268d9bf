"""LSFCluster(engine="distributed") against the command-level LSF simulator (tests/helpers/lsf_sim,
which runs its jobs as real processes here): the job script bsub receives starts the distributed
engine's worker, which joins distributed's scheduler and computes; our scheduler knows it with
its job (issue 32, point 1)."""

from __future__ import annotations

import lsfsim  # noqa: E402
import pytest
from helpers.distributed_engine import joins_and_computes_on_simulator
from helpers.sims import use_simulator

from hpc_cluster import LSFCluster

pytestmark = pytest.mark.timeout(300)


def test_an_lsf_job_starts_a_distributed_worker(isolated_home, monkeypatch):
    home = use_simulator(monkeypatch, lsfsim, isolated_home / "lsf_sim_home", "LSF_SIM_HOME", LSF_SIM_UNITS="mb")
    jobs = joins_and_computes_on_simulator(lsfsim, home, lambda: LSFCluster(
        cores=1, memory="1GB", walltime="00:10", lsf_units="mb", engine="distributed",
        log_directory=str(isolated_home / "logs")))
    assert len(jobs) == 1 and {r["raw_state"] for r in jobs.values()} == {"RUN"}, jobs
