"""Remote submission: a site with `ssh:` runs sbatch/squeue/scancel through a private sshd
on 127.0.0.1 (tests/sshd.py) against the real SLURM test cluster, as on a site where
the cluster daemon runs off the login node.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sshd as private_sshd  # noqa: E402
from waiting import wait_until  # noqa: E402

from hpc_cluster import Client  # noqa: E402
from hpc_cluster.deploy.cluster import SLURMCluster  # noqa: E402

sshd = private_sshd.sshd          # the module fixture, under the name the test asks for


def slurm_up() -> bool:
    try:
        res = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return "UP" in res.stdout


def squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def _double(x):
    return 2 * x


@pytest.mark.slurm
def test_slurm_cluster_submits_through_ssh(sshd, tmp_path, monkeypatch):
    if not slurm_up():
        pytest.skip("SLURM test cluster not up (tests/slurm/cluster.sh up)")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(tmp_path / "etc"))
    for k in ("HPC_CLUSTER_CONFIG", "HPC_CLUSTER_SITE"):
        monkeypatch.delenv(k, raising=False)
    site = tmp_path / "site.yaml"
    site.write_text(f"""\
default: remote
sites:
  remote:
    batch: slurm
    cores: 1
    memory: 1GB
    walltime: '00:10:00'
    log_directory: {tmp_path / 'logs'}
    ssh: {{host: 127.0.0.1, port: {sshd.port}, user: {getpass.getuser()}, key: {sshd.key},
           known_hosts: {sshd.known_hosts}, host_key_policy: reject}}
""")
    logins_before = sshd.accepted()
    cluster = SLURMCluster(config=str(site))
    job_ids: list[str] = []
    try:
        info = json.loads(cluster.cluster_file.read_text())
        assert info["ssh"] is True and info["batch"] == "slurm"
        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=180)
            job_ids = sorted(cluster.jobs)
            assert len(job_ids) == 2 and set(job_ids) <= squeue_ids()
            assert client.gather(client.map(_double, range(10))) == [2 * x for x in range(10)]
        # The daemon's one SSH connection logged in; no batch command ran here instead.
        wait_until(lambda: sshd.accepted() > logins_before, 10, "sshd to log the daemon's login")
        assert sshd.accepted() - logins_before == 1
        log = sshd.log.read_text()
        assert "Accepted publickey for " + getpass.getuser() in log
    finally:
        cluster.close()
    assert not cluster.cluster_file.exists() and cluster._proc.poll() is not None
    wait_until(lambda: not (set(job_ids) & squeue_ids()), 60, "the jobs to leave squeue")
