"""Submissions larger than one message (issue 14, point 4): a map or a dask graph of more
tasks than a message may carry frames is split into bounded messages; a task no message
could carry is refused at submission, naming the limit. Real LocalClusters."""

from __future__ import annotations

import time

import pytest

from hpc_cluster import Client, LocalCluster
from hpc_cluster.protocol.frames import Limits, MessageTooLargeError
from helpers.ask import task_counts
from helpers.funcs import add_all, inc
from helpers.wait import wait_until


@pytest.fixture(scope="module")
def idle_cluster():
    # No workers: the tasks wait at the scheduler, so counting them there is quick and
    # proves each one arrived, without spending a minute running them.
    with LocalCluster(n_workers=0, timeout=60) as c:
        yield c


def test_map_over_the_frame_limit_reaches_the_scheduler_whole(idle_cluster):
    n = Limits().max_frames + 20_000       # one message would be 120,002 frames: dropped before
    with Client(idle_cluster) as client:
        futures = client.map(inc, range(n))
        assert len({f.key for f in futures}) == n
        wait_until(lambda: sum(task_counts(client, timeout=30).values()) >= n or client.status != "running", 60,
                   "the map's tasks at the scheduler")
        assert client.status == "running"
        assert task_counts(client, timeout=30) == {"queued": n}
        del futures
        wait_until(lambda: not task_counts(client, timeout=30), 30, "the released tasks to be forgotten")


def test_dask_graph_over_the_frame_limit_reaches_the_scheduler_whole(idle_cluster):
    n = Limits().max_frames + 5_000
    # Two layers: each sum depends on inputs that land in other parts of the submission.
    graph = {("x", i): (inc, i) for i in range(n - 1000)}
    graph.update({("s", j): (add_all, *[("x", i) for i in range(j, n - 1000, 1000)]) for j in range(1000)})
    with Client(idle_cluster) as client:
        futures = client.get(graph, [("s", j) for j in range(1000)], sync=False)
        wait_until(lambda: sum(task_counts(client, timeout=30).values()) >= n or client.status != "running", 60,
                   "the graph's tasks at the scheduler")
        assert client.status == "running"
        counts = task_counts(client, timeout=30)
        # every sum waits on its inputs: none was submitted before them, none lost its inputs
        assert counts == {"queued": n - 1000, "waiting": 1000}, counts
        del futures


@pytest.fixture(scope="module")
def small_cluster():
    with LocalCluster(n_workers=1, threads_per_worker=2, memory_limit="1GB", max_message_bytes="4MiB") as c:
        yield c


def test_parts_run_right_when_later_parts_need_earlier_tasks(small_cluster, monkeypatch):
    import hpc_cluster.client.submission as submission
    monkeypatch.setattr(submission, "CHUNK_TASKS", 50)
    with Client(small_cluster) as client:
        assert client.gather(client.map(inc, range(333))) == list(range(1, 334))
        # A tree whose inner nodes nobody holds a future to, listed root first (not in
        # topological order), cut into parts of 50: every part needs tasks of earlier ones.
        graph, level, width = {}, [("leaf", i) for i in range(256)], 0
        for i in range(256):
            graph[("leaf", i)] = (inc, i)
        while len(level) > 1:
            width += 1
            nxt = []
            for j in range(0, len(level), 2):
                graph[("node", width, j)] = (add_all, level[j], level[j + 1])
                nxt.append(("node", width, j))
            level = nxt
        graph = dict(reversed(list(graph.items())))
        assert client.get(graph, level[0]) == sum(range(1, 257))
        # The tasks carried between parts were released afterwards: nothing is left behind.
        wait_until(lambda: not task_counts(client, timeout=30), 20, "every task to be forgotten")


def test_a_task_no_message_can_carry_is_refused_naming_the_limit(small_cluster):
    with Client(small_cluster) as client:
        started = time.monotonic()
        with pytest.raises(MessageTooLargeError, match=r"max_message_bytes = 4\.00 MiB.*scatter"):
            client.submit(len, b"x" * (8 * 2**20))
        with pytest.raises(MessageTooLargeError, match="max_message_bytes"):
            client.map(len, [b"y", b"z" * (8 * 2**20)])
        assert time.monotonic() - started < 10
        # The session goes on: nothing was sent, nothing dropped.
        assert client.submit(inc, 1).result(timeout=20) == 2
        assert client.status == "running"


