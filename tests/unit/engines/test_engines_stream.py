"""What our scheduler's state sends a mirrored distributed worker (bridge.EngineStream): a CLOSE
(a drain before walltime, a scale-down, --lifetime, shutdown) becomes distributed's own
retirement of that worker, its results moved to a peer first, with our intent as the reason;
anything else (heartbeat pace, hand-backs) means nothing to distributed's worker and is dropped.

On a real distributed Scheduler with two real Workers in this process; the bridge is not a
plugin here (that needs our scheduler): its `ds` is set, which is all `retire` uses."""

from __future__ import annotations

from distributed import Client, Scheduler, Worker

from helpers.aio import run
from helpers.wait import wait_until_async

from hpc_cluster.engines.blame import Ledger
from hpc_cluster.engines.bridge import Bridge, EngineStream
from hpc_cluster.protocol.messages import Op


async def close_retires_the_worker() -> None:
    async with Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0") as ds, \
            Worker(ds.address, nthreads=1, host="127.0.0.1") as a, \
            Worker(ds.address, nthreads=1, host="127.0.0.1") as b, \
            Client(ds.address, asynchronous=True) as client:
        bridge = Bridge(None, Ledger())
        bridge.ds = ds
        stream = EngineStream(bridge, a.address)
        [held] = await client.scatter([123], workers=[a.address])
        assert set(ds.tasks[held.key].who_has) == {ds.workers[a.address]}

        stream.extend([{"op": Op.HEARTBEAT_INTERVAL, "interval": 2.0}, {"op": Op.RELEASE_KEYS, "keys": ["k"]}])
        assert stream.flush() is None
        assert bridge.retiring == {} and set(ds.workers) == {a.address, b.address}

        stream.send({"op": Op.CLOSE, "reason": "walltime"})
        stream.send({"op": Op.CLOSE, "reason": "retired"})      # one retirement per worker
        assert bridge.retiring == {a.address: "walltime"}
        await wait_until_async(lambda: a.address not in ds.workers, 30, "distributed to retire the worker")
        assert set(ds.workers) == {b.address}
        # retired, not lost: what it held was moved to its peer before it left
        assert set(ds.tasks[held.key].who_has) == {ds.workers[b.address]}
        assert await held == 123
        # the worker was told why (dask_worker.py reads this to tell a --lifetime from the rest)
        told = [m.get("stimulus_id", "") for _, m in ds.get_events(a.address)
                if m.get("status") == "closing_gracefully"]
        assert [s.rsplit("-", 1)[0] for s in told] == ["hpc-cluster-walltime"], ds.get_events(a.address)

        EngineStream(bridge, b.address).send({"op": Op.CLOSE})    # no reason given: a retirement
        assert bridge.retiring[b.address] == "retired"
        await wait_until_async(lambda: not ds.workers, 30, "the last worker to leave")


def test_a_close_becomes_distributeds_retirement_and_the_rest_is_dropped():
    run(close_retires_the_worker(), timeout=90)
