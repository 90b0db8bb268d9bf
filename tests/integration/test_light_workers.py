"""Light workers (issue 33, point 6): `--nworkers N --no-nanny` is one launcher process that
imports once and forks N workers (worker/forked.py). Checked here with real processes: every
worker registers under its own name, a killed one does not take its siblings, and the launcher's
end (SIGTERM, or SIGKILL that runs no cleanup) ends every worker it forked. How fast 1,000 of
them start is measured by benchmarks/many_nodes.py, never asserted here."""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from hpc_cluster import Client
from hpc_cluster.worker.forked import child_argv
from hpc_cluster.worker.worker import Worker

from helpers.procs import ClusterProcesses
from helpers.wait import wait_until

N = 20


@pytest.fixture
def light_cluster(tmp_path):
    p = ClusterProcesses(tmp_path)
    yield p
    p.end()


def all_ended(pids) -> bool:
    """Every one of these processes has ended (a zombie has: its parent has not reaped it yet)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def launch(light_cluster, address, n, *extra):
    launcher = light_cluster.worker(address, "--nworkers", str(n), "--no-nanny", "--name", "light", *extra)
    return launcher, psutil.Process(launcher.pid)


def plus_one(x):
    return x + 1


def test_twenty_forked_workers_register_by_name_and_outlive_a_killed_sibling_but_not_their_launcher(light_cluster):
    _, address = light_cluster.scheduler()
    launcher, parent = launch(light_cluster, address, N)

    def log() -> str:
        return "".join(p.read_text() for p in light_cluster.directory.glob("hpc_cluster.worker-*.log"))
    with Client(address, secret=light_cluster.secret, timeout=60) as client:
        client.wait_for_workers(N, timeout=120)
        workers = client.scheduler_info()["workers"]
        assert sorted(w["name"] for w in workers.values()) == sorted(f"light-{i}" for i in range(N))
        pids = {w["pid"] for w in workers.values()}
        # each a process of its own, forked by the one launcher (no interpreter started per worker)
        assert len(pids) == N and {c.pid for c in parent.children()} == pids
        assert len({w["address"] for w in workers.values()}) == N

        victim = next(w for w in workers.values() if w["name"] == "light-7")
        os.kill(victim["pid"], signal.SIGKILL)
        wait_until(lambda: len(client.scheduler_info()["workers"]) == N - 1, 60, "the killed worker to be removed")
        left = client.scheduler_info()["workers"].values()
        assert "light-7" not in {w["name"] for w in left}
        assert launcher.poll() is None and all(psutil.pid_exists(p) for p in pids - {victim["pid"]})
        assert client.gather(client.map(plus_one, range(100))) == list(range(1, 101))   # the 19 still work
        wait_until(lambda: "light-7 (pid" in log(), 30, "the launcher to reap and report the killed worker")
        assert "19 workers go on" in log()

        launcher.send_signal(signal.SIGTERM)              # the job's end, as a batch system sends it
        # The launcher's code is its children's worst: the killed sibling's SIGKILL; the rest left cleanly.
        assert launcher.wait(60) == 256 - signal.SIGKILL
        assert "did not leave cleanly" not in log(), log()[-3000:]
        wait_until(lambda: all_ended(pids), 30, "every forked worker to end with its launcher")
        wait_until(lambda: not client.scheduler_info()["workers"], 30, "the scheduler to see them leave")


def test_a_launcher_killed_outright_takes_its_workers_with_it(light_cluster):
    """SIGKILL runs no cleanup in the launcher: each child asked the kernel for SIGTERM when its
    parent dies (and watches it as its owner), so none lives on under PID 1."""
    _, address = light_cluster.scheduler()
    launcher, parent = launch(light_cluster, address, 5)
    with Client(address, secret=light_cluster.secret, timeout=60) as client:
        client.wait_for_workers(5, timeout=120)
        pids = [c.pid for c in parent.children()]
        assert len(pids) == 5
        launcher.kill()
        launcher.wait(30)
        wait_until(lambda: all_ended(pids), 30, "the orphaned workers to end")
        wait_until(lambda: not client.scheduler_info()["workers"], 60, "the scheduler to see them leave")


def test_each_forked_worker_gets_its_own_name_threads_port_share_and_owner():
    argv = ["--scheduler", "tcp://10.0.0.1:1", "--nworkers", "4", "--name", "x", "--nthreads", "0",
            "--no-nanny", "--owner-pid", "99", "--worker-port", "3000:3007"]
    got = child_argv(argv, 2, "x", 1, "3004:3005", owner=1234)
    assert got == ["--scheduler", "tcp://10.0.0.1:1", "--no-nanny", "--nworkers", "1", "--name", "x-2",
                   "--nthreads", "1", "--owner-pid", "1234", "--worker-port", "3004:3005"]


def test_a_worker_without_a_memory_limit_runs_no_memory_monitor(light_cluster, monkeypatch):
    """The monitor looks 10 times a second to pause or spill under the limit (dask runs none without
    one): 1,000 light workers spent over a core on it, idle. The Worker runs in this process: its
    log capture and its worker context must not outlive the test (they made later tests' prints
    vanish and their Client() find this dead worker's scheduler, in CI)."""
    from hpc_cluster.protocol import context
    from hpc_cluster.worker.logs import LogBuffer
    monkeypatch.setattr(LogBuffer, "install", classmethod(lambda cls: LogBuffer()))
    monkeypatch.setattr(context, "_worker", None)           # restored to None after the test
    _, address = light_cluster.scheduler()

    async def monitors(limit: int):
        w = Worker(address, light_cluster.secret, memory_limit=limit)
        await w.start()
        try:
            return w._monitor is not None
        finally:
            await w.close("test over")
    assert asyncio.run(monitors(0)) is False
    assert asyncio.run(monitors(2**30)) is True


def test_with_a_nanny_each_worker_keeps_its_own_nanny_process(light_cluster):
    """The fork is for --no-nanny only: a nanny watches one worker process."""
    _, address = light_cluster.scheduler()
    launcher = light_cluster.worker(address, "--nworkers", "2", "--name", "nn")
    with Client(address, secret=light_cluster.secret, timeout=60) as client:
        client.wait_for_workers(2, timeout=120)
        nannies = psutil.Process(launcher.pid).children()
        assert len(nannies) == 2
        assert all("hpc_cluster.worker" in " ".join(n.cmdline()) for n in nannies)   # started, not forked
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(60)
