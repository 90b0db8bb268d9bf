"""A real kernel OOM kill inside a memory cgroup, as SLURM's task/cgroup would cause."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_cluster import Client, KilledWorker, LocalCluster
from hpc_cluster.deploy.local import _child_env
from hpc_cluster.worker.nanny import cgroup_memory_dir, oom_kills
from waiting import wait_until

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def hog(nbytes):
    block = bytearray(nbytes)
    for i in range(0, nbytes, 4096):
        block[i] = 1
    return len(block)


def inc(x):
    return x + 1


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


def test_oom_kill_in_the_workers_cgroup_is_memory_batch(memory_cgroup):
    with LocalCluster(n_workers=0, allowed_failures=0) as cluster, Client(cluster) as c:
        # Join the cgroup first, then become the worker (with its nanny): like a job step.
        script = (f"echo $$ > {memory_cgroup}/cgroup.procs && exec {sys.executable} -m hpc_cluster.worker "
                  f"--scheduler {cluster.scheduler_address} --nthreads 1 --name cg-worker")
        log = open(cluster.log_directory / "cg-worker.log", "ab")
        proc = subprocess.Popen(["sh", "-c", script], env=_child_env(cluster.secret), stdout=log, stderr=log)
        try:
            c.wait_for_workers(1, timeout=30)
            pid = next(iter(c.scheduler_info()["workers"].values()))["pid"]
            assert cgroup_memory_dir(pid) == memory_cgroup
            before = oom_kills(memory_cgroup)
            with pytest.raises(KilledWorker) as info:
                c.submit(hog, 600 * 2**20).result(60)
            assert info.value.cause == "memory-batch"
            assert oom_kills(memory_cgroup) > before
            death = c.deaths()[0]
            assert death["blame"] and "OOM killer" in death["text"]
            assert any("cgroup OOM kill recorded" in f for f in death["evidence"])
            assert c.submit(inc, 1).result(30) == 2       # the nanny brought a new worker up
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
