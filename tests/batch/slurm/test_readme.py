"""The README's one-import example, run as written on the real SLURM: a dask-jobqueue user's
code with only the import changed computes in batch jobs and leaves nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

README = Path(__file__).resolve().parents[3] / "README.md"


def one_import_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    found = [b for b in blocks if "from hpc_cluster import SLURMCluster, Client" in b and "was: from dask_jobqueue" in b]
    assert len(found) == 1, "README.md should have one dask-jobqueue one-import example"
    return found[0]


def jobs_from(directory: Path) -> list[str]:
    """Our jobs still in the queue: those submitted from `directory` (other tests may run)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %Z"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.split()[1:] == [str(directory)]]


def test_the_readme_one_import_example_runs_as_written(slurm_cluster, tmp_path):
    code = one_import_example()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_CLUSTER_", "DASK_"))}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), HPC_CLUSTER_SYSTEM_CONFIG_DIR=str(tmp_path / "etc"),
               DASK_CONFIG=str(tmp_path / "dask"), PYTHONPATH=str(README.parent))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "328350"
    assert "Warning" not in proc.stderr, proc.stderr            # nothing of the example needs a note
    assert not jobs_from(tmp_path), "the example left jobs in the queue"
