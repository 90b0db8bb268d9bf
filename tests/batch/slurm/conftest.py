"""A real one-host SLURM for the integration tests: brought up if needed, never mocked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurm_jobs import CLUSTER_SH, cluster_is_up  # noqa: E402

from hpc_cluster.adapters.slurm import SLURMAdapter  # noqa: E402
from hpc_cluster.runners.local import LocalRunner  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slurm: needs the real SLURM test cluster (tests/batch/slurm/cluster.sh)")
    config.addinivalue_line("markers", "slow: takes a minute or more (e.g. waits for a SLURM time limit)")


@pytest.fixture(scope="session")
def slurm_cluster():
    """The test cluster, up. Started with cluster.sh when we are root; skipped loudly otherwise."""
    if cluster_is_up():
        return
    if os.geteuid() != 0:
        reason = ("SLURM TESTS SKIPPED: the test cluster is not up and we are not root to start "
                  f"it. Run `sudo {CLUSTER_SH} up` first.")
        if shutil.which("sbatch") is None:
            reason += " (no sbatch on PATH either)"
        pytest.skip(reason)
    proc = subprocess.run([str(CLUSTER_SH), "up"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"{CLUSTER_SH} up failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


@pytest.fixture(scope="session")
def slurm_node(slurm_cluster) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


@pytest.fixture(scope="session")
def adapter(slurm_cluster) -> SLURMAdapter:
    return SLURMAdapter(LocalRunner())


@pytest.fixture(scope="module")
def submitted(adapter):
    """A list to append job ids to; whatever is in it is scancel'ed when the module ends."""
    ids: list[str] = []
    yield ids
    adapter.cancel(ids)


@pytest.fixture
def own_home(tmp_path, monkeypatch) -> dict:
    """HOME and XDG_CONFIG_HOME under tmp, here and in every subprocess: no clashes with the
    user's clusters or config, and Client("name") in this process finds the same files."""
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "HPC_CLUSTER_SYSTEM_CONFIG_DIR": str(tmp_path / "etc")}
    Path(env["HOME"]).mkdir()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("HPC_CLUSTER_CONFIG", "HPC_CLUSTER_SITE"):
        monkeypatch.delenv(k, raising=False)
    return env
