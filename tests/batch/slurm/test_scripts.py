"""Every script we render is one sbatch accepts (`sbatch --test-only` asks the controller)."""

from __future__ import annotations

import subprocess

import pytest

from hpc_cluster.adapters.base import JobSpec

from slurm_jobs import scenarios

pytestmark = [pytest.mark.slurm]

SPECS = {
    "minimal": JobSpec(worker_command="python3 -m hpc_cluster.worker"),
    "everything": JobSpec(
        worker_command="python3 -m hpc_cluster.worker --nthreads 4", job_name="my workers",
        cores=4, memory=3_000_000_000, walltime=5400, queue="debug", account="hpctest",
        extra_directives=["--exclusive", "#SBATCH --comment=from-extra"],
        prologue=["echo starting", "ulimit -c 0"], epilogue=["echo done"],
        log_directory="/tmp/hpc cluster logs", env={"OMP_NUM_THREADS": "1", "ODD": "a 'b' $c"},
        working_directory="/tmp"),
    "skipped": JobSpec(worker_command="true", account="no-such-account",
                       directives_skip=["--account"]),
    "queues": JobSpec(worker_command="true", queue="high", walltime=86400 * 2 + 1),
}


@pytest.mark.parametrize("name", [*SPECS, *scenarios("/tmp")])
def test_sbatch_accepts_rendered_script(adapter, name):
    spec = SPECS.get(name) or scenarios("/tmp")[name]
    script = adapter.render(spec)
    proc = subprocess.run(["sbatch", "--test-only"], input=script, capture_output=True, text=True)
    assert proc.returncode == 0, f"sbatch --test-only refused:\n{proc.stderr}\n---\n{script}"
    assert "to start at" in proc.stderr


def test_sbatch_refusal_is_reported(adapter):
    from hpc_cluster.adapters.base import BatchError
    script = adapter.render(JobSpec(worker_command="true", queue="no-such-partition"))
    with pytest.raises(BatchError, match="no-such-partition|invalid partition|Invalid partition"):
        adapter.submit(script)
