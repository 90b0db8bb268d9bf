"""The deployment machinery with the distributed engine (issue 32, point 1), on the real SLURM:

1. a job array (job_array: true) of the default pool and a job of a second pool: every element
   and job starts a distributed worker that joins distributed's scheduler, with its own pool's
   memory, and our state knows each worker's pool and job;
2. a dask-jobqueue user's jobqueue.yaml (in dask's config directory) sets up a cluster with
   engine="distributed": its jobs are what the file says, and they compute;
3. submission over SSH (a private sshd as the login node, with a home of its own): a site with
   `ssh:` and `engine: distributed` submits through it, and the workers, which read the login
   node's copy of the cluster file, join distributed's scheduler.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import dask
import pytest
import yaml

import helpers.sshd as private_sshd
from helpers.distributed_engine import joins_and_computes, on_distributed, our_workers
from helpers.slurm import squeue_ids
from helpers.wait import wait_until

from hpc_cluster import SLURMCluster

pytestmark = pytest.mark.slurm


def test_a_job_array_and_a_second_pool_start_distributed_workers(slurm_cluster, own_home, tmp_path):
    name = f"dpool-{uuid.uuid4().hex[:4]}"
    cluster = SLURMCluster(cores=1, memory="500MB", walltime="00:10:00", engine="distributed", job_array=True,
                           name=name, log_directory=str(tmp_path / "logs"),
                           pools={"big": {"memory": "1.5GB", "max_jobs": 1}})
    assert "--pool big --engine distributed" in cluster.job_script(pool="big")
    job_ids: set[str] = set()
    try:
        with on_distributed(cluster, jobs=2) as client:
            cluster.scale(1, pool="big")
            client.wait_for_workers(3, timeout=180)
            jobs = wait_until(lambda: (t := cluster.jobs) and len(t) == 3 and all(r["workers"] for r in t.values())
                              and t, 60, "three jobs, each with its worker")
            job_ids = set(jobs)
            by_pool = {p: sorted(j for j, r in jobs.items() if r["pool"] == p) for p in ("default", "big")}
            # the default pool's two jobs are elements of one array (one sbatch): 123_0, 123_1
            arrays = {j.split("_")[0] for j in by_pool["default"]}
            assert len(arrays) == 1 and all(re.fullmatch(r"\d+_[01]", j) for j in by_pool["default"]), jobs
            assert len(by_pool["big"]) == 1 and "_" not in by_pool["big"][0]
            theirs = client.scheduler_info(n_workers=-1)["workers"]
            ours = our_workers(cluster)
            assert set(ours) == set(theirs)
            for job, row in jobs.items():
                (address,) = row["workers"]
                pool = row["pool"]
                assert ours[address]["pool"] == pool and str(ours[address]["job_id"]) == job
                # the pool's memory budget is distributed's worker's memory_limit
                assert theirs[address]["memory_limit"] == (1_503_238_553 if pool == "big" else 500_002_979)
            big = jobs[by_pool["big"][0]]["workers"][0]
            assert client.submit(pow, 2, 9, workers=[big]).result(timeout=60) == 512
            assert client.gather(client.map(pow, range(30), [2] * 30)) == [x * x for x in range(30)]
    finally:
        if cluster.status != "closed":
            cluster.close()
    wait_until(lambda: not (job_ids & squeue_ids()), 60, "the jobs to leave squeue")


def test_a_jobqueue_yaml_sets_up_a_distributed_cluster(slurm_cluster, own_home, tmp_path):
    """As a dask-jobqueue user has it: ~/.config/dask/jobqueue.yaml (here the suite's DASK_CONFIG)."""
    job_name = f"dq-{uuid.uuid4().hex[:4]}"
    yaml_file = Path(os.environ["DASK_CONFIG"]) / "jobqueue.yaml"
    yaml_file.write_text(f"""\
jobqueue:
  slurm:
    cores: 1
    memory: 1GB
    walltime: '00:07:00'
    name: {job_name}
    log-directory: {tmp_path / 'logs'}
    job-extra-directives: ['--comment=set-in-jobqueue-yaml']
""")
    dask.config.refresh()
    try:
        cluster = SLURMCluster(engine="distributed")
        script = cluster.job_script()
        assert f"#SBATCH -J {job_name}" in script and "#SBATCH -t 00:07:00" in script
        assert "--comment=set-in-jobqueue-yaml" in script
        jobs = joins_and_computes(cluster)
    finally:
        yaml_file.unlink()
        dask.config.refresh()
    (job,) = jobs
    assert jobs[job]["memory"] == 1_000_000_000

    def accounted():
        return subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", "JobName%30,Timelimit"],
                              capture_output=True, text=True, check=True).stdout.split()
    # What SLURM ran. slurmdbd may still hold the placeholder name 'allocation' for a job it has
    # not had the whole record of yet (seen once in CI under load): wait for it to catch up.
    wait_until(lambda: accounted() == [job_name, "00:07:00"], 60,
               f"sacct to record job {job} as {job_name}, 00:07:00", interval=1)
    wait_until(lambda: job not in squeue_ids(), 60, "the job to leave squeue")


def test_a_site_with_ssh_submits_distributed_workers_through_the_login_node(slurm_cluster, own_home, tmp_path):
    login_home = tmp_path / "login-home"
    login_home.mkdir()
    (tmp_path / "sshd").mkdir()
    sshd = private_sshd.SSHD(tmp_path / "sshd", private_sshd.ensure_sshd(), set_env={"HOME": str(login_home)})
    job_ids: set[str] = set()
    cluster = None
    try:
        site = tmp_path / "site.yaml"
        ssh = {"host": "127.0.0.1", "port": sshd.port, "user": getpass.getuser(), "key": str(sshd.key),
               "known_hosts": str(sshd.known_hosts), "host_key_policy": "reject"}
        site.write_text(yaml.safe_dump({"default": "remote", "sites": {"remote": {
            "batch": "slurm", "engine": "distributed", "cores": 1, "memory": "1GB", "walltime": "00:10:00",
            "log_directory": "~/hpc-logs", "python": sys.executable, "ssh": ssh}}}))
        cluster = SLURMCluster(config=str(site))
        remote_file = login_home / ".config" / "hpc-cluster" / "clusters" / f"{cluster.id}.json"
        info = json.loads(cluster.cluster_file.read_text())
        assert info["ssh"] is True and f"--cluster-file {remote_file} " in cluster.job_script()
        # the workers read distributed's address from the login node's copy
        remote = wait_until(lambda: remote_file.exists() and json.loads(remote_file.read_text()), 30,
                            "the cluster file on the login node")
        assert remote["engine_address"] == info["engine_address"]
        job_ids = set(joins_and_computes(cluster))
        assert len(job_ids) == 1
        assert any((login_home / "hpc-logs").glob(f"*-{next(iter(job_ids))}.err"))      # logs on the login node
        assert not remote_file.exists()
    finally:
        if cluster is not None and cluster.status != "closed":
            cluster.close()
        sshd.stop()
    wait_until(lambda: not (job_ids & squeue_ids()), 60, "the job to leave squeue")
