"""A worker's task threads, with real processes: what happens to a task given up on while
its thread still runs; two threads unpickling tasks that import one package."""

from __future__ import annotations

import importlib
import os
import time

from hpc_cluster import Client, LocalCluster

from waiting import wait_until


def gated(gate: str, runs: str) -> str:
    """Record a run, then wait (up to 60 s) until the test opens the gate."""
    with open(runs, "a") as f:
        f.write("run\n")
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
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
