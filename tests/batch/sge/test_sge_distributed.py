"""SGECluster(engine="distributed") on the real one-host Grid Engine (issue 32, point 1): the job
qsub runs starts the distributed engine's worker, which joins distributed's scheduler and
computes; our scheduler knows it with its Grid Engine job, and the job leaves the queue when the
cluster closes.

    python -m pytest -m sge tests/batch/sge -v        (tests/batch/sge/cluster.sh up first, or run as root)
"""

from __future__ import annotations

import pytest

from helpers.distributed_engine import joins_and_computes
from helpers.wait import wait_until

from hpc_cluster import SGECluster
from hpc_cluster.adapters.sge import SGEAdapter
from hpc_cluster.runners.local import LocalRunner

pytestmark = [pytest.mark.sge, pytest.mark.timeout(300)]


def test_an_sge_job_starts_a_distributed_worker(gridengine, isolated_home):
    cluster = SGECluster(cores=1, memory="1GB", walltime="00:05:00", engine="distributed", name="sge-dist",
                         log_directory=str(isolated_home / "logs"))
    jobs = joins_and_computes(cluster)
    assert len(jobs) == 1 and all(r["state"] == "running" and r["raw_state"] == "r" for r in jobs.values()), jobs
    qstat = SGEAdapter(LocalRunner())
    wait_until(lambda: all(s.state not in ("pending", "running") for s in qstat.status(list(jobs)).values()), 60,
               "the job to leave the queue", interval=1)
