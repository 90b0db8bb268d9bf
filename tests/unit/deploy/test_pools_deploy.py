"""Worker pools, deploy half (issue 15): the `pools` and `escalate` settings (keywords and
site YAML), each pool's job script, the job manager's pools (scale, max_jobs, demand-driven
submission and idle retirement), the daemon's view of them and the CLI. No batch system:
a fake adapter numbers submissions; tests/batch/slurm/test_pools.py runs the real SLURM.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import types
from pathlib import Path

import pytest

from hpc_cluster.cli.views import pools_tables, print_deaths
from hpc_cluster.config import ConfigError, parse_config_text, resolve
from hpc_cluster.config.pools import ESCALATE_DEFAULTS
from hpc_cluster.deploy.cluster import PBSCluster, SLURMCluster
from hpc_cluster.deploy.plan import PoolPlan, make_plan, pool_table
from hpc_cluster.deploy.daemon.pools import PoolManager, announce
from hpc_cluster.scheduler.state import SchedulerState
from hpc_cluster.worker.__main__ import build_parser, registration_info
from helpers.cli import run_cli
from helpers.fakes import FakeAdapter

POOLS = {"bigmem": {"memory": "64GB", "queue": "bigmem", "max_jobs": 2}, "long": {"walltime": "24:00:00"}}


@pytest.fixture(autouse=True)
def home(isolated_home):
    return isolated_home


def slurm(**kw):
    return SLURMCluster(cores=1, memory="4GB", walltime="01:00:00", asynchronous=True, **kw)


def directive(script: str, prefix: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith(prefix)]


# -- settings ----------------------------------------------------------------------------------

def test_each_pools_job_script_inherits_the_cluster_and_overrides_what_it_names():
    c = slurm(pools=POOLS)
    default, big, long = (c.job_script(pool=p) for p in (None, "bigmem", "long"))
    assert directive(default, "#SBATCH --mem") == ["#SBATCH --mem=4G"] and "--pool" not in default
    assert directive(default, "#SBATCH -t") == ["#SBATCH -t 01:00:00"] and "#SBATCH -p" not in default
    assert directive(big, "#SBATCH --mem") == ["#SBATCH --mem=60G"]            # 64 GB, in sbatch's GiB
    assert directive(big, "#SBATCH -p") == ["#SBATCH -p bigmem"] and directive(big, "#SBATCH -t") == ["#SBATCH -t 01:00:00"]
    assert "--pool bigmem" in big and "--memory-limit 59.60GiB" in big
    assert directive(long, "#SBATCH -t") == ["#SBATCH -t 24:00:00"] and directive(long, "#SBATCH --mem") == ["#SBATCH --mem=4G"]
    assert "--pool long" in long
    assert list(c.pools) == ["default", "bigmem", "long"] and c.pools["bigmem"].max_jobs == 2
    with pytest.raises(ValueError, match="no pool named 'huge'; this cluster's pools: default, bigmem, long"):
        c.job_script(pool="huge")


def test_pbs_pools_change_the_select_request():
    c = PBSCluster(cores=2, memory="2GB", walltime="00:10:00", asynchronous=True,
                   pools={"big": {"memory": "8GB", "cores": 4, "queue": "large"}})
    big = c.job_script(pool="big")
    assert "#PBS -l select=1:ncpus=4:mem=7630MB" in big and "#PBS -q large" in big and "--pool big" in big
    assert "#PBS -l select=1:ncpus=2:mem=1908MB" in c.job_script()
    # cores 4 with the split worked out (not given): 4 processes of 1 thread, as dask-jobqueue splits
    assert c.pools["big"].values["processes"] == 4 and "--nworkers 4" in big


def test_pools_and_escalate_from_a_site_file():
    text = """\
default: lab
sites:
  lab:
    batch: slurm
    cores: 1
    memory: 300MB
    pools:
      big:
        memory: 1.5GB
        max_jobs: 2
        escalation_only: true
        resources: {GPU: 1}
    escalate: {margin: 2}
