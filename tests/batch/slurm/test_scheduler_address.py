"""Where the scheduler listens when no interface= is set, on the real one-node SLURM (issue 33,
point 2): the address that routes to the compute nodes (here NodeAddr 127.0.0.1: loopback),
never every interface; and a worker that cannot reach the scheduler's address ends as a
`startup` death whose fix, in `hpc-cluster why`, names the address it tried and why it failed.

The unreachable address stays in 127.0.0.0/8: a port held open without listening, given to
the job's workers by a copy of the cluster file (worker_extra_args' --cluster-file, which wins
over ours), as if the compute node saw another address than the one the scheduler listens on.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys

import psutil
import pytest

from hpc_cluster.deploy.cluster import SLURMCluster
from hpc_cluster.protocol.clusterfile import read_cluster_file
from helpers.scenarios import deployed
from helpers.slurm import squeue_ids

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


def listening(pid: int) -> set[str]:
    """The addresses the process and its children listen on (TCP)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return {c.laddr.ip for p in procs for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def test_without_interface_the_scheduler_listens_on_the_nodes_address_only(slurm_cluster, isolated_home):
    cluster = SLURMCluster(cores=1, memory="300MB", walltime="00:05:00", name="addr-here",
                           log_directory=str(isolated_home / "logs"))
    with deployed(cluster, lambda: squeue_ids(check=False), jobs=1) as run:
        info = read_cluster_file(cluster.cluster_file)
        assert info["address"].startswith("tls://127.0.0.1:"), info["address"]   # an IP, not a host name; TLS
        assert run.client.submit(sum, [1, 2]).result(timeout=60) == 3
        worker = next(iter(run.client.scheduler_info()["workers"]))
        assert worker.startswith("tls://127.0.0.1:"), worker
        daemon = listening(info["pid"])              # the scheduler and its dashboard
        assert daemon and all(ipaddress.ip_address(ip).is_loopback for ip in daemon), daemon
        log = open(info["daemon_log"]).read()
        assert "scheduler address: listening on 127.0.0.1: the compute nodes (127.0.0.1) are on this host" in log


@pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])
def test_a_worker_that_cannot_reach_the_scheduler_is_a_startup_death_naming_what_it_tried(
        slurm_cluster, isolated_home, nanny):
    elsewhere = isolated_home / "elsewhere.json"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))                  # bound, never listening: connections are refused
        dead = f"tcp://127.0.0.1:{held.getsockname()[1]}"
        cluster = SLURMCluster(cores=1, memory="300MB", walltime="00:05:00", name=f"addr-gone-{int(nanny)}",
                               log_directory=str(isolated_home / "logs"), nanny=nanny, death_timeout=5,
                               startup_failures=1, worker_extra_args=["--cluster-file", str(elsewhere)])
        with deployed(cluster, lambda: squeue_ids(check=False), jobs=0) as run:
            info = read_cluster_file(cluster.cluster_file)
            elsewhere.write_text(json.dumps({"address": dead, "secret": info["secret"].hex()}))
            elsewhere.chmod(0o600)
            cluster.scale(1)
            run.jobs()
            death = run.death(lambda d: d["cause"] == "startup")
            assert death["blame"] is False
            assert f"tried {dead} (" in death["advice"] and "connection refused" in death["advice"], death
            assert "interface=" in death["advice"]
            why = subprocess.run([sys.executable, "-m", "hpc_cluster.cli", "why", cluster.id],
                                 capture_output=True, text=True, timeout=120)
            assert why.returncode == 0, why.stderr
            assert "startup" in why.stdout and f"cannot reach the scheduler from {socket.gethostname()}" in why.stdout
            assert f"tried {dead} (" in why.stdout, why.stdout
            run.outcome["why"] = why.stdout
