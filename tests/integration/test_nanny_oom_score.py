"""The nanny makes its worker, and what the worker starts, the kernel OOM killer's first choice."""

from __future__ import annotations

import os
import sys

import pytest

from hpc_cluster import Client, LocalCluster
from hpc_cluster.worker.nanny import WORKER_OOM_SCORE_ADJ

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/oom_score_adj"), reason="no /proc oom_score_adj")


def oom_scores() -> dict:
    """Run as a task: the worker's own oom_score_adj, its parent's (the nanny) and a child's."""
    import os
    import subprocess
    import sys

    def read(pid):
        with open(f"/proc/{pid}/oom_score_adj") as f:
            return int(f.read())

    child = subprocess.run([sys.executable, "-c", "print(open('/proc/self/oom_score_adj').read())"],
                           capture_output=True, text=True, check=True)
    return {"worker": read(os.getpid()), "nanny": read(os.getppid()), "nanny_pid": os.getppid(),
            "child": int(child.stdout)}


def test_the_worker_and_its_children_are_the_oom_killers_first_choice_not_the_nanny():
    # In a job's memory cgroup the killer takes the largest process: a worker whose memory is
    # spread over children each smaller than the nanny would otherwise lose its nanny, and with
    # it the exit report the diagnosis reads first and the restart.
    with open("/proc/self/oom_score_adj") as f:
        ours = int(f.read())
    with LocalCluster(n_workers=1, nanny=True) as cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=30)
        got = client.submit(oom_scores, pure=False).result(60)
        nanny_pids = set(cluster.worker_pids().values())
    assert got["worker"] == WORKER_OOM_SCORE_ADJ == 1000, got
    assert got["child"] == 1000, got                  # inherited by what a task starts
    assert got["nanny"] == ours, got                  # the nanny keeps what it was given
    assert got["nanny_pid"] in nanny_pids, (got, nanny_pids)     # the parent read is the nanny
