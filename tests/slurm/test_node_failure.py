"""A node dies under a running job: the adapter must say node-fail.

"Dies" is done for real: the node's slurmd and the job's processes are killed, and the
node is marked down as an admin (or the controller, after SlurmdTimeout) would. The
node is brought back afterwards whatever happens, so later tests have a cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from slurm_jobs import CLUSTER_SH, scenarios, wait_final, wait_for, wait_running

pytestmark = [pytest.mark.slurm]


def job_pids(job_id: str) -> set[int]:
    """Processes of this job only: its cgroups' members and its slurmstepd."""
    pids = set()
    for root in Path("/sys/fs/cgroup/memory").glob(f"slurm*/uid_*/job_{job_id}"):
        for procs in root.rglob("cgroup.procs"):
            pids.update(int(p) for p in procs.read_text().split())
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if cmd.startswith(f"slurmstepd: [{job_id}."):
            pids.add(proc.pid)
    return pids


def node_states(node: str) -> set[str]:
    """The node's state as each partition sees it (sinfo prints one line per partition)."""
    return set(subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"],
                              capture_output=True, text=True).stdout.split())


@pytest.fixture
def restore_node(slurm_node):
    yield slurm_node
    # cluster.sh up restarts slurmd and resumes an admin-downed node; it is idempotent.
    subprocess.run([str(CLUSTER_SH), "up"], stdin=subprocess.DEVNULL, capture_output=True,
                   timeout=300, check=True)
    def in_service():
        states = node_states(slurm_node)
        return states and states <= {"idle", "mixed", "allocated"}
    wait_for(in_service, 60,
             f"node {slurm_node} back in service")


def test_node_failure(adapter, submitted, restore_node, tmp_path):
    node = restore_node
    job_id = adapter.submit(adapter.render(scenarios(str(tmp_path))["node_fail"]))
    submitted.append(job_id)
    wait_running(adapter, job_id)
    wait_for(lambda: job_pids(job_id), 30, f"processes of job {job_id}")

    slurmd_pid = int(Path("/run/slurm/slurmd.pid").read_text())
    os.kill(slurmd_pid, signal.SIGKILL)
    for pid in job_pids(job_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                    "reason=hpc-cluster test: node failure"], check=True)

    r = wait_final(adapter, [job_id], timeout=120)[job_id]
    assert (r.state, r.raw_state) == ("node-fail", "NODE_FAIL")
    assert r.node == node
    status = adapter.status([job_id])[job_id]
    assert status.state == "node-fail"
