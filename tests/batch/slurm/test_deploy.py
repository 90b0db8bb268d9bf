"""Deploying onto the real SLURM test cluster: the `hpc-cluster` CLI end to end, and
SLURMCluster from Python. Every job, daemon and cluster file a test starts is gone when
it ends, which the tests themselves assert (squeue, the daemon's pid, the file).
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.funcs import square
from helpers.wait import wait_until  # noqa: E402
from slurm_jobs import cli  # noqa: E402  (own_home: conftest.py)
from helpers.slurm import squeue_ids  # noqa: E402

from hpc_cluster import Client  # noqa: E402
from hpc_cluster.deploy.cluster import SLURMCluster  # noqa: E402
from hpc_cluster.lifeline import alive  # noqa: E402

pytestmark = pytest.mark.slurm

SLURM_STATE_NAMES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "COMPLETED", "CANCELLED",
                     "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "SUSPENDED"}


def test_cli_up_status_compute_scale_why_down(slurm_cluster, own_home, tmp_path):
    logs = tmp_path / "logs"
    site = tmp_path / "site.yaml"
    site.write_text(f"default: t\nsites:\n  t:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n"
                    f"    walltime: '00:10:00'\n    log_directory: {logs}\n")
    cluster_file = Path(own_home["XDG_CONFIG_HOME"]) / "hpc-cluster" / "clusters" / "t-cli.json"
    job_ids: set[str] = set()
    pid = None
    try:
        up = cli("up", "--config", str(site), "-n", "2", "--name", "t-cli", "--timeout", "240")
        assert up.returncode == 0, up.stdout + up.stderr
        pid = json.loads(cluster_file.read_text())["pid"]
        assert alive(pid)
        assert stat.S_IMODE(cluster_file.stat().st_mode) == 0o600     # it holds the secret
        job_ids = set(re.findall(r"^job (\d+): (?:pending|running)", up.stdout, re.M))
        assert len(job_ids) == 2, up.stdout
        # Workers are named as dask-jobqueue names them: the cluster's name and the job's index.
        connected = dict(re.findall(r"^worker (t-cli-\d+) connected \(job (\d+)\)", up.stdout, re.M))
        assert sorted(connected) == ["t-cli-0", "t-cli-1"] and set(connected.values()) == job_ids, up.stdout
        worker_of = {job: name for name, job in connected.items()}
        assert "Client('t-cli')" in up.stdout and str(cluster_file) in up.stdout
        assert job_ids <= squeue_ids()

        with Client("t-cli") as client:
            assert len(client.scheduler_info()["workers"]) == 2
            assert sum(client.gather(client.map(square, range(50)))) == sum(x * x for x in range(50))

        # a worker's memory shows from its first heartbeat on ("32MB of 1GB"; before: "1GB")
        status = wait_until(lambda: (lambda r: r if r.stdout.count(" of 1GB") == 2 else None)(cli("status", "t-cli")),
                            30, "status to show both workers' memory")
        assert status.returncode == 0, status.stderr
        rows = {ln.split()[0]: ln.split() for ln in status.stdout.splitlines() if ln.split()
                and ln.split()[0] in job_ids}
        assert set(rows) == job_ids
        for jid, cols in rows.items():
            # MEMORY: what the job's worker uses now, of what the job asked for
            assert cols[1] == "running" and cols[2] == worker_of[jid] and cols[-2:] == ["of", "1GB"], cols
            assert re.fullmatch(r"\d+(\.\d)?MB", cols[-3]), cols
        assert "2 worker(s) connected" in status.stdout and "no worker deaths" in status.stdout
        as_json = cli("status", "t-cli", "--json")
        assert as_json.returncode == 0, as_json.stderr
        data = json.loads(as_json.stdout)
        assert {r["job_id"] for r in data["jobs"] if r["state"] == "running"} == job_ids
        assert all(r["memory_used"] > 10**7 and r["spilled"] == 0 for r in data["jobs"]) and data["deaths"] == []

        listed = cli("list")
        assert listed.returncode == 0 and re.search(rf"^t-cli\s+tls://\S+\s+slurm\s+t\s+{pid}\s+2 running",
                                                    listed.stdout, re.M), listed.stdout

        job_log = cli("logs", sorted(job_ids)[0], "t-cli")
        assert job_log.returncode == 0 and f"-{sorted(job_ids)[0]}.err ==" in job_log.stdout
        assert "connected to tls://" in job_log.stdout         # `up` is TLS by default (issue 34)

        scaled = cli("scale", "1", "t-cli")
        assert scaled.returncode == 0 and "target 1 job(s)" in scaled.stdout

        def one_left():
            out = cli("status", "t-cli").stdout
            done = [j for j in job_ids if re.search(rf"^{j}\s+(completed|cancelled|retired)", out, re.M)]
            return len(done) == 1 and "1 worker(s) connected" in out and done[0]
        gone = wait_until(one_left, 120, "scale 1 to end one job")
        why = cli("why", gone, "t-cli")
        assert why.returncode == 0, why.stderr
        assert f"{worker_of[gone]}  retired  not blamed" in why.stdout

        down = cli("down", "t-cli", timeout=240)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "cluster 't-cli' is down" in down.stdout
        assert not cluster_file.exists()
        assert not alive(pid)
        wait_until(lambda: not (job_ids & squeue_ids()), 60, f"jobs {job_ids} to leave squeue")
        assert cli("status", "t-cli").returncode == 3
    finally:
        if cluster_file.exists():
            cli("down", "t-cli", timeout=240)
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
        if job_ids:
            subprocess.run(["scancel", *job_ids], capture_output=True)


def test_slurm_cluster_from_python(slurm_cluster, own_home, tmp_path):
    logs = tmp_path / "logs"
    cluster = SLURMCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(logs))
    seen: dict[str, list[str]] = {}
    try:
        assert cluster.cluster_file.exists() and alive(cluster._proc.pid)
        cluster.scale(2)

        def both_running_with_workers():
            jobs = cluster.jobs
            for jid, row in jobs.items():
                assert row["raw_state"] in SLURM_STATE_NAMES, row   # from squeue, not invented
                if not seen.get(jid) or seen[jid][-1] != row["state"]:
                    seen.setdefault(jid, []).append(row["state"])
            return len(jobs) == 2 and all(r["state"] == "running" and r["workers"] for r in jobs.values())
        wait_until(both_running_with_workers, 180, "2 SLURM jobs running with a worker each", interval=0.2)
        for jid, states in seen.items():
            assert states in (["pending", "running"], ["running"]), (jid, states)
        assert squeue_state(list(seen)) == {jid: "RUNNING" for jid in seen}

        with Client(cluster) as client:
            assert client.submit(sum, client.map(square, range(10))).result(timeout=60) == 285

            cluster.scale(1)

            def one_finished_one_worker():
                jobs = cluster.jobs
                finished = [j for j in jobs.values() if j["state"] in ("completed", "cancelled")]
                return len(finished) == 1 and len(client.scheduler_info()["workers"]) == 1
            wait_until(one_finished_one_worker, 120, "scale(1) to leave one job and one worker",
                       interval=0.2)
            assert client.submit(square, 12).result(timeout=60) == 144

        cluster.adapt(minimum=1, maximum=2)
        assert cluster.status_table()["adaptive"] == [1, 2]
        with pytest.raises(ValueError, match="minimum"):
            cluster.adapt(minimum=3, maximum=2)
    finally:
        cluster.close()
    assert cluster.status == "closed" and cluster._proc.poll() is not None
    assert not cluster.cluster_file.exists()
    wait_until(lambda: not (set(seen) & squeue_ids()), 60, "the cluster's jobs to leave squeue")


def squeue_state(job_ids: list[str]) -> dict[str, str]:
    out = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T"], capture_output=True,
                         text=True, check=True).stdout
    return dict(line.split() for line in out.splitlines())


def test_job_script_passes_sbatch_test_only(slurm_cluster, own_home, tmp_path):
    with SLURMCluster(cores=2, memory="2GB", walltime="00:05:00", queue="debug",
                      log_directory=str(tmp_path / "logs")) as cluster:
        script = cluster.job_script()
    assert "#SBATCH --cpus-per-task=2" in script and str(cluster.cluster_file) in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    res = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "to start at" in res.stderr         # sbatch --test-only answers on stderr


def test_cli_up_reports_a_broken_environment_and_stops(slurm_cluster, own_home, tmp_path):
    """A prologue that fails ends every job before its worker starts: `up` must not wait out
    its timeout, but say so at once (exit 1) with the job log's own words."""
    site = tmp_path / "bad.yaml"
    site.write_text(f"default: t\nsites:\n  t:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n"
                    f"    walltime: '00:10:00'\n    log_directory: {tmp_path / 'logs'}\n"
                    f"    startup_failures: 2\n"
                    f"    job_script_prologue: [\"echo 'module load python/9.9: no such module' >&2; false\"]\n")
    cluster_file = Path(own_home["XDG_CONFIG_HOME"]) / "hpc-cluster" / "clusters" / "t-bad.json"
    job_ids: set[str] = set()
    try:
        up = cli("up", "--config", str(site), "-n", "1", "--name", "t-bad", "--timeout", "240", timeout=300)
        job_ids = set(re.findall(r"^job (\d+):", up.stdout, re.M))
        assert up.returncode == 1, up.stdout + up.stderr
        assert "stopped submitting jobs: 2 jobs in a row ended before their worker started" in up.stderr
        assert "module load python/9.9: no such module" in up.stderr
        assert "hpc-cluster down t-bad" in up.stderr
        assert cluster_file.exists()                         # still up, so the user can look

        status = cli("status", "t-bad")
        assert status.returncode == 0 and "HALTED:" in status.stdout
        why = cli("why", "t-bad")
        assert why.returncode == 0 and why.stdout.count("startup  not blamed") >= 2
    finally:
        down = cli("down", "t-bad", timeout=240)
        assert down.returncode == 0, down.stdout + down.stderr
        if job_ids:
            subprocess.run(["scancel", *job_ids], capture_output=True)
    assert not cluster_file.exists()
    assert not (job_ids & squeue_ids())


