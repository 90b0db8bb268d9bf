"""What the dashboard's tests share: plain HTTP requests, and a LocalCluster that has seen a
real memory death (the nanny stopping a worker over its budget, as in test_fault_tolerance.py)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import threading
import urllib.parse
from types import SimpleNamespace

import pytest

from hpc_cluster import Client, KilledWorker, LocalCluster
from hpc_cluster.dashboard.server import Dashboard
from hpc_cluster.scheduler.state import SchedulerState
from hpc_cluster.scheduler.stream import TaskStream
from helpers.funcs import hog
from helpers.wait import wait_until

MB = 2**20


def slowinc(x, delay=0.02):
    import time
    time.sleep(delay)
    return x + 1


def split_link(link: str) -> tuple[str, int, str]:
    """'http://host:port/status?token=T' -> (host, port, T)."""
    url = urllib.parse.urlsplit(link)
    return url.hostname, url.port, urllib.parse.parse_qs(url.query)["token"][0]


def request(link_or_base: str, path: str, token: str | None = None, headers: dict | None = None):
    """GET `path` on the dashboard of `link_or_base`; (status, headers, body as bytes)."""
    url = urllib.parse.urlsplit(link_or_base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("GET", path + (f"?token={token}" if token is not None else ""), headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def api(link: str, what: str):
    _, _, token = split_link(link)
    status, _, body = request(link, f"/api/{what}", token)
    assert status == 200, (what, status, body[:200])
    return json.loads(body)


@contextlib.contextmanager
def cluster_with_a_memory_death():
    """A LocalCluster (dashboard on a free port) whose one worker the nanny stopped over its
    400 MB budget while it ran `hog`; 30 ordinary tasks ran before, their results kept.
    Yields (cluster, client)."""
    with LocalCluster(n_workers=1, threads_per_worker=2, memory_limit="400MB", allowed_failures=0,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        kept = client.map(slowinc, range(30))          # held for the progress bars while the cluster lives
        assert client.gather(kept) == list(range(1, 31))
        future = client.submit(hog, 600 * MB, pure=False)
        try:
            future.result(90)
        except KilledWorker as exc:
            assert exc.cause == "memory-nanny", exc
        else:
            raise AssertionError("the hog was not stopped by the nanny")
        # The verdict is final once the nanny's report came; a fresh worker is back.
        wait_until(lambda: [d for d in client.deaths() if d["cause"] == "memory-nanny" and d["final_at"]], 60,
                   "a final memory-nanny verdict")
        client.wait_for_workers(1, timeout=60)
        yield cluster, client
        del kept


@pytest.fixture(scope="module")
def died():
    """Module fixture: (cluster, client) of cluster_with_a_memory_death(), for the dashboard's
    API and browser tests. Import it into a test module with
    `from helpers.dashboard import died  # noqa: F401`."""
    with cluster_with_a_memory_death() as (cluster, client):
        yield cluster, client


# -- a dashboard on a state made by hand, in this process ---------------------------------------
def fake_scheduler(state=None):
    return SimpleNamespace(state=state or SchedulerState(), stream=TaskStream(), services={})


def timeline(n: int, limit: int = 400 * 2**20) -> dict:
    """A death record's "memory" (the interface the timeline work provides): n samples rising
    to past the terminate line, two task starts, the death at the end."""
    samples = [[1000.0 + i * 0.01, int(50 * 2**20 + i * (limit / n))] for i in range(n)]
    return {"worker": "worker-0", "samples": samples, "memory_limit": limit, "terminate_at": int(limit * 0.95),
            "batch_limit": None, "task_starts": [[1000.0, "slowinc-1"], [1000.0 + n * 0.005, "hog-abc"]],
            "died_at": 1000.0 + n * 0.01}


def with_deaths(*memories) -> SchedulerState:
    st = SchedulerState()
    for i, memory in enumerate(memories):
        record = {"worker": f"tcp://127.0.0.1:{4000 + i}", "name": f"worker-{i}", "time": 1000.0 + i,
                  "cause": "memory-nanny", "blame": True, "text": "killed by the nanny over its memory budget",
                  "evidence": ["nanny: peak 398 MB of 400 MB"], "advice": "give the workers more memory",
                  "executing": ["hog-abc"], "final_at": 1001.0}
        if memory is not None:
            record["memory"] = memory
        st.add_death(record)
    return st


@contextlib.contextmanager
def serving(scheduler, secret: bytes, **kwargs):
    """A Dashboard on its own event loop in a thread; yields it once it listens."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    dashboard = Dashboard(scheduler, secret, **kwargs)
    try:
        asyncio.run_coroutine_threadsafe(_start(dashboard), loop).result(10)
        yield dashboard
    finally:
        loop.call_soon_threadsafe(dashboard.stop)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


async def _start(dashboard):
    dashboard.start()
