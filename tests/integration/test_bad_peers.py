"""A buggy client or worker that knows the secret (issue 14, point 7): each bad request is
refused with an error to its sender, and nothing else is touched. Real scheduler and worker
processes (LocalCluster); the bad peer is a raw connection on 127.0.0.1 speaking the wire
protocol, as a buggy peer would."""

import asyncio
import math

import pytest

from hpc_cluster import LocalCluster
from hpc_cluster.client.exceptions import HPCClusterError
from hpc_cluster.protocol import serialize
from hpc_cluster.protocol.comm import connect
from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.protocol.versions import get_versions
from helpers.aio import run
from helpers.ask import task_counts
from helpers.funcs import inc
from helpers.wait import wait_until


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB") as c:
        yield c

# `client` (tests/conftest.py) is a Client of this module's cluster.


async def _read_until(comm, pred, timeout=10.0):
    """Messages from `comm` until one satisfies `pred` (returned with all seen before it)."""
    seen = []
    end = asyncio.get_running_loop().time() + timeout
    while True:
        left = end - asyncio.get_running_loop().time()
        if left <= 0:
            raise AssertionError(f"no matching message within {timeout} s; got {seen}")
        for msg in await asyncio.wait_for(comm.read(), left):
            seen.append(msg)
            if pred(msg):
                return msg, seen


async def _as_worker(cluster, address):
    """Register as a worker at `address`; the scheduler's first answer, and whether it then closed."""
    comm = await connect(cluster.scheduler_address, cluster.secret, {"role": "worker", "versions": get_versions()})
    try:
        await comm.write({"op": "register-worker", "address": address, "nthreads": 1, "pid": 1})
        reply = (await asyncio.wait_for(comm.read(), 10))[0]
        try:
            await asyncio.wait_for(comm.read(), 5)
            closed = False
        except Exception:
            closed = True
        return reply, closed
    finally:
        comm.close()


def _spec(key, x, deps=(), priority=0):
    args, refs = serialize.dumps_args((x,), {})
    return {"key": key, "func": Opaque(serialize.dumps_function(inc)), "args": Opaque(args),
            "deps": list(deps), "priority": priority}


def _workers(client):
    return sorted(w["address"] for w in client._lt.run(client._request({"op": "workers"})))


def test_a_registration_reusing_a_live_workers_address_is_refused(cluster, client):
    before = _workers(client)
    assert len(before) == 1
    kept = client.submit(inc, 1)
    assert kept.result(timeout=20) == 2
    reply, closed = run(_as_worker(cluster, before[0]), timeout=20)
    assert reply["op"] == "refused" and "connected and alive" in reply["error"] and closed
    # The real worker is still the scheduler's, holds its result and runs new work; no death.
    assert _workers(client) == before
    assert kept.result(timeout=5) == 2
    assert client.submit(inc, 10).result(timeout=20) == 11
    assert client._lt.run(client._request({"op": "deaths"})) == []


def test_a_registration_reusing_a_clients_id_is_refused_and_the_client_carries_on(cluster, client):
    assert client.id.startswith("client-")
    reply, closed = run(_as_worker(cluster, client.id), timeout=20)
    assert reply["op"] == "refused" and "not a worker address" in reply["error"] and closed
    assert client.submit(inc, 20).result(timeout=20) == 21       # its stream is still its own
    assert len(_workers(client)) == 1


async def _as_client(cluster, body):
    comm = await connect(cluster.scheduler_address, cluster.secret, {"role": "client", "versions": get_versions()})
    try:
        await _read_until(comm, lambda m: m["op"] == "registered")
        return await body(comm)
    finally:
        comm.close()


def test_a_priority_beyond_64_bits_is_refused_and_the_workers_batch_still_goes(cluster, client):
    async def body(comm):
        # Three tasks in one submission, so all three would go to the worker in one batch.
        specs = [_spec("p-ok-1", 1), _spec("p-huge", 2, priority=2**63 + 5), _spec("p-ok-2", 3)]
        await comm.write({"op": "update-graph", "tasks": specs, "keys": [s["key"] for s in specs]})
        errors = {}
        await _read_until(comm, lambda m: m["op"] == "task-erred" and errors.update({m["key"]: m["error"]})
                          is None and len(errors) == 3)
        # The connection is still served: a good submission runs.
        await comm.write({"op": "update-graph", "tasks": [_spec("p-after", 4)], "keys": ["p-after"]})
        done, _ = await _read_until(comm, lambda m: m["op"] in ("key-in-memory", "task-erred") and m["key"] == "p-after")
        return errors, done

    errors, done = run(_as_client(cluster, body), timeout=20)
    assert set(errors) == {"p-ok-1", "p-huge", "p-ok-2"}
    assert all(e["kind"] == "refused" for e in errors.values())
    assert "priority=9223372036854775813 is out of range" in errors["p-huge"]["text"]
    assert done["op"] == "key-in-memory"
    assert client.submit(inc, 30).result(timeout=20) == 31
    wait_until(lambda: "processing" not in task_counts(client), 10, "nothing left processing")


