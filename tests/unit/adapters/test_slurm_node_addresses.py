"""SLURM's compute nodes' addresses (NodeAddr), for the scheduler's choice of address (issue 33):
`sinfo -h -N -o "%N %o"` captured from the one-node test cluster and from the multi-node one
(tests/multinode/cluster.sh), SLURM 22.05."""

from __future__ import annotations

import shutil

import pytest

from hpc_cluster.adapters.base import BatchAdapter
from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.adapters.slurm_text import parse_sinfo_addresses
from helpers.fakes import ScriptedRunner
from helpers.fixtures import fixture


def test_the_one_node_cluster_is_on_loopback_once():
    # Its node is in three partitions: three lines, one address.
    text = fixture("slurm", "sinfo_node_addresses.txt")
    assert len(text.splitlines()) == 3
    assert parse_sinfo_addresses(text) == ["127.0.0.1"]


def test_the_multinode_cluster_names_each_nodes_bridge_address_in_order():
    text = fixture("slurm", "sinfo_node_addresses_multinode.txt")
    assert parse_sinfo_addresses(text) == ["10.77.0.11", "10.77.0.12", "10.77.0.13", "10.77.0.14"]


def test_names_and_unset_addresses():
    # Without NodeAddr in slurm.conf, NodeAddr is the node's name; blank and odd lines are skipped.
    text = "node001 node001\nnode002 (null)\n\nnode003\ngpu01 gpu01-ib\nnode001 node001\n"
    assert parse_sinfo_addresses(text) == ["node001", "gpu01-ib"]
    assert parse_sinfo_addresses("") == []


def test_the_adapter_asks_sinfo_for_the_partition_and_gives_up_quietly():
    runner = ScriptedRunner([(["sinfo"], (0, fixture("slurm", "sinfo_node_addresses_multinode.txt"), ""))])
    assert SLURMAdapter(runner).node_addresses("batch")[0] == "10.77.0.11"
    assert runner.commands == [["sinfo", "-h", "-N", "-o", "%N %o", "-p", "batch"]]
    failing = ScriptedRunner([(["sinfo"], (1, "", "sinfo: error: Unable to contact slurm controller"))])
    assert SLURMAdapter(failing).node_addresses() == []
    assert failing.commands == [["sinfo", "-h", "-N", "-o", "%N %o"]]


def test_other_batch_systems_name_none():
    assert BatchAdapter(ScriptedRunner([])).node_addresses() == []


@pytest.mark.skipif(not shutil.which("sinfo"), reason="no SLURM here")
def test_the_real_sinfo_here():
    from hpc_cluster.runners.local import LocalRunner
    assert SLURMAdapter(LocalRunner()).node_addresses()
