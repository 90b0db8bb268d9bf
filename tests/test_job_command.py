"""Keywords -> the job: what `deploy/cluster.py` puts in the worker command and the JobSpec,
read back the way the job's shell and the worker's own argument parser read it. Pure,
except the last test, which runs a rendered job script with bash and checks that real
workers (under their nannies) joined a real scheduler from their local_directory.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from waiting import wait_until  # noqa: E402

from hpc_cluster import Client, LocalCluster  # noqa: E402
from hpc_cluster.adapters.slurm import SLURMAdapter  # noqa: E402
from hpc_cluster.deploy.cluster import (REMOTE_DEFAULT_PYTHON, JobQueueCluster, job_spec,  # noqa: E402
                                        worker_command)
from hpc_cluster.config import ConfigError, resolve  # noqa: E402
from hpc_cluster.protocol.secret import write_cluster_file  # noqa: E402
from hpc_cluster.worker.__main__ import build_parser  # noqa: E402

CLUSTER_FILE = "/home/alice/.config/hpc-cluster/clusters/big.json"


@pytest.fixture
def config(tmp_path):
    """resolve() with keywords only: no config file or HPC_CLUSTER_* of this machine is read."""
    environ = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
               "HPC_CLUSTER_SYSTEM_CONFIG_DIR": str(tmp_path / "etc")}

    def make(**kw):
        kw.setdefault("batch", "slurm")
        return resolve(environ=environ, cwd=tmp_path, **kw)
    return make


@pytest.fixture
def argv_of(tmp_path):
    """The argv the job's shell hands the worker: the command is run by bash with a stand-in
    'python' that prints its arguments, as the job would with HPC_CLUSTER_JOB_ID set."""
    fake = tmp_path / "fake python"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    fake.chmod(0o755)

    def run(cfg) -> list[str]:
        command = worker_command(cfg, CLUSTER_FILE)
        python = shlex.split(command)[0]
        command = shlex.quote(str(fake)) + command[len(shlex.quote(python)):] \
            if command.startswith(shlex.quote(python)) else command
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin", "HPC_CLUSTER_JOB_ID": "4242"})
        return out.stdout.split("\0")[:-1]
    return run


def worker_args(argv: list[str]):
    assert argv[:2] == ["-m", "hpc_cluster.worker"]
    return build_parser().parse_args(argv[2:])


def test_defaults(config, argv_of):
    cfg = config(cores=4, memory="8GB")
    command = worker_command(cfg, CLUSTER_FILE)
    assert command.startswith(shlex.quote(sys.executable) + " -m hpc_cluster.worker ")
    args = worker_args(argv_of(cfg))
    assert (args.cluster_file, args.nthreads, args.memory_limit) == (CLUSTER_FILE, 4, str(8 * 10**9))
    assert args.nanny and args.nworkers == 1 and args.host == "0.0.0.0" and args.interface is None
    assert args.death_timeout == 60.0 and args.local_directory is None
    assert args.name == "hpc-cluster-4242"
    spec = job_spec(cfg, CLUSTER_FILE)
    assert spec.python == sys.executable and spec.nanny and spec.processes == 1


def test_nanny_interface_death_timeout_and_extra_args(config, argv_of):
    cfg = config(nanny=False, interface="ib0", death_timeout="2m",
                 worker_extra_args=["--resources", "GPU=2 MEM=10e9", "--log-level", "debug"])
    argv = argv_of(cfg)
    args = worker_args(argv)
    assert not args.nanny and args.interface == "ib0" and args.death_timeout == 120.0
    assert "--host" not in argv                    # the interface's address, found on the node
    assert args.resources == "GPU=2 MEM=10e9" and args.log_level == "debug"
    # Extra arguments come after ours, so they can override any of them.
    assert argv.index("--resources") > argv.index("--death-timeout")
    assert job_spec(cfg, CLUSTER_FILE).nanny is False


def test_processes_split_cores_and_memory(config, argv_of):
    args = worker_args(argv_of(config(cores=8, memory="12GB", processes=3)))
    assert (args.nworkers, args.nthreads, args.memory_limit) == (3, 2, str(4 * 10**9))
    args = worker_args(argv_of(config(cores=2, memory="12GB", processes=4, memory_limit="1GB")))
    assert (args.nworkers, args.nthreads, args.memory_limit) == (4, 1, str(10**9))


def test_python(config, tmp_path):
    # A path under ~ is expanded by the job's shell on the node, not here.
    command = worker_command(config(python="~/venvs/my env/bin/python"), CLUSTER_FILE)
    assert command.startswith("~/'venvs/my env/bin/python' -m hpc_cluster.worker ")
    out = subprocess.run(["bash", "-c", f"HOME=/h; printf %s {command.split(' -m ')[0]}"],
                         capture_output=True, text=True).stdout
    assert out == "/h/venvs/my env/bin/python"
    cfg = config(python="/opt/py 3/bin/python3")
    assert worker_command(cfg, CLUSTER_FILE).startswith("'/opt/py 3/bin/python3' -m ")
    assert job_spec(cfg, CLUSTER_FILE).python == "/opt/py 3/bin/python3"


def test_python_over_ssh_defaults_to_python3_on_the_nodes(config):
    cfg = config(ssh={"host": "login.example.org"})
    assert worker_command(cfg, CLUSTER_FILE).startswith(f"{REMOTE_DEFAULT_PYTHON} -m hpc_cluster.worker ")
    assert job_spec(cfg, CLUSTER_FILE).python == REMOTE_DEFAULT_PYTHON
    cfg = config(ssh={"host": "login.example.org"}, python="/sw/py/bin/python")
    assert job_spec(cfg, CLUSTER_FILE).python == "/sw/py/bin/python"


def test_local_directory_is_passed_unexpanded(config, argv_of):
    # '~' and $TMPDIR mean the node's, so the worker expands them there.
    args = worker_args(argv_of(config(local_directory="$TMPDIR/hpc")))
    assert args.local_directory == "$TMPDIR/hpc"
    args = worker_args(argv_of(config(local_directory="~/scratch")))
    assert args.local_directory == "~/scratch"


@pytest.mark.parametrize("name", ["my workers", "it's", 'say "hi"', "$HOME`id`", "a\\b"])
def test_odd_names_reach_the_worker_literally(config, argv_of, name):
    cfg = config(name=name)
    assert worker_args(argv_of(cfg)).name == f"{name}-4242"
    assert job_spec(cfg, CLUSTER_FILE).job_name == name
    bash_n = subprocess.run(["bash", "-n"], input=SLURMAdapter().render(job_spec(cfg, CLUSTER_FILE)),
                            capture_output=True, text=True)
    assert bash_n.returncode == 0, bash_n.stderr


def test_a_name_on_two_lines_is_refused(config):
    with pytest.raises(ConfigError, match="name='a\\\\nb' must be one line"):
        config(name="a\nb")


def test_cluster_file_with_a_space(config, argv_of):
    cmd = worker_command(config(), "/home/a b/c.json")
    assert "--cluster-file '/home/a b/c.json'" in cmd


def test_job_spec_carries_every_job_keyword(config, tmp_path):
    cfg = config(cores=6, memory="3GB", processes=2, walltime="02:30:00", queue="gpu", account="p1",
                 job_extra_directives=["--gres=gpu:1"], job_directives_skip=["--mem"],
                 job_script_prologue=["module load py"], job_script_epilogue=["echo bye"],
                 log_directory=str(tmp_path / "logs"), env={"OMP_NUM_THREADS": 1},
                 working_directory=str(tmp_path / "run"), name="w")
    spec = job_spec(cfg, CLUSTER_FILE)
    assert (spec.cores, spec.memory, spec.processes, spec.walltime) == (6, 3 * 10**9, 2, 9000)
    assert (spec.queue, spec.account, spec.job_name) == ("gpu", "p1", "w")
    assert spec.extra_directives == ["--gres=gpu:1"] and spec.directives_skip == ["--mem"]
    assert spec.prologue == ["module load py"] and spec.epilogue == ["echo bye"]
    assert spec.log_directory == str(tmp_path / "logs") and spec.env == {"OMP_NUM_THREADS": "1"}
    assert spec.working_directory == str(tmp_path / "run")
    assert spec.worker_command == worker_command(cfg, CLUSTER_FILE)


def test_scale_wants_workers_or_jobs_not_both():
    fake = SimpleNamespace(processes=2)
    for kw in ({}, {"n": 2, "jobs": 1}):
        with pytest.raises(TypeError, match="not both"):
            JobQueueCluster.scale(fake, **kw)


# -- real workers ---------------------------------------------------------------------

def _where_am_i():
    import os
    return os.getcwd()


def test_job_script_workers_run_in_their_local_directory(config, tmp_path):
    """The rendered SLURM script, run by bash as sbatch would: two workers (processes=2), each
    under a nanny, join a real scheduler, and their tasks run in the local directory that
    the worker created, with the variable in its path expanded from the job's environment."""
    scratch = tmp_path / "node-scratch"
    with LocalCluster(n_workers=0) as local:
        cluster_file = write_cluster_file(tmp_path / "c.json", local.scheduler_address, local.secret,
                                          name="t")
        cfg = config(processes=2, cores=2, memory="1GB", local_directory="$NODE_SCRATCH/work",
                     worker_extra_args=["--resources", "SCRATCH=1"], name="lw")
        script = SLURMAdapter().render(job_spec(cfg, str(cluster_file)))
        assert "--local-directory '$NODE_SCRATCH/work'" in script
        env = {**os.environ, "SLURM_JOB_ID": "777", "NODE_SCRATCH": str(scratch),
               "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        job = subprocess.Popen(["bash", "-c", script], env=env, cwd=tmp_path,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
        try:
            with Client(local.scheduler_address, secret=local.secret) as client:
                client.wait_for_workers(2, timeout=60)
                names = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
                assert names == ["lw-777-0", "lw-777-1"]
                futures = [client.submit(_where_am_i, pure=False, resources={"SCRATCH": 1})
                           for _ in range(6)]
                assert set(client.gather(futures)) == {str(scratch / "work")}
        finally:
            os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    assert (scratch / "work").is_dir()
    assert not (scratch / "work" / "$NODE_SCRATCH").exists()   # not nested by the nanny or siblings


def test_an_unusable_local_directory_ends_the_worker_with_the_reason(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = subprocess.run([sys.executable, "-m", "hpc_cluster.worker", "--scheduler", "tcp://127.0.0.1:1",
                           "--local-directory", str(blocker / "sub")], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "HPC_CLUSTER_SECRET": "00" * 32})
    assert proc.returncode != 0
    assert f"--local-directory '{blocker / 'sub'}': cannot use" in proc.stderr
    assert "Not a directory" in proc.stderr


def test_resource_spec_reaches_a_pbs_job_and_is_refused_on_slurm(config):
    from hpc_cluster.adapters.base import BatchError
    from hpc_cluster.adapters.pbs import PBSAdapter

    spec = job_spec(config(batch="pbs", cores=4, memory="16GiB", resource_spec="nodes=1:ppn={cores},mem={memory}"),
                    CLUSTER_FILE)
    script = PBSAdapter().render(spec)
    assert "#PBS -l nodes=1:ppn=4,mem=16gb" in script and "select=" not in script
    with pytest.raises(BatchError, match="resource_spec=.* is a PBS setting; on SLURM .*job_extra_directives"):
        SLURMAdapter().render(job_spec(config(resource_spec="nodes=1"), CLUSTER_FILE))
