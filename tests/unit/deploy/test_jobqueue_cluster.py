"""SLURMCluster/PBSCluster as dask-jobqueue's: its keywords, refusals, methods and async use.

Construction-time checks need no batch system (a refused keyword must fail before any job
or daemon exists); the rest runs PBSCluster end to end on the command-level PBS simulator
(`sim` fixture, tests/conftest.py), with real workers in the simulated jobs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import sys
import warnings
from pathlib import Path

import dask
import pytest
from distributed.security import Security

from helpers.funcs import inc
from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client  # noqa: E402
from hpc_cluster.deploy.cluster import (JobqueueConfigWarning, JobQueueCluster, PBSCluster,  # noqa: E402
                                        SLURMCluster, Status)
from hpc_cluster.protocol.clusterfile import clusters_dir  # noqa: E402


@pytest.fixture
def nothing_started(sim):
    """For refusals: afterwards no cluster file, no daemon, no job exists."""
    yield
    assert not list(clusters_dir().glob("*.json")), "a refused cluster left a cluster file"
    assert not list(Path(os.environ["PBS_SIM_HOME"]).glob("jobs/*")), "a refused cluster submitted a job"


@pytest.mark.parametrize("kwargs, message", [
    ({"host": "10.0.0.1"}, r"Please pass 'host' through 'scheduler_options'"),
    ({"dashboard_address": ":8787"}, r"Please pass 'dashboard_address' through 'scheduler_options'"),
    ({"job_cls": object}, r"job_cls=.*no Job classes; a batch system is an adapter"),
    ({"scheduler_cls": object}, r"scheduler_cls=.*runs its own scheduler"),
    ({"protocol": "tls://", "security": False}, r"protocol='tls://' asks for TLS and security=False turns it off"),
    ({"protocol": "tcp://", "security": True}, r"protocol='tcp://' is plain TCP, but security=True asks for TLS"),
    ({"scheduler_options": {"protocol": "tcp"}, "security": True}, r"protocol='tcp' is plain TCP"),
    ({"protocol": "ucx"}, r"protocol='ucx': hpc-cluster speaks TLS \(the default\) or plain TCP"),
    ({"protocol": "wss://"}, r"protocol='wss://': hpc-cluster has no websocket transport"),
    ({"security": Security(tls_ca_file="ca.pem", require_encryption=True)},
     r"asks for encryption but does not give both a CA .* and a certificate with its key"),
    ({"worker_command": "dask_cuda.cli"}, r"worker_command='dask_cuda.cli' cannot start an hpc-cluster worker"),
    ({"worker_extra_args": ["--preload", "mymod"]}, r"worker_extra_args: --preload.*job_script_prologue"),
    ({"worker_extra_args": ["--lifetime", "soon"]}, r"worker_extra_args: --lifetime"),
    ({"wrong_parameter": 1}, r"unexpected keyword argument 'wrong_parameter' for PBSCluster.*job_kwargs"),
    ({"job_cpu": 4}, r"job_cpu \(keyword\) is a SLURM setting; on PBS use resource_spec"),
    ({"walltime": "1-00:00:00"}, r"PBS has no day form"),
    ({"processes": 8}, r"processes=8 with cores=1 leaves a worker without a core"),
])
def test_what_cannot_be_honoured_is_refused_before_anything_starts(nothing_started, kwargs, message):
    with pytest.raises(ValueError, match=message):
        PBSCluster(cores=1, memory="1GB", **kwargs)


def test_cores_and_memory_are_required_as_in_dask_jobqueue(nothing_started):
    for kwargs, shown in (({}, "cores=8, memory='24GB'"), ({"memory": "1GB"}, "cores=8, memory='1GB'"),
                          ({"cores": 4}, "cores=4, memory='24GB'")):
        with pytest.raises(ValueError, match="You must specify how much cores and memory") as info:
            SLURMCluster(**kwargs)
        assert f"cluster = SLURMCluster({shown})" in str(info.value)
        assert "jobqueue.slurm configuration" in str(info.value)
    with pytest.raises(ValueError, match="Job type.*job_cls.*for JobQueueCluster"):
        JobQueueCluster(cores=4, memory="1GB")


def test_what_has_no_meaning_here_is_said_in_one_warning(sim):
    with dask.config.set({"jobqueue.pbs.scheduler-options": {"dashboard_address": ":8787", "idle_timeout": 60}}):
        with pytest.warns(JobqueueConfigWarning) as caught:
            cluster = PBSCluster(cores=1, memory="1GB", security=True, silence_logs="debug",
                                 worker_extra_args=["--no-dashboard", "--dashboard-address", ":0"])
        address = cluster.scheduler_address
        cluster.close()
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "security" not in text and address.startswith("tls://")      # honoured: TLS, nothing to say
    for part in ("silence_logs='debug'",
                 "scheduler_options['idle_timeout']: not an option of hpc-cluster's scheduler",
                 "worker_extra_args: --dashboard-address: workers serve no dashboard"):
        assert part in text, (part, text)
    assert "scheduler_options['dashboard_address']" not in text          # honoured: the daemon's dashboard


def test_renamed_keywords_warn_and_still_reach_the_job(sim):
    with pytest.warns(FutureWarning) as caught:
        cluster = PBSCluster(cores=1, memory="1GB", env_extra=["export FROM_ENV_EXTRA=1"],
                             project="grant7")
    assert sorted(str(w.message).split(".")[0] for w in caught) == [
        "env_extra has been renamed to job_script_prologue", "project has been renamed to account"]
    try:
        script = cluster.job_script()
        assert "export FROM_ENV_EXTRA=1" in script and "#PBS -A grant7" in script
    finally:
        cluster.close()


def test_the_dask_jobqueue_surface_end_to_end(sim, tmp_path):
    shared = tmp_path / "shared"
    with PBSCluster(cores=2, processes=2, memory="2GB", walltime="00:10:00", name="surf",
                    shared_temp_directory=str(shared), scheduler_options={"host": "127.0.0.1"},
                    log_directory=str(tmp_path / "logs")) as cluster:
        assert cluster.status == Status.running == "running"
        # TLS by default (issue 34): the certificate made for it under the shared directory too.
        assert cluster.scheduler.ip == "127.0.0.1" and cluster.scheduler_address.startswith("tls://127.0.0.1:")
        tls_dir = shared / f".hpc-cluster-{cluster.id}-tls"
        assert json.loads((shared / f".hpc-cluster-{cluster.id}.json").read_text())["tls"]["key"].startswith(str(tls_dir))
        assert cluster.job_name == "dask-worker" and cluster.job_header.startswith("#PBS -N dask-worker\n")
        assert "#PBS -l select=1:ncpus=2:mem=1908MB" in cluster.job_header
        # The jobs read the cluster file (address and secret) from the shared directory.
        jobs_file = shared / f".hpc-cluster-{cluster.id}.json"
        assert f"--cluster-file {jobs_file} " in cluster.job_script()
        assert stat.S_IMODE(jobs_file.stat().st_mode) == 0o600
        assert json.loads(jobs_file.read_text())["address"] == cluster.scheduler_address
        # The daemon serves the dashboard (issue 17), dask's default ':8787' or a free port.
        link = cluster.dashboard_link
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/status\?token=[0-9a-f]{32}", link), link
        assert json.loads(jobs_file.read_text())["dashboard"] == link
        assert cluster.workers == {} and cluster.worker_spec == {}
        cluster.scale(3)                                      # 3 workers: 2 jobs of 2
        assert set(cluster.worker_spec) == {"surf-0", "surf-1"}
        with Client(cluster) as client:
            client.wait_for_workers(4, timeout=120)
            names = sorted(w["id"] for w in client.scheduler_info()["workers"].values())
            assert names == ["surf-0-0", "surf-0-1", "surf-1-0", "surf-1-1"]
            assert client.gather(client.map(inc, range(10))) == list(range(1, 11))
            assert client.dashboard_link == link
            # The job manager's table as of its last poll (as the page reads it): the jobs show
            # running once a poll saw them so, which may be after their workers connected.
            def all_running():
                table = _dashboard_api(link, "jobs")
                return table if {j["state"] for j in table["jobs"]} == {"running"} else None
            jobs = wait_until(all_running, 30, "both jobs running on the dashboard")
            assert jobs["batch"] is True and jobs["target"] == 2 and set(jobs["pools"]) == {"default"}
            assert sorted(j["index"] for j in jobs["jobs"]) == [0, 1]
            assert all(j["raw_state"] for j in jobs["jobs"])
            assert sorted(n for j in jobs["jobs"] for n in j["worker_names"]) == names
            workers = _dashboard_api(link, "workers")["workers"]
            assert {w["job_id"] for w in workers} == {j["job_id"] for j in jobs["jobs"]}
            assert all(0 < w["time_left"] <= 600 for w in workers)         # walltime 00:10:00
            assert re.fullmatch(r"PBSCluster\('surf', 'tls://127\.0\.0\.1:\d+', workers=4, threads=4, "
                                r"memory=3\.73 GiB, status=running\)", repr(cluster)), repr(cluster)
            logs = cluster.get_logs()
            assert "Cluster" in logs and any(k.startswith("tls://") for k in logs)
            cluster.scale(jobs=1)
            assert len(cluster.worker_spec) == 1
            wait_until(lambda: len(client.scheduler_info()["workers"]) == 2, 60, "one job of two workers left")
            cluster.scale(memory="0GB")
            wait_until(lambda: not cluster.workers, 60, "every job gone after scale(memory='0GB')")
    assert cluster.status == Status.closed and not jobs_file.exists() and not tls_dir.exists()


def _dashboard_api(link: str, what: str) -> dict:
    import urllib.request
    base, token = link.split("/status?token=")
    with urllib.request.urlopen(f"{base}/api/{what}?token={token}", timeout=30) as r:
        return json.loads(r.read())


def test_a_dashboard_address_of_none_turns_the_daemons_dashboard_off(sim):
    with PBSCluster(cores=1, memory="1GB", scheduler_options={"dashboard_address": None}) as cluster:
        assert cluster.dashboard_link is None
        with Client(cluster) as client:
            assert client.dashboard_link is None and client.services == {}


def test_adapt_counts_workers_in_whole_jobs_and_takes_dasks_keywords(sim):
    with PBSCluster(cores=2, processes=2, memory="1GB", walltime="00:10:00") as cluster:
        ad = cluster.adapt(minimum=3, maximum=8, interval="200ms", wait_count=2, target_duration="10s")
        assert ad.policy == {"minimum": 2, "maximum": 4, "interval": 0.2, "wait_count": 2, "target_duration": 10.0}
        assert cluster.status_table()["adaptive"] == [2, 4]
        wait_until(lambda: len(cluster.worker_spec) == 2, 60, "adapt's minimum of 2 jobs")
        ad = cluster.adapt(minimum_jobs=0, maximum_jobs=1, maximum_memory="4GB")
        assert (ad.policy["minimum"], ad.policy["maximum"]) == (0, 1)
        ad.stop()
        assert cluster.status_table()["adaptive"] is None
        with pytest.raises(ValueError, match="minimum of 3 job"):
            cluster.adapt(minimum_jobs=3, maximum_jobs=1)


def test_asynchronous_use(sim):
    async def main():
        async with PBSCluster(cores=1, memory="1GB", walltime="00:10:00", asynchronous=True) as cluster:
            assert cluster.status == Status.running
            await cluster.scale(1)
            assert len(cluster.worker_spec) == 1
            cluster.scale(2)                                # not awaited: done all the same
            await cluster                                   # waits for what was asked
            assert len(cluster.worker_spec) == 2
            await asyncio.to_thread(lambda: Client(cluster).wait_for_workers(2, timeout=120))
            cluster.adapt(minimum=0, maximum=1)             # not awaited, then the cluster closes
        return cluster
    cluster = asyncio.run(main())
    assert cluster.status == Status.closed and cluster._proc.poll() is not None


def test_an_asynchronous_cluster_starts_only_when_awaited(sim):
    cluster = PBSCluster(cores=1, memory="1GB", asynchronous=True)
    assert cluster.status == Status.created and cluster.scheduler_address is None
    assert not list(clusters_dir().glob("*.json"))
    assert "#PBS -l select=1:ncpus=1" in cluster.job_script()       # a script needs no daemon

    async def main():
        await cluster
        assert cluster.status == Status.running
        await cluster.close()
    asyncio.run(main())
    assert cluster.status == Status.closed


def test_the_jobqueue_yaml_of_a_user_reaches_the_job_script(sim, monkeypatch):
    with dask.config.set({"jobqueue.pbs": {"cores": 4, "memory": "8GB", "queue": "workq", "walltime": "01:00:00",
                                           "job-script-prologue": ["module load python"], "name": "mine"}}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")                    # nothing in it needs a note
            cluster = PBSCluster()
        try:
            script = cluster.job_script()
        finally:
            cluster.close()
    for line in ("#PBS -N mine", "#PBS -q workq", "#PBS -l select=1:ncpus=4:mem=7630MB",
                 "#PBS -l walltime=01:00:00", "module load python", "--nthreads 1 --memory-limit 1.86GiB --nworkers 4"):
        assert line in script, line
