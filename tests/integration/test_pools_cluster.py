"""Placement by memory= on a real LocalCluster whose workers have different memory limits
(issue 15): submit, map, dask.annotate and compute all reach the scheduler's placement."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dask
import pytest

from hpc_cluster import Client, LocalCluster
from hpc_cluster.protocol import context
from hpc_cluster.units import parse_memory

from helpers.wait import wait_until  # noqa: E402


def where():
    return context.worker().address


@pytest.fixture(scope="module")
def two_sizes():
    # LocalCluster gives every worker one memory_limit; the second worker is started after
    # raising it, so the cluster has a 1 GB and a 3 GB worker.
    cluster = LocalCluster(n_workers=1, threads_per_worker=2, memory_limit="1GB")
    try:
        cluster.memory_limit = parse_memory("3GB")
        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            limits = {a: w["memory_limit"] for a, w in client.scheduler_info()["workers"].items()}
            assert sorted(limits.values()) == [10**9, 3 * 10**9]
            big = next(a for a, m in limits.items() if m == 3 * 10**9)
            yield client, big
    finally:
        cluster.close()


def test_memory_places_tasks_only_on_a_worker_that_holds_them(two_sizes):
    client, big = two_sizes
    futures = [client.submit(where, memory="2GB", pure=False) for _ in range(4)]
    futures += client.map(lambda i: where(), range(4), memory="1.5GB")
    assert set(client.gather(futures)) == {big}
    # Without memory= both workers are used.
    assert len(set(client.gather(client.map(lambda i: (time.sleep(0.2), where())[1], range(8))))) == 2


def test_memory_through_dask_annotate_compute_and_persist(two_sizes):
    client, big = two_sizes
    with dask.annotate(memory="2GB"):
        annotated = [dask.delayed(where, pure=False)() for _ in range(3)]
    assert set(dask.compute(*annotated)) == {big}
    assert set(client.gather(client.compute([dask.delayed(where, pure=False)() for _ in range(3)],
                                            memory="2GB"))) == {big}
    persisted = client.persist([dask.delayed(where, pure=False)() for _ in range(3)], memory="2GB")
    assert set(dask.compute(*persisted)) == {big}


def test_a_task_no_worker_can_hold_waits_and_a_bad_value_is_refused_where_it_is_written(two_sizes):
    client, _ = two_sizes
    future = client.submit(where, memory="8GB", pure=False)
    time.sleep(0.5)
    assert future.status == "pending"            # no pools known (LocalCluster): it waits, as resources= do
    client.cancel(future)
    with pytest.raises(ValueError, match="memory='lots'"):
        client.submit(where, memory="lots")
    with pytest.raises(TypeError, match="pool="):
        client.submit(where, pool=3)
    assert client.submit(where, pool="default", pure=False).result(timeout=30)  # its workers' pool


def test_dask_annotations_and_compute_keywords_carry_every_need_to_the_wire():
    from hpc_cluster.client.graph import graph_tasks

    with dask.annotate(memory="2GB", pool="bigmem", duration="5m"):
        annotated = dask.delayed(sum, pure=True)([1, 2])
    plain = dask.delayed(max, pure=True)([1, 2])
    specs, _ = graph_tasks(annotated, lambda f: b"f")
    assert {(s["memory"], s["pool"], s["duration"]) for s in specs} == {(2 * 10**9, "bigmem", 300.0)}
    specs, _ = graph_tasks(plain, lambda f: b"f", {"memory": "1GiB", "pool": "long"})
    assert {(s["memory"], s["pool"], "duration" in s) for s in specs} == {(2**30, "long", False)}
    with pytest.raises(ValueError, match="memory='lots'"):
        graph_tasks(plain, lambda f: b"f", {"memory": "lots"})


def hog_where(nbytes):
    block = bytearray(nbytes)           # touched pages: real RSS
    for i in range(0, nbytes, 4096):
        block[i] = 1
    time.sleep(0.5)
    return where()


class InProcessScheduler:
    """A scheduler on an event loop in this process, so the test can give it pools (the
    deploy half's daemon does the same) and read its state."""

    def __init__(self, **kwargs):
        from hpc_cluster.scheduler.server import Scheduler
        self.secret = os.urandom(32)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.sched = Scheduler(self.secret, **kwargs)
        self.address = self.run(self.sched.start())

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def call(self, fn):
        """fn() on the scheduler's loop (its state is the loop's alone)."""
        async def go():
            return fn()
        return self.run(go())

    def close(self):
        self.run(self.sched.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def start_worker(address, secret, name, memory_limit, log_dir):
    from hpc_cluster.deploy.local.cluster import _child_env
    with open(log_dir / f"{name}.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "hpc_cluster.worker", "--scheduler", address, "--name", name,
                                 "--nthreads", "1", "--memory-limit", memory_limit, "--nanny",
                                 "--owner-pid", str(os.getpid())],
                                env=_child_env(secret), stdout=log, stderr=log, stdin=subprocess.DEVNULL)


def test_a_task_its_nanny_ended_for_memory_finishes_on_a_worker_of_the_bigger_pool(tmp_path):
    # allowed_failures=0: without the move, the first memory death would fail the task.
    s = InProcessScheduler(allowed_failures=0)
    state = s.sched.state
    # Workers of a pool say so with --pool (the deploy half's flag); here, by their name.
    add_worker = state.add_worker

    def add_named(address, nthreads, now, **kw):
        kw["info"] = dict(kw.get("info") or {}, pool="bigmem" if kw.get("name", "").startswith("big") else "default")
        return add_worker(address, nthreads, now, **kw)

    state.add_worker = add_named
    s.call(lambda: state.set_pools({"default": {"memory": 300 * 10**6, "nthreads": 1},
                                    "bigmem": {"memory": 1500 * 10**6, "nthreads": 1}}))
    procs = [start_worker(s.address, s.secret, "small", "300MB", tmp_path)]
    try:
        with Client(s.address, secret=s.secret) as client:
            client.wait_for_workers(1, timeout=60)
            future = client.submit(hog_where, 400 * 2**20, pure=False)
            # Its nanny ends the 300 MB worker; the verdict moves the task, and the big pool is
            # asked for a worker (no job manager here: the test starts it).
            wait_until(lambda: s.call(state.pool_demand)["bigmem"] == 1, timeout=60, what="demand for bigmem")
            assert future.status == "pending"
            procs.append(start_worker(s.address, s.secret, "big", "1.5GB", tmp_path))
            ran_on = future.result(timeout=90)
            assert client.scheduler_info()["workers"][ran_on]["name"] == "big"
            death = next(d for d in client.deaths() if d.get("escalation"))
            assert death["cause"] == "memory-nanny" and death["pool"] == "default" and death["peak_memory"]
            assert death["escalation"].startswith("attempt 2 on bigmem (1.5 GB) after memory-nanny at "), death
            why = client.why(future)
            assert "in pool default: memory-nanny (moved, not charged)" in why and "escalation: attempt 2" in why
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        s.close()
