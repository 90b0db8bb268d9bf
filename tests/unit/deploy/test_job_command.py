"""Keywords -> the job: what `deploy/plan.py` puts in the worker command and the JobSpec,
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


from hpc_cluster import Client, LocalCluster  # noqa: E402
from hpc_cluster.adapters.slurm import SLURMAdapter  # noqa: E402
from hpc_cluster.deploy.cluster import SLURMCluster  # noqa: E402
from hpc_cluster.deploy.plan import REMOTE_DEFAULT_PYTHON, job_spec, worker_command  # noqa: E402
from hpc_cluster.config import ConfigError, resolve  # noqa: E402
from hpc_cluster.protocol.clusterfile import write_cluster_file  # noqa: E402
from hpc_cluster.worker.__main__ import build_parser  # noqa: E402

CLUSTER_FILE = "/home/alice/.config/hpc-cluster/clusters/big.json"


@pytest.fixture
def config(tmp_path):
    """resolve() with keywords only: no config file or HPC_CLUSTER_* of this machine is read."""
    environ = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
               "HPC_CLUSTER_SYSTEM_CONFIG_DIR": str(tmp_path / "etc")}

    def make(**kw):
        kw.setdefault("batch", "slurm")
        kw.setdefault("cores", 1)
        kw.setdefault("memory", "1GB")
        return resolve(environ=environ, cwd=tmp_path, **kw)
    return make


@pytest.fixture
def argv_of(tmp_path):
    """The argv the job's shell hands the worker: the command is run by bash with a stand-in
    'python' that prints its arguments, as the 4th job of cluster 'big' would."""
    fake = tmp_path / "fake python"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    fake.chmod(0o755)

    def run(cfg, name="big") -> list[str]:
        command = worker_command(cfg, CLUSTER_FILE, name)
        python = shlex.split(command)[0]
        command = shlex.quote(str(fake)) + command[len(shlex.quote(python)):] \
            if command.startswith(shlex.quote(python)) else command
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin", "HPC_CLUSTER_JOB_ID": "4242",
                                  "HPC_CLUSTER_WORKER_INDEX": "3", "WHERE": "lab"})
        return out.stdout.split("\0")[:-1]
    return run


def worker_args(argv: list[str]):
    assert argv[:2] == ["-m", "hpc_cluster.worker"]
    return build_parser().parse_args(argv[2:])


def test_defaults_are_dask_jobqueues(config, argv_of):
    # cores=4: dask-jobqueue runs 4 processes of 1 thread, each with a quarter of the memory,
    # written as dask writes it (format_bytes), with a 60 s death timeout, under a nanny.
    cfg = config(cores=4, memory="8GB")
    command = worker_command(cfg, CLUSTER_FILE, "big")
    assert command.startswith(shlex.quote(sys.executable) + " -m hpc_cluster.worker ")
    assert "--nthreads 1 --memory-limit 1.86GiB --nworkers 4 --nanny --death-timeout 60 " in command
    args = worker_args(argv_of(cfg))
    assert (args.cluster_file, args.nthreads, args.memory_limit) == (CLUSTER_FILE, 1, "1.86GiB")
    assert args.nanny and args.nworkers == 4 and args.host == "0.0.0.0" and args.interface is None
    assert args.death_timeout == 60.0 and args.local_directory is None
    assert args.reconnect_window is None and "--reconnect-window" not in command    # the worker's default
    assert args.name == "big-3"
    spec = job_spec(cfg, CLUSTER_FILE, "big")
    assert spec.python == sys.executable and spec.nanny and spec.processes == 4
    assert spec.job_name == "dask-worker" and spec.walltime == 1800 and spec.shebang == "#!/usr/bin/env bash"


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


def test_reconnect_window_reaches_the_worker(config, argv_of):
    args = worker_args(argv_of(config(reconnect_window="30m")))
    assert args.reconnect_window == 1800.0 and args.death_timeout == 60.0


def test_processes_split_cores_and_memory(config, argv_of):
    args = worker_args(argv_of(config(cores=8, memory="12GB", processes=3)))
    assert (args.nworkers, args.nthreads, args.memory_limit) == (3, 2, "3.73GiB")
    args = worker_args(argv_of(config(cores=4, memory="12GB", processes=4, memory_limit="1GB")))
    assert (args.nworkers, args.nthreads, args.memory_limit) == (4, 1, "0.93GiB")


@pytest.mark.parametrize("cores, processes, threads", [(1, 1, 1), (2, 2, 1), (4, 4, 1), (6, 3, 2), (8, 4, 2),
                                                       (12, 4, 3), (16, 4, 4), (24, 6, 4), (7, 7, 1), (36, 6, 6)])
def test_processes_default_to_dask_jobqueues_split(config, argv_of, cores, processes, threads):
    # distributed's nprocesses_nthreads: one per core up to 4, then the smallest factor >= sqrt.
    from distributed.deploy.local import nprocesses_nthreads
    assert nprocesses_nthreads(cores) == (processes, threads)
    args = worker_args(argv_of(config(cores=cores)))
    assert (args.nworkers, args.nthreads) == (processes, threads)


def test_more_processes_than_cores_is_refused(config):
    with pytest.raises(ConfigError, match="processes=4 with cores=2 leaves a worker without a core"):
        config(cores=2, processes=4)


def test_python(config, tmp_path):
    # A path under ~ is expanded by the job's shell on the node, not here.
    command = worker_command(config(python="~/venvs/my env/bin/python"), CLUSTER_FILE, "w")
    assert command.startswith("~/'venvs/my env/bin/python' -m hpc_cluster.worker ")
    out = subprocess.run(["bash", "-c", f"HOME=/h; printf %s {command.split(' -m ')[0]}"],
                         capture_output=True, text=True).stdout
    assert out == "/h/venvs/my env/bin/python"
    cfg = config(python="/opt/py 3/bin/python3")
    assert worker_command(cfg, CLUSTER_FILE, "w").startswith("'/opt/py 3/bin/python3' -m ")
    assert job_spec(cfg, CLUSTER_FILE).python == "/opt/py 3/bin/python3"


def test_python_over_ssh_defaults_to_python3_on_the_nodes(config):
    cfg = config(ssh={"host": "login.example.org"})
    assert worker_command(cfg, CLUSTER_FILE, "w").startswith(f"{REMOTE_DEFAULT_PYTHON} -m hpc_cluster.worker ")
    assert job_spec(cfg, CLUSTER_FILE).python == REMOTE_DEFAULT_PYTHON
    cfg = config(ssh={"host": "login.example.org"}, python="/sw/py/bin/python")
    assert job_spec(cfg, CLUSTER_FILE).python == "/sw/py/bin/python"


def test_local_directory_is_passed_unexpanded(config, argv_of):
    # '~' and $TMPDIR mean the node's, so the worker expands them there.
    args = worker_args(argv_of(config(local_directory="$TMPDIR/hpc")))
    assert args.local_directory == "$TMPDIR/hpc"
    args = worker_args(argv_of(config(local_directory="~/scratch")))
    assert args.local_directory == "~/scratch"


@pytest.mark.parametrize("name", ["my workers", "it's", 'say "hi"', "a\\b", "back`tick`"])
def test_odd_names_reach_the_worker_literally(config, argv_of, name):
    assert worker_args(argv_of(config(), name)).name == f"{name}-3"
    cfg = config(job_name=name)
    assert job_spec(cfg, CLUSTER_FILE).job_name == name
    bash_n = subprocess.run(["bash", "-n"], input=SLURMAdapter().render(job_spec(cfg, CLUSTER_FILE, name)),
                            capture_output=True, text=True)
    assert bash_n.returncode == 0, bash_n.stderr


def test_variables_in_a_name_expand_in_the_job_as_in_dask_jobqueue(config, argv_of):
    # dask-jobqueue's names are not quoted: 'run-$WHERE' takes the job's $WHERE (a job array
    # index, or a variable the prologue sets).
    assert worker_args(argv_of(config(), "run-$WHERE")).name == "run-lab-3"


def test_a_name_on_two_lines_is_refused(config):
    with pytest.raises(ConfigError, match="name='a\\\\nb' must be one line"):
        worker_command(config(), CLUSTER_FILE, "a\nb")
    with pytest.raises(ConfigError, match="job_name='a\\\\nb' must be one line"):
        config(job_name="a\nb")


def test_cluster_file_with_a_space(config, argv_of):
    cmd = worker_command(config(), "/home/a b/c.json", "w")
    assert "--cluster-file '/home/a b/c.json'" in cmd


def test_job_spec_carries_every_job_keyword(config, tmp_path):
    cfg = config(cores=6, memory="3GB", processes=2, walltime="02:30:00", queue="gpu", account="p1",
                 job_extra_directives=["--gres=gpu:1"], job_directives_skip=["--mem"],
                 job_script_prologue=["module load py"], job_script_epilogue=["echo bye"],
                 log_directory=str(tmp_path / "logs"), env={"OMP_NUM_THREADS": 1},
                 working_directory=str(tmp_path / "run"), job_name="w", job_cpu=12, job_mem="8G",
                 shebang="#!/bin/bash -l")
    spec = job_spec(cfg, CLUSTER_FILE, "big")
    assert (spec.cores, spec.memory, spec.processes, spec.walltime) == (6, 3 * 10**9, 2, 9000)
    assert (spec.queue, spec.account, spec.job_name) == ("gpu", "p1", "w")
    assert (spec.job_cpu, spec.job_mem, spec.shebang) == (12, "8G", "#!/bin/bash -l")
    assert spec.extra_directives == ["--gres=gpu:1"] and spec.directives_skip == ["--mem"]
    assert spec.prologue == ["module load py"] and spec.epilogue == ["echo bye"]
    assert spec.log_directory == str(tmp_path / "logs") and spec.env == {"OMP_NUM_THREADS": "1"}
    assert spec.working_directory == str(tmp_path / "run")
    assert spec.worker_command == worker_command(cfg, CLUSTER_FILE, "big")


def test_scale_counts_as_dask_jobqueue_does():
    # scale(n) workers -> whole jobs of `processes`; jobs=, memory=, cores= as in dask-jobqueue
    # (the largest wins); scale() alone is zero jobs.
    def fake(nodes):
        f = SimpleNamespace(config=SimpleNamespace(values={"memory": 16 * 10**9, "cores": 4, "processes": 4,
                                                           "nodes": nodes}))
        f._processes = lambda pool: SLURMCluster._processes(f, pool)
        return f

    def jobs(nodes=1, **kw):
        return SLURMCluster._jobs_for(fake(nodes), kw.get("n"), kw.get("jobs", 0), kw.get("memory"), kw.get("cores"))
    assert jobs(n=8) == 2 and jobs(n=9) == 3 and jobs(jobs=5) == 5 and jobs() == 0
    assert jobs(memory="40GB") == 3 and jobs(memory="0GB") == 0 and jobs(cores=9) == 3
    assert jobs(n=4, memory="40GB") == 3 and jobs(jobs=1, cores=2) == 1
    # nodes=2: a job is 8 workers, 32 GB and 8 cores (memory and cores are per node).
    assert jobs(nodes=2, n=8) == 1 and jobs(nodes=2, n=9) == 2 and jobs(nodes=2, memory="40GB") == 2


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
                     worker_extra_args=["--resources", "SCRATCH=1"])
        script = SLURMAdapter().render(job_spec(cfg, str(cluster_file), "lw").replace(worker_index=7))
        assert "--local-directory '$NODE_SCRATCH/work'" in script
        env = {**os.environ, "SLURM_JOB_ID": "777", "NODE_SCRATCH": str(scratch),
               "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        job = subprocess.Popen(["bash", "-c", script], env=env, cwd=tmp_path,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
        try:
            with Client(local.scheduler_address, secret=local.secret) as client:
                client.wait_for_workers(2, timeout=60)
                names = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
                assert names == ["lw-7-0", "lw-7-1"]
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
    assert "#PBS -l nodes=1:ppn=4,mem=16GB" in script and "select=" not in script
    # Refused when the configuration is read (dask-jobqueue's SLURMCluster has no such keyword),
    # and by the adapter for a spec made some other way.
    with pytest.raises(ConfigError, match=r"resource_spec \(keyword\) is a PBS/SGE setting; on SLURM use job_extra_directives"):
        config(resource_spec="nodes=1")
    with pytest.raises(BatchError, match="resource_spec=.* is a PBS/SGE setting; on SLURM .*job_extra_directives"):
        SLURMAdapter().render(job_spec(config(), CLUSTER_FILE).replace(resource_spec="nodes=1"))


def test_slurm_settings_are_refused_on_pbs(config):
    for kw in ({"job_cpu": 4}, {"job_mem": "10G"}):
        with pytest.raises(ConfigError, match=f"{next(iter(kw))} \\(keyword\\) is a SLURM setting; on PBS use resource_spec"):
            config(batch="pbs", **kw)
