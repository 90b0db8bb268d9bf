"""A walltime drain on the distributed engine lets a running task that fits finish where it runs,
as our engine's drain does (issue 32, point 5). distributed's retirement alone closed the worker
with the task still running 12 s before the deadline: a task that fitted in the job was cut at
every drain and started over in the replacement job."""

from __future__ import annotations

import time

import pytest

from hpc_cluster import Client as OurClient
from hpc_cluster import SLURMCluster
from helpers.by_value import by_value
from helpers.wait import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _sleep_then_say_job(seconds: float) -> str:
    import os as _os
    import time as _time
    _time.sleep(seconds)
    return _os.environ.get("SLURM_JOB_ID", "")


@pytest.mark.timeout(300)
def test_a_running_task_that_fits_finishes_on_its_draining_worker(slurm_cluster, own_home, tmp_path):
    from distributed import Client
    cluster = SLURMCluster(cores=1, memory="1GB", walltime="00:01:00", engine="distributed",
                           log_directory=str(tmp_path / "logs"))
    try:
        cluster.scale(1)
        with Client(cluster, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=180)
            with OurClient(cluster_file=str(cluster.cluster_file), timeout=30) as ours:
                (row,) = ours.scheduler_info()["workers"].values()
            deadline, first_job = row["job_start"] + row["job_walltime"], str(row["job_id"])
            # Started 20 s before the deadline, it runs into the drain (12 s before: a fifth of
            # the walltime) and ends 10 s before it: it fits.
            wait_until(lambda: time.time() >= deadline - 20, 80, "20 s before the job's deadline", interval=0.2)
            future = client.submit(by_value(_sleep_then_say_job), 10, pure=False)
            assert future.result(timeout=150) == first_job, "the task was cut by the drain and ran again elsewhere"
            with OurClient(cluster_file=str(cluster.cluster_file), timeout=30) as ours:
                death = wait_until(lambda: next((d for d in ours.deaths() if str(d.get("job_id")) == first_job),
                                                None), 90, "the drained worker's death record")
            assert death["cause"] == "retired" and not death["blame"], death
    finally:
        cluster.close()
