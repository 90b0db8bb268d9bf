"""A worker's task threads, with real processes: what happens to a task given up on while
its thread still runs."""

from __future__ import annotations

import os
import time

from hpc_cluster import Client, LocalCluster

from waiting import wait_until


def gated(gate: str, runs: str) -> str:
    """Record a run, then wait (up to 60 s) until the test opens the gate."""
    with open(runs, "a") as f:
        f.write("run\n")
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "done"


def test_a_task_submitted_again_while_its_released_thread_runs_finishes_once(tmp_path):
    # Found in an audit: the scheduler sent the new submission to the worker whose thread
    # still ran the released task; the worker ignored it and the future never finished.
    gate, runs = str(tmp_path / "gate"), str(tmp_path / "runs")
    with LocalCluster(n_workers=1, threads_per_worker=1, nanny=False) as cluster, Client(cluster) as client:
        fut = client.submit(gated, gate, runs)
        key = fut.key
        wait_until(lambda: os.path.exists(runs), what="the task to start")
        del fut                                          # released while its thread runs
        wait_until(lambda: all(w["processing"] == 0 for w in client.scheduler_info()["workers"].values()),
                   what="the scheduler to give the task up")
        again = client.submit(gated, gate, runs)
        assert again.key == key
        # The worker takes the running thread over and says it is executing the task again.
        wait_until(lambda: all(w["executing"] == 1 for w in client.scheduler_info()["workers"].values()),
                   what="the worker to report the running thread as executing the task again")
        open(gate, "w").close()
        assert again.result(timeout=30) == "done"
        with open(runs) as f:
            assert f.read().count("run") == 1            # the running thread's result was used
