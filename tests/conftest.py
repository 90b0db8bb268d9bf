"""Shared fixtures: real LocalClusters (scheduler and worker processes on this machine)."""

from __future__ import annotations

import pytest

from hpc_cluster import Client, LocalCluster


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=2, memory_limit="2GB") as c:
        yield c


@pytest.fixture
def client(cluster):
    with Client(cluster) as c:
        yield c
