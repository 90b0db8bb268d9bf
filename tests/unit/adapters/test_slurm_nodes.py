"""nodes= (issue 33, point 5): one SLURM job over several nodes, a worker set on each.

The directives, the srun loop (run by bash with stand-ins for scontrol and srun that record what
each node's step was given: the real srun runs in tests/batch/slurm/test_one_allocation_slurm.py
and tests/multinode/test_one_allocation.py), the refusal on batch systems whose jobs cannot span
nodes, and the counting of workers in jobs of nodes x processes.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from hpc_cluster.adapters.base import BatchError, JobSpec
from hpc_cluster.adapters.pbs import PBSAdapter
from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.config import ConfigError, resolve
from hpc_cluster.deploy.cluster import PBSCluster, SLURMCluster
from hpc_cluster.deploy.plan import pool_table
from helpers.cli import run_cli
from helpers.fixtures import bash_n

WORKER = 'worker --name "w-${HPC_CLUSTER_WORKER_INDEX:-0}"'


def test_one_node_keeps_the_single_task_script():
    script = SLURMAdapter().render(JobSpec(worker_command=WORKER))
    assert "#SBATCH -n 1" in [line for line in script.splitlines() if line.startswith("#SBATCH")] and "srun" not in script and f"exec {WORKER}" in script


def test_nodes_directives_per_node_cores_and_memory():
    script = SLURMAdapter().render(JobSpec(worker_command=WORKER, nodes=3, cores=8, memory=4 * 2**30))
    assert [line for line in script.splitlines() if line.startswith("#SBATCH")] == [
        "#SBATCH -J hpc-cluster", "#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --no-kill",
        "#SBATCH --cpus-per-task=8", "#SBATCH --mem=4G", "#SBATCH -t 01:00:00", "#SBATCH --no-requeue"]
    assert "exec " not in script
    bash_n(script)


def test_nodes_directives_skip_both_spellings():
    script = SLURMAdapter().render(JobSpec(worker_command=WORKER, nodes=2, directives_skip=["-N", "--no-kill"]))
    lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=2" not in lines and "#SBATCH --no-kill" not in lines
    assert "#SBATCH --ntasks-per-node=1" in lines


def fake_slurm(tmp_path, nodes: list[str], status: dict[str, int] | None = None):
    """scontrol and srun stand-ins: srun writes its arguments and the worker's name and index per node."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text("#!/bin/bash\n[ \"$1 $2\" = 'show hostnames' ] || exit 9\n"
                                   + "".join(f"echo {n}\n" for n in nodes))
    codes = "".join(f"[ \"$node\" = {n} ] && code={c}\n" for n, c in (status or {}).items())
    (bin_ / "srun").write_text(
        "#!/bin/bash\nnode=$(printf '%s\\n' \"$@\" | sed -n 's/^--nodelist=//p')\ncode=0\n" + codes
        + f"echo \"$* | $HPC_CLUSTER_WORKER_INDEX | $HPC_CLUSTER_JOB_ID\" > {tmp_path}/step-$node\nexit $code\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
            "SLURM_JOB_NODELIST": "n[1-3]"}


def test_each_node_gets_its_own_step_and_unique_worker_names(tmp_path):
    env = fake_slurm(tmp_path, ["n1", "n2", "n3"])
    marker = tmp_path / "epilogue-ran"
    script = SLURMAdapter().render(JobSpec(worker_command=WORKER, nodes=3, cores=4, worker_index=5,
                                           epilogue=[f"touch {marker}"]))
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    seen = {n: (tmp_path / f"step-{n}").read_text().strip().split(" | ") for n in ("n1", "n2", "n3")}
    for i, node in enumerate(("n1", "n2", "n3")):
        args, index, job = seen[node]
        assert args == f"--nodes=1 --ntasks=1 --nodelist={node} --cpus-per-task=4 worker --name w-5-n{i}"
        assert index == f"5-n{i}" and job == "77"
    assert marker.exists()


def test_the_job_ends_with_a_failed_nodes_status_after_every_node_ended(tmp_path):
    env = fake_slurm(tmp_path, ["n1", "n2", "n3"], status={"n2": 3})
    script = SLURMAdapter().render(JobSpec(worker_command=WORKER, nodes=3))
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 3
    assert all((tmp_path / f"step-{n}").exists() for n in ("n1", "n2", "n3"))


def test_other_batch_systems_refuse_nodes_saying_what_to_do(isolated_home):
    with pytest.raises(BatchError, match=r"nodes=2: pbs jobs here run on one node each; ask for one job per node"):
        PBSAdapter().render(JobSpec(worker_command=WORKER, nodes=2))
    with pytest.raises(ConfigError) as info:
        PBSCluster(cores=1, memory="1GB", nodes=3, asynchronous=True)
    said = str(info.value)
    assert "nodes=3 (keyword): one job over several nodes is supported with SLURM" in said
    assert "with PBS ask for one job per node instead" in said and "scale(jobs=N)" in said
    PBSCluster(cores=1, memory="1GB", nodes=1, asynchronous=True)          # one node: as always
    with pytest.raises(ConfigError, match="nodes=0 must be a whole number greater than 0"):
        SLURMCluster(cores=1, memory="1GB", nodes=0, asynchronous=True)


def test_workers_count_in_jobs_of_nodes_times_processes(isolated_home):
    c = SLURMCluster(cores=4, memory="4GB", processes=2, nodes=3, asynchronous=True)
    assert "#SBATCH --nodes=3" in c.job_script() and "--nworkers 2" in c.job_script()
    assert c._jobs_for(12, 0, None, None) == 2 and c._jobs_for(13, 0, None, None) == 3
    assert c._jobs_for(None, 0, "24GB", None) == 2          # 4 GB on each of 3 nodes: 12 GB a job
    assert c._jobs_for(None, 0, None, 13) == 2              # 12 cores a job
    assert c._processes(None) == 6
    assert pool_table(resolve(batch="slurm", cores=4, memory="4GB", processes=2, nodes=3))["default"]["processes"] == 6


def test_site_key_and_up_flag(isolated_home, capsys):
    site = isolated_home / "site.yaml"
    site.write_text("default: lab\nsites:\n  lab:\n    batch: slurm\n    cores: 2\n    memory: 1GB\n    nodes: 2\n")
    cfg = resolve(config=str(site))
    assert cfg.values["nodes"] == 2
    code, out, err = run_cli(capsys, "up", "--help")
    assert code == 0 and "--nodes N" in out
    pbs = isolated_home / "pbs.yaml"
    pbs.write_text("default: lab\nsites:\n  lab:\n    batch: pbs\n    cores: 2\n    memory: 1GB\n")
    code, out, err = run_cli(capsys, "up", "--config", str(pbs), "--nodes", "3", "--no-wait")
    assert code == 2 and "nodes=3 (keyword): one job over several nodes is supported with SLURM" in err
    assert not (isolated_home / "xdg" / "hpc-cluster" / "clusters").exists()
