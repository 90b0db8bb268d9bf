"""Walltime drain and renewal on the distributed engine, on the real SLURM (issue 32, point 5).

1. 100 tasks of 2 s on 2 workers whose jobs have a 1-minute walltime (jobs drain at ~48 s, so
   the work spans three generations of jobs): every result arrives, no KilledWorker, every death
   a planned retirement (`retired`, walltime drain, not charged), no job killed by its time limit,
   and each drained job's replacement started before it ended (sacct's times).
2. dask-jobqueue's --lifetime and --lifetime-stagger in worker_extra_args (10-minute jobs): the
   workers drain and retire at their lifetime, replacement jobs start ahead, every result arrives.
3. --lifetime with --lifetime-restart: the nanny starts a fresh worker in the same job when the
   lifetime ends (the distributed worker exits EXIT_LIFETIME when its retirement was for its
   lifetime: engines/dask_worker.py), so one job serves several workers in turn.
All three run at once (minutes of wall time, little CPU). The benchmark-sized run (240 tasks,
side by side with dask-jobqueue and our engine) is benchmarks/walltime_vs_jobqueue.py.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import uuid
from pathlib import Path

import pytest
from distributed import Client

from helpers.by_value import by_value
from helpers.funcs import slow_square
from helpers.slurm import squeue_ids
from helpers.wait import wait_until

from hpc_cluster import Client as OurClient
from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.deploy.cluster import SLURMCluster
from hpc_cluster.runners.local import LocalRunner

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


two_seconds = by_value(slow_square)      # distributed's scheduler cannot import helpers


def run_on_two_workers(tmp: Path, prefix: str, tasks: int, walltime: str, extra: list[str]) -> dict:
    """`tasks` x 2 s on 2 distributed workers; what the cluster recorded, and sacct's word on its jobs."""
    name = f"{prefix}-{uuid.uuid4().hex[:4]}"
    with SLURMCluster(cores=1, memory="1GB", walltime=walltime, engine="distributed", name=name, job_name=name,
                      log_directory=str(tmp / "logs"), worker_extra_args=extra) as cluster, Client(cluster) as c:
        cluster.scale(2)
        c.wait_for_workers(2, timeout=120)
        futures = c.map(two_seconds, range(tasks), pure=False)
        results = c.gather(futures)            # raises if any task failed (KilledWorker ...)
        with OurClient(cluster_file=str(cluster.cluster_file)) as ours:
            deaths = ours.deaths()
        table = cluster.status_table()
    ids = [j["job_id"] for j in table["jobs"]]
    wait_until(lambda: not set(ids) & squeue_ids(), 120, "the cluster's jobs to leave squeue")
    adapter = SLURMAdapter(LocalRunner())
    wait_until(lambda: all(r.end and r.end != "Unknown" for r in adapter.accounting(ids).values()), 60,
               "sacct to have every job's end")
    return {"results": results, "deaths": deaths, "jobs": table["jobs"], "renewals": table.get("renewals"),
            "accounting": adapter.accounting(ids)}


def _time(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


def successors(o: dict, intent: str) -> tuple[list[str], dict]:
    """The jobs whose worker retired with `intent`, and for each a distinct job that started after
    it and before it ended (sacct's Start and End, whole seconds): its replacement, submitted ahead."""
    acct = o["accounting"]
    retired = sorted({str(d["job_id"]) for d in o["deaths"] if d["text"] == f"asked to leave ({intent})"},
                     key=lambda j: _time(acct[j].end))
    taken, found = set(), {}
    for jid in retired:
        start, end = _time(acct[jid].start), _time(acct[jid].end)
        later = sorted((_time(r.start), k) for k, r in acct.items()
                       if k != jid and k not in taken and r.start and start < _time(r.start) < end)
        if later:
            taken.add(later[0][1])
            found[jid] = later[0][1]
    return retired, found


def assert_every_death_planned(o: dict, intent: str) -> None:
    unplanned = [(d["name"], d["cause"], d["blame"], d["text"]) for d in o["deaths"]
                 if d["cause"] != "retired" or d["blame"] or d["text"] not in (f"asked to leave ({intent})",
                                                                               "asked to leave (down)")]
    assert not unplanned, f"deaths other than a planned retirement: {unplanned}"


@pytest.fixture(scope="module")
def outcomes(slurm_cluster, tmp_path_factory):
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        scenarios = {"walltime": ("dwt", 100, "00:01:00", []),
                     "lifetime": ("dlife", 50, "00:10:00", ["--lifetime", "30s", "--lifetime-stagger", "4s"]),
                     "restart": ("drestart", 30, "00:10:00",
                                 ["--lifetime", "20s", "--lifetime-stagger", "4s", "--lifetime-restart"])}
        runs = {name: pool.submit(run_on_two_workers, tmp_path_factory.mktemp(args[0]), *args)
                for name, args in scenarios.items()}
        return {name: f.result() for name, f in runs.items()}


def renewed_ahead(o: dict, tasks: int, intent: str) -> list[str]:
    """Every result, every death a planned retirement, at least two jobs whose workers retired
    with `intent`, each replaced by a job that started before it ended; returns those jobs."""
    assert o["results"] == [i * i for i in range(tasks)]
    assert_every_death_planned(o, intent)
    retired, found = successors(o, intent)
    assert len(retired) >= 2, o["deaths"]
    assert found.keys() == set(retired), f"jobs whose replacement started only after they ended: " \
                                         f"{sorted(set(retired) - found.keys())}"
    return retired


def test_distributed_workers_drain_before_the_walltime_and_jobs_renew_ahead(outcomes):
    o = outcomes["walltime"]
    # 100 s of work on 2 workers in jobs that drain at ~48 s: at least two generations renewed.
    retired = renewed_ahead(o, 100, "walltime drain")
    # Each drained job ended on its own, before its time limit: none was killed by it.
    states = {j: r.raw_state for j, r in o["accounting"].items()}
    assert not [j for j, s in states.items() if s == "TIMEOUT"], states
    assert o["renewals"] >= len(retired)
    print(f"\n100 x 2 s on 2 distributed workers, 1-min jobs: {len(o['jobs'])} jobs, {o['renewals']} renewals")


def test_lifetime_flags_drain_the_distributed_workers_and_renew_their_jobs(outcomes):
    o = outcomes["lifetime"]
    retired = renewed_ahead(o, 50, "lifetime")
    # The jobs ended with their workers' lifetime, long before their 10-minute walltime.
    acct = o["accounting"]
    assert all(_time(acct[j].end) - _time(acct[j].start) < 60 for j in retired), \
        {j: (acct[j].start, acct[j].end) for j in retired}


def test_lifetime_restart_starts_a_fresh_distributed_worker_in_the_same_job(outcomes):
    o = outcomes["restart"]
    assert o["results"] == [i * i for i in range(30)]
    assert_every_death_planned(o, "lifetime")
    lifetimes = [d for d in o["deaths"] if d["text"] == "asked to leave (lifetime)"]
    by_job: dict = {}
    for d in lifetimes:
        by_job.setdefault(str(d["job_id"]), []).append(d)
    # 30 s of work on 2 workers with 16-24 s lifetimes: each job's worker was retired at least
    # once and its nanny started the next one in the same job; no job was submitted to replace them.
    assert len(by_job) == 2 and all(by_job.values()), lifetimes
    assert len(o["jobs"]) == 2, o["jobs"]
