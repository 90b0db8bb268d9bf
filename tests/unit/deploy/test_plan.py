"""The plan (deploy/plan.py): config -> a typed Plan, written and read as the JSON the cluster
daemon has always read, so that a daemon resumed from a plan file written before the Plan
existed still reads it."""

from __future__ import annotations

import dataclasses
import json
import os
import stat

import pytest

from hpc_cluster.adapters.base import JobSpec
from hpc_cluster.config import resolve
from hpc_cluster.deploy.daemon.polling import PollSettings
from hpc_cluster.deploy.plan import Plan, PoolPlan, SchedulerPlan, make_plan


@pytest.fixture(autouse=True)
def home(isolated_home):
    return isolated_home


def job(**changes) -> dict:
    """A job as launch() wrote it before the Plan (every JobSpec field of that time)."""
    return {"worker_command": "/venv/bin/python -m hpc_cluster.worker --cluster-file /h/c.json --name \"c-\"",
            "job_name": "dask-worker", "cores": 2, "memory": 4_000_000_000, "processes": 1, "walltime": 3600,
            "queue": "debug", "account": None, "extra_directives": ["--exclusive"], "directives_skip": [],
            "prologue": ["module load python"], "epilogue": [], "log_directory": "/h/logs", "python": "/venv/bin/python",
            "nanny": True, "env": {"OMP_NUM_THREADS": "1"}, "working_directory": None, "template": None,
            "resource_spec": None, "shebang": "#!/usr/bin/env bash", "job_cpu": None, "job_mem": None,
            "worker_index": 0, "worker_name": "c", "job_array": False, "array_size": 0, "batch_options": {},
            **changes}


# A plan file as launch() wrote it before this module: a scheduler job's, resumed, with a pool.
BEFORE = {
    "name": "c-1a2b3c", "site": "lab", "batch": "slurm", "ssh": None, "login": None,
    "cluster_file": "/h/.config/hpc-cluster/clusters/c-1a2b3c.json", "remote_cluster_file": None,
    "job_cluster_file": "/shared/.hpc-cluster-c-1a2b3c.json",
    "scheduler": {"host": "0.0.0.0", "port": 0, "allowed_failures": 3, "heartbeat_ttl": 300.0,
                  "versions": "warn", "walltime_margin": 60.0, "max_message_bytes": 2**30,
                  "max_frame_bytes": 2**28, "dashboard": ["", 8787], "prefer_port": 40123, "interface": "ib0"},
    "job": job(),
    "n_jobs": 2, "max_jobs_in_queue": 50,
    "pools": {"default": {"job": job(), "max_jobs": None, "escalation_only": False, "n_jobs": 2,
                          "scheduler": {"memory": 4_000_000_000, "walltime": 3600.0, "nthreads": 2, "processes": 1,
                                        "resources": {}, "max_jobs": None, "escalation_only": False},
                          "job_lifetime": None},
              "big": {"job": job(memory=16_000_000_000, worker_command="w --pool big"), "max_jobs": 2,
                      "escalation_only": True, "n_jobs": 0,
                      "scheduler": {"memory": 16_000_000_000, "walltime": 3600.0, "nthreads": 2, "processes": 1,
                                    "resources": {"GPU": 1.0}, "max_jobs": 2, "escalation_only": True},
                      "job_lifetime": 3060.0}},
    "escalate": {"memory": True, "walltime": True, "margin": 1.5},
    "poll_interval": 30.0, "poll_interval_fast": 2.0, "batch_calls_per_minute": 60,
    "startup_failures": 3, "journal": True, "job_lifetime": None,
    "resume": True, "daemon_log": "/h/c-1a2b3c.log", "plan_file": "/h/.c-1a2b3c.plan.json",
    "tls_directory": None, "owner_pid": None, "owner_file": "/h/c-1a2b3c.owner",
    "scheduler_job": {"job": job(cores=1, worker_command="python -m hpc_cluster.deploy.daemon /h/.c.plan.json"),
                      "submitted": 1700000000.5},
    "successor_of": "4242",
}


def with_spec_defaults(plan: dict) -> dict:
    """`plan` with each job holding every JobSpec field (a field added since is written with its default)."""
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(JobSpec) if f.name != "worker_command"}
    out = json.loads(json.dumps(plan))
    for holder in [out, *([out["scheduler_job"]] if "scheduler_job" in out else []), *out["pools"].values()]:
        holder["job"] = {**defaults, **holder["job"]}
    return out


