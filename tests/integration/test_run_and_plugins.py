"""Reaching and preparing workers (issue 31, points 3 and 4) on a real LocalCluster: client.run
(on workers and in their nannies), get_worker(), run_on_scheduler's refusal, upload_file,
worker plugins (setup, teardown, transition, a worker that joins later, a setup that raises),
and the plugins distributed ships: PipInstall, UploadDirectory, Environ."""

from __future__ import annotations

import os
import sys
import uuid
import zipfile

import pytest

from hpc_cluster import (Client, Environ, LocalCluster, PipInstall, UploadDirectory, WorkerPlugin, get_worker)
from helpers.funcs import inc
from helpers.wait import wait_until


@pytest.fixture(scope="module")
def cluster():
    # Its own: tests here register plugins, add a worker and restart workers.
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GB", dashboard_address=None) as c:
        yield c


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _pids(client) -> dict:
    return client.run(os.getpid)


def _getenv(name: str):
    return os.environ.get(name)      # (os.environ.get itself would travel with this process's environ)


# -- run ---------------------------------------------------------------------------------
def test_run_answers_for_every_worker_from_its_own_process(client):
    pids = _pids(client)
    assert set(pids) == set(client.scheduler_info()["workers"])
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    assert client.run(lambda a, b=0: a + b, 1, b=2) == {w: 3 for w in pids}


def test_dask_worker_and_get_worker_show_the_worker(client, cluster):
    def look(dask_worker):
        return (dask_worker.address, dask_worker.nthreads, dask_worker.memory_limit,
                os.path.isdir(dask_worker.local_directory), get_worker() is dask_worker,
                dask_worker.scheduler.address)
    for addr, seen in client.run(look).items():
        assert seen == (addr, 1, 10**9, True, True, client.scheduler_address)
    held = client.submit(inc, 41)
    assert held.result(10) == 42
    where = client.submit(lambda: get_worker().address).result(10)
    assert where in client.scheduler_info()["workers"]
    # `data`: the results a worker holds, as a read-only mapping of key -> value.
    holding = client.run(lambda dask_worker: {k: dask_worker.data[k] for k in dask_worker.data if k == held.key})
    assert [v for v in holding.values() if v] == [{held.key: 42}]
    with pytest.raises(ValueError, match="No worker found"):
        get_worker()


def test_run_picks_workers_by_address_or_name_and_refuses_an_unknown_one(client):
    info = client.scheduler_info()["workers"]
    first = sorted(info)[0]
    assert set(client.run(os.getpid, workers=[first])) == {first}
    assert set(client.run(os.getpid, workers=[info[first]["name"]])) == {first}
    with pytest.raises(ValueError, match=r"'tcp://10\.9\.9\.9:1' is not a worker of this cluster") as err:
        client.run(os.getpid, workers=["tcp://10.9.9.9:1"])
    assert first in str(err.value)                       # it names the workers there are
    assert client.submit(inc, 1).result(10) == 2         # nothing lost: the client carries on


def _fails_on(target):
    def fn(dask_worker):
        if dask_worker.address == target:
            raise ZeroDivisionError(f"no luck on {target}")
        return "fine"
    return fn


def test_run_on_error_raise_return_or_ignore(client):
    a, b = sorted(client.scheduler_info()["workers"])
    with pytest.raises(ZeroDivisionError, match="no luck") as err:
        client.run(_fails_on(a))
    assert any(a in note for note in err.value.__notes__)
    returned = client.run(_fails_on(a), on_error="return")
    assert isinstance(returned[a], ZeroDivisionError) and returned[b] == "fine"
    assert client.run(_fails_on(a), on_error="ignore") == {b: "fine"}
    with pytest.raises(ValueError, match="on_error='loud'"):
        client.run(os.getpid, on_error="loud")


def test_run_coroutines_and_wait_false(client, tmp_path):
    async def where(dask_worker):
        return dask_worker.address
    assert {k: v for k, v in client.run(where).items() if k == v} == client.run(where)

    async def touch(path, dask_worker):
        open(os.path.join(path, dask_worker.name.replace("/", "_").replace(":", "_")), "w").close()
    assert client.run(touch, str(tmp_path), wait=False) is None
    wait_until(lambda: len(os.listdir(tmp_path)) == 2, 20, "both workers' background coroutines")


