"""The user-facing API on a real LocalCluster (scheduler and worker processes)."""

from __future__ import annotations

import operator
import pickle
import threading

import cloudpickle

import pytest

from hpc_cluster import CancelledError, Client, Future, LocalCluster, TimeoutError, as_completed, wait
from hpc_cluster.protocol.serialize import SerializationError, loads
from helpers.funcs import add, inc, slow_inc, total
from helpers.wait import wait_for_file, wait_until


def boom(x):
    raise ZeroDivisionError(f"bad input {x}")


def test_submit_result_and_status(client):
    f = client.submit(inc, 1)
    assert isinstance(f, Future) and f.key.startswith("inc-")
    assert f.result(timeout=10) == 2
    assert f.status == "finished" and f.done() and f.exception() is None


def test_pure_keys_are_shared_and_impure_are_not(client):
    assert client.submit(inc, 5).key == client.submit(inc, 5).key
    assert client.submit(inc, 5, pure=False).key != client.submit(inc, 5, pure=False).key
    assert client.submit(inc, 5, key="mine").key == "mine"


def test_map_and_gather_many(client):
    futures = client.map(inc, range(1000))
    assert client.gather(futures) == list(range(1, 1001))
    assert client.gather(client.map(add, range(10), range(10))) == [2 * i for i in range(10)]


def test_gather_keeps_structure(client):
    a, b = client.submit(inc, 1), client.submit(inc, 2)
    assert client.gather({"x": a, "y": [b, 7]}) == {"x": 2, "y": [3, 7]}


def test_futures_nested_in_arguments_are_replaced_by_values(client):
    fs = client.map(inc, range(5))
    assert client.submit(total, fs).result(10) == 15
    d = client.submit(lambda m: m["a"][1] + m["b"], {"a": (0, fs[2]), "b": fs[4]})
    assert d.result(10) == 3 + 5
    assert client.submit(add, a=fs[0], b=fs[1]).result(10) == 3


def test_exception_is_reraised_with_remote_traceback_for_future_and_dependents(client):
    bad = client.submit(boom, 3)
    dependent = client.submit(inc, bad)
    with pytest.raises(ZeroDivisionError, match="bad input 3") as info:
        bad.result(10)
    assert "boom" in info.value.remote_traceback
    with pytest.raises(ZeroDivisionError, match="bad input 3"):
        dependent.result(10)
    assert isinstance(bad.exception(), ZeroDivisionError) and bad.status == "error"
    assert client.submit(inc, 41).result(10) == 42          # the cluster carries on


def test_gather_errors_skip_drops_failed_futures_at_any_depth(client):
    ok1, bad, ok2 = client.submit(inc, 1), client.submit(boom, 1), client.submit(inc, 2)
    assert client.gather([ok1, bad, ok2], errors="skip") == [2, 3]
    assert client.gather((ok1, bad), errors="skip") == (2,)
    assert client.gather({ok1, bad}, errors="skip") == {2}
    assert client.gather({"a": ok1, "b": bad, "c": 7}, errors="skip") == {"a": 2, "c": 7}
    nested = client.gather([[ok1, bad], (bad, ok2), {"x": bad, "y": [bad]}, 5], errors="skip")
    assert nested == [[2], (3,), {"y": []}, 5]
    assert client.gather(bad, errors="skip") is None
    cancelled = client.submit(slow_inc, 1, 30, pure=False)
    cancelled.cancel()
    assert client.gather([cancelled, ok1], errors="skip") == [2]
    with pytest.raises(ZeroDivisionError):
        client.gather([ok1, bad])


def test_gather_raises_the_first_failure_without_waiting_for_the_keys_before_it(client, tmp_path):
    # As distributed's: a failure ends the gather even while a key listed before it still runs
    # (waiting key by key, in order, this gather timed out on the slow task).
    gate = tmp_path / "go"
    slow = client.submit(wait_for_file, str(gate), 60, pure=False)
    bad = client.submit(boom, 1, pure=False)
    with pytest.raises(ZeroDivisionError, match="bad input 1"):
        client.gather([slow, bad], timeout=30)
    assert slow.status == "pending"
    gate.touch()          # its thread ends now, not in a minute (a cancel would leave it running)
    assert slow.result(30) == str(gate)


def test_retries(client, tmp_path):
    marker = tmp_path / "attempts"

    def flaky(path):
        import os
        n = len(open(path).read()) if os.path.exists(path) else 0
        open(path, "a").write("x")
        if n < 2:
            raise RuntimeError(f"attempt {n}")
        return n

    assert client.submit(flaky, str(marker), retries=2, pure=False).result(10) == 2


