"""Reading the kernel's OOM-kill count of a memory cgroup (v1 and v2 files), and a real
kernel OOM kill inside a memory cgroup, as SLURM's task/cgroup would cause."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_cluster import Client, KilledWorker, LocalCluster
from hpc_cluster.deploy.local.cluster import _child_env
from hpc_cluster.worker.nanny import cgroup_memory_dir, oom_kills, parse_oom_kills
from helpers.funcs import hog, inc
from helpers.wait import wait_until

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


# cgroup v1 memory.oom_control as read on this machine (Linux 6.x); kernels before 4.13 lack
# the oom_kill line. cgroup v2 memory.events as documented for Linux 5.17+ (oom_group_kill is
# the newest line); `oom` counts OOM events, `oom_kill` the processes the OOM killer ended.
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"
V1_BEFORE_4_13 = "oom_kill_disable 0\nunder_oom 0\n"
V2_EVENTS = "low 0\nhigh 12\nmax 40\noom 7\noom_kill {n}\noom_group_kill 0\n"


def test_parse_oom_kills_reads_the_oom_kill_line_only():
    assert parse_oom_kills(V1_OOM_CONTROL.format(n=3)) == 3
    assert parse_oom_kills(V2_EVENTS.format(n=2)) == 2          # not `oom 7`, not `oom_group_kill`
    assert parse_oom_kills(V1_BEFORE_4_13) is None                # no count kept: unknown, not zero
    assert parse_oom_kills("") is None
    assert parse_oom_kills("oom_kill lots\n") is None


def test_oom_kills_reads_a_v1_or_v2_cgroup_directory(tmp_path):
    v1, v2, old, empty = (tmp_path / d for d in ("v1", "v2", "old", "empty"))
    for d in (v1, v2, old, empty):
        d.mkdir()
    (v1 / "memory.oom_control").write_text(V1_OOM_CONTROL.format(n=0))
    (v2 / "memory.events").write_text(V2_EVENTS.format(n=1))
    (old / "memory.oom_control").write_text(V1_BEFORE_4_13)
    assert oom_kills(v1) == 0 and oom_kills(v2) == 1
    # Read afresh each time: the nanny compares the count before and after its worker's life.
    (v1 / "memory.oom_control").write_text(V1_OOM_CONTROL.format(n=1))
    assert oom_kills(v1) == 1
    assert oom_kills(old) is None and oom_kills(empty) is None
    assert oom_kills(tmp_path / "gone") is None and oom_kills(None) is None


def _cgroup_v1_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create a memory cgroup"
    if not (CGROUP_ROOT / "memory.limit_in_bytes").exists():
        return "no cgroup v1 memory controller at /sys/fs/cgroup/memory"
    return None


@pytest.fixture
def memory_cgroup():
    reason = _cgroup_v1_usable()
    if reason:
        pytest.skip(f"LOUD SKIP: cgroup OOM test cannot run here: {reason}")
    path = CGROUP_ROOT / f"hpc-cluster-test-{os.getpid()}"
    path.mkdir()
    (path / "memory.limit_in_bytes").write_text(str(300 * 2**20))
    try:
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until(lambda: not (path / "cgroup.procs").read_text().strip(), what="cgroup to empty")
        path.rmdir()


# Each step is bounded by a generous deadline, not timed: on a slow or loaded core the worker
# fills its cgroup slowly (every page fault reclaims near the limit) and starts again slowly.
SLOW_STEP = 240


def test_oom_kill_in_the_workers_cgroup_is_memory_batch(memory_cgroup):
    # Filling the cgroup can keep a worker starved of CPU from beating for longer than the
    # default 5 s heartbeat TTL: it was then lost as 'heartbeat-lost' (not blamed, retried)
    # before its OOM kill, a second death. What is tested here is the OOM kill's diagnosis.
    with LocalCluster(n_workers=0, allowed_failures=0, heartbeat_ttl=SLOW_STEP) as cluster, Client(cluster) as c:
        # Join the cgroup first, then become the worker (with its nanny): like a job step.
        script = (f"echo $$ > {memory_cgroup}/cgroup.procs && exec {sys.executable} -m hpc_cluster.worker "
                  f"--scheduler {cluster.scheduler_address} --nthreads 1 --name cg-worker")
        log = open(cluster.log_directory / "cg-worker.log", "ab")
        proc = subprocess.Popen(["sh", "-c", script], env=_child_env(cluster.secret), stdout=log, stderr=log)
        try:
            c.wait_for_workers(1, timeout=SLOW_STEP)
            pid = next(iter(c.scheduler_info()["workers"].values()))["pid"]
            assert cgroup_memory_dir(pid) == memory_cgroup
            before = oom_kills(memory_cgroup)
            hogging = c.submit(hog, 600 * 2**20, hold=0)
            wait_until(lambda: oom_kills(memory_cgroup) > before, timeout=SLOW_STEP, what="the kernel's OOM kill")
            with pytest.raises(KilledWorker) as info:
                hogging.result(SLOW_STEP)
            assert info.value.cause == "memory-batch"
            [death] = c.deaths()
            assert death["blame"] and "OOM killer" in death["text"], death
            assert any("cgroup OOM kill recorded" in f for f in death["evidence"])
            assert c.submit(inc, 1).result(SLOW_STEP) == 2       # the nanny brought a new worker up
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
