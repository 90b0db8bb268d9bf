"""A worker's task threads: the hand-off from the event loop to long-lived threads
(worker/threads.py), driven directly; and with real processes, what happens to a task given up
on while its thread still runs, two threads unpickling tasks that import one package."""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
import time

from hpc_cluster import Client, LocalCluster
from hpc_cluster.protocol import serialize
from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.worker.logs import LogBuffer
from hpc_cluster.worker.threads import TaskThreads
from hpc_cluster.worker.worker import Worker

from helpers.wait import wait_for_file, wait_until, wait_until_async


def test_task_threads_live_on_and_take_what_was_queued_while_they_ran():
    ran, gate = [], threading.Event()

    def run(item):
        if item == "block":
            gate.wait(30)                  # as a seceded task waits on its subtasks
        return threading.current_thread()

    def done(item, thread):
        # the worker's hand-back to its loop: called once the thread counts as idle, so what
        # the loop starts next needs no new thread
        ran.append((item, thread))

    pool = TaskThreads(run, most=2, done=done)
    try:
        for i in range(20):
            pool.submit(i)
            wait_until(lambda: len(ran) == i + 1, 10, f"item {i}")
        # one after another: one thread ran all of them, and it is a daemon (a task that never
        # returns does not hold the process at exit)
        assert len({t for _, t in ran}) == 1 and pool.threads == 1 and ran[0][1].daemon
        pool.submit("block")                                   # holds the only thread
        wait_until(lambda: pool._idle == 0, 10, "the thread to take the blocking item")
        pool.submit("next")                                    # a second thread, up to `most`
        wait_until(lambda: ("next" in [i for i, _ in ran]), 10, "the next item on another thread")
        assert pool.threads == 2
        pool.submit("queued")                                  # no third: waits for a free thread
        assert pool.threads == 2
        wait_until(lambda: "queued" in [i for i, _ in ran], 10, "the queued item")
        gate.set()
        wait_until(lambda: "block" in [i for i, _ in ran], 10, "the blocked item to end")
    finally:
        gate.set()
        pool.shutdown(wait=True)
    pool.submit("after")                                       # closed: dropped
    assert "after" not in [i for i, _ in ran]


class FlushRecorder:
    """The scheduler's end of a worker, in process: what was sent, and what was flushed."""

    def __init__(self):
        self.sent, self.flushed = [], []

    def send(self, msg):
        self.sent.append(msg)

    def flush(self):
        self.flushed.extend(self.sent[len(self.flushed):])


def test_a_worker_hands_started_tasks_to_its_threads_after_task_started_is_flushed(monkeypatch):
    """Blame needs `task-started` on the wire before a task runs; the threads run only what
    the loop started (then flushed), and the results come back to the loop in order."""
    monkeypatch.setattr(LogBuffer, "install", classmethod(lambda cls: None))
    w = Worker("tcp://127.0.0.1:1", b"s" * 32, nthreads=1)
    w.scheduler = FlushRecorder()
    seen = []

    def check_started(key):
        # in the task thread: was this task's task-started flushed before it began?
        seen.append(any(m["op"] == "task-started" and m["key"] == key for m in w.scheduler.flushed))
        return key

    monkeypatch.setattr(w.functions, "get", lambda blob: check_started)     # (a closure does not pickle)
    func = Opaque(b"check_started")

    async def run():
        w.loop = asyncio.get_running_loop()
        for i in range(30):
            args, _ = serialize.dumps_args((f"k{i}",), {})
            w._add_task({"op": "compute", "key": f"k{i}", "func": func, "args": Opaque(args), "priority": [i]})
        w._run_ready()
        await wait_until_async(lambda: len([m for m in w.scheduler.sent if m["op"] == "task-finished"]) >= 30, 30,
                               "the 30 tasks to finish")

    try:
        asyncio.run(run())
    finally:
        w.executor.shutdown(wait=True)
    assert seen == [True] * 30
    finished = [m["key"] for m in w.scheduler.sent if m["op"] == "task-finished"]
    assert finished == [f"k{i}" for i in range(30)]              # one thread, in priority order
    assert w.executor.threads == 1 and not w.executing
    assert [w.data[f"k{i}"] for i in (0, 29)] == ["k0", "k29"]


def gated(gate: str, runs: str) -> str:
    """Record a run, then wait (up to 60 s) until the test opens the gate."""
    with open(runs, "a") as f:
        f.write("run\n")
    wait_for_file(gate, 60)
    return "done"


def test_a_task_submitted_again_while_its_released_thread_runs_finishes_once(tmp_path):
    # Found in an audit: the scheduler sent the new submission to the worker whose thread
    # still ran the released task; the worker ignored it and the future never finished.
    gate, runs = str(tmp_path / "gate"), str(tmp_path / "runs")
    with LocalCluster(n_workers=1, threads_per_worker=1, nanny=False) as cluster, Client(cluster) as client:
        fut = client.submit(gated, gate, runs)
        key = fut.key
        wait_until(lambda: os.path.exists(runs), what="the task to start")
        del fut                                          # released while its thread runs
        wait_until(lambda: all(w["processing"] == 0 for w in client.scheduler_info()["workers"].values()),
                   what="the scheduler to give the task up")
        again = client.submit(gated, gate, runs)
        assert again.key == key
        # The worker takes the running thread over and says it is executing the task again.
        wait_until(lambda: all(w["executing"] == 1 for w in client.scheduler_info()["workers"].values()),
                   what="the worker to report the running thread as executing the task again")
        open(gate, "w").close()
        assert again.result(timeout=30) == "done"
        with open(runs) as f:
            assert f.read().count("run") == 1            # the running thread's result was used


# A package laid out as dask.array is: its __init__ imports a submodule that registers
# what the package's functions look up (dask.array.backends filling concatenate_lookup).
PACKAGE = {
    "__init__.py": ("import os, time\nopen(os.environ['RACEPKG_IMPORTING'], 'w').close()\n"
                    "time.sleep(0.5)\nfrom racepkg import backends  # noqa\n"),
    "core.py": "REGISTRY = {}\n\ndef lookup():\n    return REGISTRY['numpy']\n",
    "backends.py": "from racepkg import core\ncore.REGISTRY['numpy'] = 'concatenate'\n",
}


class ImportOnLoad:
    """Unpickles (on the worker) to the module `name`, imported there: as a task's function
    reference makes pickle import its module."""

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        return importlib.import_module, (self.name,)


def use(module, delay: float):
    time.sleep(delay)
    return importlib.import_module("racepkg.core").lookup()


def test_two_threads_unpickling_tasks_that_import_one_package_see_it_whole(tmp_path, monkeypatch):
    # One thread imports the package (its __init__ takes 0.5 s), the other a submodule of it
    # meanwhile: without one unpickling at a time, one of them gets a half-imported package
    # (a deadlock Python breaks by handing out the partial module, or an error), as dask's
    # first array compute on a fresh 4-thread worker did ("No dispatch for ndarray").
    (tmp_path / "racepkg").mkdir()
    for name, text in PACKAGE.items():
        (tmp_path / "racepkg" / name).write_text(text)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    importing = tmp_path / "importing"
    monkeypatch.setenv("RACEPKG_IMPORTING", str(importing))
    with LocalCluster(n_workers=1, threads_per_worker=2) as cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=60)
        first = client.submit(use, ImportOnLoad("racepkg"), 0, pure=False)
        wait_until(importing.exists, 30, "the first task to be importing the package")
        second = client.submit(use, ImportOnLoad("racepkg.core"), 0, pure=False)
        assert [first.result(timeout=60), second.result(timeout=60)] == ["concatenate"] * 2
