"""Tiny tasks run on the worker's event loop (worker/inline.py): when they do, when they stop,
a task there that would wait on its own cluster starts over on a thread, and a crash there
is charged to that task alone. Real LocalClusters (worker processes under nannies)."""

from __future__ import annotations

import threading
import time

import pytest

from hpc_cluster import Client, KilledWorker, LocalCluster, worker_client
from hpc_cluster.worker.inline import (INLINE_AFTER, INLINE_BAN, INLINE_BELOW, INLINE_BELOW_DEFAULT, InlineMixin,
                                       inline_allowed, inline_below)
from helpers.funcs import inc


def thread_name(x):
    return threading.current_thread().name


def slow_where(x):
    time.sleep(0.002)
    return threading.current_thread().name


def subtask_on_the_loop(x, path, from_):
    """On the loop (after its quick runs), or from `from_` on: waits on a subtask."""
    name = threading.current_thread().name
    with open(path, "a") as f:
        f.write(f"{x} {name}\n")
    if name == "MainThread" or x >= from_:
        with worker_client() as c:
            return c.submit(inc, x).result()
    return -x


def sees_a_loop(x):
    """As code that picks sync or async by asking for a running loop (asyncio.run() does)."""
    import asyncio
    try:
        asyncio.get_running_loop()
        return "a running loop"
    except RuntimeError:
        return threading.current_thread().name


def where_or_crash(x, crash_at):
    if x == crash_at:
        import ctypes
        ctypes.string_at(0)
    return threading.current_thread().name


def one_by_one(c, func, xs, *args):
    return [c.submit(func, x, *args, pure=False).result(timeout=30) for x in xs]


# A run is timed on the wall clock: on a core 2.5x slower, or a thread preempted under load, a
# function that takes 50 us here can take over INLINE_BELOW's 0.2 ms at every run and never
# reach the loop. These workers call any run under a second tiny, so that what the tests prove
# (what happens on the loop) does not hang on the machine's speed; the threshold's own effect
# is tested with the default (test_a_slower_function_stays_on_threads) and on the pure mixin.
GENEROUS = {"HPC_CLUSTER_INLINE_BELOW": "1.0"}


@pytest.fixture(scope="module")
def cluster():
    with pytest.MonkeyPatch.context() as mp:
        for name, value in GENEROUS.items():
            mp.setenv(name, value)
        with LocalCluster(n_workers=1, threads_per_worker=1) as c:
            yield c


def test_a_tiny_function_runs_on_the_loop_after_its_quick_runs_on_threads(cluster):
    with Client(cluster) as c:
        names = one_by_one(c, thread_name, range(40))
    assert all(n.startswith("hpc-task") for n in names[:INLINE_AFTER]), names
    assert "MainThread" in names[INLINE_AFTER:], names


def test_a_slower_function_stays_on_threads(monkeypatch):
    monkeypatch.delenv("HPC_CLUSTER_INLINE_BELOW", raising=False)       # the default threshold
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as c:
        names = one_by_one(c, slow_where, range(INLINE_AFTER + 12))
    assert all(n.startswith("hpc-task") for n in names), names


def test_the_environment_can_raise_the_tiny_threshold(cluster):
    # 2 ms a run: never tiny by default (test_a_slower_function_stays_on_threads), tiny under a second.
    with Client(cluster) as c:
        names = one_by_one(c, slow_where, range(INLINE_AFTER + 4))
    assert all(n.startswith("hpc-task") for n in names[:INLINE_AFTER]) and "MainThread" in names, names
    assert INLINE_BELOW == INLINE_BELOW_DEFAULT == inline_below({}) == 0.0002   # this process: unset
    assert inline_below({"HPC_CLUSTER_INLINE_BELOW": "0.5"}) == 0.5
    for bad in ("", "fast", "0", "-1", "nan"):
        assert inline_below({"HPC_CLUSTER_INLINE_BELOW": bad}) == INLINE_BELOW_DEFAULT, bad


def test_a_task_on_the_loop_sees_no_running_loop_as_on_a_thread(cluster):
    with Client(cluster) as c:
        names = one_by_one(c, sees_a_loop, range(30))
        assert "MainThread" in names and "a running loop" not in names, names
        assert c.submit(inc, 1, pure=False).result(timeout=30) == 2        # the worker's loop goes on


def test_a_task_on_the_loop_that_waits_on_its_cluster_starts_over_on_a_thread(cluster, tmp_path):
    path = tmp_path / "attempts"
    with Client(cluster) as c:
        out = one_by_one(c, subtask_on_the_loop, range(40), str(path), 30)
    assert out == [-x for x in range(30)] + [x + 1 for x in range(30, 40)]   # nothing deadlocked
    attempts = [line.split() for line in path.read_text().splitlines()]
    on_loop = [x for x, name in attempts if name == "MainThread"]
    assert len(on_loop) == 1, attempts                # then never on the loop again
    retried = [name for x, name in attempts if x == on_loop[0]]
    assert len(retried) == 2 and retried[1].startswith("hpc-task"), attempts


def test_a_crash_on_the_loop_is_charged_to_that_task_alone(monkeypatch):
    for name, value in GENEROUS.items():
        monkeypatch.setenv(name, value)
    with LocalCluster(n_workers=1, threads_per_worker=1, allowed_failures=0) as cluster, Client(cluster) as c:
        names = one_by_one(c, where_or_crash, range(30), -1)
        assert "MainThread" in names, names
        bad = c.submit(where_or_crash, 30, 30, pure=False)
        with pytest.raises(KilledWorker):
            bad.result(60)
        death = c.deaths()[0]
        assert death["cause"] == "crash" and death["blame"] and death["executing"] == [bad.key], death


def test_the_environment_can_keep_every_task_on_threads(monkeypatch):
    monkeypatch.setenv("HPC_CLUSTER_INLINE_TASKS", "0")
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as c:
        names = one_by_one(c, thread_name, range(INLINE_AFTER + 12))
    assert all(n.startswith("hpc-task") for n in names), names
    assert inline_allowed({}) and inline_allowed({"HPC_CLUSTER_INLINE_TASKS": "1"})
    assert not inline_allowed({"HPC_CLUSTER_INLINE_TASKS": " Off"})


class _Runs(InlineMixin):
    def __init__(self):
        self._quick = {}
        self._inline_allowed = True


class _Task:
    def __init__(self, func):
        self.func = func


def test_the_quick_run_count_resets_on_a_slow_run_and_a_long_one_is_never_inlined_again():
    r, ts = _Runs(), _Task(b"f")
    for _ in range(INLINE_AFTER - 1):
        r._note_run(b"f", INLINE_BELOW / 10)
    assert not r._runs_inline(ts)
    r._note_run(b"f", INLINE_BELOW / 10)
    assert r._runs_inline(ts)
    r._note_run(b"f", INLINE_BELOW * 2)             # a slower run: back to threads for a while
    assert not r._runs_inline(ts)
    for _ in range(INLINE_AFTER):
        r._note_run(b"f", INLINE_BELOW / 10)
    assert r._runs_inline(ts)
    r._quick[b"f"] = -1                              # as _run_inline does after INLINE_BAN
    for _ in range(2 * INLINE_AFTER):
        r._note_run(b"f", INLINE_BELOW / 10)
    assert not r._runs_inline(ts) and INLINE_BAN > INLINE_BELOW
