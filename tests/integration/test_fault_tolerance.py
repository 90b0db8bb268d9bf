"""Worker deaths with real processes and real signals: what is noticed, charged and recomputed."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from hpc_cluster import CancelledError, Client, KilledWorker, LocalCluster, LostDataError
from helpers.ask import worker_pids
from helpers.funcs import add, hog, inc, segfault, slow
from helpers.wait import wait_until


def slow_plus(x, y, delay=1.0):
    return slow(x + y, delay)


def exit_one(x):
    os._exit(1)


def holder_of(client, future) -> str:
    return client._lt.run(client._request({"op": "who-has", "keys": [future.key]}))[future.key][0]


def test_segfault_is_a_crash_charged_to_the_task_only(tmp_path):
    with LocalCluster(n_workers=2, threads_per_worker=1, allowed_failures=1) as cluster, Client(cluster) as c:
        others = c.map(slow, range(6), [0.2] * 6)
        bad = c.submit(segfault, 1)
        with pytest.raises(KilledWorker) as info:
            bad.result(60)
        exc = info.value
        assert exc.cause == "crash" and len(exc.attempts) == 2
        assert "SIGSEGV" in str(exc) and bad.key in str(exc)
        assert c.gather(others) == list(range(6))          # innocent tasks finished
        deaths = [d for d in c.deaths() if d["cause"] == "crash"]
        assert len(deaths) == 2 and all(d["executing"] == [bad.key] and d["blame"] for d in deaths)
        assert any("signal 11 (SIGSEGV)" in fact for fact in deaths[0]["evidence"])
        # The worker's faulthandler stack, kept by its nanny, says where the task crashed.
        final = wait_until(lambda: [d for d in c.deaths() if d["cause"] == "crash" and d["final_at"]])
        # (A log line over its width is cut in the middle, so the frames are matched, not the words
        # before them: how much is cut depends on how long the task's file's path is.)
        assert any("string_at (ctypes/__init__.py:" in fact
                   and "<- segfault (helpers/funcs.py:" in fact for fact in final[0]["evidence"]), \
            final[0]["evidence"]


def test_nonzero_exit_while_running_is_a_crash():
    with LocalCluster(n_workers=1, threads_per_worker=1, allowed_failures=0) as cluster, Client(cluster) as c:
        with pytest.raises(KilledWorker, match="exited with code 1") as info:
            c.submit(exit_one, 1).result(60)
        assert info.value.cause == "crash"
        assert c.submit(inc, 1).result(30) == 2           # the nanny started a fresh worker


def test_nanny_memory_kill_is_reported_and_blamed():
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="400MB",
                      allowed_failures=0) as cluster, Client(cluster) as c:
        with pytest.raises(KilledWorker) as info:
            c.submit(hog, 600 * 2**20, hold=30).result(60)
        assert info.value.cause == "memory-nanny"
        assert "over its budget" in str(info.value)
        wait_until(lambda: "Worker exceeded 95% memory budget. Restarting" in cluster.logs()["worker-0"],
                   what="the nanny's log line")
        death = c.deaths()[0]
        assert death["cause"] == "memory-nanny" and death["blame"]
        assert any("killed by the nanny over its memory budget" in f for f in death["evidence"])
        assert c.submit(inc, 1).result(30) == 2


def busy_worker(c) -> str:
    """The address of a worker executing a task, once one is."""
    return wait_until(lambda: next((a for a, w in c.scheduler_info()["workers"].items() if w["executing"]), None),
                      what="a task to start")


def test_sigkill_from_outside_is_noticed_at_once_and_not_charged():
    with LocalCluster(n_workers=2, threads_per_worker=1, allowed_failures=0) as cluster, Client(cluster) as c:
        long = c.submit(slow, 42, 3.0, pure=False)
        victim = busy_worker(c)
        killed_at = time.time()
        os.kill(worker_pids(c)[victim], signal.SIGKILL)
        assert long.result(60) == 42                      # rerun elsewhere, not failed
        death = wait_until(lambda: [d for d in c.deaths() if d["worker"] == victim], what="the death")[0]
        assert death["time"] - killed_at < 4.0            # the connection closed; no TTL (5 s) needed
        wait_until(lambda: c.deaths()[0]["cause"] == "unknown", what="the nanny's report")
        assert not c.deaths()[0]["blame"] and "SIGKILL" in c.deaths()[0]["text"]


def test_sigstopped_worker_is_lost_after_heartbeat_ttl():
    with LocalCluster(n_workers=2, threads_per_worker=1, heartbeat_ttl=2.0, nanny=False) as cluster, \
            Client(cluster) as c:
        long = c.submit(slow, 7, 2.0, pure=False)
        victim = busy_worker(c)
        pid = worker_pids(c)[victim]
        stopped_at = time.time()
        os.kill(pid, signal.SIGSTOP)
        try:
            assert long.result(30) == 7
            death = wait_until(lambda: [d for d in c.deaths() if d["worker"] == victim], what="the death")[0]
            assert death["cause"] == "heartbeat-lost" and not death["blame"]
            # The TTL runs from the last heartbeat (sent every 0.5 s), not from the SIGSTOP.
            assert 1.5 <= death["time"] - stopped_at < 10
        finally:
            os.kill(pid, signal.SIGCONT)


def test_a_silent_worker_is_ended_by_its_nanny_and_replaced():
    with LocalCluster(n_workers=2, threads_per_worker=1, heartbeat_ttl=2.0) as cluster, Client(cluster) as c:
        long = c.submit(slow, 7, 2.0, pure=False)
        victim = busy_worker(c)
        pid = worker_pids(c)[victim]
        os.kill(pid, signal.SIGSTOP)
        try:
            assert long.result(30) == 7
            death = wait_until(lambda: [d for d in c.deaths() if d["worker"] == victim and d["final_at"]],
                               timeout=20, what="a final verdict")[0]
            assert death["cause"] == "heartbeat-lost" and not death["blame"]
            assert "its nanny found the process stopped and ended it" in death["text"], death["text"]
            # The verdict no longer waits on a batch system that would keep saying "running".
            assert death["final_at"] - death["time"] < 5
            wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
                       what="the stopped process to be gone")
            wait_until(lambda: len(c.scheduler_info()["workers"]) == 2, timeout=30,
                       what="the nanny's fresh worker")
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def test_the_nanny_restarts_a_worker_killed_again_and_again():
    # Found by the chaos test: nannies gave up after 5 deaths within a minute, leaving no
    # worker at all. A worker that was running is restarted however often it dies.
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as c:
        for i in range(7):
            pid = wait_until(lambda: list(worker_pids(c).values()), what=f"worker {i + 1} to connect")[0]
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: pid not in worker_pids(c).values(), what="the death to be noticed")
        assert c.submit(inc, 1).result(30) == 2
        assert len(c.deaths()) == 7


def test_a_nanny_whose_worker_cannot_start_gives_up():
    import asyncio

    from hpc_cluster.worker.nanny import Nanny

    nanny = Nanny(["--no-such-option"], max_startup_failures=3)      # argparse exits 2 at once
    assert asyncio.run(asyncio.wait_for(nanny.run(), 60)) == 1
    assert len(nanny.reports) == 3
    assert all(r["exit_code"] == 2 and not r["registered"] for r in nanny.reports)
    assert "python -m hpc_cluster.worker: error:" in nanny.reports[-1]["log_tail"][-1]


def test_results_lost_with_a_worker_are_recomputed_from_lineage():
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as c:
        xs = c.map(inc, range(20))
        ys = [c.submit(add, x, 100) for x in xs]
        c.gather(ys)
        victim = holder_of(c, ys[0])
        os.kill(worker_pids(c)[victim], signal.SIGKILL)
        wait_until(lambda: victim not in c.scheduler_info()["workers"], what="the worker's removal")
        total = c.submit(sum, ys)
        assert total.result(60) == sum(i + 1 + 100 for i in range(20))
        assert c.gather(ys) == [i + 1 + 100 for i in range(20)]


def test_only_executing_tasks_are_charged_not_queued_ones():
    with LocalCluster(n_workers=1, threads_per_worker=1, allowed_failures=0) as cluster, Client(cluster) as c:
        base = c.submit(int, 0)
        assert base.result(30) == 0
        bad = c.submit(segfault, 0)
        # tasks with an input are prefetched behind it (root tasks would wait for a thread)
        queued = [c.submit(slow_plus, base, i, 0.05, pure=False) for i in range(4)]
        with pytest.raises(KilledWorker):
            bad.result(60)
        assert c.gather(queued) == list(range(4))
        death = c.deaths()[0]
        assert death["executing"] == [bad.key]
        assert set(death["processing"]) > {bad.key}       # others were there, queued


def test_scattered_data_lost_with_its_only_holder_raises_lost_data():
    with LocalCluster(n_workers=2, threads_per_worker=1, nanny=False) as cluster, Client(cluster) as c:
        data = c.scatter([1, 2, 3, 4])
        target = data[0]
        dependent = c.submit(add, target, 1)
        assert dependent.result(10) == 2
        victim = holder_of(c, target)
        os.kill(worker_pids(c)[victim], signal.SIGKILL)
        with pytest.raises(LostDataError, match="replicate"):
            wait_until(lambda: target.status == "error", what="the loss to be reported")
            target.result(10)
        with pytest.raises(LostDataError):
            c.submit(add, target, 2).result(10)


def test_replicate_keeps_copies_and_restores_them():
    with LocalCluster(n_workers=3, threads_per_worker=1, nanny=False) as cluster, Client(cluster) as c:
        [d] = c.scatter(["precious"])
        c.replicate([d], n=2)
        holders = c._lt.run(c._request({"op": "who-has", "keys": [d.key]}))[d.key]
        assert len(holders) == 2
        os.kill(worker_pids(c)[holders[0]], signal.SIGKILL)
        wait_until(lambda: holders[0] not in c.scheduler_info()["workers"], what="the removal")
        assert d.result(10) == "precious"
        wait_until(lambda: len(c._lt.run(c._request({"op": "who-has", "keys": [d.key]}))[d.key]) == 2,
                   what="the second copy to be restored")


def test_restart_restarts_workers_and_cancels_futures():
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as c:
        before = worker_pids(c)
        pending = c.submit(slow, 1, 30, pure=False)
        done = c.submit(inc, 1)
        done.result(10)
        c.restart(timeout=60)
        after = worker_pids(c)
        assert len(after) == 2 and not set(after.values()) & set(before.values())
        with pytest.raises(CancelledError, match="restarted"):
            pending.result(10)
        assert c.submit(inc, 10).result(10) == 11
        assert all(d["cause"] == "retired" for d in c.deaths())


def test_restart_without_nanny_says_it_cannot():
    with LocalCluster(n_workers=1, threads_per_worker=1, nanny=False) as cluster, Client(cluster) as c:
        c.submit(inc, 1).result(10)
        with pytest.warns(RuntimeWarning, match="without a nanny and cannot be restarted"):
            c.restart(timeout=10)
        assert c.submit(inc, 2).result(10) == 3


def test_worker_logs_including_a_dead_workers_last_lines():
    with LocalCluster(n_workers=1, threads_per_worker=1, allowed_failures=0) as cluster, Client(cluster) as c:
        logs = c.get_worker_logs()
        assert any("connected to" in line for lines in logs.values() for line in lines)
        with pytest.raises(KilledWorker):
            c.submit(segfault, 3).result(60)
        wait_until(lambda: any("died: crash" in k for k in c.get_worker_logs()), what="the dead worker's tail")


def one_over_pred(v):
    return 1 / (v - 1)


def _traceback_frames(tb) -> list[tuple[str, str]]:
    out = []
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_name, tb.tb_frame.f_code.co_filename))
        tb = tb.tb_next
    return out


def test_recreate_error_locally_reruns_with_real_inputs(client):
    x = client.submit(inc, 0)
    bad = client.submit(one_over_pred, x)
    dependent = client.submit(inc, bad)
    with pytest.raises(ZeroDivisionError) as remote:
        dependent.result(10)
    # Re-raised from the worker, the task's frame is a stand-in named as the remote one
    # (client/tracebacks.py): none of the task's locals are here...
    stand_in = remote.tb
    while stand_in.tb_next is not None:
        stand_in = stand_in.tb_next
    assert stand_in.tb_frame.f_code.co_name == "one_over_pred" and "v" not in stand_in.tb_frame.f_locals
    with pytest.raises(ZeroDivisionError) as info:
        client.recreate_error_locally(dependent)
    # ...run again in this process, the traceback ends in it, called with the real input (1).
    frames = _traceback_frames(info.tb)
    assert frames[-1] == ("one_over_pred", __file__), frames
    assert info.tb.tb_next is not None
    last = info.tb
    while last.tb_next is not None:
        last = last.tb_next
    assert last.tb_frame.f_locals["v"] == 1


def test_versions_are_reported_and_strict_refuses_a_mismatch(cluster):
    import asyncio

    from hpc_cluster.protocol.comm import AuthenticationError, connect
    from hpc_cluster.protocol.versions import get_versions

    with Client(cluster) as c:
        v = c.get_versions(check=True)
        assert set(v) == {"scheduler", "workers", "client"} and len(v["workers"]) == 2
    with LocalCluster(n_workers=0, versions="strict") as strict:
        fake = dict(get_versions(), tornado="1.0")
        with pytest.raises(AuthenticationError, match=r"(?s)versions differ.*tornado\s+\S+\s+1\.0"):
            asyncio.run(connect(strict.scheduler_address, strict.secret, {"role": "client", "versions": fake}))
        with Client(strict) as ok:                        # matching versions are let in
            assert ok.scheduler_info()["workers"] == {}


def test_knobs_come_from_environment_and_config_file(monkeypatch, tmp_path):
    cfg = tmp_path / "site.yaml"
    cfg.write_text("settings:\n  heartbeat_ttl: 7\n  allowed_failures: 2\n")
    monkeypatch.setenv("HPC_CLUSTER_ALLOWED_FAILURES", "0")          # env beats the file
    with LocalCluster(n_workers=1, threads_per_worker=1, config=str(cfg)) as cluster, Client(cluster) as c:
        assert cluster.settings["heartbeat_ttl"] == 7 and cluster.settings["allowed_failures"] == 0
        with pytest.raises(KilledWorker) as info:
            c.submit(segfault, 9).result(60)
        assert len(info.value.attempts) == 1
    with pytest.raises(TypeError, match="did you mean 'allowed_failures'"):
        LocalCluster(n_workers=0, config=str(cfg), **{"allowed_failure": 1})