def test_the_scheduler_runs_no_user_code(client):
    def peek(dask_scheduler=None):
        return len(dask_scheduler.workers)
    with pytest.raises(NotImplementedError, match="never runs or unpickles user code") as err:
        client.run_on_scheduler(peek)
    assert "client.scheduler_info()" in str(err.value)   # and says what to use instead
    with pytest.raises(ValueError, match="dask_scheduler"):
        client.run(peek)


def test_run_in_the_nanny(client):
    workers = _pids(client)
    nannies = client.run(os.getpid, nanny=True)
    assert set(nannies) == set(workers) and not set(nannies.values()) & set(workers.values())
    assert client.run(os.getppid) == nannies             # each worker is its nanny's child
    seen = client.run(lambda dask_worker: (dask_worker.worker_address, dask_worker.worker_pid), nanny=True)
    assert seen == {addr: (addr, pid) for addr, pid in workers.items()}


# -- upload_file ---------------------------------------------------------------------------
def test_upload_file_imports_a_module_everywhere_and_a_new_version_replaces_it(client, tmp_path):
    name = _unique("uploaded")
    path = tmp_path / f"{name}.py"
    path.write_text("def answer():\n    return 41\n")
    try:
        assert set(client.upload_file(str(path))) == set(client.scheduler_info()["workers"])
        assert set(client.run(lambda: __import__(name).answer()).values()) == {41}
        assert client.submit(lambda: __import__(name).answer()).result(10) == 41
        path.write_text("def answer():\n    return 42\n")
        client.upload_file(str(path))
        assert set(client.run(lambda: __import__(name).answer()).values()) == {42}
    finally:
        client.unregister_worker_plugin(f"upload-file-{name}.py")


def test_upload_file_of_a_zip_of_a_package(client, tmp_path):
    package = _unique("zipped")
    archive = tmp_path / f"{package}.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(f"{package}/__init__.py", "NAME = 'from the zip'\n")
    try:
        client.upload_file(str(archive))
        assert set(client.run(lambda: __import__(package).NAME).values()) == {"from the zip"}
    finally:
        client.unregister_worker_plugin(f"upload-file-{package}.zip")


def test_upload_of_a_missing_file_is_refused_before_anything_is_sent(client, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file here"):
        client.upload_file(str(tmp_path / "nowhere.py"))
    plugins = client.run(lambda dask_worker: [p for p in dask_worker.plugins if "nowhere" in p])
    assert set(map(tuple, plugins.values())) == {()}


# -- worker plugins -----------------------------------------------------------------------
class Recorder(WorkerPlugin):
    """Notes its setup and teardown in files named after the worker's pid, and its transitions."""

    name = "recorder"

    def __init__(self, directory):
        self.directory = directory
        self.transitions = []

    def setup(self, worker):
        # get_worker() answers in setup too, also in a worker that joins later (setup runs as
        # it registers, before its first task).
        with open(os.path.join(self.directory, f"setup-{os.getpid()}"), "w") as f:
            f.write(get_worker().address)

    def teardown(self, worker):
        open(os.path.join(self.directory, f"teardown-{os.getpid()}"), "w").close()

    def transition(self, key, start, finish, **kwargs):
        self.transitions.append((key, start, finish))


def _files(directory, prefix: str) -> set[int]:
    return {int(f.split("-")[1]) for f in os.listdir(directory) if f.startswith(prefix)}


def test_a_plugin_is_set_up_everywhere_sees_transitions_and_reaches_a_worker_that_joins_later(client, cluster,
                                                                                              tmp_path):
    before = _pids(client)
    assert set(client.register_plugin(Recorder(str(tmp_path)))) == set(before)
    assert _files(tmp_path, "setup-") == set(before.values())
    f = client.submit(inc, 1, key=_unique("watched"))
    assert f.result(10) == 2
    seen = client.run(lambda dask_worker: dask_worker.plugins["recorder"].transitions)
    assert [t for ts in seen.values() for t in ts if t[0] == f.key] == [
        (f.key, "ready", "executing"), (f.key, "executing", "memory")]
    cluster.scale(3)
    try:
        client.wait_for_workers(3, timeout=30)
        now = _pids(client)
        (joined,) = set(now.values()) - set(before.values())
        wait_until(lambda: joined in _files(tmp_path, "setup-"), 10, "the new worker's setup")
        assert (tmp_path / f"setup-{joined}").read_text() in now
        assert client.run(lambda dask_worker: "recorder" in dask_worker.plugins) == {a: True for a in now}
    finally:
        client.unregister_worker_plugin("recorder")
        cluster.scale(2)
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 2, 30, "the cluster back to 2 workers")
    assert _files(tmp_path, "teardown-") == set(now.values())
    assert set(client.run(lambda dask_worker: "recorder" in dask_worker.plugins).values()) == {False}


