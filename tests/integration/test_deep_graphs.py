"""Deep graphs and deep nestings: no code path recurses per level (issue 14, point 3).

Each depth is well past Python's default recursion limit (1,000), so a recursive walk fails
here with RecursionError, and every test checks that nothing is left behind.
"""

import sys

from hpc_cluster import Client, LocalCluster
from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.scheduler.state.ahead import AHEAD_DEPTH
from hpc_cluster.scheduler.state import SchedulerState
from helpers.ask import task_counts
from helpers.funcs import inc
from helpers.wait import wait_for_file, wait_until

F, A = Opaque(b"f"), Opaque(b"a")
DEPTH = 3000
assert DEPTH > 2 * sys.getrecursionlimit()


def chain(n, prefix="t"):
    """t0 <- t1 <- ... <- t{n-1}: each task the input of the next."""
    return [{"key": f"{prefix}{i}", "func": F, "args": A, "deps": [f"{prefix}{i - 1}"] if i else []}
            for i in range(n)]


def test_releasing_a_deep_waiting_chain_forgets_every_record():
    s = SchedulerState(prefetch=0)
    s.update_graph("c", chain(DEPTH), [f"t{DEPTH - 1}"])       # no worker: all waiting
    assert s.counts() == {"queued": 1, "waiting": DEPTH - 1}
    s.client_releases("c", [f"t{DEPTH - 1}"])
    assert s.tasks == {}


def test_closing_the_client_of_a_deep_chain_forgets_every_record():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.add_client("c")
    s.update_graph("c", chain(DEPTH), [f"t{DEPTH - 1}", "t0"])
    s.task_finished("w", "t0", 1)
    s.task_started("w", "t1", now=1)                             # executing: abandoned, slot kept
    s.take_outbox()
    s.remove_client("c")
    assert s.tasks == {}
    # t2.. were held on w until t1 finished there (scheduler/state/ahead.py): w drops them too
    held = [f"t{i}" for i in range(AHEAD_DEPTH + 1, 1, -1)]
    assert s.take_outbox()["w"] == [{"op": "free-keys", "keys": [k]} for k in held + ["t1", "t0"]]
    assert s.workers["w"].abandoned == {"t1"} and not s.workers["w"].processing


def finished_chain() -> SchedulerState:
    """A chain of DEPTH tasks, each on the one worker 'w', all finished."""
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", chain(DEPTH), [f"t{DEPTH - 1}"])
    for i in range(DEPTH):
        s.task_finished("w", f"t{i}", 1)
    return s


def test_a_deep_chain_finishes_and_its_intermediates_are_forgotten_when_released():
    s = finished_chain()
    assert s.tasks[f"t{DEPTH - 1}"].state == "memory"
    assert s.counts() == {"memory": 1, "released": DEPTH - 1}  # kept for lineage
    s.client_releases("c", [f"t{DEPTH - 1}"])
    assert s.tasks == {} and not s.workers["w"].has_what


def test_an_error_at_the_root_of_a_deep_chain_reaches_its_end_and_is_released():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", chain(DEPTH), [f"t{DEPTH - 1}"])
    s.task_erred("w", "t0", {"text": "boom"})
    assert s.counts() == {"erred": DEPTH}
    assert s.tasks[f"t{DEPTH - 1}"].error["origin"] == "t0"
    s.client_releases("c", [f"t{DEPTH - 1}"])
    assert s.tasks == {}


def test_a_real_scheduler_forgets_a_deep_chain_when_its_client_disconnects(tmp_path):
    gate = tmp_path / "gate"
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB") as cluster:
        try:
            with Client(cluster) as watcher:
                c = Client(cluster)
                try:
                    f = c.submit(wait_for_file, str(gate))
                    for _ in range(DEPTH):
                        f = c.submit(inc, f)
                    wait_until(lambda: sum(task_counts(watcher).values()) == DEPTH + 1, 30,
                               "the scheduler to hold the whole chain")
                finally:
                    c.close()
                # The scheduler's record of the client's work goes with it: nothing leaks.
                wait_until(lambda: task_counts(watcher) == {}, 20, "the chain to be forgotten")
                # ...and the scheduler still serves: a new task runs.
                gate.touch()
                assert watcher.submit(inc, 1).result(timeout=20) == 2
        finally:
            gate.touch()


def test_a_cycle_closing_a_deep_chain_is_refused_without_recursion():
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    tasks = chain(DEPTH)
    tasks[0]["deps"] = [f"t{DEPTH - 1}"]                          # t0 waits for the end of its own chain
    s.update_graph("c", tasks, [f"t{DEPTH - 1}"])
    assert s.tasks == {} and not s.take_outbox().get("w")
    s.update_graph("c", chain(DEPTH), [f"t{DEPTH - 1}"])         # without the cycle it is taken in
    assert len(s.tasks) == DEPTH


