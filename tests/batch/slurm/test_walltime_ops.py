"""Walltime-aware operation on the real SLURM cluster (issue 7's proof).

1. 240 tasks of 2 s on 2 workers whose jobs have a 1-minute walltime: every result right,
   no KilledWorker, no task run twice, makespan within 1.5 x (ideal + one job start).
2. 50-second tasks are never started on a worker with less than 50 s left.
3. dask-jobqueue's walltime recipe, --lifetime in worker_extra_args: the worker drains and
   retires at its lifetime, a replacement job is submitted, every task runs once.
All run at once (they take minutes of wall time, little CPU).
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from hpc_cluster import Client
from hpc_cluster.deploy.cluster import SLURMCluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def two_seconds(i, marks):
    import os
    import time
    import uuid
    open(os.path.join(marks, f"{i}-{uuid.uuid4().hex}"), "w").close()   # one file per execution
    time.sleep(2)
    return i * i


def fifty_seconds(i):
    import os
    import time
    start = time.time()
    deadline = float(os.environ["HPC_CLUSTER_JOB_START"]) + float(os.environ["HPC_CLUSTER_JOB_WALLTIME"])
    time.sleep(50)
    return {"i": i, "left_at_start": deadline - start, "job": os.environ.get("HPC_CLUSTER_JOB_ID")}


def _queue_ids(name_prefix: str) -> list[str]:
    """Our jobs still in the queue: the clusters below give their jobs their own job_name."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()[1:] and
            line.split()[1].startswith(name_prefix)]


def run_240(tmp: Path) -> dict:
    marks = tmp / "marks"
    marks.mkdir()
    name = f"wt240-{uuid.uuid4().hex[:4]}"
    with SLURMCluster(cores=1, memory="1GB", walltime="00:01:00", log_directory=str(tmp / "logs"),
                      name=name, job_name=name) as cluster, Client(cluster) as c:
        t0 = time.time()
        cluster.scale(2)
        c.wait_for_workers(2, timeout=120)
        first_worker = time.time() - t0
        futures = c.map(two_seconds, range(240), [str(marks)] * 240)
        results = c.gather(futures)            # raises if any task failed (KilledWorker ...)
        makespan = time.time() - t0
        deaths = c.deaths()
        table = cluster.status_table()
    return {"results": results, "makespan": makespan, "first_worker": first_worker,
            "executions": sorted(p.name.split("-")[0] for p in marks.iterdir()), "deaths": deaths,
            "jobs": table["jobs"], "renewals": table.get("renewals"), "leftover": _queue_ids(name)}


def run_long(tmp: Path) -> dict:
    name = f"wtlong-{uuid.uuid4().hex[:4]}"
    with SLURMCluster(cores=1, memory="1GB", walltime="00:01:00", log_directory=str(tmp / "logs"),
                      name=name, job_name=name) as cluster, Client(cluster) as c:
        cluster.scale(1)
        c.wait_for_workers(1, timeout=120)
        w = next(iter(c.scheduler_info()["workers"].values()))
        deadline = w["job_start"] + w["job_walltime"]
        while deadline - time.time() > 20:       # wait until the worker has 20 s or less
            time.sleep(0.5)
        left_when_submitted = deadline - time.time()
        futures = c.map(fifty_seconds, range(2), duration="50s")
        results = c.gather(futures)
    return {"results": results, "left_when_submitted": left_when_submitted, "leftover": _queue_ids(name)}


def run_lifetime(tmp: Path) -> dict:
    marks = tmp / "marks"
    marks.mkdir()
    name = f"wtlife-{uuid.uuid4().hex[:4]}"
    with SLURMCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp / "logs"),
                      name=name, job_name=name, worker_extra_args=["--lifetime", "40s"]) as cluster, \
            Client(cluster) as c:
        cluster.scale(1)
        c.wait_for_workers(1, timeout=120)
        results = c.gather(c.map(two_seconds, range(45), [str(marks)] * 45))     # 90 s on one worker
        deaths = c.deaths()
        table = cluster.status_table()
    return {"results": results, "deaths": deaths, "jobs": table["jobs"],
            "executions": sorted(p.name.split("-")[0] for p in marks.iterdir()), "leftover": _queue_ids(name)}


@pytest.fixture(scope="module")
def outcomes(slurm_cluster, tmp_path_factory):
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        a = pool.submit(run_240, tmp_path_factory.mktemp("wt240"))
        b = pool.submit(run_long, tmp_path_factory.mktemp("wtlong"))
        c = pool.submit(run_lifetime, tmp_path_factory.mktemp("wtlife"))
        return {"240": a.result(), "long": b.result(), "lifetime": c.result()}


def test_a_worker_lifetime_ends_in_a_drain_and_a_renewed_job(outcomes):
    o = outcomes["lifetime"]
    assert o["results"] == [i * i for i in range(45)]
    assert o["executions"] == sorted(str(i) for i in range(45))      # none ran twice
    assert [d["cause"] for d in o["deaths"]] and all(d["cause"] == "retired" and not d["blame"]
                                                     for d in o["deaths"]), o["deaths"]
    assert any(d["text"] == "asked to leave (lifetime)" for d in o["deaths"]), o["deaths"]
    # The job ended with its worker, well before its 10-minute walltime; a replacement ran on.
    assert len(o["jobs"]) >= 2 and not any(j["state"] == "timeout" for j in o["jobs"]), o["jobs"]
    assert o["leftover"] == []


def test_240_tasks_across_walltime_boundaries(outcomes):
    o = outcomes["240"]
    assert o["results"] == [i * i for i in range(240)]
    unplanned = [(d["name"], d["cause"], d["text"]) for d in o["deaths"] if d["cause"] != "retired"]
    assert not unplanned, f"deaths other than a planned retirement: {unplanned}"
    twice = sorted({e for e in o["executions"] if o["executions"].count(e) > 1}, key=int)
    assert o["executions"] == sorted(str(i) for i in range(240)), f"tasks ran twice: {twice}"
    assert any(d["text"] == "asked to leave (walltime drain)" for d in o["deaths"]), "no worker drained"
    ideal = 240 * 2 / 2
    limit = 1.5 * (ideal + o["first_worker"])
    print(f"\n240 x 2 s on 2 workers, 1-min walltime: makespan {o['makespan']:.0f} s "
          f"(limit {limit:.0f} s), {len(o['jobs'])} jobs, {o['renewals']} renewals")
    assert o["makespan"] <= limit
    assert o["leftover"] == []


def test_long_tasks_never_start_on_a_worker_with_too_little_time(outcomes):
    o = outcomes["long"]
    assert o["left_when_submitted"] <= 20
    assert [r["i"] for r in o["results"]] == [0, 1]
    for r in o["results"]:
        assert r["left_at_start"] >= 50, f"a 50 s task started with only {r['left_at_start']:.0f} s left"
    assert o["leftover"] == []