class FailsOnOne(WorkerPlugin):
    name = "fails-on-one"

    def __init__(self, target):
        self.target = target

    def setup(self, worker):
        if worker.address == self.target:
            raise RuntimeError("no GPU on this node")


class Marker(WorkerPlugin):
    name = "marker"


def test_a_plugin_whose_setup_raises_names_itself_and_the_worker_and_loses_nothing(client):
    pids = _pids(client)
    bad = sorted(pids)[0]
    kept = client.submit(inc, 10, key=_unique("kept"))
    assert kept.result(10) == 11
    client.register_plugin(Marker())
    try:
        with pytest.raises(RuntimeError, match="no GPU on this node") as err:
            client.register_plugin(FailsOnOne(bad))
        note = "\n".join(err.value.__notes__)
        assert "'fails-on-one'" in note and bad in note and "unregister_worker_plugin" in note
        assert _pids(client) == pids                      # no worker was lost
        plugins = client.run(lambda dask_worker: sorted(dask_worker.plugins))
        assert plugins[bad] == ["marker"]                 # the failed one is not kept there; the rest is
        assert [p for a, p in plugins.items() if a != bad] == [["fails-on-one", "marker"]]
        assert kept.result(10) == 11 and client.submit(inc, kept).result(10) == 12
    finally:
        client.unregister_worker_plugin("fails-on-one")
        client.unregister_worker_plugin("marker")
    with pytest.raises(ValueError, match="no worker plugin of that name"):
        client.unregister_worker_plugin("fails-on-one")


class Counted(WorkerPlugin):
    name = "counted"
    idempotent = True

    def __init__(self, mark):
        self.mark = mark


def test_an_idempotent_plugin_is_not_replaced_and_bad_plugins_are_refused(client):
    try:
        assert client.register_plugin(Counted("first"))
        assert client.register_plugin(Counted("second")) == {}
        assert set(client.run(lambda dask_worker: dask_worker.plugins["counted"].mark).values()) == {"first"}
        assert client.register_plugin(Counted("third"), idempotent=False)
        assert set(client.run(lambda dask_worker: dask_worker.plugins["counted"].mark).values()) == {"third"}
    finally:
        client.unregister_worker_plugin("counted")
    with pytest.raises(TypeError, match="not the class Counted"):
        client.register_plugin(Counted)
    with pytest.raises(TypeError, match="not a dict"):
        client.register_plugin({"setup": print})


def test_the_older_names_and_distributeds_own_plugin_classes(client):
    from distributed.diagnostics.plugin import SchedulerPlugin
    from distributed.diagnostics.plugin import WorkerPlugin as DistributedWorkerPlugin

    class Theirs(DistributedWorkerPlugin):
        name = "theirs"

        def setup(self, worker):
            self.address = worker.address

    with pytest.warns(DeprecationWarning, match="register_plugin"):
        client.register_worker_plugin(Theirs())
    try:
        assert client.run(lambda dask_worker: dask_worker.plugins["theirs"].address) == {
            a: a for a in client.scheduler_info()["workers"]}
    finally:
        client.unregister_worker_plugin("theirs")
    with pytest.raises(TypeError, match="scheduler plugin"):
        client.register_plugin(SchedulerPlugin())


