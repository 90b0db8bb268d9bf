"""What `python -m hpc_cluster.engines.dask_worker` (the process our nanny starts on the
distributed engine) does before it can run anything, in real processes: it reads the cluster
file, and a worker whose dask or distributed is not the scheduler's (the file's
engine_versions), or that has no distributed at all, exits with EXIT_REFUSED, which our nanny
does not restart, saying both versions, its interpreter and what to install. The same process
on a cluster of our engine refuses too. (tests/batch/slurm/test_distributed_versions.py runs
the refusal as a SLURM job, with a second environment of an older distributed.)"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from hpc_cluster.engines.dask_worker import EXIT_REFUSED, version_mismatch
from hpc_cluster.protocol.clusterfile import new_secret, write_cluster_file

HERE = {name: metadata.version(name) for name in ("dask", "distributed")}
FIX = "install the same versions in the environment the jobs run"


def cluster_file(tmp_path, **engine):
    # An address nothing listens on: a worker that got past its checks would fail to connect
    # (and say so) instead of exiting at once.
    return write_cluster_file(tmp_path / "c.json", "tcp://127.0.0.1:9", new_secret(), **engine)


def run_dask_worker(python, path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "hpc_cluster.engines.dask_worker", "--cluster-file", str(path),
                           "--death-timeout", "5"], capture_output=True, text=True, timeout=120)


def test_the_same_versions_are_no_mismatch():
    assert version_mismatch(dict(HERE)) is None
    assert version_mismatch(None) is None and version_mismatch({}) is None      # an older cluster file
    assert version_mismatch({"numpy": "0.1"}) is None                            # not this check's


def test_a_worker_of_another_distributed_is_refused_at_start(tmp_path):
    path = cluster_file(tmp_path, engine="distributed", engine_address="tcp://127.0.0.1:9",
                        engine_versions={"distributed": "2024.12.0", "dask": HERE["dask"]})
    proc = run_dask_worker(sys.executable, path)
    assert proc.returncode == EXIT_REFUSED, proc.stderr
    said = proc.stderr.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("hpc-cluster worker: this worker's packages differ"), said
    assert f"(distributed {HERE['distributed']} here, 2024.12.0 on the scheduler)" in said[0]
    assert FIX in said[0] and f"({sys.executable}: the cluster's python= setting" in said[0]
    assert "dask " not in said[0].split("(", 1)[1].split(")")[0]                 # dask agreed: not named


def test_a_worker_without_distributed_is_refused_at_start_saying_so(tmp_path, no_distributed_python):
    path = cluster_file(tmp_path, engine="distributed", engine_address="tcp://127.0.0.1:9",
                        engine_versions=dict(HERE))
    proc = run_dask_worker(no_distributed_python, path)
    assert proc.returncode == EXIT_REFUSED, proc.stderr
    assert f"distributed not installed here, {HERE['distributed']} on the scheduler" in proc.stderr
    assert FIX in proc.stderr and str(no_distributed_python) in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("python", ["this", "without distributed"])
def test_a_cluster_of_our_engine_is_refused_naming_the_flag(tmp_path, python, no_distributed_python):
    proc = run_dask_worker(sys.executable if python == "this" else no_distributed_python, cluster_file(tmp_path))
    assert proc.returncode == EXIT_REFUSED, proc.stderr
    assert "names no distributed scheduler: the cluster runs hpc-cluster's engine" in proc.stderr
