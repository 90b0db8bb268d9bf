"""Chaos: a 5,000-task map-reduce while a thread SIGKILLs a random worker every ~2 s."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from hpc_cluster import Client, LocalCluster


def square(x):
    time.sleep(0.002)
    return x * x


def total(xs):
    time.sleep(0.002)
    return sum(xs)


def build(client, n_leaves=4000, fan_in=5):
    level = client.map(square, range(n_leaves))
    count = len(level)
    while len(level) > 1:
        level = [client.submit(total, level[i:i + fan_in]) for i in range(0, len(level), fan_in)]
        count += len(level)
    return level[0], count


@pytest.mark.slow
def test_map_reduce_survives_random_sigkills():
    rng = random.Random(2026)
    kills: list[tuple[float, int]] = []
    stop = threading.Event()
    with LocalCluster(n_workers=3, threads_per_worker=1, allowed_failures=3) as cluster, Client(cluster) as c:
        def killer():
            while not stop.wait(2.0):
                pids = [w["pid"] for w in c.scheduler_info()["workers"].values() if w.get("pid")]
                if pids:
                    pid = rng.choice(pids)
                    try:
                        os.kill(pid, signal.SIGKILL)
                        kills.append((time.time(), pid))
                    except ProcessLookupError:
                        pass

        thread = threading.Thread(target=killer, daemon=True)
        start = time.time()
        result, count = build(c)
        thread.start()
        try:
            value = result.result(timeout=600)
        finally:
            stop.set()
            thread.join()
        assert count >= 5000
        assert value == sum(i * i for i in range(4000))      # the serial answer
        assert len(kills) >= 2, "the computation ended before the chaos began"
        deaths = c.deaths()
        assert len(deaths) >= len(kills)
        assert not any(d["blame"] for d in deaths), "an outside SIGKILL was charged to a task"
        print(f"\nchaos: {count} tasks, {len(kills)} SIGKILLs, {len(deaths)} deaths, "
              f"{time.time() - start:.1f} s")
