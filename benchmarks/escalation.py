"""Retry by cause into a bigger pool (issue 15): hpc-cluster next to dask-jobqueue, same SLURM.

Two scenarios, each run through three setups on the real one-host SLURM (tests/batch/slurm/cluster.sh):

  memory    200 tasks; 10 of them allocate 700 MB, the others a few MB.
              hpc-cluster    a 300 MB default pool (4 jobs) and a 1.5 GB pool "big" that starts
                             empty (max_jobs=2): the 10 die once, are charged for memory, and
                             finish on the big pool
              jq, small      dask-jobqueue with the same 300 MB jobs: KilledWorker for the 10
              jq, big        dask-jobqueue with 1.5 GB jobs for everything: all succeed
  walltime  60 tasks of 1 s and 3 tasks of 100 s.
              hpc-cluster    a 1-minute default pool (adapt 0..2) and a 5-minute pool "long"
                             that starts empty (max_jobs=2): the long ones are cut once and move
              jq, small      dask-jobqueue with 1-minute jobs (adapt 2..2, so dead jobs return)
              jq, big        dask-jobqueue with 5-minute jobs for everything

For each: results correct, tasks failed (by exception), innocent tasks charged (ours), jobs
of each size submitted, makespan, and the memory-hours reserved (sacct: requested memory x
elapsed, summed over the run's jobs).

    python benchmarks/escalation.py [--only memory|walltime] [--setup ours|jq-small|jq-big] [--json out.json]

Needs the SLURM test cluster up (root: tests/batch/slurm/cluster.sh up) and dask-jobqueue installed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CAP = 600                 # seconds a run may take before what is unfinished is counted so
BIG_EVERY = 20            # memory: every 20th task is a big one (10 of 200)
LONG_TASKS, SHORT_TASKS = 3, 60


def allocate(i, megabytes, seconds=0.5):
    import time
    import numpy as np
    block = np.ones(megabytes * 2**20 // 8)      # touched: resident, as a real array would be
    time.sleep(seconds)
    return i + int(block[0])


def sleepy(i, seconds):
    import time
    time.sleep(seconds)
    return i * i


def _memory_tasks():
    return [(allocate, i, 700 if i % BIG_EVERY == 7 else 4) for i in range(200)]


def _expected(kind, i):
    return i + 1 if kind == "memory" else i * i


def _submit(client, kind, pure_kw):
    if kind == "memory":
        return [client.submit(allocate, i, mb, **pure_kw) for _, i, mb in _memory_tasks()]
    longs = [client.submit(sleepy, i, 100, **pure_kw) for i in range(LONG_TASKS)]
    shorts = [client.submit(sleepy, i, 1, **pure_kw) for i in range(LONG_TASKS, LONG_TASKS + SHORT_TASKS)]
    return longs + shorts


def _collect(futures, kind):
    """Each future's outcome within one cap for all: correct, or failed (by exception), or
    unfinished when the cap ran out."""
    deadline = time.monotonic() + CAP
    correct, failures = 0, collections.Counter()
    for i, f in enumerate(futures):
        try:
            correct += f.result(timeout=max(0.1, deadline - time.monotonic())) == _expected(kind, i)
        except Exception as exc:
            timed_out = "imeout" in type(exc).__name__ or "imed out" in str(exc)
            kind_ = f"unfinished after {CAP} s" if timed_out else type(exc).__name__
            failures[kind_] += 1
            if failures[kind_] == 1:
                print(f"  first {kind_}: {str(exc)[:600]}", flush=True)
    return correct, failures


def _sacct(name: str, since: str) -> list[dict]:
    """The run's jobs: requested memory (MB), elapsed seconds, state."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "--name", name, "-S", since,
                          "-o", "JobID,ReqMem,ElapsedRaw,State"], capture_output=True, text=True, timeout=60).stdout
    jobs = []
    for line in out.splitlines():
        jid, req, elapsed, state = line.split("|")[:4]
        jobs.append({"job": jid, "mem_mb": _megabytes(req), "elapsed": int(elapsed or 0), "state": state})
    return jobs


def _megabytes(req: str) -> float:
    req = req.rstrip("nc")                       # old sacct: 300Mn (per node) / 300Mc (per cpu)
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    return float(req[:-1]) * scale[req[-1]] if req and req[-1] in scale else float(req or 0)