"""
    f = parse_config_text(text, "/x/site.yaml")
    assert f.sites["lab"]["pools"].value == {"big": {"memory": 1_500_000_000, "max_jobs": 2,
                                                      "escalation_only": True, "resources": {"GPU": 1.0}}}
    assert f.sites["lab"]["escalate"].value == {**ESCALATE_DEFAULTS, "margin": 2.0}
    bad = text.replace("max_jobs: 2", "max_jobs: -1")
    with pytest.raises(ConfigError) as e:
        parse_config_text(bad, "/x/site.yaml")
    assert "line 10" in str(e.value) and "pools.big.max_jobs=-1" in str(e.value) and "null for no limit" in str(e.value)


@pytest.mark.parametrize("pools,says", [
    ({"bigmem": {"memroy": "64GB"}}, "unknown key 'memroy' in pool 'bigmem'; did you mean 'memory'?"),
    ({"bigmem": {"memory": "64XB"}}, "pool 'bigmem': pools.bigmem.memory='64XB' is not a size"),
    ({"bigmem": {"max_jobs": -1}}, "pools.bigmem.max_jobs=-1 must be a whole number >= 0"),
    ({"default": {"memory": "8GB"}}, "the pool 'default' is the cluster's own job spec; set memory= on the cluster"),
    ({"big mem": {}}, "pool name 'big mem' must be letters"),
    ({"b": {"n_workers": 1, "jobs": 1}}, "give n_workers or jobs"),
    ({"b": {"walltime": "forever"}}, "pools.b.walltime"),
    ({"b": {"cores": 2, "processes": 4}}, "pool 'b': processes=4 with cores=2"),
    ({"b": {"jobs": 3, "max_jobs": 1}}, "starts with 3 job(s) but max_jobs=1"),
    ({"b": {"resources": "GPU"}}, "'GPU' is not NAME=NUMBER"),
    ("bigmem", "must be a map of pool names"),
])
def test_bad_pools_are_refused_naming_the_pool_and_key(pools, says):
    with pytest.raises((ConfigError, ValueError)) as e:
        slurm(pools=pools)
    assert says in str(e.value)


def test_escalate_keyword_defaults_partial_and_errors():
    assert slurm().config.values["escalate"] == {"memory": True, "walltime": True, "margin": 1.5}
    assert slurm(escalate={"walltime": False}).config.values["escalate"] == {"memory": True, "walltime": False,
                                                                             "margin": 1.5}
    assert slurm(escalate=False).config.values["escalate"]["memory"] is False
    with pytest.raises(ConfigError, match="unknown key 'marign' in escalate; did you mean 'margin'"):
        slurm(escalate={"marign": 2})
    with pytest.raises(ConfigError, match="margin=0.5 must be a number >= 1"):
        slurm(escalate={"margin": 0.5})


def test_the_scheduler_is_told_each_pools_size_and_policy(tmp_path):
    cfg = resolve(batch="slurm", cores=2, processes=2, memory="4GB", walltime="01:00:00", jobqueue=False,
                  pools={"big": {"memory": "16GB", "walltime": "02:00:00", "max_jobs": 2, "resources": "GPU=1",
                                 "escalation_only": True, "n_workers": 3}})
    table = pool_table(cfg)
    assert table == {
        # memory: what the workers register with, their --memory-limit as written (1.86GiB, 7.45GiB)
        "default": {"memory": 1_997_159_792, "walltime": 3600.0, "nthreads": 1, "processes": 2, "resources": {},
                    "max_jobs": None, "escalation_only": False},
        "big": {"memory": 7_999_376_588, "walltime": 7200.0, "nthreads": 1, "processes": 2,
                "resources": {"GPU": 1.0}, "max_jobs": 2, "escalation_only": True}}
    plan = make_plan(cfg, "t", tmp_path / "t.json", n_jobs=1, pool_jobs=None)
    assert {n: p.n_jobs for n, p in plan.pools.items()} == {"default": 1, "big": 2}   # 3 workers: 2 jobs
    assert plan.pools["big"].job.memory == 16_000_000_000 and plan.escalate["margin"] == 1.5
    assert "--pool big --resources GPU=1" in plan.pools["big"].job.worker_command
    told = []
    state = types.SimpleNamespace(set_pools=lambda pools, escalate: told.append((pools, escalate)))
    assert announce(state, plan.pools, plan.escalate) and told == [(table, ESCALATE_DEFAULTS)]
    assert announce(types.SimpleNamespace(), plan.pools, None) is False     # a scheduler without pools
    with pytest.raises(ConfigError, match="no pool named 'huge'"):
        make_plan(cfg, "t", tmp_path / "t.json", n_jobs=0, pool_jobs={"huge": 1})


def test_the_worker_registers_with_its_pool():
    args = build_parser().parse_args(["--scheduler", "tcp://127.0.0.1:1", "--pool", "bigmem"])
    info = registration_info(args, {"HPC_CLUSTER_JOB_ID": "42"})
    assert info["pool"] == "bigmem" and info["job_id"] == "42"
    assert registration_info(build_parser().parse_args(["--scheduler", "tcp://x:1"]), {})["pool"] == "default"


# -- the job manager's pools -------------------------------------------------------------------

def manager(max_jobs_in_queue=None, big_max=2):
    state = SchedulerState()
    sched = types.SimpleNamespace(state=state, walltime_margin=60, retire_workers=lambda *a: None,
                                  drained=[], halts=[], fail_if_stranded=lambda: None)
    sched.drain = lambda addrs, why: sched.drained.append((tuple(addrs), why))
    sched.halt = sched.halts.append
    job = {"worker_command": "w", "cores": 1, "memory": 300_000_000, "walltime": 600}
    pools = {"default": {"job": job},
             "big": {"job": {**job, "worker_command": "w --pool big", "memory": 1_500_000_000, "cores": 2},
                     "max_jobs": big_max, "escalation_only": True}}
    adapter = FakeAdapter()
    pm = PoolManager(sched, adapter, {name: PoolPlan.from_json(p) for name, p in pools.items()},
                     max_jobs_in_queue=max_jobs_in_queue)
    return pm, adapter, state, sched


def test_scale_per_pool_keeps_indices_unique_and_rows_name_their_pool():
    pm, adapter, _, _ = manager()

    async def run():
        await pm.scale(2)
        table = await pm.scale(1, "big")
        assert adapter.scripts == ["w #0 mem=300000000", "w #1 mem=300000000", "w --pool big #2 mem=1500000000"]
        assert [(r["job_id"], r["pool"], r["index"], r["memory"]) for r in table["jobs"]] == [
            ("1", "default", 0, 300_000_000), ("2", "default", 1, 300_000_000), ("3", "big", 2, 1_500_000_000)]
        assert table["target"] == 3 and table["pools"]["big"]["jobs"] == ["3"]
        assert table["pools"]["big"]["max_jobs"] == 2 and table["pools"]["big"]["escalation_only"] is True
        with pytest.raises(ValueError, match="pool 'big' to 3 jobs: its max_jobs is 2"):
            await pm.scale(3, "big")
        with pytest.raises(ValueError, match="no pool named 'huge'; this cluster's pools: default, big"):
            await pm.scale(1, "huge")
        await pm.poll_once()
        assert len(adapter.status_calls) == 1            # one squeue for every pool's jobs
        await pm.scale(0, "big")
        assert adapter.cancelled == ["3"] and len(pm.managers["default"].active()) == 2

    asyncio.run(run())


def test_demand_submits_jobs_within_max_jobs_and_the_idle_ones_go_after_the_cooldown():
    pm, adapter, state, _ = manager()
    demand = {"big": 7}                                   # threads; 2 per job of pool big
    state.pool_demand = lambda: dict(demand)
    big = pm.managers["big"]

    async def run():
        await pm.reconcile()
        assert len(adapter.scripts) == 2 and all("--pool big" in s for s in adapter.scripts)   # 4 wanted, max 2
        assert len(pm.managers["default"].jobs) == 0     # only the pool with the demand grew
        assert pm.table()["pools"]["big"]["demand_jobs"] == 4
        # One job's worker runs a task; the demand is gone.
        state.add_worker("tcp://a:1", nthreads=2, now=0, info={"job_id": "1", "pool": "big"})
        state.workers["tcp://a:1"].processing.add("x")
        demand["big"] = 0
        for _ in range(2):
            await pm.reconcile()
        assert adapter.cancelled == []                   # not before wait_count rounds agree
        await pm.reconcile()
        assert adapter.cancelled == ["2"]                # the idle (pending) job goes; the busy one stays
        assert [j.job_id for j in big.active()] == ["1"]
        state.workers["tcp://a:1"].processing.clear()    # its task finished: idle now
        for _ in range(3):
            await pm.reconcile()
        assert [j.job_id for j in big.active()] == [] and big.target == 0

    asyncio.run(run())


def test_no_pool_demand_call_means_no_demand_and_the_queue_cap_counts_every_pool():
    pm, adapter, _, _ = manager(max_jobs_in_queue=3)

    async def run():
        await pm.reconcile()                             # no tasks: no demand, whatever the scheduler has
        assert adapter.scripts == []
        await pm.scale(2)
        await pm.scale(2, "big")
        assert len(adapter.scripts) == 3                 # 2 default + 1 big: the cap of 3 across pools
        assert [j.job_id for j in pm.managers["big"].active()] == ["3"]

    asyncio.run(run())


def test_a_halted_pool_is_named_to_the_scheduler_and_evidence_routes_by_job():
    pm, adapter, _, sched = manager()

    async def run():
        await pm.scale(1)
        await pm.scale(1, "big")
        pm.managers["big"]._halt("3 jobs in a row ended before their worker started")
        assert sched.halts[-1] == "pool big: 3 jobs in a row ended before their worker started"
        assert pm.table()["halted"] == "pool big: 3 jobs in a row ended before their worker started"
        pm.managers["big"]._halt(None)
        assert sched.halts[-1] is None
        asked = []

        async def tail(job_id, lines=40, pool=None):
            asked.append((pool, job_id))
            return [f"{pool}"]
        for name, m in pm.managers.items():
            m.log_tail = lambda job_id, lines=40, name=name: tail(job_id, lines, name)
        assert await pm.log_tail("2") == ["big"] and await pm.log_tail("1") == ["default"]

    asyncio.run(run())


# -- CLI ---------------------------------------------------------------------------------------

SITE = """\
default: lab
sites:
  lab:
    batch: slurm
    cores: 1
    memory: 1GB
    walltime: "00:10:00"
    pools:
      bigmem: {memory: 4GB, queue: bigmem, max_jobs: 2}
