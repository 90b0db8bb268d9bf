"""Placement keywords on a real LocalCluster (issue 31, point 6): workers=, allow_other_workers=,
fifo_timeout=, batch_size=, actor= on submit, map, compute and persist, honoured as
distributed honours them or refused with the reason, and none of them, distributed's or ours,
ever passed to the user's function."""

from __future__ import annotations

import inspect
import socket
import uuid

import dask
import distributed
import pytest

from hpc_cluster import Client, LocalCluster
from hpc_cluster.client.graph import placement_keywords, task_where
from helpers.ask import worker_pids
from helpers.funcs import inc, kwargs_of, pid_of
from helpers.wait import wait_until

# Our keywords beside distributed's (duration, memory, pool; batch_size on submit too).
OURS = {"key", "pure", "retries", "priority", "resources", "duration", "memory", "pool", "workers",
        "allow_other_workers", "fifo_timeout", "batch_size", "actor", "actors"}


def own_keywords(method) -> set[str]:
    """The keywords a Client method takes for itself (not *args, **kwargs, the function)."""
    return {n for n, p in inspect.signature(method).parameters.items()
            if n not in ("self", "func") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def keyword_value(name: str, address: str) -> dict:
    """A value of `name` that runs on the shared cluster (with the keyword it needs, if any)."""
    values = {"key": f"kw-{uuid.uuid4().hex}", "workers": [address], "resources": {}, "retries": 1,
              "priority": 1, "fifo_timeout": "1 s", "allow_other_workers": True, "actor": False,
              "actors": False, "pure": False, "batch_size": 2, "duration": "10 s", "memory": "1 MB",
              "pool": "default"}
    assert name in values, f"a keyword with no value in this test: {name} (add one)"
    return {name: values[name], **({"workers": [address]} if name == "allow_other_workers" else {})}


# -- no keyword reaches the function ---------------------------------------------------------

def test_every_keyword_of_distributeds_submit_and_map_and_ours_is_kept_from_the_function(client):
    names = own_keywords(distributed.Client.submit) | own_keywords(distributed.Client.map) | OURS
    assert {"workers", "allow_other_workers", "fifo_timeout", "actor", "actors", "batch_size"} <= names
    address = sorted(worker_pids(client))[0]
    assert client.submit(kwargs_of, 1, other=5).result(30) == {"other": 5}      # the test can fail
    for name in sorted(names):
        given = {"pure": False, **keyword_value(name, address)}      # run each: no result shared
        assert client.submit(kwargs_of, 1, **given).result(30) == {}, name
        if name == "key":
            given["key"] = f"kw-{uuid.uuid4().hex}"                 # map's key= is a prefix
        assert client.gather(client.map(kwargs_of, [1, 2, 3], **given), timeout=30) == [{}] * 3, name
    everything = {k: v for n in sorted(names - {"key"}) for k, v in keyword_value(n, address).items()}
    assert client.submit(kwargs_of, 2, **everything).result(30) == {}
    assert client.gather(client.map(kwargs_of, [1, 2], **everything), timeout=30) == [{}, {}]


def test_our_signatures_take_every_keyword_of_distributeds():
    for method in ("submit", "map", "compute", "persist"):
        theirs = own_keywords(getattr(distributed.Client, method))
        ours = own_keywords(getattr(Client, method))
        assert theirs <= ours, (method, sorted(theirs - ours))


# -- workers= and allow_other_workers= ---------------------------------------------------------

def test_tasks_restricted_by_address_name_or_tuple_run_only_on_that_worker(client):
    pids = worker_pids(client)
    rows = client.scheduler_info()["workers"]
    first, second = sorted(pids)
    host, port = first.split("://")[1].rsplit(":", 1)
    for workers, expected in ((first, first), (rows[second]["name"], second), ([(host, int(port))], first),
                              (f"localhost:{port}", first)):
        futures = client.map(pid_of, range(8), workers=workers, pure=False)
        assert set(client.gather(futures, timeout=30)) == {pids[expected]}, workers


def test_a_task_restricted_to_this_host_runs(client):
    assert client.submit(pid_of, 1, workers=socket.gethostname(), pure=False).result(30) in worker_pids(client).values()


def test_a_task_no_live_worker_can_run_waits_and_why_says_so_unless_it_may_run_elsewhere(client):
    waiting = client.submit(inc, 1, workers=["nobody-here"], pure=False)
    note = wait_until(lambda: "no live worker is one of them" in client.why(waiting) and client.why(waiting))
    assert "workers=['nobody-here']" in note and "allow_other_workers=True" in note
    assert waiting.status == "pending"
    elsewhere = client.submit(inc, 1, workers=["nobody-here"], allow_other_workers=True, pure=False)
    assert elsewhere.result(30) == 2
    waiting.cancel()


def test_a_waiting_task_runs_on_the_worker_it_names_once_that_joins():
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as c:
        future = c.submit(pid_of, 1, workers="worker-1", pure=False)     # LocalCluster's next worker
        wait_until(lambda: "no live worker is one of them" in c.why(future))
        cluster.scale(2)
        c.wait_for_workers(2, timeout=60)
        new = next(a for a, row in c.scheduler_info()["workers"].items() if row["name"] == "worker-1")
        assert future.result(60) == worker_pids(c)[new]


def test_compute_persist_and_dask_annotate_honour_workers(client):
    pids = worker_pids(client)
    first, second = sorted(pids)

    def tasks():          # new keys each time: a key still held would be shared, wherever it ran
        return [dask.delayed(pid_of)(i, dask_key_name=f"where-{uuid.uuid4().hex}") for i in range(6)]
    assert set(client.compute(tasks(), workers=first, sync=True)) == {pids[first]}
    assert set(dask.compute(*tasks(), workers=[second])) == {pids[second]}
    with dask.annotate(workers=[first]):
        annotated = tasks()
    assert set(client.gather(client.compute(annotated))) == {pids[first]}
    persisted = client.persist(dask.delayed(pid_of)(1, dask_key_name=f"p-{uuid.uuid4().hex}"), workers=[second])
    assert persisted.compute() == pids[second]


def test_allow_other_workers_is_checked_as_distributed_checks_it(client):
    with pytest.raises(ValueError, match="allow_other_workers=True goes with workers="):
        client.submit(inc, 1, allow_other_workers=True)
    with pytest.raises(ValueError, match="allow_other_workers=True goes with workers="):
        client.map(inc, [1], allow_other_workers=True)
    with pytest.raises(TypeError, match="allow_other_workers='yes': give True or False"):
        client.submit(inc, 1, workers=["a"], allow_other_workers="yes")
    with pytest.raises(TypeError, match="workers=3.5: give a worker's address, name or host"):
        client.submit(inc, 1, workers=3.5)
    with pytest.raises(TypeError, match="workers= entry None"):
        client.compute(dask.delayed(inc)(1), workers=[None])


# -- actors, fifo_timeout, batch_size ---------------------------------------------------------

def test_actors_are_refused_with_the_reason(client):
    with pytest.raises(NotImplementedError, match="actor=True: hpc-cluster does not run actors"):
        client.submit(inc, 1, actor=True)
    with pytest.raises(NotImplementedError, match="actors=True: hpc-cluster does not run actors"):
        client.map(inc, [1], actors=True)
    with pytest.raises(NotImplementedError, match="does not run actors"):
        client.compute(dask.delayed(inc)(1), actors=True)


def test_fifo_timeout_and_batch_size_are_checked_and_batch_size_cuts_a_map(client):
    with pytest.raises(ValueError, match="fifo_timeout='soon': give a time such as '100 ms'"):
        client.submit(inc, 1, fifo_timeout="soon")
    with pytest.raises(ValueError, match="fifo_timeout=-1"):
        client.persist(dask.delayed(inc)(1), fifo_timeout=-1)
    with pytest.raises(TypeError, match="batch_size=0: give a whole number"):
        client.map(inc, [1], batch_size=0)
    sent = []
    real = client._submit

    def counting(specs, wanted):
        sent.append(len(specs))
        real(specs, wanted)
    client._submit = counting
    try:
        futures = client.map(inc, range(10), batch_size=3, pure=False)
    finally:
        del client._submit
    assert sent == [3, 3, 3, 1]                               # distributed's batches: a submission each
    assert client.gather(futures, timeout=30) == list(range(1, 11))
    assert client.compute(dask.delayed(inc)(1), fifo_timeout=0, batch_size=5, sync=True) == 2


# -- the client's reading of workers= (pure) ----------------------------------------------------

def test_task_where_reads_workers_as_distributed_does():
    assert task_where(None) == {} and task_where([]) == {}
    assert task_where("tcp://10.0.0.1:5") == {"workers": ["tcp://10.0.0.1:5"], "allow_other_workers": False}
    assert task_where([0, "bob", "bob"], True) == {"workers": ["0", "bob"], "allow_other_workers": True}
    assert task_where(("10.0.0.1", 5))["workers"] == ["10.0.0.1:5"]
    assert task_where("localhost:5")["workers"] == ["127.0.0.1:5"]
    assert task_where("tls://localhost:5")["workers"] == ["tls://127.0.0.1:5"]
    assert task_where("node017")["workers"] == ["node017"]                # a host or name: as written
    assert placement_keywords("100 ms", None) is None and placement_keywords(0, 7) == 7
