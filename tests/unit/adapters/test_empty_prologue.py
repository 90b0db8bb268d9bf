"""An empty prologue renders nothing (issue 34's papercut: it rendered `set -e` then `set +e`),
in every batch system's job script; a prologue still fails the job at its first failing line."""

import pytest

from hpc_cluster.adapters import get_adapter
from hpc_cluster.adapters.base import JobSpec


def script(batch: str, prologue: list[str]) -> str:
    adapter = get_adapter(batch)
    spec = JobSpec(worker_command="python -m hpc_cluster.worker", log_directory="/tmp/logs", prologue=prologue)
    return adapter.render(spec) if batch != "htcondor" else "\n".join(adapter.job_lines(spec))


@pytest.mark.parametrize("batch", ["slurm", "pbs", "sge", "lsf", "htcondor"])
def test_no_prologue_no_set_e(batch):
    assert "set -e" not in script(batch, []) and "set +e" not in script(batch, [])
    with_one = script(batch, ["module load python"])
    assert with_one.index("set -e") < with_one.index("module load python") < with_one.index("set +e")
