"""The keeper restarts a SIGKILLed daemon of a distributed-engine cluster: distributed's scheduler
starts anew at a new address, and the cluster object must say so, so that Client(cluster) reaches
the new one (it kept the dead address: issue 32's review)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from hpc_cluster import SLURMCluster
from helpers.wait import wait_until

pytestmark = pytest.mark.slurm


def test_after_the_keeper_restarts_the_daemon_client_cluster_reaches_the_new_scheduler(slurm_cluster, own_home,
                                                                                      tmp_path):
    from distributed import Client
    cluster = SLURMCluster(cores=1, memory="1GB", walltime="00:10:00", engine="distributed",
                           log_directory=str(tmp_path / "logs"))
    try:
        old_address, old_pid = cluster.scheduler_address, cluster._proc.pid
        os.kill(old_pid, signal.SIGKILL)

        def restarted():
            info = json.loads(cluster.cluster_file.read_text()) if cluster.cluster_file.exists() else {}
            return (cluster._proc.pid != old_pid and info.get("engine_address") not in (None, old_address)
                    and info["engine_address"])
        new_address = wait_until(restarted, 120, "the keeper to restart the daemon", interval=0.2)
        wait_until(lambda: cluster.scheduler_address == new_address, 30, "the cluster to name the new scheduler")
        cluster.scale(1)
        with Client(cluster, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=180)
            assert client.submit(pow, 3, 4).result(timeout=60) == 81
    finally:
        cluster.close()


def test_our_client_refuses_a_distributed_cluster_and_leaves_its_workers_alone(slurm_cluster, own_home, tmp_path):
    """hpc_cluster.Client(cluster) of a distributed-engine cluster would speak our protocol to
    distributed's scheduler: refused, saying which Client to use. Through the cluster file (our
    control plane), get_worker_logs() must not open our handshake on distributed's workers (one
    tried to allocate 643 PiB, and the traceback joined its log tail)."""
    from distributed import Client
    from hpc_cluster import Client as OurClient
    cluster = SLURMCluster(cores=1, memory="1GB", walltime="00:10:00", engine="distributed",
                           log_directory=str(tmp_path / "logs"))
    try:
        with pytest.raises(ValueError, match="distributed's Client"):
            OurClient(cluster)
        cluster.scale(1)
        with Client(cluster, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=180)
            (address,) = client.scheduler_info()["workers"]
            with OurClient(cluster_file=str(cluster.cluster_file), timeout=30) as ours:
                logs = ours.get_worker_logs()
            assert "get_worker_logs" in logs[address][0]
            theirs = client.get_worker_logs()[address]
            assert not any("MemoryError" in line or "handshake" in line.lower() for _level, line in theirs), theirs
    finally:
        cluster.close()


def _hold_the_gil(seconds: int) -> int:
    import ctypes
    ctypes.PyDLL(None).sleep(seconds)       # libc's sleep through PyDLL: the GIL stays held
    return seconds


@pytest.mark.timeout(300)
def test_a_task_holding_the_gil_past_our_heartbeat_ttl_keeps_its_distributed_worker(slurm_cluster, own_home,
                                                                                    tmp_path):
    """distributed's workers beat from their event loop, which a task holding the GIL stops; our
    heartbeat_ttl (2 s here) removed such a worker and its nanny killed it (xgboost in CI lost its
    scattered data so). distributed's worker-ttl judges their silence instead."""
    from distributed import Client
    from hpc_cluster import Client as OurClient
    from helpers.by_value import by_value
    cluster = SLURMCluster(cores=1, memory="1GB", walltime="00:10:00", engine="distributed", heartbeat_ttl=2,
                           log_directory=str(tmp_path / "logs"))
    try:
        cluster.scale(1)
        with Client(cluster, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=180)
            (before,) = client.scheduler_info()["workers"]
            assert client.submit(by_value(_hold_the_gil), 8, pure=False).result(timeout=120) == 8
            assert list(client.scheduler_info()["workers"]) == [before]
            with OurClient(cluster_file=str(cluster.cluster_file), timeout=30) as ours:
                assert ours.deaths() == []
    finally:
        cluster.close()
