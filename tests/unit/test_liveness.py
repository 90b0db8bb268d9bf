"""lifeline.alive: the one liveness check, which a reused pid does not fool (issue 30, point 6).

A login node's reboot (or a wrap of the pid space) gives a recorded pid to another process;
its start time tells them apart. A reused pid is simulated by recording a wrong start time
for a live pid."""

import os
import subprocess
import sys

import pytest

from hpc_cluster.deploy.launch import daemon_running
from hpc_cluster.deploy.local.cluster import _process_id, _running
from hpc_cluster.lifeline import START_TOLERANCE, alive, owner_alive, process_start

ME = os.getpid()


def test_a_live_process_with_its_start_time_is_alive():
    started = process_start(ME)
    assert started is not None and alive(ME, started)
    assert alive(ME, started + START_TOLERANCE / 2)          # two readings may differ a little


def test_a_reused_pid_reads_as_dead():
    assert not alive(ME, process_start(ME) - 3600)            # the pid's process started an hour later
    assert not alive(ME, process_start(ME) + 5)


def test_without_a_start_time_the_pid_alone_answers():
    assert alive(ME) and alive(ME, None)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not alive(gone.pid) and process_start(gone.pid) is None


def test_a_zombie_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)    # exited, not reaped: a zombie
        assert not alive(child.pid)
    finally:
        child.wait()


def test_the_owner_watch_reads_a_reused_owner_pid_as_gone():
    parent = os.getppid()
    assert owner_alive(ME, parent, process_start(ME))
    assert not owner_alive(ME, parent, process_start(ME) - 3600)
    assert owner_alive(ME, parent)                               # started unknown: the pid alone


def test_a_cluster_files_daemon_pid_reused_after_a_reboot_is_not_running(tmp_path):
    path = tmp_path / "c.json"
    assert daemon_running({"pid": ME, "pid_started": process_start(ME)}, path)
    assert not daemon_running({"pid": ME, "pid_started": process_start(ME) - 86400}, path)
    assert daemon_running({"pid": ME}, path)                     # a file written before pid_started


def test_local_clusters_owner_file_ids():
    assert _running([_process_id(ME)]) == [ME]
    assert _running([[ME, process_start(ME) - 3600]]) == []
    assert _running([[ME, None], ["x", 1.0]]) == []


@pytest.mark.parametrize("module", ["hpc_cluster.deploy.launch", "hpc_cluster.deploy.daemon.run", "hpc_cluster.cli.lookup",
                                    "hpc_cluster.cli.down", "hpc_cluster.lifeline"])
def test_no_liveness_check_of_its_own(module):
    # One check: os.kill(pid, 0) is blind to a reused pid.
    import importlib
    import inspect
    assert "os.kill(pid, 0)" not in inspect.getsource(importlib.import_module(module))