def test_cli_up_stops_waiting_on_held_jobs_and_says_how_to_release_them(slurm_cluster, own_home, tmp_path):
    """Issue 34 papercut: `up` waited its whole timeout (600 s) on a held job that would never
    start. A job pending with a reason that waits on a person (JobHeldUser here: --hold) ends
    the wait at once, exit 1, naming the job, its reason and what to do."""
    site = tmp_path / "held.yaml"
    site.write_text(f"default: t\nsites:\n  t:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n"
                    f"    walltime: '00:10:00'\n    log_directory: {tmp_path / 'logs'}\n"
                    f"    job_extra_directives: ['--hold']\n")
    job_ids: set[str] = set()
    try:
        up = cli("up", "--config", str(site), "-n", "1", "--name", "t-held", "--timeout", "240", timeout=300)
        job_ids = set(re.findall(r"^job (\d+):", up.stdout, re.M))
        assert up.returncode == 1, up.stdout + up.stderr
        assert "will not start until someone acts" in up.stderr and "(JobHeldUser)" in up.stderr, up.stderr
        assert "scontrol release" in up.stderr and "hpc-cluster down t-held" in up.stderr
        assert "within 240 s" not in up.stderr                   # it did not wait out its timeout
    finally:
        down = cli("down", "t-held", timeout=240)
        assert down.returncode == 0, down.stdout + down.stderr
        if job_ids:
            subprocess.run(["scancel", *job_ids], capture_output=True)
    assert not (job_ids & squeue_ids())


