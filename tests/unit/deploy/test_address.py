"""The scheduler's address when none is set (issue 33, point 2): deploy/address.py's pure
chooser over node -> routed-from address maps, and the plan leaving the choice to the daemon
unless host or interface are set."""

from __future__ import annotations

import pytest

from hpc_cluster.config import ConfigError, resolve
from hpc_cluster.deploy.address import LOOPBACK, choose_address, is_loopback, scheduler_address_here
from hpc_cluster.deploy.plan import scheduler_host

from helpers.cli import run_cli


def test_nodes_on_this_host_give_loopback():
    # The one-node test cluster: NodeAddr 127.0.0.1, routed from 127.0.0.1.
    choice = choose_address({"127.0.0.1": "127.0.0.1"}, "10.0.0.5", "192.168.1.2")
    assert choice.host == LOOPBACK and "on this host" in choice.how


def test_nodes_on_another_network_give_the_address_they_are_routed_from():
    # The multi-node test cluster: the login node is 10.77.0.1 on the nodes' bridge; its host
    # name resolves to 127.0.0.1 and the default route is elsewhere: neither counts.
    routes = {f"10.77.0.1{i}": "10.77.0.1" for i in range(1, 5)}
    choice = choose_address(routes, "127.0.0.1", "172.16.0.9")
    assert choice.host == "10.77.0.1"
    assert "10.77.0.11, 10.77.0.12, 10.77.0.13, 10.77.0.14" in choice.how


def test_nodes_routed_from_different_addresses_give_the_most_common_and_say_so():
    routes = {"n1": "10.1.0.1", "n2": "10.2.0.1", "n3": "10.2.0.1", "n4": "10.2.0.1", "n5": None}
    choice = choose_address(routes, "10.1.0.1")
    assert choice.host == "10.2.0.1"
    assert "3 of 4 compute nodes" in choice.how and "10.1.0.1 for n1" in choice.how
    assert "interface=" in choice.how and "no route to n5" in choice.how


def test_a_tie_goes_to_the_first_nodes_address():
    assert choose_address({"a": "10.1.0.1", "b": "10.2.0.1"}).host == "10.1.0.1"
    assert choose_address({"b": "10.2.0.1", "a": "10.1.0.1"}).host == "10.2.0.1"


@pytest.mark.parametrize("routes,why", [({}, "did not name its compute nodes"),
                                        ({"n1": None, "n2": None}, "no route to any compute node (n1, n2)")])
def test_no_node_to_route_to_falls_back_to_the_host_names_address(routes, why):
    choice = choose_address(routes, "10.0.0.5", "192.168.1.2")
    assert choice.host == "10.0.0.5" and why in choice.how and "interface=" in choice.how


def test_a_host_name_on_loopback_falls_back_to_the_default_route_then_loopback():
    # Debian maps the host name to 127.0.1.1: not an address another node can use.
    choice = choose_address({}, "127.0.1.1", "192.168.1.2")
    assert choice.host == "192.168.1.2" and "default route" in choice.how and "127.0.1.1" in choice.how
    choice = choose_address({}, None, None)
    assert choice.host == LOOPBACK and "only workers on this host" in choice.how


def test_never_every_interface():
    for routes, name, default in [({}, "0.0.0.0", None), ({"n": "127.0.0.1"}, None, None), ({}, None, "0.0.0.0")]:
        assert choose_address(routes, name, default).host not in ("", "0.0.0.0")


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("127.0.1.1") and is_loopback("::1")
    assert not is_loopback("10.77.0.1") and not is_loopback("node001") and not is_loopback(None)


class Nodes:
    """An adapter that names nodes (as SLURMAdapter.node_addresses does from sinfo)."""

    def __init__(self, nodes=None, error=None):
        self.nodes, self.error, self.asked = nodes or [], error, []

    def node_addresses(self, partition=None):
        self.asked.append(partition)
        if self.error:
            raise self.error
        return self.nodes


def test_here_routes_to_the_nodes_the_adapter_names():
    # Real routing lookups on this host: 127.0.0.2 is routed from 127.0.0.2 (any 127/8 is local).
    adapter = Nodes(["127.0.0.1", "127.0.0.1"])
    assert scheduler_address_here(adapter, None, "debug").host == "127.0.0.1"
    assert adapter.asked == ["debug"]


def test_here_over_ssh_routes_to_the_login_node_not_the_nodes():
    adapter = Nodes(["no-such-node.invalid"])
    assert scheduler_address_here(adapter, {"host": "127.0.0.1"}).host == "127.0.0.1"
    assert adapter.asked == []


def test_here_a_failing_node_list_falls_back_and_is_not_every_interface():
    choice = scheduler_address_here(Nodes(error=OSError("sinfo: not found")))
    assert choice.host not in ("", "0.0.0.0") and "did not name its compute nodes" in choice.how


def test_the_plan_leaves_the_address_to_the_daemon_unless_one_is_set(tmp_path):
    environ = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
               "HPC_CLUSTER_SYSTEM_CONFIG_DIR": str(tmp_path / "etc")}

    def config(**kw):               # keywords only: no config file of this machine is read
        return resolve(environ=environ, batch="slurm", cores=1, memory="1GB", **kw)

    assert scheduler_host(config()) == ""
    assert scheduler_host(config(scheduler_options={"host": "10.0.0.7"})) == "10.0.0.7"
    assert scheduler_host(config(scheduler_options={"host": "0.0.0.0"})) == "0.0.0.0"     # asked for: kept
    assert scheduler_host(config(interface="lo")) == "127.0.0.1"
    assert scheduler_host(config(scheduler_options={"interface": "lo"})) == "127.0.0.1"
    with pytest.raises(ConfigError, match="no such network interface; this host has .*lo"):
        scheduler_host(config(interface="nosuch0"))


def test_up_interface_is_the_interface_setting(isolated_home, capsys):
    site = isolated_home / "site.yaml"
    site.write_text("default: lab\nsites:\n  lab:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n")
    code, out, err = run_cli(capsys, "up", "--config", str(site), "--interface", "nosuch0", "--no-wait")
    assert code == 2 and "--interface 'nosuch0': no such network interface" in err, (code, err)
    assert not list((isolated_home / "xdg" / "hpc-cluster" / "clusters").glob("*.json"))
