"""The scheduler as a batch job (issue 16, point 5): the pure parts of deploy/daemon/scheduler_job.py,
the configuration's checks, and the handle's and the handover file's logic. The real runs are
tests/batch/slurm/test_scheduler_job.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time

import pytest

from hpc_cluster.adapters.base import BatchError, JobStatus
from hpc_cluster.adapters.pbs import PBSAdapter
from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.cli import main
from hpc_cluster.config import ConfigError, resolve
from hpc_cluster.deploy.daemon import scheduler_job as sj
from hpc_cluster.deploy.plan import Plan, job_spec
from hpc_cluster.protocol.clusterfile import cluster_file_for
from helpers.wait import wait_until


@pytest.fixture(autouse=True)
def home(isolated_home):
    return isolated_home


def slurm_cfg(**kw):
    return resolve(batch="slurm", cores=4, memory="8GB", walltime="02:00:00", queue="debug", account="lab",
                   job_script_prologue=["module load python"], job_mem="9G", job_cpu=4, jobqueue=False, **kw)


def test_the_scheduler_job_is_the_workers_job_with_one_core_and_the_daemon_command():
    cfg = slurm_cfg(scheduler_in_job=True)
    worker = job_spec(cfg, "/shared/c.json", "c")
    command = sj.daemon_command("/venv/bin/python", "/shared/.c.plan.json", "/shared/c 1.log")
    spec = sj.scheduler_spec(worker, command, 3600, cfg.values["scheduler_job_memory"], "dask-worker-scheduler")
    assert (spec.cores, spec.processes, spec.walltime, spec.job_cpu, spec.job_mem) == (1, 1, 3600, None, None)
    assert (spec.queue, spec.account, spec.prologue) == ("debug", "lab", ["module load python"])
    script = SLURMAdapter().render(spec)
    assert "#SBATCH --cpus-per-task=1" in script and "#SBATCH --mem=2G" in script     # 2GB, rounded up in GiB
    assert "#SBATCH -t 01:00:00" in script and "#SBATCH -p debug" in script and "module load python" in script
    assert "#SBATCH -J dask-worker-scheduler" in script
    assert ("exec /venv/bin/python -m hpc_cluster.deploy.daemon /shared/.c.plan.json >> '/shared/c 1.log' 2>&1"
            in script)
    pbs = PBSAdapter().render(sj.scheduler_spec(worker.replace(job_cpu=None, job_mem=None), command, 600,
                                                10**9, "s"))
    assert "ncpus=1" in pbs and "walltime=00:10:00" in pbs


def test_scheduler_job_walltime_defaults_to_none_and_is_read_as_the_batch_system_reads_it():
    assert slurm_cfg().values["scheduler_in_job"] is False
    assert slurm_cfg().values["scheduler_job_walltime"] is None
    assert slurm_cfg(scheduler_job_walltime="60").values["scheduler_job_walltime"] == 3600    # SLURM: minutes
    assert slurm_cfg(scheduler_job_memory="500MB").values["scheduler_job_memory"] == 500_000_000
    with pytest.raises(ConfigError, match="scheduler_job_walltime"):
        slurm_cfg(scheduler_job_walltime="soon")


def test_scheduler_in_job_without_a_batch_system_is_refused_naming_what_to_change():
    with pytest.raises(ConfigError) as info:
        resolve(batch="local", scheduler_in_job=True, jobqueue=False)
    assert "batch: local" in str(info.value.problems) and "scheduler_in_job" in str(info.value.problems)
    with pytest.raises(ConfigError) as info:
        slurm_cfg(scheduler_in_job=True, ssh={"host": "login.example.org"})
    assert "with ssh is not supported yet" in str(info.value.problems)
    with pytest.raises(ConfigError, match="needs journal: true"):
        slurm_cfg(scheduler_in_job=True, journal=False)
    with pytest.raises(ConfigError, match="scheduler_in_job"):
        slurm_cfg(scheduler_in_job="sometimes")


def test_up_scheduler_in_job_with_a_local_site_is_a_usage_error(capsys, home):
    cfg = home / "local.yaml"
    cfg.write_text("default: here\nsites:\n  here:\n    batch: local\n")
    code = main(["up", "--config", str(cfg), "-n", "1", "--scheduler-in-job"])
    err = capsys.readouterr().err
    assert code == 2 and "scheduler_in_job: true" in err and "batch: slurm or batch: pbs" in err
    assert not cluster_file_for("default").exists()


def test_renewal_time_leaves_the_margin_the_queue_wait_and_the_startup():
    assert sj.renew_at(1000, 3600, 60, 30) == 1000 + 3600 - (60 + 30 + sj.DAEMON_STARTUP)
    # A one-minute job: the margin is at most a fifth of it, and never before half of it.
    assert sj.renew_at(0, 60, 60, 2) == 60 - (12 + 2 + sj.DAEMON_STARTUP)
    assert sj.renew_at(0, 60, 60, 100) == 30


def test_only_a_sigterm_at_the_walltime_keeps_the_cluster_for_a_successor():
    assert sj.is_walltime_sigterm(1055, 1000, 60)           # SLURM's limit, up to a poll late
    assert sj.is_walltime_sigterm(1075, 1000, 60)
    assert not sj.is_walltime_sigterm(1020, 1000, 60)       # scancel in the middle: a shutdown
    assert not sj.is_walltime_sigterm(1075, None, 60)


def test_own_job_reads_the_job_scripts_exports():
    env = {"HPC_CLUSTER_JOB_ID": "42", "HPC_CLUSTER_JOB_START": "1000", "HPC_CLUSTER_JOB_WALLTIME": "60"}
    assert sj.own_job(env) == {"id": "42", "started": 1000.0, "walltime": 60.0}
    assert sj.own_job({}) is None


class QueueOf:
    """A batch system's queue as a dict of job id -> state, behind the adapter's status/cancel."""

    def __init__(self, states: dict[str, str]):
        self.states, self.cancelled, self.fail = states, [], False

    def status(self, ids):
        if self.fail:
            raise BatchError("squeue: timeout")
        return {i: JobStatus(i, self.states.get(i, "unknown"), self.states.get(i, "?").upper()) for i in ids}

    def cancel(self, ids):
        self.cancelled += list(ids)


def test_the_handle_follows_the_cluster_through_a_handover(home):
    path = home / "c.json"
    path.write_text(json.dumps({"scheduler_job": "1"}))
    q = QueueOf({"1": "running"})
    now = [0.0]
    handle = sj.SchedulerJob(q, "1", path, clock=lambda: now[0])
    assert handle.pid is None and handle.poll() is None
    sj.write_handover(path, predecessor="1", successor="2", state="submitted")
    q.states.update({"1": "completed", "2": "pending"})
    now[0] += 10
    assert handle.poll() is None and handle.job_id == "2"    # the old job ended, its successor queues
    path.write_text(json.dumps({"scheduler_job": "2"}))
    q.states["2"] = "running"
    now[0] += 10
    assert handle.poll() is None
    handle.kill()
    assert "2" in q.cancelled
    q.states["2"] = "cancelled"
    now[0] += 10
    assert handle.poll() == 1 and handle.state == "cancelled"


def test_the_handle_waits_with_popens_timeout_and_a_failed_squeue_is_not_an_end(home):
    path = home / "c.json"
    q = QueueOf({"7": "pending"})
    handle = sj.SchedulerJob(q, "7", path)
    q.fail = True
    assert handle.poll() is None
    q.fail = False
    with pytest.raises(subprocess.TimeoutExpired):
        handle.wait(timeout=0.1)
    q.states["7"] = "completed"
    handle._checked = -1e9
    assert handle.wait(5) == 0


def test_job_alive_knows_queued_running_and_ended_scheduler_jobs(home):
    path = home / "c.json"
    assert sj.job_alive({"pid": 5}, path) is None                     # a daemon here: its pid tells
    assert sj.job_alive({"scheduler_job": "3"}, path, QueueOf({"3": "pending"})) is True
    assert sj.job_alive({"scheduler_job": "3"}, path, QueueOf({"3": "timeout"})) is False
    sj.write_handover(path, predecessor="3", successor="4", state="ready")
    assert sj.job_alive({"scheduler_job": "3"}, path, QueueOf({"3": "completed", "4": "running"})) is True
    failing = QueueOf({})
    failing.fail = True
    assert sj.job_alive({"scheduler_job": "3"}, path, failing) is True


def plan_for(home) -> Plan:
    job = {"worker_command": "x", "walltime": 60}
    return Plan.from_json({
        "name": "c", "batch": "slurm", "cluster_file": str(home / "c.json"), "plan_file": str(home / ".c.plan.json"),
        "job": job, "n_jobs": 2, "pools": {"default": {"job": job, "n_jobs": 2}},
        "scheduler": {"host": "0.0.0.0", "allowed_failures": 3, "heartbeat_ttl": 60, "versions": "warn",
                      "max_message_bytes": 10**9, "max_frame_bytes": 10**8, "walltime_margin": 60, "port": 0},
        "scheduler_job": {"job": job, "submitted": 990.0}})


def test_the_successors_plan_resumes_on_the_old_port_and_submits_no_jobs(home):
    renewal = sj.Renewal(QueueOf({}), plan_for(home), {"id": "9", "started": 1000.0, "walltime": 60.0}, 4321,
                         hand_over=None, clock=lambda: 1030.0)
    assert renewal.queue_wait == 10.0
    assert renewal.due() == sj.renew_at(1000, 60, 60, 10)
    plan = renewal.successor_plan().to_json()
    assert plan["resume"] is True and plan["successor_of"] == "9"
    assert plan["scheduler"]["prefer_port"] == 4321 and plan["scheduler_job"]["submitted"] == 1030.0
    assert plan["n_jobs"] == 0 and plan["pools"]["default"]["n_jobs"] == 0
    assert renewal.plan.n_jobs == 2 and not renewal.plan.resume          # its own plan is left as it was


def test_a_successor_waits_for_done_or_for_its_predecessors_end(home):
    path = home / "c.json"

    def old_daemon_lets_go():
        wait_until(lambda: sj.read_handover(path).get("state") == "ready", 10, "the successor to be ready",
                   interval=0.05)
        sj.write_handover(path, predecessor="1", successor="2", state="done")
    t = threading.Thread(target=old_daemon_lets_go)
    t.start()
    assert asyncio.run(sj.await_predecessor(QueueOf({"1": "running"}), path, "2", "1", timeout=10)) == "done"
    t.join()
    # The old job reached its walltime first: the journal is what it left.
    sj.handover_path(path).unlink()
    assert asyncio.run(sj.await_predecessor(QueueOf({"1": "timeout"}), path, "2", "1", timeout=30)) == "gone"
    assert asyncio.run(sj.await_predecessor(QueueOf({"1": "running"}), path, "2", "1", timeout=0.3)) == "timeout"


def test_a_daemon_in_a_job_takes_a_still_owner_file_for_a_gone_owner(home):
    path = home / ".c.owner"
    sj.touch_owner(path)

    async def watch(touching: bool, longest: float) -> float:
        stop = asyncio.Event()
        start = time.monotonic()
        task = asyncio.create_task(sj.watch_owner_file(path, stop, timeout=0.6))
        while time.monotonic() - start < longest and not stop.is_set():
            if touching:
                os.utime(path, ns=(time.time_ns(), time.time_ns()))
            await asyncio.sleep(0.05)
        task.cancel()
        return time.monotonic() - start if stop.is_set() else -1.0
    assert asyncio.run(watch(touching=True, longest=2.0)) == -1.0     # a live owner: never stopped
    took = asyncio.run(watch(touching=False, longest=30.0))
    assert 0.6 <= took < 30, took                             # a still file: stopped after the timeout
