"""The distributed engine (issue 32) through the `hpc-cluster` CLI and with TLS, on the real SLURM.

1. `up --engine distributed` (TLS, the default), then distributed's Client by scheduler file, by
   address and as `up` printed it; `status` (text and --json) names the engine, distributed's scheduler, its
   scheduler file and both dashboards (which answer); `logs` of a worker and of a job; `scale`,
   `why` and `down`, which leaves no job, daemon, cluster file or scheduler file.
2. SLURMCluster(engine="distributed", security=True): distributed's Client and workers speak
   tls:// with the cluster's certificate (cluster.security is distributed's Security), a
   cleartext client is refused, and the certificate goes with the cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import textwrap
import urllib.request
from pathlib import Path

import distributed
import pytest
from distributed import Client

from helpers.slurm import squeue_ids
from helpers.wait import wait_until
from slurm_jobs import cli  # noqa: E402  (own_home: conftest.py)

from hpc_cluster.cli.engine import client_security, connect_hint
from hpc_cluster.deploy.cluster import SLURMCluster
from hpc_cluster.lifeline import alive

pytestmark = pytest.mark.slurm


def python_lines(text: str) -> str:
    """The indented Python `up` prints under 'Connect from Python:', as code to run."""
    return textwrap.dedent(text.split("Connect from Python:\n", 1)[1].split("\ncluster file", 1)[0])


def answers(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return reply.status


@pytest.fixture
def left_behind(own_home):
    """What the CLI test started, filled in as it learns it (daemon pid, job ids): if the test fails
    halfway, `down` and then the pid and the jobs themselves stop what is left."""
    left: dict = {"name": "t-dcli", "pid": None, "jobs": set()}
    yield left
    if (Path(own_home["XDG_CONFIG_HOME"]) / "hpc-cluster" / "clusters" / f"{left['name']}.json").exists():
        cli("down", left["name"], timeout=240)
    if left["pid"] and alive(left["pid"]):
        os.kill(left["pid"], signal.SIGKILL)
    if left["jobs"]:
        subprocess.run(["scancel", *left["jobs"]], capture_output=True)


def test_cli_up_connect_status_logs_scale_why_down(slurm_cluster, own_home, tmp_path, left_behind):
    site = tmp_path / "site.yaml"
    site.write_text(f"default: t\nsites:\n  t:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n"
                    f"    walltime: '00:10:00'\n    log_directory: {tmp_path / 'logs'}\n")
    clusters = Path(own_home["XDG_CONFIG_HOME"]) / "hpc-cluster" / "clusters"
    cluster_file, scheduler_file = clusters / "t-dcli.json", clusters / "t-dcli.scheduler.json"
    up = cli("up", "--config", str(site), "-n", "2", "--name", "t-dcli", "--engine", "distributed",
             "--timeout", "240")
    assert up.returncode == 0, up.stdout + up.stderr
    info = json.loads(cluster_file.read_text())
    pid = left_behind["pid"] = info["pid"]
    assert info["engine"] == "distributed" and info["scheduler_file"] == str(scheduler_file)
    assert json.loads(scheduler_file.read_text())["address"] == info["engine_address"]   # distributed's format
    assert stat.S_IMODE(scheduler_file.stat().st_mode) == 0o600
    job_ids = left_behind["jobs"] = set(re.findall(r"^job (\d+): (?:pending|running)", up.stdout, re.M))
    connected = dict(re.findall(r"^worker (t-dcli-\d+) connected \(job (\d+)\)", up.stdout, re.M))
    assert len(job_ids) == 2 and sorted(connected) == ["t-dcli-0", "t-dcli-1"], up.stdout
    worker_of = {job: name for name, job in connected.items()}
    assert "(engine: distributed)" in up.stdout and f"distributed's dashboard: {info['engine_dashboard']}" in up.stdout

    # distributed's Client, by scheduler file, by address, and as `up` said to connect; over TLS,
    # `up`'s default (issue 34), with the cluster's certificate (the cluster file names it)
    assert info["engine_address"].startswith("tls://")
    security = client_security(info)
    with Client(scheduler_file=str(scheduler_file), security=security, timeout=30, set_as_default=False) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        assert sorted(w["name"] for w in workers.values()) == ["t-dcli-0", "t-dcli-1"]
        assert client.submit(sum, [1, 2, 3]).result(timeout=60) == 6
    with Client(info["engine_address"], security=security, timeout=30, set_as_default=False) as client:
        assert client.gather(client.map(pow, range(50), [2] * 50)) == [x * x for x in range(50)]
    code = python_lines(up.stdout)
    assert f"Client({info['engine_address']!r}, security=security)" in code
    assert f"scheduler_file={str(scheduler_file)!r}" in code
    namespace: dict = {}
    exec(code, namespace)
    with namespace["client"] as client:
        assert client.submit(pow, 3, 4).result(timeout=60) == 81

    status = wait_until(lambda: (lambda r: r if r.stdout.count(" of 1GB") == 2 else None)(cli("status", "t-dcli")),
                        30, "status to show both workers' memory")
    version = distributed.__version__
    assert f"engine: distributed {version}, its scheduler at {info['engine_address']}" in status.stdout
    assert f"scheduler file: {scheduler_file}\n" in status.stdout
    assert f"distributed's dashboard: {info['engine_dashboard']}\n" in status.stdout      # bokeh's
    assert f"dashboard: {info['dashboard']}\n" in status.stdout                          # ours, the deaths page
    assert "2 worker(s) connected" in status.stdout and "no worker deaths" in status.stdout
    assert answers(info["engine_dashboard"]) == 200 and answers(info["dashboard"]) == 200
    data = json.loads(cli("status", "t-dcli", "--json").stdout)
    assert (data["engine"], data["engine_address"], data["scheduler_file"], data["engine_dashboard"]) == \
        ("distributed", info["engine_address"], str(scheduler_file), info["engine_dashboard"])
    assert data["engine_versions"]["distributed"] == version and data["address"] == info["address"]
    assert {r["job_id"] for r in data["jobs"] if r["state"] == "running"} == job_ids and data["deaths"] == []

    # a worker's log, from distributed's worker (asked through its scheduler), and a job's files
    worker_log = cli("logs", "t-dcli-0", "t-dcli")
    assert worker_log.returncode == 0, worker_log.stderr
    assert "== worker t-dcli-0 (tls://" in worker_log.stdout
    assert f"Registered to:      {info['engine_address']}" in worker_log.stdout
    job = sorted(job_ids)[0]
    job_log = cli("logs", job, "t-dcli", "--tail", "500")
    assert job_log.returncode == 0 and f"-{job}.err ==" in job_log.stdout
    assert re.search(r"distributed.worker - INFO - +Start worker at: ", job_log.stdout), job_log.stdout

    assert cli("scale", "1", "t-dcli").returncode == 0

    def one_left():
        out = cli("status", "t-dcli").stdout
        done = [j for j in job_ids if re.search(rf"^{j}\s+(completed|cancelled|retired)", out, re.M)]
        return len(done) == 1 and "1 worker(s) connected" in out and done[0]
    gone = wait_until(one_left, 120, "scale 1 to end one job")
    with Client(scheduler_file=str(scheduler_file), security=security, timeout=30, set_as_default=False) as client:
        assert len(client.scheduler_info(n_workers=-1)["workers"]) == 1          # distributed's view too
    why = cli("why", gone, "t-dcli")
    assert why.returncode == 0, why.stderr
    assert f"{worker_of[gone]}  retired  not blamed" in why.stdout
    # `logs` asked distributed's worker in distributed's protocol: nothing in its log went wrong
    assert "Traceback" not in why.stdout and "Error" not in why.stdout, why.stdout

    down = cli("down", "t-dcli", timeout=240)
    assert down.returncode == 0 and "cluster 't-dcli' is down" in down.stdout, down.stdout + down.stderr
    assert not cluster_file.exists() and not scheduler_file.exists() and not alive(pid)
    wait_until(lambda: not (job_ids & squeue_ids()), 60, f"jobs {job_ids} to leave squeue")
    assert cli("status", "t-dcli").returncode == 3


def test_security_true_runs_tasks_over_tls(slurm_cluster, own_home, tmp_path):
    cluster = SLURMCluster(cores=1, memory="1GB", walltime="00:10:00", engine="distributed", security=True,
                           log_directory=str(tmp_path / "logs"))
    job_ids: list[str] = []
    try:
        info = json.loads(cluster.cluster_file.read_text())
        tls = info["engine_tls"]
        assert cluster.scheduler_address == info["engine_address"] and cluster.scheduler_address.startswith("tls://")
        assert isinstance(cluster.security, distributed.Security) and cluster.security.require_encryption
        assert cluster.security.tls_client_cert == tls["cert"] and stat.S_IMODE(os.stat(tls["key"]).st_mode) == 0o600
        cluster.scale(1)
        with Client(cluster, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=180)
            job_ids = list(cluster.jobs)
            assert all(a.startswith("tls://") for a in client.scheduler_info(n_workers=-1)["workers"])
            assert client.submit(pow, 3, 3).result(timeout=60) == 27
        # by the scheduler file, with the cluster's certificate; and as `up` prints it for a TLS cluster
        with Client(scheduler_file=info["scheduler_file"], security=cluster.security, timeout=30,
                    set_as_default=False) as client:
            assert client.submit(sum, [4, 5]).result(timeout=60) == 9
        code = connect_hint(cluster.id, info)
        assert "security=security" in code
        namespace: dict = {}
        exec(textwrap.dedent(code), namespace)
        with namespace["client"] as client:
            assert client.submit(pow, 2, 7).result(timeout=60) == 128
        with pytest.raises(OSError):            # no certificate, no cluster
            Client(cluster.scheduler_address.replace("tls://", "tcp://"), timeout="5s", set_as_default=False)
    finally:
        cluster.close()
    assert not os.path.exists(tls["key"]) and not os.path.exists(info["scheduler_file"])
    wait_until(lambda: not (set(job_ids) & squeue_ids()), 60, "the cluster's job to leave squeue")
