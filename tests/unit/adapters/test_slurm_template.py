"""SLURM job scripts: which keyword makes which directive, and that bash can parse them all.

No SLURM needed; tests/batch/slurm/test_scripts.py feeds the same scripts to `sbatch --test-only`.
"""

from __future__ import annotations

import subprocess

import pytest

from hpc_cluster.adapters.base import BatchError, JobSpec
from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.runners.local import LocalRunner
from helpers.fixtures import bash_n


@pytest.fixture(scope="module")
def adapter():
    return SLURMAdapter(LocalRunner())


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def test_minimal(adapter):
    script = adapter.render(JobSpec(worker_command="python3 -m hpc_cluster.worker"))
    assert script.startswith("#!/usr/bin/env bash\n")
    # dask-jobqueue's directives and spelling, then ours (--no-requeue).
    assert sbatch_lines(script) == [
        "#SBATCH -J hpc-cluster", "#SBATCH -n 1", "#SBATCH --cpus-per-task=1",
        "#SBATCH --mem=954M",  # 10**9 bytes is 953.7 MiB: rounded up, never below the ask
        "#SBATCH -t 01:00:00", "#SBATCH --no-requeue",
    ]
    assert "exec python3 -m hpc_cluster.worker\n" in script
    assert "export HPC_CLUSTER_JOB_WALLTIME=3600\n" in script
    assert 'export HPC_CLUSTER_JOB_ID="$SLURM_JOB_ID"' in script
    bash_n(script)


def test_every_keyword(adapter):
    spec = JobSpec(worker_command="python3 -m hpc_cluster.worker", job_name="my workers", cores=8,
                   memory=16 * 2**30, walltime=5401, queue="gpu", account="proj-42",
                   log_directory="/scratch/me/logs/", working_directory="/scratch/me/run",
                   extra_directives=["--exclusive", "#SBATCH --qos=long"])
    assert sbatch_lines(adapter.render(spec)) == [
        "#SBATCH -J 'my workers'", "#SBATCH -e /scratch/me/logs/%x-%j.err",
        "#SBATCH -o /scratch/me/logs/%x-%j.out", "#SBATCH -p gpu", "#SBATCH -A proj-42",
        "#SBATCH -n 1", "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=16G", "#SBATCH -t 01:31:00",  # 5401 s -> 91 whole minutes
        "#SBATCH --no-requeue", "#SBATCH --chdir=/scratch/me/run", "#SBATCH --exclusive", "#SBATCH --qos=long",
    ]
    assert "export HPC_CLUSTER_JOB_WALLTIME=5460\n" in adapter.render(spec)


@pytest.mark.parametrize("nbytes", [1, 1023, 1024, 10**6, 300 * 10**6, 2**30 - 1, 2**30, 10**9, 28 * 10**9, 16 * 2**30])
def test_memory_is_rounded_up_as_dask_jobqueue_does(adapter, nbytes):
    from dask_jobqueue.slurm import slurm_format_bytes_ceil
    from hpc_cluster.adapters.slurm_text import parse_slurm_memory, slurm_memory
    if nbytes >= 1024:           # dask-jobqueue's own fails below 1 KiB ('1K' % n)
        assert slurm_memory(nbytes) == slurm_format_bytes_ceil(nbytes)
    assert parse_slurm_memory(slurm_memory(nbytes)) >= nbytes


def test_job_cpu_job_mem_and_shebang(adapter):
    spec = JobSpec(worker_command="w", cores=8, memory=28 * 10**9, job_cpu=16, job_mem="100G",
                   shebang="#!/bin/bash -l")
    script = adapter.render(spec)
    assert script.startswith("#!/bin/bash -l\n")
    assert "#SBATCH --cpus-per-task=16" in script and "#SBATCH --mem=100G" in script
    assert "--cpus-per-task=8" not in script and "--mem=27G" not in script


def test_directives_skip(adapter):
    spec = JobSpec(worker_command="w", account="x", queue="q", directives_skip=["--account", "--mem"],
                   extra_directives=["--mem-per-cpu=2G"])
    lines = sbatch_lines(adapter.render(spec))
    assert not any(line.startswith("#SBATCH -A") for line in lines)
    assert "#SBATCH -p q" in lines
    # Built-in lines only: the user's own memory request replaces ours and stays.
    assert [line for line in lines if "--mem" in line] == ["#SBATCH --mem-per-cpu=2G"]