def test_result_timeout(client):
    f = client.submit(slow_inc, 1, 2.0, pure=False)
    with pytest.raises(TimeoutError):
        f.result(timeout=0.1)
    assert f.result(timeout=10) == 2


def test_cancel(client):
    f = client.submit(slow_inc, 1, 30, pure=False)
    g = client.submit(inc, f)
    f.cancel()
    with pytest.raises(CancelledError):
        f.result(10)
    with pytest.raises(CancelledError):
        g.result(10)
    assert f.cancelled()


def test_priority_runs_urgent_work_first():
    # One thread, so the order is decided by priority alone (and no other test's leftovers).
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as c:
        blocker = c.submit(slow_inc, 0, 0.5, pure=False)
        order = []
        lock = threading.Lock()

        def record(f):
            with lock:
                order.append(f.key)

        low = [c.submit(inc, i, key=f"low-{i}") for i in range(6)]
        high = c.submit(inc, 100, key="high", priority=10)
        for f in [*low, high]:
            f.add_done_callback(record)
        wait([blocker, *low, high], timeout=30)
        wait_until(lambda: len(order) == 7, what="all callbacks")
        # At most the prefetched low tasks (2) may run before the urgent one.
        assert order.index("high") <= 2, order


def test_add_done_callback_and_as_completed(client):
    seen = []
    event = threading.Event()
    f = client.submit(inc, 10)
    f.add_done_callback(lambda fut: (seen.append(fut.key), event.set()))
    assert event.wait(10) and seen == [f.key]
    fs = client.map(slow_inc, [3, 1, 2], [0.6, 0.0, 0.3], pure=False)
    done = list(as_completed(fs, timeout=20))
    assert sorted(x.key for x in done) == sorted(x.key for x in fs)
    assert [r for _, r in as_completed(client.map(inc, [1, 2]), with_results=True)].count(2) == 1


def test_wait_first_completed(client):
    fast, slow = client.submit(inc, 1), client.submit(slow_inc, 1, 3, pure=False)
    done, not_done = wait([fast, slow], timeout=10, return_when="FIRST_COMPLETED")
    assert fast in done and slow in not_done


def _who_has(client, keys) -> dict[str, list[str]]:
    return client._lt.run(client._request({"op": "who-has", "keys": list(keys)}))


def _held_by(client, worker: str, keys) -> dict:
    """What the worker itself answers for these keys (not what anyone says it holds)."""
    reply = client._lt.run(client._worker_request(worker, {"op": "get-data", "keys": list(keys)}))
    return {k: loads(v.data) for k, v in reply["data"].items()}


def test_scatter_and_broadcast(client):
    [a, b] = client.scatter([10, 20])
    assert client.submit(add, a, b).result(10) == 30
    assert len(_who_has(client, [a.key])[a.key]) == 1           # not broadcast: one copy
    data = client.scatter({"x": 1, "y": 2})
    assert set(data) == {"x", "y"} and data["x"].result(10) == 1
    payload = list(range(1000))
    big = client.scatter(payload, broadcast=True)               # a list: one future per element
    one = client.scatter("payload", broadcast=True)
    workers = sorted(client.scheduler_info()["workers"])
    assert len(workers) == 2
    keys = [one.key, *(f.key for f in big)]
    who_has = _who_has(client, keys)
    assert all(sorted(who_has[k]) == workers for k in keys), who_has
    for w in workers:                                           # and each worker really has them
        assert _held_by(client, w, keys) == {one.key: "payload", **{f.key: v for f, v in zip(big, payload)}}
    assert one.result(10) == "payload" and client.gather(big) == payload


def test_results_are_released_when_no_future_refers_to_them(cluster):
    with Client(cluster) as c:
        f = c.submit(inc, 123456)
        f.result(10)
        key = f.key
        assert c._lt.run(c._request({"op": "who-has", "keys": [key]}))[key]
        del f
        wait_until(lambda: not c._lt.run(c._request({"op": "who-has", "keys": [key]}))[key],
                   what="the result to be released")


def test_unpicklable_argument_fails_at_submit_naming_it(client):
    lock = threading.Lock()
    with pytest.raises(SerializationError, match=r"argument 1 \(lock"):
        client.submit(add, 1, lock)
    with pytest.raises(SerializationError, match=r"keyword argument 'b'"):
        client.submit(add, 1, b=lock)
    with pytest.raises(SerializationError, match="could not pickle the function"):
        client.submit(lambda: lock.acquire())


class Point:
    def __init__(self, x):
        self.x = x


