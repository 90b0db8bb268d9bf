"""An asynchronous Client (issue 31, point 2), from a real asyncio program: `await Client(...)`,
`async with`, awaitable methods and futures, and a user's loop that is never blocked."""

from __future__ import annotations

import asyncio
import threading

import pytest

import dask
from hpc_cluster import Client, LocalCluster, TimeoutError, as_completed, wait
from helpers.aio import run
from helpers.funcs import inc
from helpers.wait import wait_for_file, wait_until_async

QUIET = {"dashboard_address": None}


def refuses(x):
    raise ValueError(f"refused {x}")


class Ticker:
    """Counts the turns of the event loop it runs on: a blocked loop stops counting."""

    def __init__(self):
        self.ticks = 0
        self.task = asyncio.ensure_future(self._tick())

    async def _tick(self):
        while True:
            await asyncio.sleep(0.005)
            self.ticks += 1


def test_await_client_starts_its_own_cluster_and_async_with_closes_it():
    async def main():
        async with Client(n_workers=1, threads_per_worker=1, asynchronous=True, **QUIET) as c:
            assert c.status == "running" and c.cluster.status == "running"
            assert await c.submit(inc, 1) == 2
            assert await c.gather([c.submit(inc, i) for i in range(3)]) == [1, 2, 3]
            [x] = await c.scatter([41])
            assert await c.submit(inc, x) == 42
            await c.wait_for_workers(1)
            info = c.scheduler_info()                 # at once: the info last fetched, a dict
            assert len(info["workers"]) == 1 and len((await info)["workers"]) == 1
            assert await c.nthreads() == {a: 1 for a in info["workers"]}
        return c

    c = run(main(), timeout=120)
    assert c.status == "closed" and c.cluster.status == "closed"


def test_the_users_loop_runs_while_the_client_waits(cluster, tmp_path):
    gate = str(tmp_path / "gate")

    async def main():
        async with Client(cluster, asynchronous=True) as c:
            ticker = Ticker()
            f = c.submit(wait_for_file, gate, 60)          # finishes once the test creates `gate`
            waiting = [asyncio.ensure_future(c.gather(f)), asyncio.ensure_future(f)]     # gather, await future
            start = ticker.ticks
            await wait_until_async(lambda: ticker.ticks >= start + 10, 20, "the loop to turn while waiting")
            assert not any(w.done() for w in waiting)
            open(gate, "w").close()
            assert await asyncio.gather(*waiting) == [gate, gate]
            ticker.task.cancel()

    run(main(), timeout=120)


def test_failures_timeouts_wait_and_as_completed(cluster, tmp_path):
    gate = str(tmp_path / "gate")

    async def main():
        async with Client(cluster, asynchronous=True) as c:
            bad = c.submit(refuses, 1)
            assert isinstance(await bad.exception(), ValueError)
            with pytest.raises(ValueError, match="refused 1"):
                await bad
            stuck = c.submit(wait_for_file, gate, 60)
            with pytest.raises(TimeoutError):
                await c.gather(stuck, timeout=0.2)
            with pytest.raises(TimeoutError):
                await wait([stuck], timeout=0.2)
            futures = c.map(inc, range(5))
            done = await wait(futures)
            assert len(done.done) == 5 and not done.not_done
            seen = [await f async for f in as_completed(c.map(inc, range(10, 15)))]
            assert sorted(seen) == list(range(11, 16))
            assert [p async for p in as_completed([c.submit(inc, 1)], with_results=True)][0][1] == 2
            first = await wait([stuck, c.submit(inc, 2)], return_when="FIRST_COMPLETED")
            assert stuck in first.not_done and len(first.done) == 1
            open(gate, "w").close()
            assert await stuck.result() == gate

    run(main(), timeout=120)


def test_from_a_plain_thread_the_same_client_blocks_as_a_synchronous_one(cluster):
    async def main():
        async with Client(cluster, asynchronous=True) as c:
            f = c.submit(inc, 1)
            assert asyncio.isfuture(c.gather(f))                       # async code: an awaitable
            out = await asyncio.to_thread(c.gather, f)                  # a thread: the value
            assert out == 2 and threading.current_thread() is threading.main_thread()
            assert await asyncio.to_thread(lambda: c.asynchronous) is False and c.asynchronous

    run(main(), timeout=120)


def test_sync_loop_and_dask_compute(cluster):
    async def twice(x):
        await asyncio.sleep(0)
        return 2 * x

    async def main():
        async with Client(cluster, asynchronous=True) as c:
            assert c.loop.asyncio_loop is asyncio.get_running_loop()       # the loop it was made in
            assert await c.sync(twice, 4) == 8
            x = dask.delayed(inc)(1)
            with pytest.raises(RuntimeError, match="asynchronous Client in a synchronous context"):
                x.compute()
            assert await c.compute(x) == 2

    run(main(), timeout=120)
    with Client(cluster, set_as_default=False) as c:                      # synchronous: blocks for it
        assert c.sync(twice, 5) == 10
        assert c.loop.asyncio_loop is c._loop


def test_async_local_cluster_with_threads():
    async def main():
        async with LocalCluster(n_workers=1, processes=False, asynchronous=True, **QUIET) as cluster:
            assert cluster.status == "running"
            async with Client(cluster, asynchronous=True) as c:
                assert await c.submit(inc, 2) == 3
        later = LocalCluster(n_workers=1, processes=False, asynchronous=True, **QUIET)     # not awaited
        async with Client(later, asynchronous=True) as c:          # waits for its scheduler
            assert await c.submit(inc, 3) == 4
        await later.close()
        return cluster, later

    assert [c.status for c in run(main(), timeout=120)] == ["closed", "closed"]
