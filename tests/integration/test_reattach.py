"""Workers and clients reattach to a restarted scheduler (issue 16, points 3-4): real scheduler
and worker processes, the scheduler SIGKILLed while a client's gather waits, then started
again on the same address with the same secret and no knowledge of the work."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid

import psutil
import pytest

from hpc_cluster import Client
from helpers.procs import ClusterProcesses
from helpers.wait import wait_until


def marked(directory, name, value, delay=0.0):
    """A task that leaves one marker file per execution, then sleeps `delay` and returns value * 10."""
    with open(os.path.join(directory, f"{name}.{uuid.uuid4().hex}"), "w"):
        pass
    time.sleep(delay)
    return value * 10


def runs(directory, name) -> int:
    return sum(1 for f in os.listdir(directory) if f.split(".")[0] == name)


@pytest.fixture
def processes(tmp_path):
    p = ClusterProcesses(tmp_path)
    yield p
    p.end()


def kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def test_a_gather_waiting_through_a_scheduler_restart_returns_every_result_and_nothing_runs_twice(processes,
                                                                                                  tmp_path):
    """The scheduler is SIGKILLed while 6 tasks of 2 s run on 2 workers and a gather waits on them,
    and started again on its port 1 s later, knowing nothing. The workers keep their results and
    reattach; the client reattaches and resubmits what is unfinished: the gather returns every
    result, within its timeout, and no task ran twice (results held before the kill, tasks that
    were running through it, tasks finished during the outage), counted by marker files."""
    marks = tmp_path / "marks"
    marks.mkdir()
    first, address = processes.scheduler()
    port = int(address.rsplit(":", 1)[1])
    workers = [processes.worker(address, "--no-nanny", "--reconnect-window", "60") for _ in range(2)]
    with Client(address, secret=processes.secret, timeout=20) as c:
        c.wait_for_workers(2, 30)
        pids = {w["pid"] for w in c.scheduler_info()["workers"].values()}
        early = c.map(marked, [str(marks)] * 4, [f"early{i}" for i in range(4)], range(4))
        assert c.gather(early, timeout=30) == [0, 10, 20, 30]
        late = c.map(marked, [str(marks)] * 6, [f"late{i}" for i in range(6)], range(6), delay=2.0)
        got: dict = {}
        waiter = threading.Thread(target=lambda: got.update(result=c.gather(late, timeout=90)))
        started = time.monotonic()
        waiter.start()
        wait_until(lambda: runs(marks, "late0") + runs(marks, "late1") >= 2, what="the long tasks to start")
        kill(first)
        second, _ = processes.scheduler("--reattach-grace", "5", port=port)
        waiter.join(120)
        assert got.get("result") == [0, 10, 20, 30, 40, 50]
        assert time.monotonic() - started < 90
        # The same worker processes, back with what they held: the early results are not computed again.
        assert {w["pid"] for w in c.scheduler_info()["workers"].values()} == pids
        assert c.gather(early, timeout=30) == [0, 10, 20, 30]
        counts = {name: runs(marks, name) for name in [f"early{i}" for i in range(4)] + [f"late{i}" for i in range(6)]}
        assert counts == dict.fromkeys(counts, 1)
        assert all(w.poll() is None for w in workers)
    kill(second)


def test_a_client_resubmits_to_a_scheduler_that_knows_nothing(processes, tmp_path):
    """Tasks submitted to a scheduler with no workers (so nothing ran, nothing is held anywhere);
    the scheduler SIGKILLed and started again empty: the client's reattach resubmits its
    unfinished futures from the specs it kept, and a worker of the new scheduler computes them."""
    marks = tmp_path / "marks"
    marks.mkdir()
    first, address = processes.scheduler()
    port = int(address.rsplit(":", 1)[1])
    with Client(address, secret=processes.secret, timeout=20) as c:
        futures = c.map(marked, [str(marks)] * 3, ["a", "b", "c"], [1, 2, 3])
        total = c.submit(sum, futures)
        wait_until(lambda: c.scheduler_info() and c._lt.run(c._request({"op": "counts"}), 10).get("queued") == 3,
                   what="the tasks to reach the first scheduler")
        kill(first)
        second, _ = processes.scheduler(port=port)
        processes.worker(address, "--no-nanny")
        assert total.result(timeout=60) == 60
        assert c.gather(futures, timeout=30) == [10, 20, 30]
        assert [runs(marks, n) for n in "abc"] == [1, 1, 1]
        assert len(c._specs) == 0            # every spec was dropped with its result
    kill(second)


def test_a_worker_whose_window_ends_exits_scheduler_lost_not_a_crash(processes, tmp_path):
    """No scheduler comes back: the worker (under its nanny) keeps trying for its reconnect window
    (3 s) and then exits with code 4 ('scheduler-lost'), and its nanny with it; not at once, and
    not by a crash. The result it held is gone with it."""
    first, address = processes.scheduler()
    nanny = processes.worker(address, "--nanny", "--reconnect-window", "3")
    with Client(address, secret=processes.secret, timeout=20, reconnect=0) as c:
        c.wait_for_workers(1, 30)
        [worker] = [w["pid"] for w in c.scheduler_info()["workers"].values()]
        assert c.submit(marked, str(tmp_path), "x", 1).result(30) == 10
        kill(first)
        lost = time.monotonic()
        assert nanny.wait(30) == 4
        assert 2.5 <= time.monotonic() - lost < 15.0
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    log = (tmp_path / "hpc_cluster.worker-1.log").read_text()
    assert "reconnect window" in log and "Traceback" not in log


def scheduler_with_cluster_file(processes, tmp_path):
    """A scheduler publishing its address in a cluster file, and a worker that follows the file."""
    from hpc_cluster.protocol.clusterfile import read_cluster_file, write_cluster_file
    cluster_file = tmp_path / "cluster.json"
    write_cluster_file(cluster_file, "tcp://127.0.0.1:1", processes.secret)
    first, address = processes.scheduler("--cluster-file", str(cluster_file))
    wait_until(lambda: read_cluster_file(cluster_file)["address"] == address, what="the cluster file")
    processes.worker(address, "--no-nanny", "--cluster-file", str(cluster_file))
    return cluster_file, first, address


def test_workers_and_clients_follow_the_cluster_file_to_a_new_address(processes, tmp_path):
    """The restarted scheduler cannot have its old port (here: it takes any) and publishes its new
    address in the cluster file; the worker and the client given that file find it there, and the
    result the worker held is still served without being computed again."""
    marks = tmp_path / "marks"
    marks.mkdir()
    cluster_file, first, address = scheduler_with_cluster_file(processes, tmp_path)
    with Client(cluster_file=str(cluster_file), timeout=20) as c:
        c.wait_for_workers(1, 30)
        held = c.submit(marked, str(marks), "held", 4)
        assert held.result(30) == 40
        kill(first)
        second, new_address = processes.scheduler("--cluster-file", str(cluster_file), "--reattach-grace", "3")
        assert new_address != address
        late = c.submit(marked, str(marks), "late", 5)
        assert late.result(timeout=60) == 50                 # submitted during the outage
        assert c.scheduler_address == new_address
        assert [w["address"] for w in c.scheduler_info()["workers"].values()] != []
        assert held.result(timeout=30) == 40 and runs(marks, "held") == 1
    kill(second)


def test_a_client_waits_through_a_cluster_file_with_no_address_yet(processes, tmp_path, caplog):
    """`hpc-cluster up` resuming a killed daemon writes the cluster file with an empty address
    until the new scheduler listens (deploy/launch.py); a client reconnecting then took '' for
    an address, failed to parse it and cancelled every future at once (CI, test_restart.py)."""
    import logging

    from hpc_cluster.protocol.clusterfile import write_cluster_file
    caplog.set_level(logging.INFO, logger="hpc_cluster.client")
    cluster_file, first, address = scheduler_with_cluster_file(processes, tmp_path)
    with Client(cluster_file=str(cluster_file), timeout=20) as c:
        c.wait_for_workers(1, 30)
        kill(first)
        write_cluster_file(cluster_file, "", processes.secret)
        seen = len(caplog.records)
        wait_until(lambda: sum("not reachable yet" in r.getMessage() for r in caplog.records[seen:]) >= 2,
                   20, "the client to retry while the cluster file names no address")
        late = c.submit(marked, str(tmp_path), "late", 5)
        second, new_address = processes.scheduler("--cluster-file", str(cluster_file), "--reattach-grace", "3")
        assert late.result(timeout=60) == 50
        assert c.scheduler_address == new_address
    kill(second)


def test_a_nanny_rejoins_the_restarted_scheduler_so_restart_reaches_it(processes):
    """The nanny's own link to the scheduler comes back too: client.restart() after a scheduler
    restart restarts the worker through its nanny (a new worker process), instead of finding a
    worker 'without a nanny'."""
    import warnings
    first, address = processes.scheduler()
    port = int(address.rsplit(":", 1)[1])
    processes.worker(address, "--nanny", "--reconnect-window", "60")
    with Client(address, secret=processes.secret, timeout=20) as c:
        c.wait_for_workers(1, 30)
        [pid] = [w["pid"] for w in c.scheduler_info()["workers"].values()]
        kill(first)
        second, _ = processes.scheduler(port=port)
        wait_until(lambda: [w["pid"] for w in c.scheduler_info()["workers"].values()] == [pid], timeout=30,
                   what="the worker to reattach")

        def restarted_through_the_nanny() -> bool:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                c.restart(timeout=20)
            return not caught
        wait_until(restarted_through_the_nanny, timeout=30, what="the nanny to rejoin", interval=0.5)
        new = wait_until(lambda: [w["pid"] for w in c.scheduler_info()["workers"].values()], what="a worker")
        assert new != [pid]
        assert c.submit(runs, "/", "x").result(30) == 0
    kill(second)


def test_a_client_whose_scheduler_does_not_come_back_cancels_its_futures_after_its_window(processes):
    """Client(reconnect=2): pending futures stay pending through the outage, then are cancelled
    saying why (not at once, and not never)."""
    first, address = processes.scheduler()
    with Client(address, secret=processes.secret, timeout=20, reconnect=2) as c:
        future = c.submit(runs, "/", "never")                # no worker: it stays pending
        wait_until(lambda: c._lt.run(c._request({"op": "counts"}), 10).get("queued") == 1, what="the task")
        kill(first)
        lost = time.monotonic()
        wait_until(lambda: c.status == "reconnecting", what="the client to notice")
        assert not future.done()
        error = future.exception(timeout=20)
        assert 1.5 <= time.monotonic() - lost < 15
        assert "did not come back within 2 s" in str(error) and future.status == "cancelled"


def test_the_reconnect_window_defaults_and_is_cut_by_the_walltime_and_lifetime():
    from types import SimpleNamespace

    from hpc_cluster.worker.reattach import deadline, reconnect_window
    assert reconnect_window(60, None) == 600 and reconnect_window(1200, None) == 1200
    assert reconnect_window(60, 5) == 5                      # given: as given
    worker = SimpleNamespace(reconnect_window=600.0, extra_info={})
    assert deadline(worker, 100.0, 1000.0) == 700.0
    worker.extra_info = {"job_start": 900.0, "job_walltime": 300.0}     # the job ends at 1200: 200 s left
    assert deadline(worker, 100.0, 1000.0) == 300.0
    worker.extra_info["lifetime_end"] = 1050.0
    assert deadline(worker, 100.0, 1000.0) == 150.0
    worker.extra_info = {"job_start": 0.0, "job_walltime": 500.0}       # already past: give up at once
    assert deadline(worker, 100.0, 1000.0) == 100.0


def test_a_scheduler_shut_down_on_purpose_ends_its_clients_futures_at_once(processes):
    """SIGTERM is a shutdown, not a crash: the client is told, does not wait its reconnect window
    (600 s by default) and cancels its pending futures at once, saying so."""
    import signal
    first, address = processes.scheduler()
    with Client(address, secret=processes.secret, timeout=20) as c:
        future = c.submit(runs, "/", "never")                # no worker: it stays pending
        wait_until(lambda: c._lt.run(c._request({"op": "counts"}), 10).get("queued") == 1, what="the task")
        first.send_signal(signal.SIGTERM)
        error = future.exception(timeout=20)
        assert "the scheduler was shut down" in str(error) and c.status == "disconnected"


def test_the_client_keeps_a_spec_only_while_unfinished_work_needs_it():
    """SpecKeeper: a wanted spec goes with its result; an intermediate of a graph stays while a
    kept spec needs it and goes with the last of them; a finished input stays while an unfinished
    dependent needs it (it may have to be recomputed for it)."""
    from hpc_cluster.client.reattach import SpecKeeper

    def spec(key, deps=()):
        return {"key": key, "deps": list(deps)}
    k = SpecKeeper()
    k.add([spec("a"), spec("mid", ["a"]), spec("out1", ["mid"]), spec("out2", ["mid"])], ["a", "out1", "out2"])
    k.done("a")
    assert set(k.specs) == {"a", "mid", "out1", "out2"}      # a: out1 and out2 still need it (through mid)
    k.done("out1")
    assert set(k.specs) == {"a", "mid", "out2"}
    k.done("out2")
    assert k.specs == {} and k.pins == {}
    k.add([spec("x")], ["x"])
    k.done("x")
    k.add([spec("y", ["x"])], ["y"])                         # x finished before y came: not kept for it
    assert set(k.specs) == {"y"}


def test_a_resubmitted_task_waits_for_the_worker_that_holds_its_input(processes, tmp_path):
    """The client comes back before the worker (stopped meanwhile) that holds x, a finished
    future whose spec the client dropped; y, submitted during the outage, takes x as input. The
    new scheduler holds y's submission back until the worker reattaches with x: y runs on it and
    x is not computed again (it could not be: its spec is gone). Before, y failed at once with
    'input x was released before the task was submitted'."""
    import signal
    marks = tmp_path / "marks"
    marks.mkdir()
    first, address = processes.scheduler()
    port = int(address.rsplit(":", 1)[1])
    worker = processes.worker(address, "--no-nanny", "--reconnect-window", "60")
    with Client(address, secret=processes.secret, timeout=20) as c:
        c.wait_for_workers(1, 30)
        x = c.submit(marked, str(marks), "x", 1)
        assert x.result(30) == 10 and len(c._specs) == 0
        kill(first)
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            y = c.submit(marked, str(marks), "y", x)
            second, _ = processes.scheduler(port=port)
            wait_until(lambda: c.status == "running", what="the client to reattach")
            assert not y.done()
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        assert y.result(timeout=60) == 100
        assert (runs(marks, "x"), runs(marks, "y")) == (1, 1)
    kill(second)
