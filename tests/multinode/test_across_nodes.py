"""Workers on other nodes reach the scheduler on the login node across the bridge, with no
interface= setting (issue 33, point 2), and each node keeps its own /tmp (point 1)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import pytest

from hpc_cluster import Client
from hpc_cluster.deploy.cluster import SLURMCluster
from helpers import multinode as MN
from helpers.wait import wait_until

pytestmark = pytest.mark.timeout(600)


def where_am_i():
    return socket.gethostname()


def write_local(name):
    path = os.path.join(tempfile.gettempdir(), name)
    with open(path, "w") as f:
        f.write(socket.gethostname())
    return socket.gethostname(), path


@pytest.fixture(scope="module")
def across(tmp_path_factory):
    base = MN.SHARED / "tests" / "across"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(base / "xdg"))
        mp.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(base / "etc"))
        with SLURMCluster(cores=1, memory="400MB", walltime="00:10:00", name="mn-across",
                          log_directory=str(base / "logs")) as cluster:
            cluster.scale(4)
            with Client(cluster) as client:
                client.wait_for_workers(4, timeout=180)
                yield cluster, client


def test_the_scheduler_advertises_the_address_that_routes_to_the_nodes(across):
    cluster, client = across
    assert client.scheduler_info()["address"].split("://")[1].split(":")[0] == MN.LOGIN_ADDRESS


def test_workers_on_every_node_register_by_address(across):
    cluster, client = across
    hosts = client.run(where_am_i)
    assert len(set(hosts.values())) >= 3, hosts           # CR_LLN spreads the 4 jobs
    assert set(hosts.values()) <= set(MN.NODES), hosts
    for address, host in hosts.items():
        # An IP the login node can reach, on the node's own bridge address, not a host name.
        assert address.split("://")[1].split(":")[0] == f"10.77.0.1{host[-1]}", (address, host)
    assert sum(client.gather(client.map(lambda x: x + 1, range(200)))) == sum(range(1, 201))


def test_each_node_has_its_own_tmp(across):
    cluster, client = across
    name = f"mn-local-{os.getpid()}"
    written = client.run(write_local, name)
    for host, path in written.values():
        assert path.startswith("/tmp/"), path
        on_node = MN.STATE / host / "tmp" / os.path.basename(path)
        assert on_node.read_text() == host
        others = [n for n in MN.NODES if n != host and (MN.STATE / n / "tmp" / name).exists()
                  and (MN.STATE / n / "tmp" / name).read_text() == host]
        assert not others, others
    assert not os.path.exists(os.path.join("/tmp", name))        # the login node's /tmp is its own


def test_interface_still_selects_one_explicitly(shared_config):
    """The login node's bridge interface for the scheduler, the nodes' eth0 for the workers."""
    with SLURMCluster(cores=1, memory="300MB", walltime="00:05:00", name="mn-interface", interface="eth0",
                      scheduler_options={"interface": "hpcmnl0"}, log_directory=str(shared_config / "logs")) as cluster:
        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=180)
            # TLS by default (issue 34), across the nodes too.
            assert client.scheduler_info()["address"].startswith(f"tls://{MN.LOGIN_ADDRESS}:")
            assert all(a.startswith("tls://10.77.0.1") for a in client.scheduler_info()["workers"])


def test_a_scheduler_address_the_nodes_cannot_reach_fails_the_job_at_start(shared_config):
    """127.0.0.1 on the login node is, on a compute node, the compute node itself: the worker
    tries, fails within its death_timeout, and says what it tried; `why` shows it."""
    with SLURMCluster(cores=1, memory="300MB", walltime="00:05:00", name="mn-unreachable", death_timeout=5,
                      startup_failures=1, scheduler_options={"host": "127.0.0.1"},
                      log_directory=str(shared_config / "logs")) as cluster:
        with Client(cluster) as client:
            cluster.scale(1)
            death = wait_until(lambda: next((d for d in client.deaths() if d["cause"] == "startup"
                                             and d.get("final_at")), None), 180, "a startup death", interval=1)
            address = client.scheduler_info()["address"]        # tls://127.0.0.1:PORT
            assert death["blame"] is False
            assert f"tried {address} (" in death["advice"], death["advice"]
            assert "cannot reach the scheduler from hpcn" in death["advice"], death["advice"]
            why = subprocess.run([sys.executable, "-m", "hpc_cluster.cli", "why", cluster.id],
                                 capture_output=True, text=True, timeout=120)
            assert why.returncode == 0, why.stderr
            assert "startup" in why.stdout and f"tried {address} (" in why.stdout, why.stdout


def test_a_worker_started_by_hand_on_a_node_listens_where_the_scheduler_reaches_it(across):
    """No --host: the node's address that routes to the scheduler (as dask-worker picks), not
    127.0.0.1, which on another node is that node itself."""
    from hpc_cluster.protocol.clusterfile import read_cluster_file
    cluster, client = across
    info = read_cluster_file(cluster.cluster_file)
    before = set(client.scheduler_info()["workers"])
    tls = info.get("tls") or {}              # TLS by default: the cluster's certificates, as dask-worker takes them
    flags = [x for k, flag in (("ca_file", "--tls-ca-file"), ("cert", "--tls-cert"), ("key", "--tls-key"))
             if tls.get(k) for x in (flag, tls[k])]
    proc = subprocess.Popen(["nsenter", "--net=/var/run/netns/hpcn6", sys.executable, "-m", "hpc_cluster.worker",
                             "--scheduler", info["address"], "--no-nanny", "--name", "by-hand", *flags],
                            env=dict(os.environ, HPC_CLUSTER_SECRET=info["secret"].hex()),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        new = wait_until(lambda: set(client.scheduler_info()["workers"]) - before, 60, "the worker started by hand")
        assert [a.split("://")[1].split(":")[0] for a in new] == ["10.77.0.16"], new
        # It serves tasks (the scheduler reaches it there); nsenter --net: the login node's host name.
        assert client.submit(where_am_i, workers=list(new), pure=False).result(timeout=60) == socket.gethostname()
    finally:
        proc.terminate()
        proc.wait(30)
