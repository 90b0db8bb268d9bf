"""PBSCluster end to end against the command-level PBS simulator (tests/helpers/pbs_sim): the
daemon submits with qsub, reads states with qstat, cancels with qdel; real workers run
in the simulated jobs and join. No PBS server installs here (see DESIGN.md).
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path


from helpers.funcs import inc
from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client  # noqa: E402
from hpc_cluster.deploy.cluster import PBSCluster  # noqa: E402
from pbssim import live_pids  # noqa: E402  (the `sim` fixture is in conftest.py)

def qstat_finished(home: Path, job_ids) -> dict[str, str]:
    """job id -> job_state from `qstat -x -f -F json`, as a user would check."""
    out = subprocess.run(["qstat", "-x", "-f", "-F", "json", *job_ids], capture_output=True, text=True,
                         check=True).stdout
    return {jid: j["job_state"] for jid, j in json.loads(out, strict=False)["Jobs"].items()}


def test_pbs_cluster_scale_compute_close(sim, tmp_path):
    logs = tmp_path / "logs"
    cluster = PBSCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(logs))
    job_ids: list[str] = []
    try:
        assert stat.S_IMODE(cluster.cluster_file.stat().st_mode) == 0o600   # it holds the secret
        script = cluster.job_script()
        assert "#PBS -l walltime=00:10:00" in script and f"#PBS -o {logs}/" in script
        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=120)
            jobs = wait_until(lambda: (j := cluster.jobs) and all(r["workers"] for r in j.values()) and j,
                              60, "both PBS jobs to show their worker")
            job_ids = sorted(jobs)
            assert len(job_ids) == 2 and all(j.endswith(".pbssim") for j in job_ids)
            assert {r["state"] for r in jobs.values()} == {"running"}
            assert {r["raw_state"] for r in jobs.values()} == {"R"}          # qstat's own letter
            # Named as dask-jobqueue names them: the cluster's name and the job's index.
            names = {n for r in jobs.values() for n in r["worker_names"]}
            assert names == {"PBSCluster-0", "PBSCluster-1"}
            assert {r["index"] for r in jobs.values()} == {0, 1}
            assert client.gather(client.map(inc, range(20))) == list(range(1, 21))
            assert live_pids(str(sim))                                          # jobs really run here
    finally:
        cluster.close()
    assert cluster._proc.poll() is not None and not cluster.cluster_file.exists()
    states = qstat_finished(sim, job_ids)
    assert states == {j: "F" for j in job_ids}, states
    wait_until(lambda: not live_pids(str(sim)), 30, "the jobs' processes to exit")
    # The job logs landed where log_directory said, named <job name>.o<seq> / .e<seq>.
    for j in job_ids:
        assert (logs / f"dask-worker.e{j.split('.')[0]}").exists()


def test_n_workers_starts_whole_jobs_and_scale_counts_jobs(sim, tmp_path):
    """n_workers=3 with processes=2 is two jobs (four workers) from the start; scale(jobs=1)
    then keeps one job, whatever `processes` is."""
    cluster = PBSCluster(cores=2, processes=2, n_workers=3, memory="1GB", walltime="00:10:00",
                         log_directory=str(tmp_path / "logs"))
    job_ids: list[str] = []
    try:
        with Client(cluster) as client:
            client.wait_for_workers(4, timeout=120)
            jobs = cluster.jobs
            job_ids = sorted(jobs)
            assert len(job_ids) == 2 and {r["state"] for r in jobs.values()} == {"running"}
            names = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
            assert names == ["PBSCluster-0-0", "PBSCluster-0-1", "PBSCluster-1-0", "PBSCluster-1-1"]

            cluster.scale(jobs=1)

            def one_job_two_workers():
                live = [j for j, r in cluster.jobs.items() if r["state"] in ("pending", "running")]
                return len(live) == 1 and len(client.scheduler_info()["workers"]) == 2 and live
            (kept,) = wait_until(one_job_two_workers, 60, "scale(jobs=1) to leave one job of two workers")
            assert client.submit(inc, 1).result(timeout=60) == 2
            cluster.scale(3)                                   # workers: rounded up to 2 jobs
            wait_until(lambda: len(client.scheduler_info()["workers"]) == 4, 120, "4 workers again")
            job_ids = sorted(cluster.jobs)
            assert len([j for j, r in cluster.jobs.items() if r["state"] == "running"]) == 2
    finally:
        cluster.close()
    assert set(qstat_finished(sim, job_ids).values()) == {"F"}