def test_a_priority_beyond_64_bits_from_the_client_api_fails_its_future_only(client):
    good = client.submit(inc, 40)
    bad = client.submit(inc, 41, priority=2**63)
    with pytest.raises(HPCClusterError, match="out of range"):
        bad.result(timeout=20)
    assert good.result(timeout=20) == 41


def test_a_dependency_cycle_is_refused_instead_of_waiting_for_ever(cluster, client):
    async def body(comm):
        specs = [_spec("cyc-a", 1, deps=["cyc-c"]), _spec("cyc-b", 1, deps=["cyc-a"]),
                 _spec("cyc-c", 1, deps=["cyc-b"]), _spec("cyc-free", 1)]
        await comm.write({"op": "update-graph", "tasks": specs, "keys": ["cyc-c", "cyc-free"]})
        errors = {}
        await _read_until(comm, lambda m: m["op"] == "task-erred" and errors.update({m["key"]: m["error"]})
                          is None and len(errors) == 4)
        return errors

    errors = run(_as_client(cluster, body), timeout=20)
    text = errors["cyc-c"]["text"]
    assert errors["cyc-c"]["kind"] == "refused" and "dependency cycle" in text
    assert "'cyc-a' -> 'cyc-c' -> 'cyc-b' -> 'cyc-a'" in text
    for key in ("cyc-a", "cyc-b", "cyc-c", "cyc-free"):          # none of it was taken in
        assert client._lt.run(client._request({"op": "why", "key": key})) is None
    assert "waiting" not in task_counts(client)
    assert client.submit(inc, 50).result(timeout=20) == 51


def test_a_dask_graph_with_a_cycle_raises_at_once(client):
    graph = {"x": (inc, "y"), "y": (inc, "x"), "z": (inc, 1)}
    with pytest.raises(Exception, match="cycle"):
        client.get(graph, ["x", "z"])


@pytest.mark.parametrize("timeout", [-1, 0, "soon", math.inf, True])
def test_restart_with_a_bad_timeout_is_refused_and_clears_nothing(cluster, client, timeout):
    kept = client.submit(inc, 60)
    assert kept.result(timeout=20) == 61
    workers = _workers(client)

    async def body(comm):
        await comm.write({"op": "restart", "timeout": timeout, "rid": 7})
        reply, _ = await _read_until(comm, lambda m: m["op"] == "reply" and m.get("rid") == 7)
        return reply["result"]

    result = run(_as_client(cluster, body), timeout=20)
    assert "restart timeout=" in result["error"] and "nothing was restarted" in result["error"]
    assert kept.status == "finished" and kept.result(timeout=5) == 61
    assert _workers(client) == workers
    with pytest.raises(ValueError, match="restart timeout="):
        client.restart(timeout=-5)


def test_a_workers_memory_report_beyond_64_bits_does_not_break_what_clients_are_sent(cluster, client):
    """Numbers a worker reports are passed on to clients (the workers table); a float such
    as 1e30 became an integer beyond 64 bits and made that reply unpackable, so the client's
    request never came back."""
    async def body():
        comm = await connect(cluster.scheduler_address, cluster.secret, {"role": "worker", "versions": get_versions()})
        try:
            await comm.write({"op": "register-worker", "address": "tcp://127.0.0.1:1", "nthreads": 1})
            assert (await asyncio.wait_for(comm.read(), 10))[0]["op"] == "registered"
            await comm.write({"op": "heartbeat", "memory": {"rss": 1e30, "managed": 5}})
            await comm.write({"op": "heartbeat"})
            await asyncio.sleep(0)
            table = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                client._request({"op": "workers"}, 10), client._loop))
            return {w["address"]: w["memory"] for w in table}
        finally:
            comm.close()

    memory = run(body(), timeout=20)
    assert memory["tcp://127.0.0.1:1"] == {"managed": 5}          # the impossible number left out
    wait_until(lambda: len(_workers(client)) == 1, 10, "the fake worker to be gone")
    assert client.submit(inc, 70).result(timeout=20) == 71
