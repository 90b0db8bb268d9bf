"""PBSCluster(engine="distributed") against the command-level PBS simulator (tests/helpers/pbs_sim,
which runs its jobs as real processes here): the job script qsub receives starts the distributed
engine's worker, which joins distributed's scheduler and computes; our scheduler knows it with
its job (issue 32, point 1)."""

from __future__ import annotations

from helpers.distributed_engine import joins_and_computes
from helpers.wait import wait_until

from hpc_cluster.deploy.cluster import PBSCluster
from pbssim import live_pids  # noqa: E402  (the `sim` fixture is in tests/conftest.py)


def test_a_pbs_job_starts_a_distributed_worker(sim, tmp_path):
    cluster = PBSCluster(cores=1, memory="1GB", walltime="00:10:00", engine="distributed",
                         log_directory=str(tmp_path / "logs"))
    jobs = joins_and_computes(cluster)
    assert len(jobs) == 1 and all(j.endswith(".pbssim") for j in jobs)
    wait_until(lambda: not live_pids(str(sim)), 30, "the job's processes to exit")
