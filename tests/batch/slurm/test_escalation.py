"""Retry by cause on the real SLURM (issue 15, point 5): a task charged for memory, or cut by
the walltime, finishes on a bigger pool's job instead of failing; innocent tasks are never
charged; the bigger pool gets no more jobs than it needs. The benchmark-sized run (200 tasks,
side by side with dask-jobqueue, memory-hours) is benchmarks/escalation.py."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client, SLURMCluster  # noqa: E402

pytestmark = pytest.mark.slurm


def allocate(i, megabytes):
    import time
    import numpy as np
    block = np.ones(megabytes * 2**20 // 8)          # touched: resident
    time.sleep(0.3)
    return i + int(block[0])


def sleepy(i, seconds):
    import time
    time.sleep(seconds)
    return i * i


def _gone(job_ids) -> None:
    wait_until(lambda: not set(job_ids) & set(subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True,
                                                             text=True).stdout.split()), 120, "the jobs to leave squeue")


def test_tasks_out_of_memory_finish_on_the_bigger_pool_and_no_innocent_is_charged(slurm_cluster, tmp_path):
    name = f"esc-{uuid.uuid4().hex[:4]}"
    big = {3, 11}
    with SLURMCluster(cores=1, memory="300MB", walltime="00:10:00", log_directory=str(tmp_path), name=name,
                      pools={"big": {"memory": "1.5GB", "max_jobs": 2}}) as cluster, Client(cluster) as client:
        cluster.scale(2)
        futures = [client.submit(allocate, i, 700 if i in big else 4, pure=False) for i in range(24)]
        assert client.gather(futures, timeout=300) == [i + 1 for i in range(24)]
        deaths = client.deaths()
        hogs = {futures[i].key for i in big}
        charged = [d for d in deaths if d["blame"]]
        assert charged and all(set(d["executing"]) <= hogs for d in charged), charged   # no innocent charged
        moved = [d for d in deaths if d.get("escalation")]
        assert {k for d in moved for k in d["executing"]} == hogs, deaths
        assert all(d["pool"] == "default" and d["cause"] in ("memory-batch", "memory-nanny") and
                   d["escalation"].startswith("attempt 2 on big (1.5 GB) after memory-") for d in moved), moved
        jobs = cluster.status_table()["jobs"]
        assert 1 <= sum(j["pool"] == "big" for j in jobs) <= 2, jobs
        job_ids = [j["job_id"] for j in jobs]
        # `hpc-cluster why` shows the move.
        why = subprocess.run([sys.executable, "-m", "hpc_cluster.cli", "why", cluster.id], capture_output=True,
                             text=True, timeout=120)
        assert why.returncode == 0 and "escalation: attempt 2 on big (1.5 GB)" in why.stdout, why.stdout + why.stderr
    _gone(job_ids)


@pytest.mark.slow
def test_a_task_cut_by_the_walltime_finishes_on_the_pool_with_longer_jobs(slurm_cluster, tmp_path):
    # 1-minute jobs end at 70-80 s here (SLURM checks limits every 30 s); a 100 s task is cut,
    # and moves to the 5-minute pool; the short ones finish where they are.
    name = f"escw-{uuid.uuid4().hex[:4]}"
    with SLURMCluster(cores=1, memory="500MB", walltime="00:01:00", log_directory=str(tmp_path), name=name,
                      pools={"long": {"walltime": "00:05:00", "max_jobs": 1}}) as cluster, Client(cluster) as client:
        cluster.scale(1)
        long_task = client.submit(sleepy, 7, 100, pure=False)
        shorts = client.map(sleepy, range(10), [1] * 10, pure=False)
        assert client.gather(shorts, timeout=240) == [i * i for i in range(10)]
        assert long_task.result(timeout=420) == 49
        moved = [d for d in client.deaths() if d.get("escalation")]
        assert moved and all(not d["blame"] for d in moved), moved
        assert moved[0]["escalation"].startswith("attempt 2 on long (00:05:00 walltime) after walltime at"), moved
        jobs = cluster.status_table()["jobs"]
        assert sum(j["pool"] == "long" for j in jobs) == 1, jobs
        job_ids = [j["job_id"] for j in jobs]
    _gone(job_ids)
