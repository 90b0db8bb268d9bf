"""Job scenarios for the SLURM integration tests and the fixture capture script.

Each scenario is a JobSpec whose job ends in one known way. The tests and
capture_fixtures.py share them, so the committed fixtures are outputs of exactly the
jobs the tests run.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from hpc_cluster.adapters.base import AccountingRecord, JobSpec
from hpc_cluster.adapters.slurm import SLURMAdapter
from helpers.wait import wait_until

HERE = Path(__file__).resolve().parent
CLUSTER_SH = HERE / "cluster.sh"

# Enough memory held for a few seconds that the 1 s accounting sampler records it.
HOLD_50MB = "python3 -c 'import time; b = b\"x\" * (50 << 20); time.sleep(3)'"
# Grows by 4 MiB every 50 ms until the cgroup limit stops it, so MaxRSS is sampled first.
GROW_PAST_LIMIT = ("python3 -c 'import time\nb = []\nwhile True:\n"
                   "    b.append(b\"x\" * (4 << 20)); time.sleep(0.05)'")
SEGFAULT = "python3 -c 'import ctypes; ctypes.string_at(0)'"


def scenarios(log_directory: str) -> dict[str, JobSpec]:
    """Jobs that can run side by side, by the outcome they are made to have."""
    base = JobSpec(worker_command="true", log_directory=log_directory, memory=200 * 2**20,
                   walltime=300)
    return {
        "completed": base.replace(
            job_name="t-completed", walltime=90,
            prologue=['echo "job=$HPC_CLUSTER_JOB_ID walltime=$HPC_CLUSTER_JOB_WALLTIME '
                      'start=$HPC_CLUSTER_JOB_START"'],
            worker_command=HOLD_50MB),
        "exit3": base.replace(job_name="t-exit3", worker_command="bash -c 'exit 3'"),
        "segfault": base.replace(job_name="t-segfault", worker_command=SEGFAULT),
        "oom": base.replace(job_name="t-oom", memory=100 * 2**20, worker_command=GROW_PAST_LIMIT),
        "timeout": base.replace(job_name="t-timeout", walltime=60, worker_command="sleep 600"),
        # Cancelled by the test once running.
        "cancelled": base.replace(job_name="t-cancelled", worker_command="sleep 600"),
        # Preempted: 'low' holds 20 GB of the node's 32; 'high' needs 20 GB too.
        "preempted": base.replace(job_name="t-preempted", queue="low", memory=20_000 * 2**20,
                                  worker_command="sleep 600"),
        "preemptor": base.replace(job_name="t-preemptor", queue="high", memory=20_000 * 2**20,
                                  worker_command="sleep 2"),
        "node_fail": base.replace(job_name="t-node-fail", worker_command="sleep 600",
                                  extra_directives=["--no-requeue"]),
    }


# helpers/wait.py's wait_until, polling every 0.5 s by default: the conditions here run squeue,
# sacct or scontrol, each a call into slurmctld or slurmdbd. Its timeout is a TimeoutError.
wait_for = functools.partial(wait_until, interval=0.5)


def settled(record: AccountingRecord | None) -> bool:
    """Final, and its steps too: sacct writes the job line before the steps' last words."""
    # A job cancelled before it started has no steps to wait for.
    return bool(record and record.final and (record.steps or record.start is None)
                and all(s.state not in ("pending", "running") for s in record.steps))


def wait_final(adapter: SLURMAdapter, job_ids: list[str], timeout: float) -> dict[str, AccountingRecord]:
    """Accounting records of `job_ids` once all have settled (one sacct call per poll)."""
    latest: dict[str, AccountingRecord] = {}

    def all_settled():
        latest.update(adapter.accounting(job_ids))
        return all(settled(latest.get(j)) for j in job_ids)

    try:
        wait_for(all_settled, timeout, f"jobs {job_ids} to settle in accounting", interval=1.0)
    except TimeoutError as e:
        states = {j: (latest[j].raw_state if j in latest else "absent") for j in job_ids}
        raise TimeoutError(f"{e}; last seen: {states}") from None
    return latest


def wait_running(adapter: SLURMAdapter, job_id: str, timeout: float = 60) -> None:
    wait_for(lambda: adapter.status([job_id])[job_id].state == "running", timeout,
             f"job {job_id} to start running")


def cluster_is_up() -> bool:
    return subprocess.run([str(CLUSTER_SH), "status"], capture_output=True).returncode == 0


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


def fail_node(node: str, job_id: str) -> None:
    """Make `node` die under `job_id`: kill its slurmd and the job's processes, mark it down.

    Only those processes: slurmd by its pid file, the job's by its cgroups. Bring the
    node back with `cluster.sh up` (restarts slurmd, resumes the node).
    """
    wait_for(lambda: job_pids(job_id), 30, f"processes of job {job_id}")
    os.kill(int(Path("/run/slurm/slurmd.pid").read_text()), signal.SIGKILL)
    for pid in job_pids(job_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                    "reason=hpc-cluster test: node failure"], check=True)


def node_states(node: str) -> set[str]:
    """The node's state as each partition sees it (sinfo prints one line per partition)."""
    return set(subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"],
                              capture_output=True, text=True).stdout.split())


def restore_node(node: str) -> None:
    # cluster.sh up restarts slurmd and resumes an admin-downed node; it is idempotent.
    subprocess.run([str(CLUSTER_SH), "up"], stdin=subprocess.DEVNULL, capture_output=True,
                   timeout=300, check=True)

    def in_service():
        states = node_states(node)
        return states and states <= {"idle", "mixed", "allocated"}
    wait_for(in_service, 60, f"node {node} back in service")


def cli(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """`hpc-cluster ARGS` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "hpc_cluster.cli", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def gather_in_background(client, futures, timeout: float = 600) -> tuple[threading.Thread, dict]:
    """`client.gather(futures)` in a thread (the test does something meanwhile); the dict gets
    "result", or "error" with what it raised."""
    got: dict = {}

    def gather():
        try:
            got["result"] = client.gather(futures, timeout=timeout)
        except BaseException as exc:      # the test reads it
            got["error"] = exc
    waiter = threading.Thread(target=gather, daemon=True)
    waiter.start()
    return waiter, got
