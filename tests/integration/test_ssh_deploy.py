"""Remote submission: a site with `ssh:` runs sbatch/squeue/sacct/scancel on a "login node"
(a private sshd on 127.0.0.1, tests/helpers/sshd.py) against the real SLURM test cluster, as from
a laptop that shares no filesystem with the cluster.

What makes that true here, so that the test fails if anything is done locally instead:
- the login node's HOME (sshd SetEnv) is another directory than ours, so every path the
  jobs use (cluster file, log directory) must be resolved there, not here;
- our PATH starts with stand-ins for every batch command that record the call and fail,
  so a batch command run here instead of over SSH shows up and breaks the cluster.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import helpers.sshd as private_sshd  # noqa: E402
from helpers.funcs import double
from helpers.slurm import squeue_ids
from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client  # noqa: E402
from hpc_cluster.adapters.base import BatchError  # noqa: E402
from hpc_cluster.cli import main as cli_main  # noqa: E402
from hpc_cluster.deploy.cluster import SLURMCluster  # noqa: E402
from hpc_cluster.deploy.remote import (LoginNode, job_log_names, parse_probe, place_tls,  # noqa: E402
                                      remote_tls_directory)
from hpc_cluster.protocol.clusterfile import read_cluster_file  # noqa: E402

BATCH_COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "qsub", "qstat", "qdel")
SQUEUE = shutil.which("squeue") or "squeue"        # ours, for checking; found before PATH changes


@pytest.fixture(scope="module")
def login(tmp_path_factory):
    """An sshd whose sessions have HOME=<login home>: the login node's home is not ours."""
    tmp = tmp_path_factory.mktemp("login")
    home = tmp / "login-home"
    home.mkdir()
    server = private_sshd.SSHD(tmp, private_sshd.ensure_sshd(), set_env={"HOME": str(home)})
    server.home = home
    yield server
    server.stop()


