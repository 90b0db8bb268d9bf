"""Chaos: a 5,000-task map-reduce while a thread SIGKILLs a random worker every ~2 s, and
again while the scheduler is also SIGSTOPped 3-10 s at random moments."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import psutil
import pytest

from hpc_cluster import Client, LocalCluster
from helpers.funcs import slow_square


# 3 ms per task: long enough for several kills (at 2 ms on a map-then-reduce the
# computation ended after about 3); each kill also costs the recompute of what it held.
def slow_total(xs):
    time.sleep(0.003)
    return sum(xs)


def build(client, n_leaves=4000, fan_in=5, first=0):
    """A reduction tree submitted depth-first (each reducer right after its inputs).

    Priority is submission order, so this runs depth-first, as dask.order would, and the
    results a kill can destroy stay few. Submitted level by level instead (all leaves, then
    all reducers), the results pile up, and at one kill per 2 s they are lost faster than
    three workers recompute them: the computation never ends.
    """
    count = 0

    def tree(lo, hi):
        nonlocal count
        if hi - lo <= fan_in:
            inputs = client.map(slow_square, range(lo, hi), seconds=0.003)
        else:
            step = -(-(hi - lo) // fan_in)
            inputs = [tree(a, min(a + step, hi)) for a in range(lo, hi, step)]
        count += len(inputs) if hi - lo <= fan_in else 0
        count += 1
        return client.submit(slow_total, inputs)

    return tree(first, first + n_leaves), count


def worker_processes(cluster) -> list[int]:
    """The worker processes, found as the nannies' children: asking the scheduler would wait
    out its pauses, and the kills go on meanwhile."""
    pids = []
    for nanny in cluster.worker_pids().values():
        try:
            pids += [p.pid for p in psutil.Process(nanny).children() if p.status() != psutil.STATUS_ZOMBIE]
        except psutil.NoSuchProcess:
            pass
    return pids


def chaos(cluster, c, rng, pause_scheduler: bool, n_leaves: int = 4000) -> None:
    """Trees of tasks until five SIGKILLs (and, with pause_scheduler, two scheduler pauses)
    happened; each result checked against the serial answer, and no death charged."""
    kills: list[tuple[float, int]] = []
    pauses: list[float] = []
    stop = threading.Event()

    def killer():
        while not stop.wait(2.0):
            pids = worker_processes(cluster) if pause_scheduler else \
                [w["pid"] for w in c.scheduler_info()["workers"].values() if w.get("pid")]
            if pids:
                pid = rng.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append((time.time(), pid))
                except ProcessLookupError:
                    pass

    def pauser():
        # SIGSTOP the scheduler 3-10 s at random moments: longer than its heartbeat TTL (5 s)
        # at times, and long enough that killed workers' successors register during a pause.
        # 10-20 s apart: stopped 2-6 s apart (60% of the time) while a worker died every 2 s,
        # the work was lost faster than done (136 deaths in 6 min, the first tree unfinished).
        sched = cluster._scheduler.pid
        while not stop.wait(rng.uniform(10.0, 20.0)):
            length = rng.uniform(3.0, 10.0)
            os.kill(sched, signal.SIGSTOP)
            try:
                stop.wait(length)
            finally:
                os.kill(sched, signal.SIGCONT)
            pauses.append(length)

    threads = [threading.Thread(target=killer, daemon=True)]
    if pause_scheduler:
        threads.append(threading.Thread(target=pauser, daemon=True))
    start = time.time()
    rounds = 0
    for t in threads:
        t.start()
    try:
        # A fast machine finishes a tree before five kills (CI once did in 9 s: 4 kills);
        # then another tree, on other numbers, until the chaos has been real. Killing more
        # often instead is no fix: at one kill per 1.2 s recomputing falls behind (463 s).
        # Two pauses take up to 60 s (10-20 s apart, 3-10 s long): a fast machine finished
        # 6 trees with one pause (2026-11-25), so up to 12.
        while (len(kills) < 5 or (pause_scheduler and len(pauses) < 2)) and rounds < 12:
            first = n_leaves * rounds
            result, count = build(c, n_leaves=n_leaves, first=first)
            value = result.result(timeout=600)
            assert count >= 1.25 * n_leaves
            assert value == sum(i * i for i in range(first, first + n_leaves))      # the serial answer
            rounds += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert len(kills) >= 5, f"{rounds} trees ended before much chaos happened"
    if pause_scheduler:
        assert len(pauses) >= 2, f"{rounds} trees ended before the scheduler was paused twice"
    deaths = c.deaths()
    # During a pause, a killed worker's successor may be killed before it could register:
    # no death then (24 kills, 20 deaths in one run).
    assert len(deaths) >= (5 if pause_scheduler else len(kills))
    assert not any(d["blame"] for d in deaths), "an outside SIGKILL was charged to a task"
    # The scheduler's pauses are nobody's fault: no worker is dropped as silent, none gives up.
    assert not [d for d in deaths if d["cause"] in ("heartbeat-lost", "scheduler-lost")], deaths
    paused = f"scheduler paused {len(pauses)} times ({sum(pauses):.0f} s), " if pause_scheduler else ""
    print(f"\nchaos: {rounds} x {count} tasks, {len(kills)} SIGKILLs, {len(deaths)} deaths, {paused}"
          f"{time.time() - start:.1f} s")


@pytest.mark.slow
def test_map_reduce_survives_random_sigkills():
    with LocalCluster(n_workers=3, threads_per_worker=1, allowed_failures=3) as cluster, Client(cluster) as c:
        chaos(cluster, c, random.Random(2026), pause_scheduler=False)


@pytest.mark.slow
def test_map_reduce_survives_random_sigkills_and_scheduler_pauses():
    """Issue 14's 'kept held': the same chaos (2,500-task trees) while the scheduler is
    SIGSTOPped 3-10 s at random moments. The results are right and no task is charged."""
    # A 2 s TTL: every pause outlasts it. With the default 5 s the old watchdog dropped no
    # worker in one run (the race between it and the queued heartbeats went the right way).
    with LocalCluster(n_workers=3, threads_per_worker=1, allowed_failures=3, heartbeat_ttl=2.0) as cluster, \
            Client(cluster) as c:
        chaos(cluster, c, random.Random(14), pause_scheduler=True, n_leaves=2000)
