"""Retry by cause on the distributed engine, on the real SLURM (issue 32, point 6): a task killed
for memory in the default pool's 300 MB jobs is moved to the bigmem pool (1.5 GB), a bigmem job is
submitted for it, and it ends there with its result, as on our engine (test_escalation.py). The
death that moved it does not count toward allowed-failures: the cluster allows none, so a charge
would fail the task at once."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from distributed import Client

from helpers.by_value import by_value
from helpers.slurm import squeue_ids
from helpers.wait import wait_until

from hpc_cluster import Client as OurClient
from hpc_cluster.deploy.cluster import SLURMCluster

pytestmark = pytest.mark.slurm


def allocate_in_job(i, megabytes):
    import os
    import time
    import numpy as np
    block = np.ones(megabytes * 2**20 // 8)          # touched: resident
    time.sleep(0.3)
    return {"value": i + int(block[0]), "job": os.environ.get("HPC_CLUSTER_JOB_ID")}


allocate_in_job = by_value(allocate_in_job)        # distributed's scheduler cannot import this module


def test_a_task_killed_for_memory_ends_on_the_bigger_pool_without_a_charge(slurm_cluster, tmp_path):
    name = f"dpool-{uuid.uuid4().hex[:4]}"
    hog = 3
    with SLURMCluster(cores=1, memory="300MB", walltime="00:10:00", engine="distributed", name=name, job_name=name,
                      log_directory=str(tmp_path), allowed_failures=0,
                      pools={"bigmem": {"memory": "1.5GB", "max_jobs": 1}}) as cluster, Client(cluster) as client:
        cluster.scale(2)
        client.wait_for_workers(2, timeout=120)
        futures = [client.submit(allocate_in_job, i, 700 if i == hog else 4, pure=False) for i in range(8)]
        results = client.gather(futures)         # raises KilledWorker if a death was charged
        with OurClient(cluster_file=str(cluster.cluster_file)) as ours:
            deaths = ours.deaths()
        jobs = cluster.status_table()["jobs"]
        why = subprocess.run([sys.executable, "-m", "hpc_cluster.cli", "why", cluster.id], capture_output=True,
                             text=True, timeout=120)
    assert [r["value"] for r in results] == [i + 1 for i in range(8)]
    pool_of = {j["job_id"]: j["pool"] for j in jobs}
    assert [j["pool"] for j in jobs].count("bigmem") == 1, jobs
    # The hog ran to its end in the bigmem job. (The others may run on any worker, the bigmem one
    # too: distributed has no pools, and escalation_only is not enforced for unmoved tasks.)
    assert pool_of[results[hog]["job"]] == "bigmem", (results[hog], jobs)
    # The death that moved it says so, and names only the hog; no death charged an innocent task.
    moved = [d for d in deaths if d.get("escalation")]
    assert moved and moved[0]["executing"] == [futures[hog].key], deaths
    assert moved[0]["pool"] == "default" and moved[0]["cause"] in ("memory-batch", "memory-nanny"), moved
    assert moved[0]["escalation"].startswith("attempt 2 on bigmem (1.5 GB) after memory-"), moved
    assert all(set(d.get("executing") or ()) <= {futures[hog].key} for d in deaths if d["blame"]), deaths
    assert why.returncode == 0 and "escalation: attempt 2 on bigmem (1.5 GB)" in why.stdout, why.stdout + why.stderr
    ids = list(pool_of)
    wait_until(lambda: not set(ids) & squeue_ids(), 120, "the cluster's jobs to leave squeue")
