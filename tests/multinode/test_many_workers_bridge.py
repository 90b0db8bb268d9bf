"""100 light workers across the bridge (issue 33, point 6, at the suite's scale): the scheduler on
the login node (10.77.0.1), a launcher of 25 forked workers in each of the four nodes' network
namespaces. They all register, by name and by their node's address; a no-op map and a sleep
map run on every node; and a second client is answered all along, while they register and
while the maps run. Counts and answers are asserted, never times: the time 1,000 of them take is
benchmarks/many_nodes.py's to measure (BENCHMARKS.md, "Issue 33")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from hpc_cluster import Client

from helpers import multinode as MN
from helpers.procs import ClusterProcesses
from helpers.wait import wait_until

PER_NODE = 25
NODES = [f"hpcn{k}" for k in range(1, 5)]                 # 100 workers on the first four nodes
NODE_ADDRESSES = {node: f"10.77.0.{10 + int(node[4:])}" for node in NODES}


@pytest.fixture
def bridge_scheduler(tmp_path):
    """A scheduler listening on the login node's bridge address, and the launchers started on the nodes."""
    if not all(os.path.exists(f"/var/run/netns/{node}") for node in NODES):
        pytest.skip("the multi-node cluster's network namespaces are not there: "
                    f"`sudo bash {MN.CLUSTER_SH} up` first")
    procs = ClusterProcesses(tmp_path)
    launchers: list[subprocess.Popen] = []
    try:
        _, address = procs.scheduler("--host", MN.LOGIN_ADDRESS)
        yield procs, address, launchers
    finally:
        for p in launchers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)          # passed on to its workers
        for p in launchers:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()                               # its workers follow (PR_SET_PDEATHSIG)
                p.wait()
        procs.end()


def launch_on(node: str, address: str, env: dict, log) -> subprocess.Popen:
    cmd = ["nsenter", f"--net=/var/run/netns/{node}", sys.executable, "-m", "hpc_cluster.worker",
           "--scheduler", address, "--nworkers", str(PER_NODE), "--no-nanny", "--nthreads", "1",
           "--name", node, "--host", "0.0.0.0", "--death-timeout", "300"]
    return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


class Asker:
    """A second client asking the scheduler a small question (its worker table) in a loop, from a
    thread of its own: every question must be answered, whatever the workers are doing."""

    def __init__(self, address: str, secret: bytes):
        self.client = Client(address, secret=secret, timeout=60)
        self.answers: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.answers.append(len(self.client.scheduler_info()["workers"]))
            except Exception as exc:          # noqa: BLE001 - counted and shown by the test
                self.errors.append(repr(exc))
            self.stop.wait(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        self.client.close()


def host_and(x):
    """(the address this task's node reaches the login node from, x): nsenter --net leaves the host name."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.77.0.1", 9))                  # asks the routing table; sends nothing
        return s.getsockname()[0], x


def nap(x):
    time.sleep(0.1)
    return x


def test_a_hundred_light_workers_across_the_bridge_register_and_run_maps_while_a_client_is_answered(bridge_scheduler,
                                                                                                   tmp_path):
    procs, address, launchers = bridge_scheduler
    n = PER_NODE * len(NODES)
    assert address.startswith(f"tcp://{MN.LOGIN_ADDRESS}:")
    asker = Asker(address, procs.secret)
    try:
        with open(tmp_path / "launchers.log", "wb") as log:
            launchers += [launch_on(node, address, procs.env, log) for node in NODES]
        with Client(address, secret=procs.secret, timeout=60) as client:
            client.wait_for_workers(n, timeout=300)
            answered_while_registering = len(asker.answers)
            workers = client.scheduler_info()["workers"].values()
            # every worker by its own name, listening on its node's address (the bridge), 25 a node
            assert sorted(w["name"] for w in workers) == sorted(f"{node}-{i}" for node in NODES
                                                                for i in range(PER_NODE))
            hosts = Counter(w["address"].split("://")[1].rsplit(":", 1)[0] for w in workers)
            assert hosts == {ip: PER_NODE for ip in NODE_ADDRESSES.values()}

            got = client.gather(client.map(host_and, range(2_000)))
            assert [x for _, x in got] == list(range(2_000))
            assert {h for h, _ in got} == set(NODE_ADDRESSES.values())          # every node ran some
            assert client.gather(client.map(nap, range(3 * n))) == list(range(3 * n))
            assert len(client.scheduler_info()["workers"]) == n   # none lost on the way
    finally:
        asker.close()
    assert not asker.errors, asker.errors[:5]
    # answered while the workers registered (its table growing to all of them) and after
    assert answered_while_registering >= 1 and len(asker.answers) > answered_while_registering
    assert max(asker.answers) == n and asker.answers == sorted(asker.answers)
    for p in launchers:                          # each launcher ends its 25 workers and itself
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
