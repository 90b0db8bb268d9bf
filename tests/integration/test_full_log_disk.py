"""A full log filesystem (issue 34): a worker's job log on a full disk (stdout and stderr on
/dev/full, which answers every write with ENOSPC). The nanny used to die of its first write
(exit 1, or 120 flushing at exit), so a segfault cost the whole job and was reported as a lost
connection; and a task that only printed failed with a bare "No space left on device"."""

from __future__ import annotations

import os
import subprocess
import sys

import cloudpickle
import pytest

from hpc_cluster import Client, LocalCluster
from helpers.wait import wait_until

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(300)


def crash():
    import ctypes
    ctypes.string_at(0)


def chatty():
    for _ in range(1000):
        print("x" * 100)
    return 1


@pytest.fixture
def worker_on_a_full_disk():
    """A LocalCluster with no workers of its own, and one nanny'd worker whose stdout and
    stderr are a full disk."""
    with LocalCluster(n_workers=0, processes=True) as cluster, Client(cluster) as client:
        full = open("/dev/full", "w")
        proc = subprocess.Popen([sys.executable, "-m", "hpc_cluster.worker", "--scheduler", cluster.scheduler_address,
                                 "--nanny", "--name", "full"], stdout=full, stderr=full, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, HPC_CLUSTER_SECRET=cluster.secret.hex()))
        try:
            client.wait_for_workers(1, timeout=120)
            yield client, proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            full.close()


def test_a_segfault_with_a_full_log_disk_is_reported_and_the_nanny_lives_on(worker_on_a_full_disk):
    client, nanny = worker_on_a_full_disk
    fut = client.submit(crash, pure=False, retries=0)
    assert fut.exception(timeout=120) is not None
    death = wait_until(lambda: next((d for d in client.deaths() if d.get("final_at")), None), 60, "a final verdict")
    assert death["cause"] == "crash" and "SIGSEGV" in death["text"], death["text"]
    assert nanny.poll() is None                                  # the nanny survived its full log
    wait_until(lambda: len(client.scheduler_info()["workers"]) == 1, 60, "the nanny's fresh worker")


def test_a_task_that_prints_into_a_full_log_says_it_is_the_log_directory(worker_on_a_full_disk):
    client, _ = worker_on_a_full_disk
    exc = client.submit(chatty, pure=False).exception(timeout=120)
    assert isinstance(exc, OSError) and exc.errno == 28, repr(exc)
    assert "writing the worker's stdout (/dev/full), its job's log in log_directory" in str(exc), str(exc)
    assert "Free space there, or set log_directory to another filesystem" in str(exc)


def test_a_nanny_whose_log_is_full_exits_with_its_own_code_not_120():
    # A nanny that gives up on an unreachable scheduler exits 3; with its log on a full disk
    # Python's own flush at exit failed and made that 120 (issue 34: "exited with code 120").
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "hpc_cluster.worker", "--scheduler", "tcp://127.0.0.1:9",
                               "--nanny", "--death-timeout", "2"], stdout=full, stderr=full,
                              stdin=subprocess.DEVNULL, env=dict(os.environ, HPC_CLUSTER_SECRET="00" * 32), timeout=120)
    assert proc.returncode == 3
