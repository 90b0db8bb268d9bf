"""A log directory the jobs cannot write (issue 34), on the real SLURM: refused by `hpc-cluster up`
(exit 2, a bad configuration) and by SLURMCluster(...) before any job is submitted, with a
message naming the directory and what to change.

Before: one that could not be created printed a raw traceback (exit 1); an unwritable one was
not checked, so every job failed at its start (SLURM could not open its -o/-e files) and the
advice was to read job logs that could not exist. We run as root here, who may write anywhere
but on a read-only filesystem: the unwritable directory is a read-only tmpfs mounted in the
test's own tmp directory (unmounted at the end), the uncreatable one a path under a file."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from hpc_cluster.config import ConfigError
from hpc_cluster.deploy.cluster import SLURMCluster
from helpers.slurm import squeue_named
from slurm_jobs import cli  # noqa: E402  (tests/batch/slurm on sys.path: conftest.py)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


@contextmanager
def read_only_directory(path: Path):
    """`path`, a directory on a read-only tmpfs (root respects that); skipped where we cannot mount."""
    path.mkdir(parents=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {made.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def site_with_logs(tmp_path: Path, name: str, logs: Path) -> Path:
    site = tmp_path / "site.yaml"
    site.write_text(f"default: t\nsites:\n  t:\n    batch: slurm\n    cores: 1\n    memory: 300MB\n"
                    f"    walltime: '00:05:00'\n    job_name: {name}\n    log_directory: {logs}\n")
    return site


def up_refused(tmp_path: Path, name: str, logs: Path):
    """`hpc-cluster up -n 1` with `logs` as log_directory: its result, after making sure that no
    job of its name is left and the cluster is down whatever happened."""
    site = site_with_logs(tmp_path, name, logs)
    try:
        return cli("up", "--config", str(site), "-n", "1", "--name", name, "--timeout", "60")
    finally:
        submitted = squeue_named(name)
        cli("down", name, timeout=120)
        if submitted:
            subprocess.run(["scancel", *submitted])
        assert not submitted, f"jobs {submitted} were submitted with a bad log directory"


def test_up_refuses_a_log_directory_that_cannot_be_created(slurm_cluster, own_home, tmp_path):
    (tmp_path / "afile").write_text("not a directory\n")
    logs = tmp_path / "afile" / "logs"
    up = up_refused(tmp_path, "t-logdir-file", logs)
    assert up.returncode == 2, up.stdout + up.stderr
    assert "Traceback" not in up.stderr, up.stderr
    assert f"log_directory '{logs}'" in up.stderr and f"{tmp_path / 'afile'} is a file" in up.stderr, up.stderr
    assert "set log_directory to a directory you can write" in up.stderr, up.stderr


def test_up_refuses_a_log_directory_it_cannot_write(slurm_cluster, own_home, tmp_path):
    with read_only_directory(tmp_path / "ro") as logs:
        up = up_refused(tmp_path, "t-logdir-ro", logs)
    assert up.returncode == 2, up.stdout + up.stderr
    assert f"log_directory '{logs}'" in up.stderr and "is not writable (Read-only file system)" in up.stderr, \
        up.stderr
    # Nothing of the cluster is left to list or resume.
    assert not list((Path(own_home["XDG_CONFIG_HOME"]) / "hpc-cluster" / "clusters").glob("t-logdir-ro*.json"))


def test_the_cluster_class_refuses_bad_log_directories_before_any_job(slurm_cluster, isolated_home, tmp_path):
    (tmp_path / "afile").write_text("")
    with read_only_directory(tmp_path / "ro") as ro:
        for logs, what in ((ro, "is not writable"), (tmp_path / "afile", "is a file, not a directory"),
                           (tmp_path / "afile" / "logs", "cannot be created")):
            with pytest.raises(ConfigError) as refused:
                SLURMCluster(cores=1, memory="300MB", walltime="00:05:00", n_workers=1, job_name="t-logdir-class",
                             log_directory=str(logs))
            assert f"log_directory '{logs}', from a keyword, {what}" in str(refused.value), refused.value
    assert squeue_named("t-logdir-class") == set()


def test_a_good_log_directory_is_made_and_left_clean(tmp_path):
    """The check leaves no file of its own behind (the directory is the user's)."""
    from hpc_cluster.config import resolve
    from hpc_cluster.deploy.plan import writable_directory
    logs = tmp_path / "new" / "logs"
    assert writable_directory(resolve(batch="slurm", log_directory=str(logs)), "log_directory") == logs
    assert logs.is_dir() and os.listdir(logs) == []