def test_a_plan_written_before_the_plan_type_reads_and_writes_back_the_same():
    plan = Plan.from_json(json.loads(json.dumps(BEFORE)))
    assert plan.to_json() == with_spec_defaults(BEFORE)
    # What the daemon's readers take from it.
    assert plan.scheduler.prefer_port == 40123 and plan.scheduler.interface == "ib0"
    assert plan.pools["big"].job.memory == 16_000_000_000 and plan.pools["big"].max_jobs == 2
    assert plan.pools["big"].scheduler["resources"] == {"GPU": 1.0} and plan.pools["big"].job_lifetime == 3060.0
    assert plan.scheduler_job.submitted == 1700000000.5 and plan.scheduler_job.job.cores == 1
    assert (plan.resume, plan.successor_of, plan.owner_file, plan.journal) == (True, "4242", "/h/c-1a2b3c.owner", True)
    poll = PollSettings.from_plan(plan)
    assert (poll.steady, poll.fast, poll.calls_per_minute) == (30.0, 2.0, 60)


def test_the_keys_written_only_when_set_stay_out_of_a_fresh_plan():
    fresh = {k: v for k, v in BEFORE.items() if k not in ("resume", "owner_file", "scheduler_job", "successor_of")}
    fresh["scheduler"] = {k: v for k, v in BEFORE["scheduler"].items() if k not in ("prefer_port", "interface")}
    plan = Plan.from_json(fresh)
    written = plan.to_json()
    assert written == with_spec_defaults(fresh) and list(written) == list(fresh)
    assert (plan.resume, plan.scheduler_job, plan.scheduler.prefer_port) == (False, None, None)


def test_a_plan_from_before_pools_has_its_job_as_the_default_pool():
    old = {"name": "c", "batch": "slurm", "cluster_file": "/h/c.json", "job": job(), "n_jobs": 3,
           "job_lifetime": 600.0,
           "scheduler": {"host": "0.0.0.0", "allowed_failures": 3, "heartbeat_ttl": 60, "versions": "warn",
                         "max_message_bytes": 10**9, "max_frame_bytes": 10**8}}
    plan = Plan.from_json(old)
    assert list(plan.pools) == ["default"]
    default = plan.pools["default"]
    assert (default.job, default.n_jobs, default.job_lifetime, default.max_jobs) == (plan.job, 3, 600.0, None)
    # The daemon's defaults for what such a plan did not say.
    assert (plan.scheduler.port, plan.scheduler.walltime_margin, plan.startup_failures) == (0, 60.0, 3)
    assert PollSettings.from_plan(plan) == PollSettings()


def test_make_plan_turns_a_configuration_into_the_daemons_plan(tmp_path):
    cfg = resolve(batch="slurm", cores=2, memory="4GB", walltime="01:00:00", jobqueue=False, log_directory=None,
                  scheduler_options={"port": 8786, "dashboard_address": ":0"},
                  pools={"big": {"memory": "16GB", "max_jobs": 2}})
    plan = make_plan(cfg, "c", tmp_path / "c.json", n_jobs=2, pool_jobs={"big": 1})
    assert isinstance(plan.scheduler, SchedulerPlan) and plan.scheduler.port == 8786
    assert plan.scheduler.dashboard == ["127.0.0.1", 0]              # no host: loopback (issue 34)
    assert (plan.name, plan.batch, plan.cluster_file, plan.n_jobs) == ("c", "slurm", str(tmp_path / "c.json"), 2)
    assert {n: (p.n_jobs, p.max_jobs) for n, p in plan.pools.items()} == {"default": (2, None), "big": (1, 2)}
    assert all(isinstance(p, PoolPlan) and isinstance(p.job, JobSpec) for p in plan.pools.values())
    assert plan.pools["default"].job is plan.job and "--cluster-file" in plan.job.worker_command
    # Nothing launch() adds is set yet, and the JSON is exactly the plan again.
    assert (plan.daemon_log, plan.plan_file, plan.owner_pid, plan.resume) == (None, None, None, False)
    text = json.dumps(plan.to_json())
    assert Plan.from_json(json.loads(text)) == plan


def test_a_saved_plan_is_private_and_loads_as_it_was(tmp_path):
    plan = Plan.from_json(BEFORE)
    path = tmp_path / ".c.plan.json"
    plan.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Plan.load(path) == plan and json.loads(path.read_text()) == with_spec_defaults(BEFORE)
    copy = plan.copy()
    copy.pools["big"].n_jobs = 5
    assert plan.pools["big"].n_jobs == 0                  # a deep copy
