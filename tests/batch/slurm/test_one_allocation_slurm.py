"""One allocation, many nodes (issue 33, point 5) on the real one-node SLURM: the nodes= script's
srun path (one step per allocated node) and `hpc-cluster run` inside `sbatch -N 1 --wrap`. The
same with 3 nodes, a node failure and the association limit: tests/multinode/test_one_allocation.py.
"""

from __future__ import annotations

import shlex
import sys
import textwrap

import pytest

from hpc_cluster.adapters.base import JobSpec
from hpc_cluster.protocol.clusterfile import cluster_file_for, tls_directory_for
from slurm_jobs import wait_final

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

HPC_CLUSTER = str(__import__("pathlib").Path(sys.executable).with_name("hpc-cluster"))

SCRIPT = textwrap.dedent("""\
    import sys
    from hpc_cluster import Client
    with Client() as client:                    # no arguments: the runner's scheduler
        client.wait_for_workers(2, timeout=60)
        print("workers", len(client.scheduler_info()["workers"]))
        print("sum", sum(client.gather(client.map(lambda x: x * x, range(100)))))
    sys.exit(int(sys.argv[1]))
    """)


def test_the_nodes_script_starts_a_step_per_allocated_node(adapter, submitted, tmp_path, slurm_node):
    """The script nodes=2 renders, asking for the one node there is: its loop starts one srun
    step per node of the allocation it got, each worker set told its own name and index."""
    probe = (f"{shlex.quote(sys.executable)} -c 'import os, socket; print(\"step\", os.environ[\"SLURM_STEP_ID\"], "
             "socket.gethostname(), os.environ[\"HPC_CLUSTER_WORKER_INDEX\"], os.environ[\"HPC_CLUSTER_JOB_ID\"])' "
             '--name "w-${HPC_CLUSTER_WORKER_INDEX:-0}"')
    script = adapter.render(JobSpec(worker_command=probe, nodes=2, cores=1, memory=200 * 2**20, walltime=120,
                                    worker_index=4, log_directory=str(tmp_path), job_name="mv-nodes"))
    assert "#SBATCH --nodes=2" in script
    job = adapter.submit(script.replace("#SBATCH --nodes=2", "#SBATCH --nodes=1"))
    submitted.append(job)
    record = wait_final(adapter, [job], 120)[job]
    assert record.state == "completed", record.raw
    steps = {s.step_id: s for s in record.steps}
    assert steps["0"].state == "completed" and steps["0"].nodes == [slurm_node]
    out = (tmp_path / f"mv-nodes-{job}.out").read_text()
    assert f"step 0 {slurm_node} 4-n0 {job}" in out


@pytest.mark.parametrize("flags, scheme", [((), "tls"), (("--no-tls",), "tcp")], ids=["tls", "no-tls"])
def test_run_inside_sbatch_connects_the_scripts_client_and_keeps_its_exit_status(adapter, submitted, tmp_path,
                                                                                  flags, scheme):
    (tmp_path / "script.py").write_text(SCRIPT)
    wrap = f"{shlex.quote(HPC_CLUSTER)} run --processes 2 {' '.join(flags)} script.py 3"
    job = adapter.submit(f"#!/bin/bash\n#SBATCH -N 1\n#SBATCH -c 2\n#SBATCH --mem=1G\n#SBATCH -t 3\n"
                         f"#SBATCH -J mv-run\n#SBATCH -D {tmp_path}\n#SBATCH -o {tmp_path}/out-%j.txt\n{wrap}\n")
    submitted.append(job)
    record = wait_final(adapter, [job], 180)[job]
    out = (tmp_path / f"out-{job}.txt").read_text()
    assert "workers 2" in out and "sum 328350" in out, out
    assert f"hpc-cluster run: scheduler {scheme}://" in out, out   # encrypted unless --no-tls (issue 34)
    assert not tls_directory_for(cluster_file_for(f"run-{job}")).exists()     # its certificate went with it
    assert "hpc-cluster run: script.py 3 exited with status 3" in out
    assert (record.state, record.exit_code) == ("failed", 3), record.raw
    workers = [s for s in record.steps if s.step_id == "0"]
    assert workers and workers[0].state == "completed", record.raw      # the workers left when told
