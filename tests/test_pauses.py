"""A paused scheduler (SIGSTOP, then SIGCONT: a laptop lid, Ctrl-Z/fg, a long GC pause) and a
worker that loses its connection: real processes, real signals (issue 14, point 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from hpc_cluster import Client, LocalCluster
from hpc_cluster.protocol.secret import SECRET_ENV, new_secret
from waiting import wait_until


def slow(x, delay=1.0):
    time.sleep(delay)
    return x


def inc(x):
    return x + 1


def paused(pid: int, seconds: float) -> None:
    """SIGSTOP the process for `seconds`, then SIGCONT it (always, even if the wait is cut short)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)          # the pause itself is what is tested: its length is the point
    finally:
        os.kill(pid, signal.SIGCONT)


def executing(c) -> dict[str, dict]:
    return {a: w for a, w in c.scheduler_info()["workers"].items() if w["executing"]}


def test_scheduler_pauses_longer_than_the_ttl_blame_no_one():
    """The audit's case, shortened: pauses longer than the heartbeat TTL while an innocent task
    sleeps. The scheduler reads the heartbeats queued during each pause before judging: no
    worker is dropped, the task is not charged (allowed_failures=0 would fail it at once), the
    worker keeps its results."""
    with LocalCluster(n_workers=1, threads_per_worker=1, heartbeat_ttl=1.5, allowed_failures=0) as cluster, \
            Client(cluster) as c:
        held = c.submit(inc, 1)
        assert held.result(30) == 2
        task = c.submit(slow, 42, 9.0, pure=False)
        before = wait_until(lambda: executing(c), what="the task to start")
        for _ in range(2):
            paused(cluster._scheduler.pid, 3.0)
        assert task.result(60) == 42
        assert c.deaths() == []
        assert {a: w["pid"] for a, w in c.scheduler_info()["workers"].items()} == \
            {a: w["pid"] for a, w in before.items()}
        assert c.gather(held) == 2 and c.scheduler_info()["workers"][next(iter(before))]["stored"] >= 1
