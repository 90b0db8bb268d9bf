"""The multi-node SLURM test cluster (tests/multinode/cluster.sh): its nodes, and failing them for
real. A node killed, or cut off, is always given back (`node_down`, `cut_off`), so that one test's
failure does not become the next test's."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

from helpers.wait import wait_until

CLUSTER_SH = Path(__file__).resolve().parents[1] / "multinode" / "cluster.sh"
SLURM_CONF = "/etc/slurm-multinode/slurm.conf"
STATE = Path("/var/lib/hpc-multinode")                # one directory per node: STATE/hpcnK/tmp is its /tmp
SHARED = STATE / "shared"                             # seen by every node (node-local: /tmp)
LOGIN_ADDRESS = "10.77.0.1"
NODES = [f"hpcn{k}" for k in range(1, 7)]


def cluster_sh(*args: str, timeout: float = 180) -> str:
    proc = subprocess.run(["bash", str(CLUSTER_SH), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, "SLURM_CONF": SLURM_CONF})
    if proc.returncode != 0:
        raise RuntimeError(f"cluster.sh {' '.join(args)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc.stdout


def is_up() -> bool:
    return subprocess.run(["bash", str(CLUSTER_SH), "status"], capture_output=True,
                          env={**os.environ, "SLURM_CONF": SLURM_CONF}).returncode == 0


def node_state(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], capture_output=True, text=True,
                         env={**os.environ, "SLURM_CONF": SLURM_CONF})
    return (out.stdout.split() or ["?"])[0]


def node_of(worker_row: dict) -> str:
    """The node a worker runs on, by the host name it reported."""
    return worker_row.get("host") or worker_row.get("hostname") or "?"


@contextmanager
def node_down(node: str):
    """Every process of `node` SIGKILLed (slurmd, jobs, workers: a node that lost power); started
    again, and back in service, when the block ends."""
    cluster_sh("kill-node", node)
    try:
        yield
    finally:
        cluster_sh("start-node", node)


@contextmanager
def cut_off(node: str):
    """`node`'s link down (or the login node's, node='login'): a network partition; mended when
    the block ends if the test has not mended it itself."""
    cluster_sh("cut", node)
    try:
        yield lambda: cluster_sh("mend", node)
    finally:
        cluster_sh("mend", node)


def wait_node_state(node: str, pattern: tuple[str, ...], timeout: float = 120) -> str:
    return wait_until(lambda: next((s for s in [node_state(node)] if s.startswith(pattern)), None),
                      timeout, f"{node} to be {'/'.join(pattern)}", interval=1)