"""


def test_cli_job_script_of_a_pool_and_up_refuses_an_unknown_pool(capsys, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    code, out, _ = run_cli(capsys, "job-script", "--config", str(site), "--pool", "bigmem")
    assert code == 0 and "#SBATCH --mem=4G" in out and "#SBATCH -p bigmem" in out and "--pool bigmem" in out
    code, _, err = run_cli(capsys, "job-script", "--config", str(site), "--pool", "huge")
    assert code == 2 and "no such pool; the site's pools: default, bigmem" in err
    code, _, err = run_cli(capsys, "up", "--config", str(site), "-n", "1", "--pool", "huge=1")
    assert code == 2 and "no pool named 'huge'; the site's pools: bigmem" in err
    code, _, err = run_cli(capsys, "up", "--config", str(site), "--pool", "bigmem=3")
    assert code == 2 and "pool 'bigmem' has max_jobs 2" in err
    code, _, err = run_cli(capsys, "up", "--config", str(site), "--pool", "bigmem")
    assert code == 2 and "write NAME=JOBS" in err


def test_status_groups_jobs_by_pool_and_why_prints_escalations():
    rows = [{"job_id": "11", "state": "running", "pool": "default", "workers": ["tcp://a:1"], "worker_names": ["c-0"],
             "node": "n1", "memory": 300_000_000},
            {"job_id": "12", "state": "pending", "pool": "big", "reason": "Priority", "workers": [],
             "memory": 1_500_000_000}]
    table = {"jobs": rows, "pools": {
        "default": {"target": 1, "cores": 1, "memory": 300_000_000, "processes": 1, "walltime": 600, "max_jobs": None},
        "big": {"target": 1, "cores": 1, "memory": 1_500_000_000, "processes": 1, "walltime": 300, "max_jobs": 2,
                "escalation_only": True, "demand_jobs": 1}}}
    text = pools_tables(table)
    default, big = text.split("\n\n")
    assert default.startswith("pool default: 1 core(s), 300MB, walltime 10m00s; target 1, 1 in the queue, 1 worker(s)")
    assert "11" in default and "12" not in default
    assert big.startswith("pool big: 1 core(s), 1.5GB, walltime 5m00s, max 2 job(s), escalation only; target 1, "
                          "1 in the queue, 0 worker(s), work waiting for 1 job(s)")
    assert "pending (Priority)" in big and "11" not in big.splitlines()[2]
    out = io.StringIO()
    death = {"name": "c-0", "cause": "memory-batch", "blame": True, "pool": "default", "text": "over 300MB",
             "escalation": "attempt 2 on big (1.5 GB) after memory-batch at 0.29 of 0.3 GB"}
    print_deaths([death], out, detail=True)
    assert "    escalation: attempt 2 on big (1.5 GB) after memory-batch at 0.29 of 0.3 GB" in out.getvalue()
    out = io.StringIO()
    print_deaths([{**death, "pool": "big"}], out, detail=False)
    assert "(pool big)" in out.getvalue() and "-> attempt 2 on big" in out.getvalue()


def test_status_json_carries_the_pools(capsys, monkeypatch, tmp_path):
    from hpc_cluster.cli import cluster as cli_cluster
    table = {"jobs": [{"job_id": "1", "state": "running", "pool": "big"}], "target": 1, "pools": {"big": {"jobs": ["1"]}}}
    monkeypatch.setattr(cli_cluster, "find_cluster", lambda name: ("c", tmp_path / "c.json", {"address": "tcp://x:1"}))
    monkeypatch.setattr(cli_cluster, "_jobs", lambda *a, **k: table)

    class FakeClient:
        def __init__(self, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            pass

        def deaths(self):
            return []
    monkeypatch.setattr("hpc_cluster.client.client.Client", FakeClient)
    code, out, _ = run_cli(capsys, "status", "--json")
    data = json.loads(out)
    assert code == 0 and data["pools"] == {"big": {"jobs": ["1"]}} and data["jobs"][0]["pool"] == "big"


def test_the_default_pool_is_sized_by_scale_and_adapt_not_by_demand():
    pm, adapter, state, _ = manager()
    state.pool_demand = lambda: {"default": 50, "big": 2}

    async def run():
        await pm.reconcile()
        assert [s for s in adapter.scripts if "--pool big" not in s] == []     # no default job for demand
        assert len(adapter.scripts) == 1                                      # 2 threads: one job of 2 cores

    asyncio.run(run())


def test_adapt_per_pool_sizes_a_pool_to_its_own_work(monkeypatch):
    from hpc_cluster.deploy.daemon import jobs
    asked = []

    def workload(state, pool=None):
        asked.append(pool)
        return {"big": 120.0, "default": 0.0}[pool]
    monkeypatch.setattr(jobs, "workload", workload)
    monkeypatch.setattr(jobs, "_WORKLOAD_BY_POOL", True)
    pm, _, _, _ = manager(big_max=5)
    policy = dict(interval=1.0, wait_count=3, target_duration=20.0)
    pm.managers["big"].adaptive = jobs.AdaptPolicy(0, 4, **policy)     # as pm.adapt(0, 4, pool="big") sets it
    pm.managers["default"].adaptive = jobs.AdaptPolicy(0, 4, **policy)
    assert pm.managers["big"].update_target() == 3                     # 120 s / (20 s x 2 cores)
    assert pm.managers["default"].update_target() == 0
    assert asked == ["big", "default"]
    with pytest.raises(ValueError, match="no pool named 'huge'"):
        pm.adapt(0, 1, pool="huge")


def test_escalate_may_go_in_settings_for_every_site():
    text = "default: a\nsites:\n  a: {batch: slurm, cores: 1, memory: 1GB}\nsettings:\n  escalate: {walltime: false}\n"
    assert parse_config_text(text).settings["escalate"].value == {"memory": True, "walltime": False, "margin": 1.5}
    with pytest.raises(ConfigError, match="'pools' cannot go in settings"):
        parse_config_text(text + "  pools: {big: {memory: 4GB}}\n")


def test_cli_scale_of_a_pool_is_checked_against_the_clusters_plan(capsys):
    import os
    from hpc_cluster.cli.lookup import plan_file
    from hpc_cluster.protocol.clusterfile import cluster_file_for, new_secret, write_cluster_file
    write_cluster_file(cluster_file_for("c"), "tcp://127.0.0.1:1", new_secret(), name="c", pid=os.getpid(),
                       batch="slurm", site="lab", log_directory=None, daemon_log=None)
    job = {"worker_command": "w", "processes": 1}
    plan_file("c").write_text(json.dumps({
        "name": "c", "batch": "slurm", "cluster_file": str(cluster_file_for("c")), "job": job,
        "scheduler": {"host": "0.0.0.0", "allowed_failures": 3, "heartbeat_ttl": 60, "versions": "warn",
                      "max_message_bytes": 10**9, "max_frame_bytes": 10**8},
        "pools": {"default": {"job": job}, "big": {"job": {**job, "processes": 2}, "max_jobs": 2}}}))
    code, _, err = run_cli(capsys, "scale", "1", "c", "--pool", "huge")
    assert code == 2 and "--pool huge: cluster 'c' has no such pool; its pools: default, big" in err
    code, _, err = run_cli(capsys, "scale", "6", "c", "--pool", "big")              # 6 workers: 3 jobs of 2
    assert code == 2 and "3 job(s) of pool 'big' is more than its max_jobs 2" in err
