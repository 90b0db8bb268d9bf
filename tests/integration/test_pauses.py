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
from hpc_cluster.protocol.clusterfile import SECRET_ENV, new_secret
from helpers.funcs import inc, slow
from helpers.wait import wait_until


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


def test_a_worker_dropped_by_the_scheduler_registers_again():
    """A worker stopped past the TTL is dropped (its connection closed); once it runs again it
    registers afresh with the same scheduler instead of exiting, and takes work."""
    with LocalCluster(n_workers=1, threads_per_worker=1, heartbeat_ttl=1.0, nanny=False) as cluster, \
            Client(cluster) as c:
        (addr, info), = c.scheduler_info()["workers"].items()
        os.kill(info["pid"], signal.SIGSTOP)
        try:
            wait_until(lambda: c.deaths(), timeout=20, what="the scheduler to drop the stopped worker")
        finally:
            os.kill(info["pid"], signal.SIGCONT)
        assert c.deaths()[0]["cause"] == "heartbeat-lost"
        wait_until(lambda: addr in c.scheduler_info()["workers"], timeout=20, what="the worker to register again")
        assert c.submit(inc, 41).result(20) == 42
        assert c.scheduler_info()["workers"][addr]["pid"] == info["pid"]      # the same process, not a new one
        assert psutil.Process(info["pid"]).is_running()


def _scheduler(port: int, env: dict, tmp_path) -> tuple[subprocess.Popen, str]:
    address_file = tmp_path / f"address-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-m", "hpc_cluster.scheduler", "--port", str(port),
                             "--address-file", str(address_file)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, wait_until(lambda: address_file.exists() and address_file.read_text(), what="the scheduler")


def test_a_worker_waits_its_death_timeout_for_a_lost_scheduler(tmp_path):
    """A killed scheduler started again on its address within the reconnect window gets the same
    worker process back (its nanny restarts nothing); with none, the worker exits with code 4
    ('scheduler-lost') once the window (--reconnect-window, 4 s here; by default the larger of 10
    minutes and death_timeout) ends, not at once and not never, and its nanny with it."""
    secret = new_secret()
    env = dict(os.environ, **{SECRET_ENV: secret.hex()})
    first, address = _scheduler(0, env, tmp_path)
    port = int(address.rsplit(":", 1)[1])
    procs = [first]
    nanny = subprocess.Popen([sys.executable, "-m", "hpc_cluster.worker", "--scheduler", address, "--nanny",
                              "--death-timeout", "4", "--reconnect-window", "4", "--heartbeat-interval", "0.2"],
                             env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(nanny)
    worker = None
    try:
        with Client(address, secret=secret, timeout=20) as c:
            c.wait_for_workers(1, 20)
            [worker] = [w["pid"] for w in c.scheduler_info()["workers"].values()]
        first.kill()
        first.wait()
        second, _ = _scheduler(port, env, tmp_path)
        procs.append(second)
        with Client(address, secret=secret, timeout=20) as c:
            c.wait_for_workers(1, 20)
            assert [w["pid"] for w in c.scheduler_info()["workers"].values()] == [worker]
            assert c.submit(inc, 1).result(20) == 2
        second.kill()
        second.wait()
        lost = time.monotonic()
        assert nanny.wait(20) == 4
        assert 3.0 <= time.monotonic() - lost < 14.0        # its death_timeout (4 s), with slack for a busy machine
        assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if worker is not None and psutil.pid_exists(worker):
            try:
                os.kill(worker, signal.SIGKILL)
            except ProcessLookupError:
                pass
