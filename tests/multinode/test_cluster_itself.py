"""The multi-node test cluster is what issue 33 point 1 says: a login node and compute nodes, each
with its own network, host name, slurmd, spool, /tmp and memory cgroup, nothing listening or
routed outside 127.0.0.0/8 and the bridge's subnet, and a teardown that leaves nothing."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import time

import pytest

from helpers import multinode as MN
from helpers.wait import wait_until

pytestmark = pytest.mark.timeout(600)

ALLOWED = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("10.77.0.0/24")]


def in_node(node: str, *cmd: str) -> str:
    """Run `cmd` in `node`'s network namespace (its mount and UTS namespaces are slurmd's own:
    enter them through slurmd's pid)."""
    pid = open(f"/run/hpc-multinode/slurmd-{node}.pid").read().strip()
    return subprocess.run(["nsenter", "-t", pid, "--net", "--uts", "--mount", *cmd], capture_output=True,
                          text=True, check=True).stdout


def listeners(text: str) -> list[str]:
    """Local addresses of `ss -ltnH` / `ss -lunH` lines."""
    return [line.split()[3].rsplit(":", 1)[0].strip("[]") for line in text.splitlines() if line.strip()]


def permitted(address: str) -> bool:
    if address in ("*", "0.0.0.0", "::"):
        return False
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    return any(ip in net for net in ALLOWED) or ip.is_loopback


def test_each_compute_node_is_a_host_of_its_own():
    seen = {}
    for node in MN.NODES:
        seen[node] = {"hostname": in_node(node, "hostname").strip(),
                      "addresses": in_node(node, "ip", "-4", "-o", "addr", "show", "eth0"),
                      "hosts": in_node(node, "cat", "/etc/hosts"),
                      "memory": in_node(node, "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes").strip()}
        assert seen[node]["hostname"] == node
        assert f"10.77.0.1{node[-1]}/24" in seen[node]["addresses"], seen[node]["addresses"]
        assert int(seen[node]["memory"]) == 3000 * 2**20        # the node's own memory cgroup
        # Like many sites' compute nodes, they cannot resolve the login node's name.
        assert os.uname().nodename not in seen[node]["hosts"]
        assert (MN.STATE / node / "spool").is_dir()
    assert len({s["hostname"] for s in seen.values()}) == len(MN.NODES)


def test_no_node_has_a_route_outside_the_bridge():
    for node in MN.NODES:
        routes = in_node(node, "ip", "-4", "route").strip().splitlines()
        assert routes and all(r.startswith("10.77.0.0/24") for r in routes), (node, routes)


def test_nothing_listens_outside_loopback_and_the_bridge():
    for node in MN.NODES:
        found = listeners(in_node(node, "ss", "-ltnH")) + listeners(in_node(node, "ss", "-lunH"))
        assert found and all(permitted(a) for a in found), (node, found)     # slurmd on its own address
    ctld = open("/run/hpc-multinode/slurmctld.pid").read().strip()
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    mine = [line for line in out.splitlines() if f"pid={ctld}," in line]
    assert mine and all(permitted(a) for a in listeners("\n".join(mine))), mine


def test_a_job_over_its_memory_on_a_node_is_killed_by_that_nodes_cgroup(shared_dir):
    job = subprocess.run(
        ["sbatch", "--parsable", "-w", "hpcn5", "--mem=100M", "-o", str(shared_dir / "oom-%j.out"), "--wrap",
         "python3 -c 'import time; b = []\nwhile True:\n    b.append(b\"x\" * (4 << 20)); time.sleep(0.02)'"],
        capture_output=True, text=True, check=True).stdout.strip()
    state = wait_until(lambda: (s := subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "State,NodeList"],
                                                    capture_output=True, text=True).stdout.strip())
                       and not s.startswith(("RUNNING", "PENDING")) and s, 120, "the job to end", interval=1)
    assert state == "OUT_OF_MEMORY|hpcn5", state


def test_down_leaves_nothing_and_up_brings_it_back():
    t0 = time.monotonic()
    MN.cluster_sh("down")
    left = {
        "netns": [n for n in os.listdir("/var/run/netns") if n.startswith("hpcn")] if os.path.isdir("/var/run/netns") else [],
        "links": [line for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
                  if "hpcmn" in line],
        "cgroups": [c for c in os.listdir("/sys/fs/cgroup/memory") if c.startswith("hpcmn-")],
        "files": [p for p in ("/var/lib/hpc-multinode", "/run/hpc-multinode", "/etc/slurm-multinode",
                              "/var/log/slurm/multinode") if os.path.exists(p)],
        "processes": subprocess.run(["pgrep", "-f", "slurm-multinode"], capture_output=True, text=True).stdout.split(),
    }
    down = time.monotonic() - t0
    MN.cluster_sh("up", timeout=300)
    up = time.monotonic() - down - t0
    print(f"\nmulti-node cluster: down in {down:.1f} s, up in {up:.1f} s")
    assert not any(left.values()), left
    assert MN.is_up()