def test_a_released_task_resubmitted_with_an_input_that_needs_it_is_refused():
    """The cycle runs through tasks already known: x (released, kept for lineage) is
    submitted again with an input that itself waits on x."""
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", chain(2, "x") + [{"key": "y", "func": F, "args": A, "deps": ["x1"]}], ["y"])
    s.task_finished("w", "x0", 1)
    s.task_finished("w", "x1", 1)                                 # x0 released, kept: y's lineage
    s.update_graph("c", [{"key": "z", "func": F, "args": A, "deps": ["y"]}], ["z"])
    s.take_outbox()
    assert s.tasks["x0"].state == "released"
    s.update_graph("c", [{"key": "x0", "func": F, "args": A, "deps": ["z"]}], ["x0"])
    out = s.take_outbox()
    assert [m["key"] for m in out["c"]] == ["x0"] and out["c"][0]["error"]["kind"] == "refused"
    assert "'x0' -> 'z' -> 'y' -> 'x1' -> 'x0'" in out["c"][0]["error"]["text"]
    assert s.tasks["x0"].state == "released" and not s.tasks["x0"].dependencies
    assert "c" not in s.tasks["x0"].who_wants


def _walk(nested):
    """(depth, sum of the numbers) of [[[..., x], x], x], without recursion."""
    depth, total = 0, 0
    while len(nested) == 2:
        depth, total, nested = depth + 1, total + nested[1], nested[0]
    return depth, total + nested[0]


def _deep(n):
    nested = [1]
    for _ in range(n):
        nested = [nested, 1]
    return nested


def test_futures_nested_deeper_than_pickle_recurses_travel_both_ways(tmp_path):
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB") as cluster, Client(cluster) as c:
        f = c.submit(inc, 1)
        nested = [f]
        for _ in range(DEPTH):
            nested = [nested, f]
        # Pickled as an argument, the futures inside found and resolved on the worker.
        assert c.submit(_walk, nested).result(timeout=30) == (DEPTH, 2 * (DEPTH + 1))
        # gather() rebuilds the nesting with values.
        assert _walk(c.gather(nested, timeout=30)) == (DEPTH, 2 * (DEPTH + 1))
        # A task returning such a nesting: the worker pickles it, the client unpickles it.
        assert _walk(c.submit(_deep, DEPTH).result(timeout=30)) == (DEPTH, DEPTH + 1)
        # And scattered data.
        assert _walk(c.scatter([_deep(DEPTH)])[0].result(timeout=30)) == (DEPTH, DEPTH + 1)


def test_deep_nestings_keep_their_sharing_and_cycles_when_pickled():
    from hpc_cluster.protocol import serialize
    shared = {"k": (1, frozenset({2}))}
    nested = [shared]
    for i in range(DEPTH):
        nested = [nested, shared, (i,)]
    loop = [nested]
    loop.append(loop)                                          # a list that holds itself
    blob, refs = serialize.dumps_args((loop, shared), {"t": ([],)})
    (back, back_shared), kwargs = serialize.loads_args(blob, lambda key: None)
    assert back[1] is back and refs == set()
    node, depth = back[0], 0
    while len(node) == 3:
        assert node[1] is back_shared and node[2] == (DEPTH - 1 - depth,)
        node, depth = node[0], depth + 1
    assert depth == DEPTH and node[0] is back_shared and back_shared == shared
    assert kwargs == {"t": ([],)}


def test_a_lost_result_at_the_end_of_a_deep_chain_is_recomputed_from_its_whole_lineage():
    s = finished_chain()
    s.add_worker("v", nthreads=1, now=1)
    s.take_outbox()
    s.remove_worker("w", 2, {"cause": "node-failure", "blame": False})
    assert s.counts() == {"processing": 1, "waiting": DEPTH - 1}
    for i in range(DEPTH):
        s.task_finished("v", f"t{i}", 1)
    assert s.tasks[f"t{DEPTH - 1}"].state == "memory"


def test_a_deep_dask_graph_converts_to_tasks_in_order():
    from hpc_cluster.client.graph import graph_tasks
    deep = 5000
    graph = {"x0": 0, **{f"x{i}": (inc, f"x{i - 1}") for i in range(1, deep)}}
    specs, wire = graph_tasks(graph, lambda f: b"func")
    assert [s["key"] for s in specs] == [f"x{i}" for i in range(deep)]      # dask.order: the chain's order
    assert all(s["deps"] == ([f"x{i - 1}"] if i else []) for i, s in enumerate(specs))
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [dict(spec, func=F, args=Opaque(spec["args"])) for spec in specs], [f"x{deep - 1}"])
    assert s.counts() == {"processing": 1, "waiting": deep - 1}
