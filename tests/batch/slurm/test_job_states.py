"""Job states in `status` that match the death records (issue 34), on the real SLURM.

- A worker OOM-killed by its job's cgroup (its nanny starts another in the same job), then the
  job retired (scale 0): SLURM marks the whole job OUT_OF_MEMORY, and `status` and `down` used
  to show it `out-of-memory (OUT_OF_MEMORY)` while its worker's last death says `retired`. Now
  `retired`.
- A job with --requeue requeued with `scontrol requeue`: pending again under the same id, it
  used to show the last run's node, an uptime and time left. Now `pending (requeued, ...)` and
  none of those. (Its worker's death, `preempted`, is tests/batch/slurm/test_control_plane.py's.)
"""

from __future__ import annotations

import subprocess
import sys

import cloudpickle
import pytest

from hpc_cluster.deploy.cluster import SLURMCluster
from helpers.funcs import grow
from helpers.scenarios import deployed
from helpers.slurm import squeue_ids
from helpers.wait import wait_until
from slurm_jobs import cli  # noqa: E402  (tests/batch/slurm on sys.path: conftest.py)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


def status_line(name: str, job_id: str) -> str:
    """The row of job `job_id` in `hpc-cluster status NAME`, as the user reads it."""
    out = cli("status", name, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return next(line for line in out.stdout.splitlines() if line.startswith(f"{job_id} "))


def test_a_retired_job_shows_retired_not_an_earlier_workers_oom(slurm_cluster, isolated_home, tmp_path):
    # As the memory-batch scenario: the nanny's own memory kill off, so the kernel's cgroup kills first.
    cluster = SLURMCluster(cores=1, memory="300MB", walltime="00:10:00", name="js-oom-retired",
                           log_directory=str(tmp_path / "logs"), allowed_failures=0,
                           memory_terminate_fraction=False)
    with deployed(cluster, lambda: squeue_ids(check=False), jobs=1) as run:
        worker = next(iter(run.client.scheduler_info()["workers"].values()))
        job_id = str(worker["job_id"])
        hog = run.client.submit(grow, 1 << 30, chunk=4 << 20, key="hog-js")
        assert type(hog.exception(timeout=180)).__name__ == "TaskMemoryError"
        death = run.death(lambda d: "hog-js" in d["executing"])
        assert death["cause"] == "memory-batch", death["text"]
        # The nanny started another worker in the same job; then the job is retired.
        run.worker_of(lambda w: str(w.get("job_id")) == job_id and w["pid"] != worker["pid"], what="a new worker")
        run.cluster.scale(0)
        row = wait_until(lambda: (lambda r: r if r["state"] not in ("pending", "running") else None)(
            run.jobs()[job_id]), 120, "the retired job to end", interval=1)
        assert row["raw_state"] == "OUT_OF_MEMORY", row        # what SLURM says of the whole job
        assert row["ended_retired"], row
        assert run.client.deaths()[-1]["cause"] == "retired"
        line = status_line(cluster.id, job_id)
        assert "retired" in line and "out-of-memory" not in line and "OUT_OF_MEMORY" not in line, line


def test_a_requeued_pending_job_shows_no_node_uptime_or_time_left(slurm_cluster, isolated_home, tmp_path):
    cluster = SLURMCluster(cores=1, memory="300MB", walltime="00:10:00", name="js-requeue",
                           log_directory=str(tmp_path / "logs"), job_extra_directives=["--requeue"])
    with deployed(cluster, lambda: squeue_ids(check=False), jobs=1) as run:
        job_id = str(next(iter(run.client.scheduler_info()["workers"].values()))["job_id"])
        # Running, as the batch system says (its node comes from squeue, not the registration).
        wait_until(lambda: run.jobs()[job_id]["node"] and run.jobs()[job_id]["uptime"] is not None, 60,
                   "the job's node in the table", interval=0.5)
        subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True)
        row = wait_until(lambda: (lambda r: r if r["state"] == "pending" else None)(run.jobs()[job_id]), 60,
                         "the requeued job pending in the table", interval=0.5)
        assert (row["node"], row["uptime"], row["time_left"]) == (None, None, None), row
        assert row["requeued"] == 1, row
        line = status_line(cluster.id, job_id)
        if " pending " in f" {line} ":                      # still pending (SLURM's BeginTime delay)
            assert "pending (requeued" in line, line
            assert line.split()[-4:-1] == ["-", "-", "-"], line   # NODE, UPTIME, TIME LEFT; MEMORY last
