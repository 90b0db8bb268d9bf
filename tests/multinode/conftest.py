"""A real multi-node SLURM in network namespaces (tests/multinode/cluster.sh): brought up if needed
when we are root, skipped loudly otherwise. Every SLURM command of this pytest process goes to it
(SLURM_CONF), so run these tests in a pytest process of their own (scripts/test does)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "batch" / "slurm"))   # scenarios.py

from helpers import multinode as MN  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "multinode: needs the multi-node SLURM test cluster (tests/multinode/cluster.sh)")


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/multinode/" in str(item.fspath):
            item.add_marker(pytest.mark.multinode)


@pytest.fixture(scope="session", autouse=True)
def multinode_cluster():
    if not MN.is_up():
        if os.geteuid() != 0:
            pytest.skip("MULTI-NODE TESTS SKIPPED: the multi-node cluster is not up and we are not root to "
                        f"start it (it makes network namespaces). Run `sudo bash {MN.CLUSTER_SH} up` first.")
        try:
            MN.cluster_sh("up", timeout=300)
        except RuntimeError as e:
            pytest.fail(str(e))
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = MN.SLURM_CONF
    yield
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


@pytest.fixture
def shared_dir() -> Path:
    """A directory every node sees (pytest's tmp_path is under /tmp: node-local here)."""
    d = MN.SHARED / "tests" / uuid.uuid4().hex[:10]
    d.mkdir(parents=True)
    return d


@pytest.fixture
def shared_config(shared_dir, monkeypatch):
    """Cluster files (read by the workers) and config in the shared directory, no site config."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(shared_dir / "xdg"))
    monkeypatch.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(shared_dir / "etc"))
    for k in ("HPC_CLUSTER_CONFIG", "HPC_CLUSTER_SITE"):
        monkeypatch.delenv(k, raising=False)
    return shared_dir
