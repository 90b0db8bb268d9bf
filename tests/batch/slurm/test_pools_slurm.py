"""Worker pools on the real SLURM (issue 15, deploy half): a cluster with two pools submits
jobs of each with that pool's --mem and --time and `--pool NAME` in the script SLURM ran,
scale(n, pool=) changes only that pool, and `hpc-cluster status` groups the jobs by pool.
Every job the test starts is gone when it ends (squeue says so)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from helpers.funcs import inc
from helpers.slurm import squeue_ids
from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client, SLURMCluster  # noqa: E402
from hpc_cluster.deploy.plan import pool_table  # noqa: E402

pytestmark = pytest.mark.slurm


def scontrol(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def batch_script(job_id: str) -> str:
    return subprocess.run(["scontrol", "write", "batch_script", job_id, "-"], capture_output=True, text=True,
                          check=True).stdout


def live(cluster, pool: str) -> list[dict]:
    return [j for j in cluster.jobs.values()
            if j["pool"] == pool and j["state"] in ("pending", "running") and not j["retiring"]]


def test_two_pools_submit_their_own_jobs_scale_apart_and_show_grouped(slurm_cluster, tmp_path):
    name = f"pools-{uuid.uuid4().hex[:4]}"
    cluster = SLURMCluster(cores=1, memory="500MB", walltime="00:05:00", log_directory=str(tmp_path), name=name,
                           pools={"big": {"memory": "1.5GB", "walltime": "00:10:00", "max_jobs": 2}})
    job_ids: set[str] = set()
    try:
        expected = {}
        for pool in ("default", "big"):
            script = cluster.job_script(pool=pool)
            expected[pool] = (re.search(r"^#SBATCH --mem=(\d+[MG])$", script, re.M).group(1),
                              re.search(r"^#SBATCH -t (\S+)$", script, re.M).group(1))
        assert expected["default"][1] == "00:05:00" and expected["big"][1] == "00:10:00"
        assert expected["default"][0] == "477M" and expected["big"][0] == "2G"    # 500 MB, 1.5 GB: sbatch's units
        cluster.scale(1)
        cluster.scale(1, pool="big")
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=180)
            jobs = wait_until(lambda: (j := cluster.jobs) and len(j) == 2 and all(r["workers"] for r in j.values())
                              and j, 60, "both jobs to show their worker")
            job_ids = set(jobs)
            by_pool = {r["pool"]: jid for jid, r in jobs.items()}
            assert sorted(by_pool) == ["big", "default"]
            for pool, jid in by_pool.items():
                info = scontrol(jid)
                assert info["MinMemoryNode"] == expected[pool][0], (pool, info)
                assert info["TimeLimit"] == expected[pool][1], (pool, info)
                ran = batch_script(jid)
                assert ("--pool big" in ran) == (pool == "big"), ran
            # The big pool's worker has the big pool's memory budget (memory / processes).
            workers = client.scheduler_info()["workers"]
            big_addr = jobs[by_pool["big"]]["workers"][0]
            small_addr = jobs[by_pool["default"]]["workers"][0]
            table = pool_table(cluster.config)                          # what the scheduler is told
            assert workers[big_addr]["memory_limit"] == table["big"]["memory"] == 1_503_238_553   # 1.40GiB
            assert workers[small_addr]["memory_limit"] == table["default"]["memory"] == 500_002_979  # 476.84MiB
            # The workers registered their pool (--pool), and the scheduler's workers table says so.
            assert workers[big_addr]["pool"] == "big" and workers[small_addr]["pool"] == "default"
            assert client.gather(client.map(inc, range(10))) == list(range(1, 11))

            status = subprocess.run([sys.executable, "-m", "hpc_cluster.cli", "status", cluster.id],
                                    capture_output=True, text=True, timeout=120)
            assert status.returncode == 0, status.stderr
            default_part, big_part = status.stdout.split("pool big:")
            assert "pool default: 1 core(s), 500MB, walltime 5m00s" in default_part
            assert by_pool["default"] in default_part and by_pool["big"] not in default_part
            assert big_part.startswith(" 1 core(s), 1.5GB, walltime 10m00s, max 2 job(s); target 1")
            assert by_pool["big"] in big_part.split("recent worker deaths")[0].split("no worker deaths")[0]

            with pytest.raises(ValueError, match="more than its max_jobs=2"):
                cluster.scale(3, pool="big")
            cluster.scale(0, pool="big")
            wait_until(lambda: not live(cluster, "big"), 60, "the big pool's job to go")
            assert [j["job_id"] for j in live(cluster, "default")] == [by_pool["default"]]
            assert client.submit(inc, 41).result(60) == 42          # the default pool still works
            table = cluster.status_table()
            assert table["pools"]["big"]["target"] == 0 and table["pools"]["default"]["target"] == 1
    finally:
        cluster.close()
    assert not (job_ids & squeue_ids()), "jobs left in the queue"