@pytest.mark.parametrize("skip, gone", [
    (["-J"], ["-J"]), (["--job-name"], ["-J"]), (["-n 1"], ["-n 1"]), (["--ntasks"], ["-n 1"]),
    (["-A"], ["-A"]), (["--account"], ["-A"]), (["--partition"], ["-p"]),
    (["--time"], ["-t"]), (["-e"], ["-e"]), (["--error"], ["-e"]), (["-o"], ["-o"]),
    (["--output"], ["-o"]), (["--cpus-per-task"], ["--cpus-per-task"]), (["-c "], ["--cpus-per-task"]),
    (["--mem"], ["--mem"]), (["--no-requeue"], ["--no-requeue"]),
    # A skip string drops every line that contains it, as in dask-jobqueue: '-p' and '-t' are
    # also in '--cpus-per-task'.
    (["-p"], ["-p", "--cpus-per-task"]), (["-t"], ["-t", "--cpus-per-task"]),
])
def test_skip_lists_match_both_spellings(adapter, skip, gone):
    # Written for dask-jobqueue's short flags or for sbatch's long ones: both drop the line.
    spec = JobSpec(worker_command="w", account="acct", queue="q", log_directory="/l")
    every = sbatch_lines(adapter.render(spec))
    lines = sbatch_lines(adapter.render(spec.replace(directives_skip=skip)))
    assert [line for line in every if line not in lines] == \
        [line for line in every if any(line.startswith(f"#SBATCH {g}") for g in gone)]


def test_env_is_quoted(adapter):
    script = adapter.render(JobSpec(worker_command="w", env={"ODD": "a 'b' $c; rm -rf /"}))
    bash_n(script)
    out = subprocess.run(["bash", "-c", script.replace("exec w", 'printf %s "$ODD"')],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout == "a 'b' $c; rm -rf /"


def test_bad_env_name_is_refused(adapter):
    with pytest.raises(BatchError, match="not a valid environment variable name"):
        adapter.render(JobSpec(worker_command="w", env={"1BAD": "x"}))


def test_epilogue_runs_and_keeps_worker_status(adapter, tmp_path):
    marker = tmp_path / "epilogue-ran"
    spec = JobSpec(worker_command="bash -c 'exit 7'", prologue=["echo prologue"],
                   epilogue=[f"touch {marker}"])
    script = adapter.render(spec)
    assert "exec " not in script
    bash_n(script)
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert proc.returncode == 7 and marker.exists() and "prologue" in proc.stdout


def test_failing_prologue_stops_the_job(adapter, tmp_path):
    marker = tmp_path / "worker-ran"
    script = adapter.render(JobSpec(worker_command=f"touch {marker}", prologue=["false"]))
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert proc.returncode != 0 and not marker.exists()


def test_deadline_variables(adapter):
    script = adapter.render(JobSpec(worker_command='echo "$HPC_CLUSTER_JOB_WALLTIME $HPC_CLUSTER_JOB_START"',
                                    walltime=61))
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout.split()
    assert out[0] == "120" and int(out[1]) > 1_600_000_000


@pytest.mark.parametrize("spec", [
    JobSpec(worker_command="w", job_name="a'b\"c $x"),
    JobSpec(worker_command="w", log_directory="/tmp/with space", working_directory="/tmp/a b"),
    JobSpec(worker_command="w; echo x", epilogue=["echo 'it''s'"], prologue=["module load x || true"]),
    JobSpec(worker_command="w", walltime=1, memory=1),
])
def test_odd_specs_still_parse(adapter, spec):
    bash_n(adapter.render(spec))


def test_site_template(adapter, tmp_path):
    path = tmp_path / "site.j2"
    path.write_text("#!/bin/bash\n{% for d in directives %}{{ d }}\n{% endfor %}{{ worker_command }}\n")
    script = adapter.render(JobSpec(worker_command="w", template=str(path)))
    assert script.splitlines()[-1] == "w" and "#SBATCH --mem=954M" in script


def test_site_template_with_an_undefined_variable_names_file_line_and_variable(adapter, tmp_path):
    path = tmp_path / "site.j2"
    path.write_text("#!/bin/bash\n{% for d in directives %}{{ d }}\n{% endfor %}\n"
                    "module load {{ module_list }}\nexec {{ worker_command }}\n")
    with pytest.raises(BatchError) as info:
        adapter.render(JobSpec(worker_command="w", template=str(path)))
    message = str(info.value)
    assert f"template={str(path)!r}, line 4: 'module_list' is undefined" in message
    assert "worker_command" in message and "slurm_walltime_seconds" in message   # what it may use


def test_site_template_syntax_error_names_file_and_line(adapter, tmp_path):
    path = tmp_path / "site.j2"
    path.write_text("#!/bin/bash\n\n{{ worker_command }\n")
    with pytest.raises(BatchError, match=rf"template={str(path)!r}, line 3: unexpected '}}'"):
        adapter.render(JobSpec(worker_command="w", template=str(path)))


def test_site_template_may_include_the_built_in_one(adapter, tmp_path):
    # Loaded by path, with ours on the search path: a site can wrap our template.
    path = tmp_path / "site.j2"
    path.write_text("{% include 'slurm.sh.j2' %}# site footer\n")
    script = adapter.render(JobSpec(worker_command="w", template=str(path)))
    assert "exec w\n" in script and script.endswith("# site footer\n")