def _wait_sacct(name: str, since: str, timeout: float = 120) -> list[dict]:
    """sacct once every job of the run has ended (closing cancels them; accounting lags)."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = _sacct(name, since)
        if all(j["state"] not in ("PENDING", "RUNNING") for j in jobs) or time.monotonic() > deadline:
            return jobs
        time.sleep(1)


def _jobs_summary(jobs: list[dict]) -> dict:
    sizes = collections.Counter(f"{j['mem_mb']:.0f} MB" for j in jobs)
    gb_hours = sum(j["mem_mb"] / 1024 * j["elapsed"] / 3600 for j in jobs)
    return {"jobs": dict(sizes), "memory_gb_hours": round(gb_hours, 4)}


def ours(kind: str, logs: str) -> dict:
    from hpc_cluster import Client, SLURMCluster
    name = f"esc-ours-{kind}"
    if kind == "memory":
        base = dict(cores=1, memory="300MB", walltime="00:10:00")
        pools = {"big": {"memory": "1.5GB", "max_jobs": 2}}
        start = 4
    else:
        base = dict(cores=1, memory="1GB", walltime="00:01:00")
        pools = {"long": {"walltime": "00:05:00", "max_jobs": 2}}
        start = 2
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    t0 = time.monotonic()
    with SLURMCluster(**base, pools=pools, log_directory=logs, name=name, job_name=name) as cluster, \
            Client(cluster) as client:
        if kind == "memory":
            cluster.scale(start)
        else:
            # adapt: once the short tasks are done the default pool has no work (the long ones
            # moved), and its 1-minute jobs are not renewed for nothing while they run.
            cluster.adapt(minimum=0, maximum=start)
        futures = _submit(client, kind, {"pure": False})
        correct, failures = _collect(futures, kind)
        makespan = time.monotonic() - t0
        culprits = {f.key for i, f in enumerate(futures)
                    if (kind == "memory" and i % BIG_EVERY == 7) or (kind == "walltime" and i < LONG_TASKS)}
        deaths = client.deaths()
        innocent = {k for d in deaths if d.get("blame") for k in d.get("executing", []) if k not in culprits}
        moved = [d.get("escalation") for d in deaths if d.get("escalation")]
        on_pool = collections.Counter(row.get("pool") for row in cluster.status_table()["jobs"])
    return {"correct": correct, "failures": dict(failures), "innocent_charged": len(innocent),
            "deaths": collections.Counter(d["cause"] for d in deaths), "escalations": moved[:3],
            "escalations_total": len(moved), "jobs_by_pool": dict(on_pool), "makespan": round(makespan, 1),
            **_jobs_summary(_wait_sacct(name, since))}


def jobqueue(kind: str, logs: str, big: bool) -> dict:
    from dask_jobqueue import SLURMCluster as JQ
    from distributed import Client
    name = f"esc-jq-{'big' if big else 'small'}-{kind}"
    if kind == "memory":
        spec = dict(cores=1, memory="1.5GB" if big else "300MB", walltime="00:10:00")
        n = 4
    else:
        spec = dict(cores=1, memory="1GB", walltime="00:05:00" if big else "00:01:00")
        n = 2
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    t0 = time.monotonic()
    with JQ(**spec, processes=1, log_directory=logs, python=sys.executable, job_name=name) as cluster, \
            Client(cluster) as client:
        cluster.adapt(minimum=n, maximum=n)          # dead jobs are replaced (scale() alone does not)
        futures = _submit(client, kind, {"pure": False})
        correct, failures = _collect(futures, kind)
        makespan = time.monotonic() - t0
    return {"correct": correct, "failures": dict(failures), "makespan": round(makespan, 1),
            **_jobs_summary(_wait_sacct(name, since))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("memory", "walltime"))
    p.add_argument("--setup", choices=("ours", "jq-small", "jq-big"), action="append")
    p.add_argument("--json")
    a = p.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="esc-bench-"))
    os.environ.setdefault("XDG_CONFIG_HOME", str(home / "xdg"))
    os.environ.setdefault("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(home / "etc"))
    setups = {"ours": lambda k: ours(k, str(home / "logs")),
              "jq-small": lambda k: jobqueue(k, str(home / "logs"), False),
              "jq-big": lambda k: jobqueue(k, str(home / "logs"), True)}
    labels = {"ours": "hpc-cluster, two pools", "jq-small": "dask-jobqueue, small jobs",
              "jq-big": "dask-jobqueue, big jobs for all"}
    results: dict = {}
    for kind in ("memory", "walltime"):
        if a.only and kind != a.only:
            continue
        total = 200 if kind == "memory" else LONG_TASKS + SHORT_TASKS
        for setup in a.setup or list(setups):
            print(f"running {kind}: {labels[setup]} ...", flush=True)
            try:
                results[f"{kind}/{setup}"] = r = setups[setup](kind)
            except Exception as exc:
                results[f"{kind}/{setup}"] = r = {"crashed": f"{type(exc).__name__}: {exc}"[:500]}
            print("  " + json.dumps(r, default=str), flush=True)
        print(f"\n{kind}: {total} tasks")
        print(f"  {'':<34} {'correct':>8} {'makespan':>9} {'GB-hours':>9}  jobs (by size)       failures")
        for setup in a.setup or list(setups):
            r = results.get(f"{kind}/{setup}", {})
            if "crashed" in r:
                print(f"  {labels[setup]:<34} crashed: {r['crashed']}")
                continue
            print(f"  {labels[setup]:<34} {r['correct']:>8} {r['makespan']:>8.0f}s {r['memory_gb_hours']:>9.4f}  "
                  f"{str(r['jobs']):<20} {r['failures'] or '-'}")
        ours_r, big_r = results.get(f"{kind}/ours"), results.get(f"{kind}/jq-big")
        if ours_r and big_r and "crashed" not in ours_r and "crashed" not in big_r and big_r["memory_gb_hours"]:
            print(f"  hpc-cluster reserved {ours_r['memory_gb_hours'] / big_r['memory_gb_hours']:.2f}x the "
                  f"memory-hours of big jobs for all, makespan {ours_r['makespan'] / big_r['makespan']:.2f}x; "
                  f"innocent tasks charged: {ours_r['innocent_charged']}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
