"""The cluster daemon's handlers (deploy/daemon/handlers.py), each alone, on a fake job manager
and scheduler: no daemon process, no batch system."""

from __future__ import annotations

import asyncio
import signal
import types

import pytest

from hpc_cluster.deploy.daemon import handlers as h
from hpc_cluster.deploy.daemon.jobs import Job
from helpers.aio import run


class FakePools:
    """PoolManager's surface that the handlers use, recording each call."""

    def __init__(self):
        self.calls = []
        self.scheduler = None
        self.managers = {}

    async def scale(self, jobs, pool=None):
        self.calls.append(("scale", jobs, pool))
        return {"target": jobs}

    async def refresh(self):
        self.calls.append(("refresh",))

    def table(self):
        self.calls.append(("table",))
        return {"jobs": []}

    async def close(self):
        self.calls.append(("close",))

    def adapt(self, minimum, maximum, pool=None, **policy):
        self.calls.append(("adapt", minimum, maximum, pool, policy))

    def stop_adapting(self, pool=None):
        self.calls.append(("stop_adapting", pool))

    def stop_watching(self):
        self.calls.append(("stop_watching",))


class FakeScheduler:
    def __init__(self, closed=False):
        self.handlers, self.closes = {}, []
        self.closed = asyncio.Event()
        if closed:
            self.closed.set()
        self.state = types.SimpleNamespace(workers={})

    async def close(self, restarting=False):
        self.closes.append(restarting)


def daemon(**kw) -> h.Daemon:
    return h.Daemon(pools=FakePools(), stop=asyncio.Event(), name="c", **kw)


def test_scale_asks_the_pools_for_a_whole_number_of_jobs():
    async def go():
        d = daemon()
        assert await h.scale(d, {"jobs": "3", "pool": "big"}) == {"target": 3}
        await h.scale(d, {"jobs": 1})
        return d.pools.calls
    assert run(go()) == [("scale", 3, "big"), ("scale", 1, None)]


def test_jobs_refreshes_before_it_answers_with_the_table():
    async def go():
        d = daemon()
        assert await h.jobs(d, {}) == {"jobs": []}
        return d.pools.calls
    assert run(go()) == [("refresh",), ("table",)]


def test_adapt_passes_the_policy_with_dasks_defaults_and_stop_ends_it():
    async def go():
        d = daemon()
        await h.adapt(d, {"minimum": "1", "maximum": None, "pool": "big"})
        await h.adapt(d, {"minimum": 0, "maximum": "4", "interval": 2, "wait_count": 5, "target_duration": 30})
        await h.adapt(d, {"stop": True, "pool": "big"})
        return [c for c in d.pools.calls if c[0] != "table"]
    assert run(go()) == [
        ("adapt", 1, None, "big", {"interval": 1.0, "wait_count": 3, "target_duration": 5.0}),
        ("adapt", 0, 4, None, {"interval": 2.0, "wait_count": 5, "target_duration": 30.0}),
        ("stop_adapting", "big")]


def test_shutdown_cancels_a_successor_closes_the_jobs_and_stops_after_its_reply():
    cancelled = []

    async def go():
        d = daemon(renewal=types.SimpleNamespace(cancel_successor=lambda: cancelled.append(True)))
        table = await h.shutdown(d, {})
        stopped_with_the_reply = d.stop.is_set()
        await asyncio.sleep(0)
        return table, stopped_with_the_reply, d
    table, stopped_with_the_reply, d = run(go())
    assert table == {"jobs": []} and cancelled == [True]
    assert d.pools.calls == [("close",), ("table",)]
    assert not stopped_with_the_reply and d.stop.is_set() and d.why == h.SHUTDOWN


def test_register_serves_every_handler_by_its_op():
    async def go():
        d, sched = daemon(), FakeScheduler()
        h.register(sched, d)
        assert set(sched.handlers) == {"scale", "jobs", "shutdown", "adapt"}
        return await sched.handlers["scale"]({"jobs": 2})
    assert run(go()) == {"target": 2}


@pytest.mark.parametrize("sig, in_job, now, why", [
    (signal.SIGTERM, None, 1000.0, h.SHUTDOWN),                                    # `down`, or the owner
    (signal.SIGTERM, {"id": "7", "started": 0.0, "walltime": 1000.0}, 100.0, h.SHUTDOWN),   # scancel
    (signal.SIGTERM, {"id": "7", "started": 0.0, "walltime": 1000.0}, 990.0, h.WALLTIME),   # the time limit
    (signal.SIGINT, {"id": "7", "started": 0.0, "walltime": 1000.0}, 990.0, h.SHUTDOWN),
])
def test_a_signal_stops_the_daemon_and_the_walltimes_keeps_the_cluster(sig, in_job, now, why):
    d = h.Daemon(pools=FakePools(), stop=asyncio.Event(), name="c", in_job=in_job)
    h.on_signal(d, sig, now)
    assert d.stop.is_set() and d.why == why


def test_a_handover_lets_go_of_the_scheduler_journal_and_dashboard_then_stops():
    stopped = []

    async def go():
        sched = FakeScheduler()
        journal = types.SimpleNamespace(jobs=None)
        d = daemon(scheduler=sched, journal=journal,
                   dashboard=types.SimpleNamespace(stop=lambda: stopped.append(True)))
        d.pools.scheduler = sched
        await h.hand_over(d)
        return d, sched, journal
    d, sched, journal = run(go())
    assert d.why == h.HANDOVER and d.stop.is_set() and stopped == [True]
    assert sched.closes == [True]                         # restarting: workers and clients stay
    assert ("stop_watching",) in d.pools.calls and journal.jobs == {}


def test_letting_go_of_a_closed_scheduler_does_nothing():
    async def go():
        sched, pools = FakeScheduler(closed=True), FakePools()
        await h.let_go(sched, None, pools)
        return sched, pools
    sched, pools = run(go())
    assert sched.closes == [] and pools.calls == []


def test_the_journals_jobs_record_holds_each_unfinished_job_and_its_workers_names():
    worker = types.SimpleNamespace(name="c-0", info={"job_id": 11})
    sched = types.SimpleNamespace(state=types.SimpleNamespace(workers={"tcp://a:1": worker}))
    running = Job("11", submitted=1.0, state="running", started=2.0, registered=True, index=0, worker_names=("c-0-x",))
    done = Job("12", submitted=1.0, state="completed", index=1)
    jm = types.SimpleNamespace(scheduler=sched, managers={
        "default": types.SimpleNamespace(pool="default", jobs={"11": running, "12": done})})
    assert h.jobs_record(jm) == {"11": {"pool": "default", "index": 0, "state": "running", "submitted": 1.0,
                                        "started": 2.0, "registered": True, "retiring": False,
                                        "workers": ["c-0", "c-0-x"]}}