def _blob_cache():
    """func_blob_of as the Client's: one pickle per function object."""
    from hpc_cluster.protocol import serialize
    blobs: dict = {}
    return lambda f: blobs.setdefault(id(f), (f, serialize.dumps_function(f)))[1]


def _sized(pad, x):
    return len(pad) + x


def test_a_graphs_nodes_send_their_shared_function_once():
    """Issue 19: each node of a graph carried its function by value (helpers/funcs.py's `inc`:
    ~450 B) in its own pickle, and the scheduler held a copy per task (1,871 B per waiting
    task of a 1,000,000-task graph; 933 B once the nodes share one function payload)."""
    import functools

    from dask._task_spec import Task

    from hpc_cluster.client.graph import GraphCall, graph_tasks, run_graph_node
    from hpc_cluster.protocol import serialize
    blob_of = _blob_cache()
    graph = {("leaf", i): Task(("leaf", i), inc, i) for i in range(2000)}
    big = functools.partial(_sized, b"x" * 10_000)            # pickles over PULL_BELOW
    graph[("big", 0)] = Task(("big", 0), big, 1)
    specs, wire = graph_tasks(graph, blob_of)
    leaves = [s for s in specs if s["key"].startswith("('leaf'")]
    assert len(leaves) == 2000 and len({id(s["func"]) for s in leaves}) == 1
    call = serialize.loads(leaves[0]["func"])
    assert isinstance(call, GraphCall) and call.func.__name__ == "inc"
    # The function went by value (its file's name inside it); the nodes no longer carry it.
    assert inc.__code__.co_filename.encode() in leaves[0]["func"]
    assert not any(__file__.encode() in s["args"] for s in leaves)
    assert max(len(s["args"]) for s in leaves) < len(leaves[0]["func"])
    # The user's graph is as it was; a function too large to share stays in its node.
    assert all(node.func is inc for key, node in graph.items() if key[0] == "leaf")
    (whole,) = [s for s in specs if s["key"] == wire[("big", 0)]]
    assert whole["func"] == blob_of(run_graph_node) and len(whole["args"]) > 10_000


def _kw(a, b=0, *, scale=1):
    return (a + b) * scale


def test_graphs_with_shared_functions_compute_right_on_workers(small_cluster):
    """Every kind of node runs the same with its function sent apart: keyword arguments, a
    task nested in another's arguments, data nodes, aliases, a partial, a lambda, a function
    too large to share, and tasks of dask.array."""
    import functools

    import dask.array as da
    from dask._task_spec import Alias, DataNode, Task, TaskRef

    double = functools.partial(_kw, scale=2)
    graph = {
        "a": DataNode("a", 5),
        "b": Task("b", _kw, TaskRef("a"), b=3, scale=10),                    # (5 + 3) * 10
        "c": Task("c", add_all, TaskRef("b"), Task("c-in", inc, TaskRef("a"))),   # 80 + 6
        "d": Task("d", double, TaskRef("c")),                                 # 172
        "e": Task("e", lambda v: -v, TaskRef("d")),
        "f": Alias("f", "e"),
        "g": Task("g", functools.partial(_sized, b"y" * 10_000), TaskRef("a")),
        **{("h", i): Task(("h", i), _kw, i, b=i) for i in range(50)},
    }
    with Client(small_cluster) as client:
        assert client.get(graph, ["b", "c", "d", "e", "f", "g"]) == [80, 86, 172, -172, -172, 10_005]
        assert client.get(graph, [("h", i) for i in range(50)]) == [2 * i for i in range(50)]
        x = da.arange(10_000, chunks=500)
        assert client.compute((x * 2 + 1).sum()).result(timeout=60) == sum(2 * i + 1 for i in range(10_000))