@pytest.fixture
def laptop(tmp_path, monkeypatch):
    """Our side: its own HOME and config, and a PATH whose batch commands only record the call."""
    home = tmp_path / "laptop-home"
    home.mkdir()
    traps, calls = tmp_path / "no-batch-here", tmp_path / "local-batch-calls.log"
    traps.mkdir()
    for name in BATCH_COMMANDS:
        trap = traps / name
        trap.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\necho "{name}: ran locally" >&2\nexit 97\n')
        trap.chmod(0o755)
    monkeypatch.setenv("PATH", f"{traps}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(tmp_path / "etc"))
    for k in ("HPC_CLUSTER_CONFIG", "HPC_CLUSTER_SITE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    return {"home": home, "calls": calls}


def site_file(tmp_path: Path, login, python: str | None) -> Path:
    site = tmp_path / "site.yaml"
    site.write_text(f"""\
default: remote
sites:
  remote:
    batch: slurm
    cores: 1
    memory: 1GB
    walltime: '00:10:00'
    log_directory: ~/hpc-logs
{f'    python: {python}' if python else ''}
    ssh: {{host: 127.0.0.1, port: {login.port}, user: {getpass.getuser()}, key: {login.key},
           known_hosts: {login.known_hosts}, host_key_policy: reject}}
""")
    return site


def slurm_up() -> bool:
    try:
        res = subprocess.run([shutil.which("scontrol", path="/usr/bin:/usr/local/bin") or "scontrol", "ping"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return "UP" in res.stdout


# -- pure ------------------------------------------------------------------------------

def test_login_node_paths():
    node = parse_probe("/home/alice\n/home/alice/.config\n/home/alice\n")
    assert node == LoginNode(home="/home/alice", config_home="/home/alice/.config", cwd="/home/alice")
    assert node.path("~/logs") == "/home/alice/logs" and node.path("~") == "/home/alice"
    assert node.path("scratch/../logs") == "/home/alice/logs" and node.path("/abs/x") == "/abs/x"
    assert node.cluster_file("big") == "/home/alice/.config/hpc-cluster/clusters/big.json"
    with pytest.raises(BatchError, match="login node's home"):
        parse_probe("Welcome to the cluster!\n")


def test_job_log_names_match_the_job_id_exactly():
    names = ["hpc-cluster-123.out", "hpc-cluster-123.err", "hpc-cluster-1234.out", "slurm-123.out",
             "hpc-cluster.o123", "hpc-cluster.e1230", "notes.txt"]
    assert job_log_names(names, "123.server") == ["hpc-cluster-123.err", "hpc-cluster-123.out",
                                                  "hpc-cluster.o123", "slurm-123.out"]


# -- against the sshd (no SLURM needed) ------------------------------------------------

def test_the_tls_files_are_placed_beside_the_login_nodes_cluster_file(tmp_path):
    """With TLS on by default an ssh site needs the certificate where its jobs run: place_tls
    copies the three files through the runner (here a local one), 0600 in a 0700 directory."""
    from hpc_cluster.protocol.tls import Security
    from hpc_cluster.runners.local import LocalRunner
    made = Security.temporary(tmp_path / "here")
    remote_file = tmp_path / "there" / "c-1a2b3c.json"
    remote_file.parent.mkdir(mode=0o700)
    placed = place_tls(LocalRunner(), made.to_dict(), str(remote_file))
    directory = tmp_path / "there" / "c-1a2b3c.tls"
    assert remote_tls_directory(str(remote_file)) == str(directory)
    assert placed == {"ca_file": str(directory / "tls-ca.pem"), "cert": str(directory / "tls-cert.pem"),
                      "key": str(directory / "tls-key.pem")}
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for field, path in placed.items():
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert Path(path).read_bytes() == Path(made.to_dict()[field]).read_bytes()
    Security.from_dict(placed).client_context()           # a usable certificate there


def test_job_script_of_an_ssh_site_has_the_login_nodes_paths(login, laptop, tmp_path, capsys):
    site = site_file(tmp_path, login, python=None)
    before = login.accepted()
    code = cli_main(["job-script", "--config", str(site), "--name", "big"])
    out, err = capsys.readouterr()
    assert code == 0, err
    remote_file = login.home / ".config" / "hpc-cluster" / "clusters" / "big.json"
    assert f"--cluster-file {remote_file} " in out
    assert f"#SBATCH -o {login.home}/hpc-logs/%x-%j.out" in out
    assert str(laptop["home"]) not in out
    # No python set: python3 from the node's PATH, and the user is told.
    assert "exec python3 -m hpc_cluster.worker " in out
    assert "note: site remote submits over SSH and sets no `python`" in err
    assert login.accepted() == before + 1
    assert not (login.home / "hpc-logs").exists()          # job-script only looks
    assert not laptop["calls"].exists()


# -- end to end on SLURM ----------------------------------------------------------------

@pytest.mark.slurm
def test_slurm_cluster_submits_through_ssh_without_a_shared_filesystem(login, laptop, tmp_path, capsys):
    if not slurm_up():
        pytest.skip("SLURM test cluster not up (tests/batch/slurm/cluster.sh up)")
    site = site_file(tmp_path, login, python=sys.executable)
    logins_before = login.accepted()
    cluster = SLURMCluster(config=str(site))
    job_ids: list[str] = []
    remote_file = login.home / ".config" / "hpc-cluster" / "clusters" / f"{cluster.id}.json"
    try:
        info = json.loads(cluster.cluster_file.read_text())
        assert info["ssh"] is True and info["batch"] == "slurm"
        assert cluster.cluster_file.is_relative_to(laptop["home"])
        # The workers' copy of the cluster file is on the login node, private, the same cluster.
        wait_until(remote_file.exists, 30, "the cluster file on the login node")
        assert stat.S_IMODE(remote_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(remote_file.parent.stat().st_mode) == 0o700
        remote_info = read_cluster_file(remote_file)
        assert (remote_info["address"], remote_info["secret"]) == (info["address"], bytes.fromhex(info["secret"]))
        # TLS by default (issue 34): the certificate's files copied beside it there, private; the
        # login node's cluster file names the copies, not this machine's paths.
        remote_tls = remote_file.with_suffix(".tls")
        assert info["address"].startswith("tls://") and stat.S_IMODE(remote_tls.stat().st_mode) == 0o700
        assert remote_info["tls"] == {k: str(remote_tls / n) for k, n in
                                      (("ca_file", "tls-ca.pem"), ("cert", "tls-cert.pem"), ("key", "tls-key.pem"))}
        assert {stat.S_IMODE(os.stat(p).st_mode) for p in remote_info["tls"].values()} == {0o600}
        assert (remote_tls / "tls-key.pem").read_bytes() == open(info["tls"]["key"], "rb").read()
        # Paths in the job are the login node's; the log directory was made there, not here.
        script = cluster.job_script()
        assert f"--cluster-file {remote_file} " in script
        assert f"#SBATCH -e {login.home}/hpc-logs/%x-%j.err" in script
        assert (login.home / "hpc-logs").is_dir() and not (laptop["home"] / "hpc-logs").exists()

        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=180)
            job_ids = sorted(cluster.jobs)
            assert len(job_ids) == 2 and set(job_ids) <= squeue_ids(SQUEUE)
            assert client.gather(client.map(double, range(10))) == [2 * x for x in range(10)]
        # Two logins: launch() preparing the login node, and the daemon's one connection.
        wait_until(lambda: login.accepted() >= logins_before + 2, 10, "sshd to log both logins")
        assert login.accepted() == logins_before + 2
        assert "Accepted publickey for " + getpass.getuser() in login.log.read_text()

        # `hpc-cluster logs JOB` reads the job's files on the login node, over SSH.
        err_file = login.home / "hpc-logs" / f"{cluster.job_name}-{job_ids[0]}.err"
        wait_until(lambda: "connected to tls://" in err_file.read_text(), 30, "the worker's log line")
        assert cli_main(["logs", job_ids[0], cluster.id]) == 0
        out = capsys.readouterr().out
        assert f"== {err_file} ==" in out and "connected to tls://" in out
        assert login.accepted() == logins_before + 3
    finally:
        cluster.close()
    assert not cluster.cluster_file.exists() and cluster._proc.poll() is not None
    assert not remote_file.exists() and not remote_tls.exists()      # removed on the login node too
    wait_until(lambda: not (set(job_ids) & squeue_ids(SQUEUE)), 60, "the jobs to leave squeue")
    # Not one batch command ran on this machine.
    assert not laptop["calls"].exists(), laptop["calls"].read_text()
