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


@pytest.fixture(autouse=True)
def _no_leaked_settings():
    """A test that sets HPC_CLUSTER_* by hand must not change the settings of later tests."""
    import os
    before = {k: v for k, v in os.environ.items() if k.startswith("HPC_CLUSTER_")}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("HPC_CLUSTER_")}
    for k in set(after) - set(before):
        del os.environ[k]
    os.environ.update(before)
    assert after == before, f"the test leaked environment settings: {sorted(set(after.items()) ^ set(before.items()))}"
