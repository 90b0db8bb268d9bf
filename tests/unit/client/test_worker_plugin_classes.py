"""client/worker_plugins.py and the checks register_plugin makes before anything is sent."""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import pytest

from hpc_cluster import Environ, PipInstall, UploadDirectory, WorkerPlugin
from hpc_cluster.client.workers import _check_plugin


def test_upload_directory_zips_the_directory_under_its_name_leaving_out_skipped_files(tmp_path):
    src = tmp_path / "project"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "pkg" / "mod.pyc").write_bytes(b"")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref\n")
    plugin = UploadDirectory(str(src))
    names = zipfile.ZipFile(io.BytesIO(plugin.data)).namelist()
    assert names == [os.path.join("project", "pkg", "mod.py")]
    assert plugin.name == "upload-directory-project"
    with pytest.raises(ValueError, match="runs no user code"):
        UploadDirectory(str(src), mode="scheduler")


def test_environ_puts_back_what_was_there(monkeypatch):
    monkeypatch.setenv("HPC_TEST_ENVIRON_KEPT", "old")
    monkeypatch.delenv("HPC_TEST_ENVIRON_NEW", raising=False)
    plugin = pickle.loads(pickle.dumps(Environ({"HPC_TEST_ENVIRON_KEPT": "new", "HPC_TEST_ENVIRON_NEW": 3})))
    plugin.setup(None)
    assert (os.environ["HPC_TEST_ENVIRON_KEPT"], os.environ["HPC_TEST_ENVIRON_NEW"]) == ("new", "3")
    plugin.teardown(None)
    assert os.environ["HPC_TEST_ENVIRON_KEPT"] == "old" and "HPC_TEST_ENVIRON_NEW" not in os.environ


def test_pip_install_wants_a_list_and_is_named_by_what_it_installs():
    with pytest.raises(TypeError, match=r"write \['numpy'\]"):
        PipInstall("numpy")
    assert PipInstall(["a"]).name == PipInstall(["a"]).name != PipInstall(["b"]).name
    assert PipInstall(["a"]).idempotent


def test_what_register_plugin_refuses():
    class Mine(WorkerPlugin):
        pass

    _check_plugin(Mine())
    with pytest.raises(TypeError, match="not the class Mine"):
        _check_plugin(Mine)

    class SchedulerPlugin:            # named as distributed's: refused by its kind, without importing it
        pass

    class NannyPlugin:
        pass

    with pytest.raises(TypeError, match="scheduler plugin"):
        _check_plugin(type("Theirs", (SchedulerPlugin,), {})())
    with pytest.raises(TypeError, match="nanny plugin"):
        _check_plugin(type("Theirs", (NannyPlugin,), {})())
    with pytest.raises(TypeError, match="subclass hpc_cluster.WorkerPlugin"):
        _check_plugin(object())
