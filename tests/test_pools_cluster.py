"""Placement by memory= on a real LocalCluster whose workers have different memory limits
(issue 15): submit, map, dask.annotate and compute all reach the scheduler's placement."""

from __future__ import annotations

import time

import dask
import pytest

from hpc_cluster import Client, LocalCluster
from hpc_cluster.protocol import context
from hpc_cluster.units import parse_memory


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


def test_memory_through_dask_annotate_and_compute(two_sizes):
    client, big = two_sizes
    with dask.annotate(memory="2GB"):
        annotated = [dask.delayed(where, pure=False)() for _ in range(3)]
    assert set(dask.compute(*annotated)) == {big}
    assert set(client.gather(client.compute([dask.delayed(where, pure=False)() for _ in range(3)],
                                            memory="2GB"))) == {big}


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
    from hpc_cluster.graph import graph_tasks

    with dask.annotate(memory="2GB", pool="bigmem", duration="5m"):
        annotated = dask.delayed(sum, pure=True)([1, 2])
    plain = dask.delayed(max, pure=True)([1, 2])
    specs, _ = graph_tasks(annotated, lambda f: b"f")
    assert {(s["memory"], s["pool"], s["duration"]) for s in specs} == {(2 * 10**9, "bigmem", 300.0)}
    specs, _ = graph_tasks(plain, lambda f: b"f", {"memory": "1GiB", "pool": "long"})
    assert {(s["memory"], s["pool"], "duration" in s) for s in specs} == {(2**30, "long", False)}
    with pytest.raises(ValueError, match="memory='lots'"):
        graph_tasks(plain, lambda f: b"f", {"memory": "lots"})
