"""Every process we start ends within 10 s of losing its owner (issue 14, point 6): real
processes, real SIGKILLs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from hpc_cluster import Client, LocalCluster
from helpers.wait import wait_until


def gone(pid: int) -> bool:
    """Exited (a zombie whose new parent has not reaped it yet holds nothing and runs nothing)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_all(pids) -> None:
    for pid in pids:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


OWNER = textwrap.dedent("""
    import json, sys, time
    import psutil
    from hpc_cluster import LocalCluster
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GB")
    me = psutil.Process()
    print(json.dumps([p.pid for p in me.children(recursive=True)]), flush=True)
    while True:
        time.sleep(60)
""")


def test_sigkill_of_the_python_process_that_owns_a_local_cluster_ends_all_of_it(tmp_path):
    # Its temporary directory (logs) under tmp_path: a SIGKILLed owner cannot remove it.
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, cwd=tmp_path, env=dict(os.environ, TMPDIR=str(tmp_path)))
    pids: list[int] = []
    try:
        pids = json.loads(owner.stdout.readline())
        assert len(pids) >= 5, pids             # scheduler, 2 nannies, 2 workers
        owner.kill()
        owner.wait()
        killed = time.monotonic()
        wait_until(lambda: all(gone(p) for p in pids), timeout=10,
                   what=f"the scheduler, nannies and workers of a SIGKILLed owner to exit: still "
                        f"{[p for p in pids if not gone(p)]}")
        print(f"\nall {len(pids)} processes gone {time.monotonic() - killed:.1f} s after the owner's SIGKILL")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        kill_all(pids)


def test_sigkill_of_a_nanny_ends_its_worker():
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as c:
        nanny = next(iter(cluster.worker_pids().values()))
        worker = next(iter(c.scheduler_info()["workers"].values()))["pid"]
        assert psutil.Process(worker).ppid() == nanny
        os.kill(nanny, signal.SIGKILL)
        try:
            wait_until(lambda: gone(worker), timeout=10, what="the worker of a SIGKILLed nanny to exit")
            death = wait_until(lambda: c.deaths(), what="the worker's death")[0]
            assert (death["cause"], death["blame"]) == ("retired", False), death      # it said goodbye
        finally:
            kill_all([worker])
