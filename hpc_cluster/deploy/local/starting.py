"""What `Client()` without an address starts: a LocalCluster the client owns (issue 31).

The client layer may not import deploy, so the Client calls what is registered with it
(client/starting.py's seam); this module registers LocalCluster as it loads. hpc_cluster's root
hands out `Client` from here, so `from hpc_cluster import Client; Client()` finds it.
"""

from __future__ import annotations

from ...client.client import Client
from ...client.starting import register_cluster_starter
from .cluster import LocalCluster

register_cluster_starter(LocalCluster)

__all__ = ["Client", "LocalCluster"]
