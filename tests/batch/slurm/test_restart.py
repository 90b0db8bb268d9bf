"""The cluster daemon dies and comes back on the real SLURM (issue 16, points 2 and 6).

`hpc-cluster up` runs 2 one-worker jobs; a client maps short tasks and waits in a single
gather. When a third of them are done the daemon is SIGKILLed; 5 s later the same `up`
command is run again. It resumes from the journal: same secret, the jobs adopted by id (no
new job), the workers reattach with their results, the client's gather returns every result,
and almost nothing runs twice. The second case "reboots" the daemon's machine too: its log
and plan files are gone, only the cluster file and the journal (on the shared filesystem) stay.

Each task appends its index to a file as it starts, so reruns are counted, not guessed. The
full-size run (2,000 tasks, kill after 600) is benchmarks/restart.py; this one is smaller.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.wait import wait_until  # noqa: E402
from slurm_jobs import cli, gather_in_background  # noqa: E402  (own_home: conftest.py)
from helpers.slurm import squeue_ids  # noqa: E402

from hpc_cluster import Client  # noqa: E402
from hpc_cluster.lifeline import alive  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

N_TASKS, KILL_AFTER = 400, 150


def _task(i, log):
    with open(log, "a") as f:
        f.write(f"{i}\n")
    time.sleep(0.2)
    return i * i


def _runs(log: Path) -> list[int]:
    try:
        return [int(x) for x in log.read_text().split()]
    except FileNotFoundError:
        return []


@pytest.mark.parametrize("reboot", [False, True], ids=["sigkill", "reboot"])
def test_a_killed_daemon_restarted_with_up_loses_nothing(slurm_cluster, own_home, tmp_path, reboot):
    name = f"t-rs-{'reboot' if reboot else 'kill'}"
    site = tmp_path / "site.yaml"
    site.write_text(f"default: t\nsites:\n  t:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n"
                    f"    walltime: '00:15:00'\n    job_name: {name}\n    log_directory: {tmp_path / 'logs'}\n")
    run_dir = Path(own_home["XDG_CONFIG_HOME"]) / "hpc-cluster" / "clusters"
    cluster_file, journal = run_dir / f"{name}.json", run_dir / f"{name}.journal"
    log = tmp_path / "runs.txt"
    jobs: set[str] = set()
    try:
        up = cli("up", "--config", str(site), "-n", "2", "--name", name, "--timeout", "240")
        assert up.returncode == 0, up.stdout + up.stderr
        jobs = set(re.findall(r"^job (\d+): (?:pending|running)", up.stdout, re.M))
        assert len(jobs) == 2, up.stdout
        old = json.loads(cluster_file.read_text())

        with Client(name) as client:
            futures = client.map(_task, range(N_TASKS), log=str(log))
            waiter, got = gather_in_background(client, futures)
            wait_until(lambda: len(_runs(log)) >= KILL_AFTER, 240, f"{KILL_AFTER} tasks to have started")
            os.kill(old["pid"], signal.SIGKILL)
            wait_until(lambda: not alive(old["pid"]), 30, "the daemon to die")
            started_at_kill = len(set(_runs(log)))
            assert journal.exists(), "a SIGKILLed daemon leaves its journal"
            if reboot:                            # the daemon's machine-local state is gone
                for p in (run_dir / f".{name}.plan.json", run_dir / f"{name}.log"):
                    p.unlink(missing_ok=True)
            time.sleep(5)                         # the scenario: restarted 5 s later
            assert cli("status", name).returncode == 3
            listed = cli("list")
            assert f"hpc-cluster up --name {name}` resumes it" in listed.stdout, listed.stdout + listed.stderr

            again = cli("up", "--config", str(site), "-n", "2", "--name", name, "--timeout", "240")
            assert again.returncode == 0, again.stdout + again.stderr
            assert f"resuming cluster {name!r} from its journal" in again.stdout, again.stdout
            new = json.loads(cluster_file.read_text())
            assert new["pid"] != old["pid"] and alive(new["pid"])
            assert new["secret"] == old["secret"]       # what the running workers authenticate with

            # Placement waits for the workers of the adopted jobs, and only as long as they take.
            wait_until(lambda: "every worker of the adopted jobs is back (2)" in (run_dir / f"{name}.log").read_text(),
                       60, "the resumed daemon to see both workers back")
            waiter.join(600)
            assert not waiter.is_alive(), "the client's gather did not return"
            assert "error" not in got, repr(got.get("error"))
            assert got["result"] == [i * i for i in range(N_TASKS)]

        # The same jobs, adopted: no job was submitted for the restart.
        named = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True,
                               check=True).stdout.split()
        assert set(named) == jobs, (named, jobs, again.stdout)
        status = cli("status", name, "--json")
        assert status.returncode == 0, status.stderr
        assert {str(j["job_id"]) for j in json.loads(status.stdout)["jobs"]} == jobs
        # Almost nothing ran twice (every result survived on its worker).
        runs = _runs(log)
        reruns = len(runs) - len(set(runs))
        assert set(runs) == set(range(N_TASKS))
        assert reruns < 0.02 * started_at_kill, f"{reruns} reruns of {started_at_kill} started before the kill"
    finally:
        down = cli("down", name, timeout=240)
        assert down.returncode == 0, down.stdout + down.stderr
        wait_until(lambda: not (jobs & squeue_ids()), 60, "the cluster's jobs to leave squeue")
        assert not journal.exists(), "`down` ends the cluster for good: its journal goes"
