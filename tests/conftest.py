"""Shared fixtures: real LocalClusters (scheduler and worker processes on this machine)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# dask's configuration is read by our cluster classes (a dask-jobqueue user's jobqueue.yaml):
# the suite must not see the developer's ~/.config/dask, nor leave files there (importing
# dask_jobqueue copies its jobqueue.yaml into dask's config directory). Set before dask loads.
os.environ["DASK_CONFIG"] = tempfile.mkdtemp(prefix="hpc-cluster-tests-dask-config-")
# Likewise our own: cluster files, journals and logs of the clusters tests start go to
# $XDG_CONFIG_HOME/hpc-cluster/clusters; they piled up in the developer's ~/.config (and a
# user's config file there would change what the tests see). Tests that need a home of
# their own still make one (isolated_home, own_home).
_CONFIG_HOME = tempfile.mkdtemp(prefix="hpc-cluster-tests-config-home-")
os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME
atexit.register(shutil.rmtree, _CONFIG_HOME, True)
atexit.register(shutil.rmtree, os.environ["DASK_CONFIG"], True)

from hpc_cluster import Client, LocalCluster

# helpers/ (from helpers.wait import ...) and the simulators' modules (import pbssim, lsfsim, condorsim)
TESTS = Path(__file__).resolve().parent
for _p in (TESTS / "helpers" / "htcondor_sim", TESTS / "helpers" / "lsf_sim", TESTS / "helpers" / "pbs_sim", TESTS):
    sys.path.insert(0, str(_p))


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


# -- the command-level PBS simulator (tests/helpers/pbs_sim): qsub, qstat, qdel on PATH ---------------
SIM = Path(__file__).resolve().parent / "helpers" / "pbs_sim"


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """Cluster files and user config under tmp, run from tmp: nothing of the real user's is
    read or touched (their config files, HPC_CLUSTER_CONFIG/SITE)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "home").mkdir(exist_ok=True)          # batch systems start jobs in $HOME
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(tmp_path / "etc"))
    for var in ("HPC_CLUSTER_CONFIG", "HPC_CLUSTER_SITE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def sim(isolated_home, monkeypatch):
    """The simulator on PATH for this process and the daemon it starts (which inherits
    os.environ); our cluster files under tmp. Yields the simulator's state directory."""
    import pbssim
    from helpers.wait import wait_until
    home = isolated_home / "pbs_sim_home"
    home.mkdir()
    monkeypatch.setenv("PBS_SIM_HOME", str(home))
    monkeypatch.setenv("PBS_SIM_KILL_DELAY", "1")
    monkeypatch.setenv("PATH", f"{SIM / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PBS_SIM_FLAVOR", raising=False)
    yield home
    pbssim.cleanup(str(home))
    wait_until(lambda: not pbssim.live_pids(str(home)), 15, "simulator processes to exit")


