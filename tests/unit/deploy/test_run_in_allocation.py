"""`hpc-cluster run` (deploy/runner.py): what it reads of the allocation, the srun steps it makes,
and its refusal outside an allocation. Run for real in tests/batch/slurm/test_one_allocation_slurm.py
and tests/multinode/test_one_allocation.py."""

from __future__ import annotations

import pytest

from hpc_cluster.deploy.runner import NOT_INSIDE, Allocation, RunnerError, RunSettings, allocation, worker_steps
from helpers.cli import run_cli

SLURM_ENV = {"SLURM_JOB_ID": "812", "SLURM_JOB_NODELIST": "hpcn[1-3]", "SLURM_NNODES": "3",
             "SLURM_CPUS_ON_NODE": "8", "SLURM_MEM_PER_NODE": "4096"}


def test_the_allocation_from_slurms_variables():
    a = allocation(SLURM_ENV)
    assert a == Allocation(job_id="812", nodes=["hpcn1", "hpcn2", "hpcn3"], cpus=8, memory=4096 * 2**20)
    b = allocation({"SLURM_JOBID": "9", "SLURM_NODELIST": "n07", "SLURM_CPUS_ON_NODE": "2"})
    assert (b.job_id, b.nodes, b.cpus, b.memory) == ("9", ["n07"], 2, None)


@pytest.mark.parametrize("env", [{}, {"SLURM_JOB_ID": "812"}, {"SLURM_JOB_NODELIST": "hpcn1"}])
def test_outside_an_allocation_it_refuses(env):
    with pytest.raises(RunnerError) as info:
        allocation(env)
    assert str(info.value) == NOT_INSIDE
    assert "sbatch -N 3 --wrap 'hpc-cluster run script.py' or inside salloc" in NOT_INSIDE


def test_the_command_refuses_outside_an_allocation_with_exit_2(capsys, monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = run_cli(capsys, "run", "script.py", "--input", "x")
    assert code == 2 and f"hpc-cluster run: {NOT_INSIDE}" in err and out == ""
    code, out, err = run_cli(capsys, "run", "--help")
    assert code == 0 and "--processes N" in out and "SCRIPT [ARGS]" in out


def test_one_srun_step_per_node_with_the_nodes_cores_and_memory():
    steps = worker_steps(allocation(SLURM_ENV), RunSettings(processes=2), "/home/u/c.json", "run-812", python="py")
    assert len(steps) == 3
    for i, (argv, node) in enumerate(zip(steps, ("hpcn1", "hpcn2", "hpcn3"))):
        assert argv[:6] == ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--cpus-per-task=8", "--overlap"]
        worker = argv[6:]
        assert worker[:5] == ["py", "-m", "hpc_cluster.worker", "--cluster-file", "/home/u/c.json"]
        flags = dict(zip(worker[5::2], worker[6::2]))
        assert flags["--name"] == f"run-812-n{i}" and flags["--nthreads"] == "4" and flags["--nworkers"] == "2"
        assert flags["--memory-limit"] == "2.00GiB"


def test_flags_override_the_allocation_and_unknown_memory_is_the_nodes():
    alloc = Allocation(job_id="5", nodes=["a", "b"], cpus=4, memory=None)
    (first, _) = worker_steps(alloc, RunSettings(cores=2, nanny=False), "f", "run-5", python="py")
    assert "--cpus-per-task=2" in first and "--no-nanny" in first and "--nworkers" not in first
    assert first[first.index("--memory-limit") + 1] == "auto"
    (first, _) = worker_steps(alloc, RunSettings(memory=8 * 2**30, processes=8), "f", "run-5", python="py")
    assert first[first.index("--nworkers") + 1] == "4"              # no more processes than cores
    assert first[first.index("--memory-limit") + 1] == "2.00GiB"