@pytest.mark.parametrize("keywords", [{}, {"security": True, "protocol": "tls"}], ids=["default", "dask-keywords"])
def test_slurm_cluster_runs_over_tls(slurm_cluster, own_home, tmp_path, keywords):
    """TLS on the real SLURM: by default (issue 34, point 3: no keyword at all) and with dask's
    security=True, protocol='tls' (issue 14, point 9). The job's worker reads the certificate's
    paths from the cluster file and joins over TLS; a cleartext client is refused; the files,
    0600 in a 0700 directory, go with the cluster; the dashboard listens on 127.0.0.1 and
    answers only with its token."""
    import urllib.error
    import urllib.request

    from hpc_cluster.protocol.clusterfile import read_cluster_file
    cluster = SLURMCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp_path / "logs"),
                           **keywords)
    job_ids: list[str] = []
    try:
        assert cluster.scheduler_address.startswith("tls://") and cluster.security is not None
        tls = read_cluster_file(cluster.cluster_file)["tls"]
        assert {stat.S_IMODE(os.stat(p).st_mode) for p in tls.values()} == {0o600}
        directory = Path(tls["key"]).parent
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        cluster.scale(1)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=180)
            job_ids = list(cluster.jobs)
            assert all(a.startswith("tls://") for a in client.scheduler_info()["workers"])
            assert client.submit(sum, client.map(square, range(10))).result(timeout=60) == 285
        with pytest.raises(ConnectionError):
            Client(cluster.scheduler_address.replace("tls://", "tcp://"), secret=cluster.secret, timeout=10)
        link = cluster.dashboard_link
        assert link.startswith("http://127.0.0.1:"), link
        with urllib.request.urlopen(link, timeout=30) as page:
            assert page.status == 200
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(link.split("?")[0], timeout=30)
    finally:
        cluster.close()
    assert not directory.exists()
    wait_until(lambda: not (set(job_ids) & squeue_ids()), 60, "the cluster's job to leave squeue")