def test_environ_and_upload_directory(client, tmp_path):
    var = _unique("HPC_CLUSTER_TEST_ENVIRON").upper()
    client.register_plugin(Environ({var: 5}), name="env")
    try:
        assert set(client.run(_getenv, var).values()) == {"5"}
    finally:
        client.unregister_worker_plugin("env")
    assert set(client.run(_getenv, var).values()) == {None}    # what was there is back

    package = _unique("shipped")
    source = tmp_path / package
    (source / "tests").mkdir(parents=True)
    (source / "helper.py").write_text("WHERE = 'shipped'\n")
    (source / "tests" / "test_x.py").write_text("")
    plugin = UploadDirectory(str(source), update_path=True)
    try:
        client.register_plugin(plugin)
        assert set(client.run(lambda: __import__("helper").WHERE).values()) == {"shipped"}
        skipped = client.run(lambda dask_worker: os.path.exists(os.path.join(dask_worker.local_directory,
                                                                             package, "tests")))
        assert set(skipped.values()) == {False}
    finally:
        client.unregister_worker_plugin(plugin.name)
    with pytest.raises(FileNotFoundError, match="is not a directory here"):
        UploadDirectory(str(tmp_path / "absent"))


def _wheel(directory, name: str) -> str:
    """A minimal wheel of one module (pip installs it without building anything)."""
    path = os.path.join(directory, f"{name}-1.0-py3-none-any.whl")
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", "VALUE = 7\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"{name}.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


def test_pip_install_everywhere_then_restart_the_workers(client, tmp_path):
    name = _unique("hpctiny")
    target = tmp_path / "site"
    # --target: into a directory of the test's, not the environment the suite runs in.
    plugin = PipInstall([_wheel(str(tmp_path), name)], pip_options=["--no-index", "--target", str(target)],
                        restart_workers=True)
    before = _pids(client)
    try:
        client.register_plugin(plugin)
        assert (target / f"{name}.py").is_file()
        # restart_workers: each worker that was running is replaced by a fresh process, which
        # installs again as it registers (and is not restarted again).
        def fresh():
            now = client.run(os.getpid, on_error="ignore")     # one closing meanwhile answers an error
            return len(now) == 2 and not set(now.values()) & set(before.values())
        wait_until(fresh, 60, "fresh workers")
        assert set(client.run(lambda: sys.path.insert(0, str(target)) or __import__(name).VALUE).values()) == {7}
    finally:
        client.unregister_worker_plugin(plugin.name)
    failing = PipInstall([os.path.join(str(tmp_path), "absent-1.0-py3-none-any.whl")], pip_options=["--no-index"])
    try:
        with pytest.raises(RuntimeError, match="pip install failed") as err:
            client.register_plugin(failing)
        assert failing.name in "\n".join(err.value.__notes__)
    finally:
        client.unregister_worker_plugin(failing.name)


def test_register_worker_callbacks_and_a_second_client_sees_the_plugin(cluster, client):
    def mark(dask_worker):
        os.environ["HPC_CLUSTER_TEST_CALLBACK"] = dask_worker.address
    client.register_worker_callbacks(mark)
    try:
        with Client(cluster) as other:
            seen = other.run(_getenv, "HPC_CLUSTER_TEST_CALLBACK")
            assert seen == {a: a for a in other.scheduler_info()["workers"]}
    finally:
        names = client.run(lambda dask_worker: [p for p in dask_worker.plugins if p.startswith("mark-")])
        for name in {n for ns in names.values() for n in ns}:
            client.unregister_worker_plugin(name)


def _end_this_process():
    os.kill(os.getpid(), 9)


def test_a_nanny_run_ends_with_an_error_when_the_nanny_goes_or_there_is_none():
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB", dashboard_address=None) as c, \
            Client(c) as client:
        with pytest.raises(RuntimeError, match="nanny went away before it answered"):
            client.run(_end_this_process, nanny=True)         # no caller waits for ever
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB", dashboard_address=None,
                      nanny=False) as c, Client(c) as client:
        with pytest.raises(RuntimeError, match="runs without a nanny .* run it in the worker"):
            client.run(os.getpid, nanny=True)
        assert len(client.run(os.getpid)) == 1
