"""Jobs nobody tracked (issue 34), on the real SLURM.

slurmctld paused (SIGSTOP) while the cluster grows: `sbatch` gives up after MessageTimeout
(10 s on the test cluster, tests/batch/slurm/cluster.sh) with "Socket timed out", and slurmctld
queues the job anyway when it runs again. Before, that counted as a failed submission and was
submitted again: the first job's worker joined uncounted (`status` said fewer workers than were
connected), and `down` neither listed nor cancelled the job. Now the lost submission is looked
up by its tag (sbatch --comment=hpc-cluster:<cluster id>:<index>) before anything more is
submitted, adopted, counted, shown and cancelled by `down`.

slurmctld is shared by every test on this machine: it is paused once, for sbatch's own
timeout and no longer (the pause ends as soon as the submission has failed), and always resumed.
A second test needs no pause: a job of the cluster submitted behind its back (its own job
script, by hand) is adopted when its worker registers, and retired (the cluster wants none).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpc_cluster.deploy.cluster import SLURMCluster
from helpers.scenarios import deployed
from helpers.slurm import squeue_ids, squeue_named
from helpers.wait import wait_until
from slurm_jobs import cli  # noqa: E402  (tests/batch/slurm on sys.path: conftest.py)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


def tracked_live(cluster) -> set[str]:
    return {j for j, r in cluster.jobs.items() if r["state"] in ("pending", "running")}


def status_text(name: str) -> str:
    out = cli("status", name, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_a_submission_lost_to_a_paused_controller_is_found_counted_and_cancelled(slurm_cluster, isolated_home,
                                                                               tmp_path):
    name = "ut-paused-ctld"
    cluster = SLURMCluster(cores=1, memory="300MB", walltime="00:10:00", name=name, job_name=name,
                           log_directory=str(tmp_path / "logs"))
    with deployed(cluster, lambda: squeue_ids(check=False), jobs=1) as run:
        first = set(run.jobs())
        pid = int(Path("/run/slurm/slurmctld.pid").read_text().strip())
        os.kill(pid, signal.SIGSTOP)
        try:
            paused = time.monotonic()
            # Returns once sbatch has given up (its MessageTimeout): the submission failed.
            run.cluster.scale(2)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert time.monotonic() - paused < 40
        # slurmctld queued the job sbatch gave up on; the cluster finds it instead of submitting another.
        run.client.wait_for_workers(2, timeout=180)
        both = wait_until(lambda: (lambda s: s if len(s) == 2 else None)(tracked_live(run.cluster)), 60,
                          "two live jobs in the cluster's table", interval=1)
        lost = (both - first).pop()
        assert squeue_named(name) == both, (squeue_named(name), both)     # no duplicate, none untracked
        assert "the answer was lost; the job was queued anyway: job " + lost in \
            " ".join(e["message"] for e in run.cluster.status_table()["errors"])
        text = status_text(cluster.id)
        assert "2 worker(s) connected" in text and any(line.startswith(f"{lost} ") for line in text.splitlines()), \
            text
        run.jobs()
    # `deployed` closed the cluster: every job of its name has left the queue.
    assert not squeue_named(name)


def test_a_worker_from_a_job_the_cluster_never_submitted_is_adopted(slurm_cluster, isolated_home, tmp_path):
    """The cluster wants no job: the one submitted behind its back is adopted when its worker
    registers, and, one more than the target, retired: it leaves the queue, its worker's death
    `retired`. Before, nothing knew it: it ran, uncounted, to its walltime."""
    name = "ut-by-hand"
    cluster = SLURMCluster(cores=1, memory="300MB", walltime="00:10:00", name=name, job_name=name,
                           log_directory=str(tmp_path / "logs"))
    by_hand = None
    try:
        with deployed(cluster, lambda: squeue_ids(check=False), jobs=0) as run:
            # A job of this cluster (its own script) that its daemon never heard of.
            sbatch = subprocess.run(["sbatch", "--parsable"], input=cluster.job_script(), capture_output=True,
                                    text=True, check=True, cwd=tmp_path)
            by_hand = sbatch.stdout.strip().split(";")[0]
            death = run.death(lambda d: str(d.get("job_id")) == by_hand)
            assert death["cause"] == "retired", death["text"]
            assert by_hand in run.jobs()                              # tracked: shown, polled, cancelled
            wait_until(lambda: run.jobs()[by_hand]["state"] not in ("pending", "running"), 120,
                       "the adopted job to end in the cluster's table", interval=1)
            assert by_hand not in squeue_named(name)
    finally:
        if by_hand:
            subprocess.run(["scancel", by_hand], capture_output=True)
