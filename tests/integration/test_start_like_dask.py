"""Starting a client as a dask.distributed program does (issue 31, point 1): Client() and its
LocalCluster keywords, processes=False, scheduler files, the current/default client, shutdown."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

import hpc_cluster
from hpc_cluster import Client, LocalCluster, TimeoutError, default_client, get_client, worker_client
from hpc_cluster.protocol import context
from helpers.funcs import inc, pid_of
from helpers.wait import wait_until

QUIET = {"dashboard_address": None}


def subtask_total(n):
    """Inside a task: submit n subtasks through get_client() and wait for them, seceded."""
    with worker_client() as client:
        return sum(client.gather(client.map(inc, range(n))))


def whose_task():
    """The worker a task's thread knows it runs for (protocol/context.py)."""
    ctx = context.worker()
    return None if ctx is None else ctx.address


def test_client_without_an_address_starts_a_cluster_it_owns_and_closes_it():
    with Client(n_workers=1, threads_per_worker=2, memory_limit="1GB", **QUIET) as c:
        cluster = c.cluster
        assert isinstance(cluster, LocalCluster) and cluster.status == "running"
        assert cluster.threads_per_worker == 2 and cluster.memory_limit == 10**9
        assert c.submit(inc, 1).result(timeout=30) == 2
        assert list(c.nthreads().values()) == [2]
        scheduler = cluster._scheduler
    assert c.status == "closed" and cluster.status == "closed"
    assert scheduler.poll() is not None                          # its processes ended with it


def test_processes_false_runs_the_workers_as_threads_of_this_process():
    with Client(processes=False, n_workers=2, threads_per_worker=1, **QUIET) as c:
        assert c.cluster.nanny is False and len(c.nthreads()) == 2
        assert c.submit(pid_of, 1, pure=False).result(timeout=30) == os.getpid()
        # Each task thread knows its own worker; the user's thread is no worker's.
        assert context.worker() is None
        where = {c.submit(whose_task, pure=False, workers=[a]).result(timeout=30) for a in c.nthreads()}
        assert where == set(c.nthreads())
        # get_client() and secede inside a task: on one thread per worker, the subtasks still run.
        assert c.submit(subtask_total, 10).result(timeout=60) == sum(range(1, 11))
        assert get_client() is c                                 # the user's thread: the default client
        # Threads have no pid of their own: none is handed out to be signalled (it is ours).
        assert c.cluster.worker_pids() == {}
        threads = c.cluster._threads.thread
    assert c.cluster.status == "closed" and not threads.is_alive()


def test_processes_false_defaults_to_one_worker_with_a_thread_per_core():
    with LocalCluster(processes=False, **QUIET) as cluster:
        assert (cluster.n_workers, cluster.threads_per_worker) == (1, os.cpu_count() or 1)


def test_bad_start_arguments_get_advice():
    with pytest.raises(ValueError, match="no worker process for a nanny"):
        Client(processes=False, nanny=True)
    with pytest.raises(TypeError, match="did you mean 'n_workers'") as info:
        Client(n_worker=2)
    assert "hands the keywords it does not take" in "".join(getattr(info.value, "__notes__", []))
    with pytest.raises(ValueError, match="Unexpected keyword arguments: \\['n_workers'\\]"):
        Client("tcp://127.0.0.1:1", n_workers=2)
    with pytest.raises(TypeError, match="worker_class=...\\) is distributed's and is not supported"):
        LocalCluster(worker_class=object)
    with pytest.raises(ValueError, match="tcp://"):
        LocalCluster(protocol="inproc://")
    with pytest.raises(ValueError, match="invalid value for global client timeout"):
        Client(timeout=None)


def test_distributeds_harmless_keywords_are_taken(tmp_path):
    # A program written for distributed passes these to Client(): it runs.
    with Client(n_workers=1, threads_per_worker=1, silence_logs=40, scheduler_port=0, ip="127.0.0.1",
                protocol="tcp://", name="mine", loop=None, heartbeat_interval=1000, direct_to_workers=True,
                connection_limit=10, **QUIET) as c:
        assert c.name == "mine" and c.submit(inc, 2).result(timeout=30) == 3


def test_scheduler_file_round_trip(client, tmp_path):
    path = tmp_path / "scheduler.json"
    client.write_scheduler_file(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600          # it holds the cluster's secret
    info = json.loads(path.read_text())
    assert info["type"] == "Scheduler" and info["address"] == client.scheduler_address
    assert set(info["workers"]) == set(client.nthreads()) and info["secret"]
    with pytest.raises(ValueError, match="already set"):
        client.write_scheduler_file(str(tmp_path / "other.json"))
    with Client(scheduler_file=str(path), set_as_default=False) as other:
        assert other.scheduler_address == client.scheduler_address
        assert other.submit(inc, 41).result(timeout=30) == 42


def test_a_scheduler_file_without_our_secret_takes_it_from_elsewhere(client, tmp_path):
    path = tmp_path / "dask-scheduler.json"
    path.write_text(json.dumps({"type": "Scheduler", "address": client.scheduler_address}))   # as dask writes it
    with Client(scheduler_file=str(path), secret=client._secret, set_as_default=False) as other:
        assert other.submit(inc, 1).result(timeout=30) == 2


def test_a_scheduler_file_that_never_appears_times_out(tmp_path):
    with pytest.raises(TimeoutError, match="did not appear within 0.3 s"):
        Client(scheduler_file=str(tmp_path / "never.json"), timeout=0.3)


def test_current_and_default_client(client, cluster):
    assert Client.current() is client and default_client() is client and get_client() is client
    assert get_client(client.scheduler_address) is client
    assert default_client(client) is client
    # The fixture's `with Client(...)` makes it this thread's current client, as distributed's does
    # (outside such a block allow_global=False raises: test_distributed_gaps.py).
    assert Client.current(allow_global=False) is client
    with Client(cluster, set_as_default=False) as other:
        with other.as_current():
            assert Client.current(allow_global=False) is other and Client.current() is other
        assert Client.current() is client


def test_shutdown_of_a_client_made_from_an_address_ends_the_scheduler_and_workers():
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, **QUIET)
    try:
        c = Client(cluster.scheduler_address, secret=cluster.secret, set_as_default=False)
        assert c.submit(inc, 1).result(timeout=30) == 2
        c.shutdown()
        assert c.status == "closed"
        wait_until(lambda: cluster._scheduler.poll() is not None, 30, "the scheduler process to exit")
        wait_until(lambda: all(p.poll() is not None for p in cluster.workers.values()), 30,
                   "the worker processes to exit")
    finally:
        cluster.close()


def test_shutdown_of_a_client_with_its_own_cluster_closes_it():
    c = Client(processes=False, n_workers=1, **QUIET)
    c.shutdown()
    assert c.status == "closed" and c.cluster.status == "closed"


def test_the_package_root_hands_out_the_client_that_can_start_clusters():
    from hpc_cluster.client import starting
    assert hpc_cluster.Client is Client and starting._starter is LocalCluster
    # The client package alone does not know deploy (the layering): Client() there says what to do.
    code = ("from hpc_cluster.client.client import Client\ntry:\n    Client()\nexcept RuntimeError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "from hpc_cluster import Client" in out.stdout
