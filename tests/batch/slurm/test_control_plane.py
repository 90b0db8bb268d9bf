"""The batch system's own parts failing under us, on the real SLURM (issue 34): a nanny killed
from outside, a job requeued, and (alone, marker node_down: it stops the accounting every other
test reads) slurmdbd stopped while a worker dies for memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import cloudpickle
import psutil
import pytest

from hpc_cluster.deploy.cluster import SLURMCluster
from helpers.funcs import grow
from helpers.scenarios import deployed
from helpers.slurm import squeue_ids
from helpers.wait import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_jobs import CLUSTER_SH  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

MB = 10**6


def cp_cluster(tmp_path, name, **kwargs):
    kwargs = {"cores": 1, "memory": "400MB", "walltime": "00:10:00", **kwargs}
    return SLURMCluster(name=name, log_directory=str(tmp_path / "logs"), **kwargs)


def only_worker(run) -> dict:
    return next(iter(run.client.scheduler_info()["workers"].values()))


def test_a_killed_nanny_is_diagnosed_from_the_jobs_accounting(slurm_cluster, isolated_home, tmp_path):
    with deployed(cp_cluster(tmp_path, "cp-nanny-killed"), lambda: squeue_ids(check=False), jobs=1) as run:
        worker = only_worker(run)
        nanny = psutil.Process(worker["pid"]).parent()
        assert "hpc_cluster" in " ".join(nanny.cmdline()), nanny.cmdline()
        os.kill(nanny.pid, signal.SIGKILL)
        death = run.death(lambda d: d.get("job_id") == worker.get("job_id"))
        assert (death["cause"], death["blame"]) == ("unknown", False), death["text"]
        assert "main process (the nanny, or the worker without one) was killed by SIGKILL" in death["text"]
        assert "network" not in death["advice"], death["advice"]
        assert any("FAILED 0:9" in e for e in death["evidence"]), death["evidence"]


def test_a_requeued_job_is_the_batch_system_taking_it_back(slurm_cluster, isolated_home, tmp_path):
    with deployed(cp_cluster(tmp_path, "cp-requeue", job_extra_directives=["--requeue"]),
                  lambda: squeue_ids(check=False), jobs=1) as run:
        worker = only_worker(run)
        subprocess.run(["scontrol", "requeue", str(worker["job_id"])], check=True, capture_output=True)
        death = run.death(lambda d: d.get("job_id") == worker.get("job_id"))
        assert (death["cause"], death["blame"]) == ("preempted", False), death["text"]
        assert "requeued by the batch system" in death["text"], death["text"]


def slurmdbd_pid() -> int:
    return int(Path("/run/slurm/slurmdbd.pid").read_text().strip())


@pytest.mark.node_down        # alone: every other test reads the accounting
def test_with_accounting_down_a_memory_death_is_explained_then_corrected(slurm_cluster, isolated_home, tmp_path):
    with deployed(cp_cluster(tmp_path, "cp-acct-down", memory="1GB", memory_limit="300MB", allowed_failures=0),
                  lambda: squeue_ids(check=False), jobs=1) as run:
        os.kill(slurmdbd_pid(), signal.SIGTERM)
        try:
            wait_until(lambda: subprocess.run(["sacct", "-n", "-j", "1"], capture_output=True).returncode != 0,
                       60, "sacct to fail with slurmdbd stopped", interval=0.5)
            hog = run.client.submit(grow, 800 * MB, chunk=4 << 20, key="hog-acct-down")
            error = hog.exception(timeout=120)
            assert type(error).__name__ == "TaskMemoryError", error
            death = run.death(lambda d: "hog-acct-down" in d["executing"])
            # Final while the accounting was still down: on the nanny's word, and saying so.
            assert sacct_fails()
            assert death["cause"] == "memory-nanny" and death["blame"], death["text"]
            assert any(e.startswith("accounting: not available") for e in death["evidence"]), death["evidence"]
        finally:
            subprocess.run(["bash", str(CLUSTER_SH), "up"], check=True, capture_output=True, timeout=300)
        corrected = wait_until(lambda: next((d for d in run.client.deaths() if "hog-acct-down" in d["executing"]
                                             and any(e.startswith("accounting: job") for e in d["evidence"])), None),
                               400, "the death corrected with the accounting", interval=2)
        assert corrected["cause"] == "memory-nanny"
        assert not any("not available" in e for e in corrected["evidence"]), corrected["evidence"]


def sacct_fails() -> bool:
    return subprocess.run(["sacct", "-n", "-j", "1"], capture_output=True).returncode != 0