def test_user_modules_travel_by_value_only_while_our_client_pickles(client):
    # This module is the user's own (not installed): its function, class and data reach
    # the workers by value, scattered or as arguments.
    [point] = client.scatter([Point(3)])
    assert client.submit(lambda p, q: type(p).__name__ + str(p.x + q.x), point, Point(4)).result() == "Point7"
    # ...and afterwards everything else in the process pickles it by reference again
    # (cloudpickle's by-value registry is process-wide: left on, dask's process pool sent the
    # class by value and partd's plain pickle of such an object failed, in dask's test_bag).
    assert pickle.loads(cloudpickle.dumps(Point)) is Point
    assert pickle.loads(cloudpickle.dumps(inc)) is inc



def test_code_sent_by_value_keeps_its_file_name():
    # cloudpickle 3.1.3 names the file of every function sent by value "<dynamic-code>"; the
    # diagnosis's crash site and tasks' tracebacks name the user's file, so ours keeps it.
    from hpc_cluster.protocol.serialize import dumps_function
    rebuilt = loads(dumps_function(lambda: inc(1)))
    assert rebuilt.__code__.co_filename == __file__ and rebuilt() == 2
    nested = loads(dumps_function(boom))        # this module's function, by value
    assert nested is not boom and nested.__code__.co_filename == __file__

def test_dask_collections_run_on_our_cluster(client):
    da = pytest.importorskip("dask.array")
    import dask
    import numpy as np

    x = da.arange(10_000, chunks=1000).reshape(100, 100)
    y = (x + x.T).sum(axis=0)
    (ours,) = dask.compute(y, scheduler=client.get)
    np.testing.assert_array_equal(ours, dask.compute(y, scheduler="sync")[0])
    db = pytest.importorskip("dask.bag")
    b = db.from_sequence(range(100), npartitions=7).map(inc).filter(lambda v: v % 2 == 0)
    assert b.compute(scheduler=client.get) == [v for v in range(1, 101) if v % 2 == 0]


def test_dask_graphs_are_submitted_in_dask_order():
    pytest.importorskip("dask")
    from operator import add

    from hpc_cluster.client.graph import graph_tasks, wire_key

    # Listed level by level, all leaves first; dask.order runs such a tree depth-first.
    dsk = {f"leaf-{i}": (inc, i) for i in range(16)}
    dsk.update({f"pair-{i}": (add, f"leaf-{2 * i}", f"leaf-{2 * i + 1}") for i in range(8)})
    dsk.update({f"quad-{i}": (add, f"pair-{2 * i}", f"pair-{2 * i + 1}") for i in range(4)})
    dsk["total"] = (sum, [f"quad-{i}" for i in range(4)])
    specs, wire = graph_tasks(dsk, lambda f: b"")
    submitted = [s["key"] for s in specs]
    def first(prefix):
        return min(i for i, k in enumerate(submitted) if k.startswith(prefix))

    last_leaf = max(i for i, k in enumerate(submitted) if k.startswith("leaf-"))
    assert first("pair-") < last_leaf and first("quad-") < last_leaf    # depth-first
    for spec in specs:                                                 # inputs before users
        assert all(submitted.index(d) < submitted.index(spec["key"]) for d in spec["deps"])
    assert wire == {k: wire_key(k) for k in dsk}


def test_client_from_address_needs_the_secret(cluster):
    with pytest.raises(ValueError, match="no secret"):
        Client(cluster.scheduler_address)
    with Client(cluster.scheduler_address, secret=cluster.secret.hex()) as c:
        assert c.submit(operator.mul, 6, 7).result(10) == 42


def test_scheduler_info_lists_workers(client, cluster):
    info = client.scheduler_info()
    assert len(info["workers"]) == 2
    assert all(w["nthreads"] == 2 for w in info["workers"].values())
    assert sum(client.nthreads().values()) == 4


def test_local_cluster_context_leaves_no_process_behind():
    import psutil
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as c:
        c.submit(inc, 1).result(10)
        pids = [cluster._scheduler.pid, *cluster.worker_pids().values()]
        children = [p.pid for pid in pids for p in psutil.Process(pid).children(recursive=True)]
        everything = pids + children                     # scheduler, nannies, worker processes
        assert len(everything) == 5
    wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                               for p in everything), what="all cluster processes to exit")


def test_a_large_release_goes_in_parts_the_scheduler_can_take_a_turn_at_a_time():
    # 20,000 keys in one release-keys message held every other client's answer for 15 ms at a
    # time at 500 workers; parts of CHUNK_TASKS let Comm.batches give the loop turns between.
    from hpc_cluster.client.submission import CHUNK_TASKS, release_messages
    keys = [f"k{i}" for i in range(2 * CHUNK_TASKS + 1)]
    msgs = release_messages(keys)
    assert [len(m["keys"]) for m in msgs] == [CHUNK_TASKS, CHUNK_TASKS, 1]
    assert [k for m in msgs for k in m["keys"]] == keys and {m["op"] for m in msgs} == {"release-keys"}
