"""Leftovers and permissions (issue 14, point 8): what one cluster leaves behind must not break
the next; files that hold or reveal the secret or addresses are the user's alone; tasks'
subprocesses do not inherit the cluster secret."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.files import mode  # noqa: E402
from helpers.funcs import double  # noqa: E402
from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client, LocalCluster  # noqa: E402


def test_second_cluster_reusing_a_log_directory_starts(tmp_path):
    logs = tmp_path / "logs"
    with LocalCluster(n_workers=1, threads_per_worker=1, log_directory=str(logs)) as first:
        first_address = first.scheduler_address
    first_log = (logs / "scheduler.log").read_text()
    assert first_log
    # A cluster whose owner was killed leaves its address file behind: make one, as it would.
    (logs / "scheduler.address").write_text(first_address)
    with LocalCluster(n_workers=1, threads_per_worker=1, log_directory=str(logs)) as second, \
            Client(second) as c:
        assert second.scheduler_address != first_address
        assert c.submit(double, 21).result(timeout=30) == 42
    # The first run's log is still there (appended to, never truncated).
    log = (logs / "scheduler.log").read_text()
    assert log.startswith(first_log) and len(log) > len(first_log)


def test_log_directory_of_a_running_cluster_is_refused_and_that_cluster_is_untouched(tmp_path):
    logs = tmp_path / "logs"
    with LocalCluster(n_workers=1, threads_per_worker=1, log_directory=str(logs)) as first, \
            Client(first) as c:
        address = (logs / "scheduler.address").read_text()
        with pytest.raises(RuntimeError, match="log_directory .* is in use by a running LocalCluster"):
            LocalCluster(n_workers=1, threads_per_worker=1, log_directory=str(logs))
        assert (logs / "scheduler.address").read_text() == address
        assert len(c.scheduler_info()["workers"]) == 1
        assert c.submit(double, 4).result(timeout=30) == 8


def test_log_directory_is_refused_while_an_orphaned_scheduler_runs_there(tmp_path):
    """The owner SIGKILLed, its scheduler still running: the directory is still in use."""
    logs = tmp_path / "logs"
    code = ("import sys, time; from hpc_cluster import LocalCluster; "
            f"c = LocalCluster(n_workers=0, log_directory={str(logs)!r}); print('up', flush=True); time.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    sched_pid = None
    try:
        assert owner.stdout.readline().strip() == "up"
        import json
        procs = json.loads((logs / "cluster.owner").read_text())["processes"]
        sched_pid = procs[1][0]
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        with pytest.raises(RuntimeError, match=f"in use by a running LocalCluster .*{sched_pid}"):
            LocalCluster(n_workers=0, log_directory=str(logs))
        os.kill(sched_pid, signal.SIGTERM)
        import psutil
        wait_until(lambda: not psutil.pid_exists(sched_pid) or
                   psutil.Process(sched_pid).status() == psutil.STATUS_ZOMBIE, 15, "the scheduler to exit")
        sched_pid = None
        # Now everything there is stale: a new cluster starts.
        with LocalCluster(n_workers=1, threads_per_worker=1, log_directory=str(logs)) as again, Client(again) as c:
            assert c.submit(double, 1).result(timeout=30) == 2
    finally:
        if owner.poll() is None:
            # Its processes first: this test must leave none behind, even when it fails early.
            import psutil
            for child in psutil.Process(owner.pid).children(recursive=True):
                child.kill()
            owner.kill()
            owner.wait()
        if sched_pid is not None:
            try:
                os.kill(sched_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_log_directory_and_its_files_are_private(tmp_path):
    logs = tmp_path / "new" / "logs"
    with LocalCluster(n_workers=1, threads_per_worker=1, log_directory=str(logs)):
        assert mode(logs) == 0o700
        files = sorted(p.name for p in logs.iterdir())
        assert "scheduler.address" in files and "scheduler.log" in files and "worker-0.log" in files
        for name in files:
            assert mode(logs / name) == 0o600, (name, oct(mode(logs / name)))


def _env_and_inner_client(x):
    import subprocess

    from hpc_cluster import get_client
    env = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    inner = get_client().submit(double, x).result(timeout=30)     # the worker still knows the secret
    return env, inner


@pytest.mark.parametrize("nanny", [True, False])
def test_tasks_subprocesses_do_not_inherit_the_secret(nanny):
    with LocalCluster(n_workers=1, threads_per_worker=2, nanny=nanny) as cluster, Client(cluster) as c:
        env, inner = c.submit(_env_and_inner_client, 5).result(timeout=60)
        assert inner == 10
        assert "HPC_CLUSTER_SECRET" not in env
        assert cluster.secret.hex() not in env
        assert "PATH=" in env                       # it is the environment, and it was read
        if nanny:    # a restarted worker (the nanny starts it again) still gets the secret
            pid_before = c.submit(os.getpid, pure=False).result(timeout=30)
            c.restart(timeout=30)
            assert c.submit(os.getpid, pure=False).result(timeout=30) != pid_before
            env, inner = c.submit(_env_and_inner_client, 6).result(timeout=60)
            assert inner == 12 and cluster.secret.hex() not in env


def test_clusters_directory_and_daemon_log_are_private(sim):
    """The daemon `SLURMCluster`/`PBSCluster`/`hpc-cluster up` start: its cluster files' directory
    0700 (even one an older version made 0755), its log 0600."""
    from hpc_cluster.deploy.cluster import PBSCluster
    from hpc_cluster.protocol.clusterfile import clusters_dir
    clusters = clusters_dir()
    clusters.mkdir(parents=True, mode=0o755)
    os.chmod(clusters, 0o755)
    cluster = PBSCluster(cores=1, memory="1GB", walltime="00:10:00")
    try:
        assert mode(clusters) == 0o700
        assert mode(cluster.cluster_file) == 0o600
        logs = list(clusters.glob("*.log"))
        assert logs and all(mode(p) == 0o600 for p in logs), [(p, oct(mode(p))) for p in logs]
    finally:
        cluster.close()
