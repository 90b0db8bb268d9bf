"""240 tasks of 2 s on 2 workers whose jobs have a 1-minute walltime: hpc-cluster (both engines)
vs dask-jobqueue.

    python benchmarks/walltime_vs_jobqueue.py [--tasks 240] [--cap 600] [--only ours|distributed|plain|lifetime]

Needs the SLURM test cluster (tests/batch/slurm/cluster.sh up) and dask-jobqueue. Four runs on
the same SLURM, one after the other:
  hpc-cluster             SLURMCluster(walltime="00:01:00").scale(2): deadlines, drain, renewal
  hpc-cluster, distributed the same with engine="distributed" (dask.distributed's scheduler and
                          workers; our drain becomes distributed's retire_workers), distributed's Client
  dask-jobqueue, plain    the same keywords, scale(2): what a user writes first
  dask-jobqueue, lifetime the documented workaround: --lifetime 50s --lifetime-stagger 4s
                          and adapt(minimum_jobs=2, maximum_jobs=2)
Each prints: results received (correct), tasks failed and how many of them with KilledWorker,
tasks executed more than once, wall time (makespan), and the jobs used. A run is capped at
--cap seconds.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time


def two_seconds(i, marks):
    import os
    import time
    import uuid
    open(os.path.join(marks, f"{i}-{uuid.uuid4().hex}"), "w").close()
    time.sleep(2)
    return i * i


def _collect(futures, wait, cap):
    """Wait up to `cap` seconds; then results where available, failures counted by kind."""
    try:
        wait(futures, timeout=cap)
    except Exception:          # the cap passed: count what did not finish
        pass
    results, failures, killed = {}, collections.Counter(), 0
    for i, f in enumerate(futures):
        if f.status == "finished":
            results[i] = f.result()
        elif f.status == "error":
            exc = f.exception()
            failures[type(exc).__name__] += 1
            # Ours, distributed's, and the distributed engine's (both at once: engines/errors.py).
            killed += any(c.__name__ == "KilledWorker" for c in type(exc).__mro__)
        else:
            failures["not finished by the cap"] += 1
    return results, failures, killed


def _marks_summary(marks):
    counts = collections.Counter(name.split("-")[0] for name in os.listdir(marks))
    return sum(1 for c in counts.values() if c > 1)


def hpc_cluster_run(n, cap, logs, engine):
    """hpc-cluster's deployment: our engine and our Client, or (engine="distributed")
    dask.distributed's scheduler and workers and distributed's Client."""
    if engine == "distributed":
        from distributed import Client, wait
    else:
        from hpc_cluster import Client, wait
    from hpc_cluster import Client as OurClient
    from hpc_cluster import SLURMCluster
    marks = tempfile.mkdtemp(prefix="marks-")
    t0 = time.time()
    with SLURMCluster(cores=1, memory="1GB", walltime="00:01:00", log_directory=logs, engine=engine,
                      name="bench-dist" if engine == "distributed" else "bench-ours") as cl, Client(cl) as c:
        cl.scale(2)
        futures = c.map(two_seconds, range(n), [marks] * n, pure=False)
        results, failures, killed = _collect(futures, wait, cap)
        makespan = time.time() - t0
        jobs = len(cl.status_table()["jobs"])
        with OurClient(cluster_file=str(cl.cluster_file)) as ours:      # our scheduler's records, either engine
            deaths = collections.Counter(f"{d['cause']}, {'charged' if d['blame'] else 'not charged'}: {d['text']}"
                                         for d in ours.deaths())
    return dict(results=results, failures=failures, killed=killed, twice=_marks_summary(marks), makespan=makespan,
                jobs=jobs, deaths=deaths)


def jobqueue(n, cap, logs, lifetime):
    from dask_jobqueue import SLURMCluster as JQ
    from distributed import Client, wait
    marks = tempfile.mkdtemp(prefix="marks-")
    extra = ["--lifetime", "50s", "--lifetime-stagger", "4s"] if lifetime else []
    t0 = time.time()
    with JQ(cores=1, processes=1, memory="1GB", walltime="00:01:00", log_directory=logs,
            python=sys.executable, job_name="bench-jq", worker_extra_args=extra) as cl, Client(cl) as c:
        if lifetime:
            cl.adapt(minimum_jobs=2, maximum_jobs=2)
        else:
            cl.scale(2)
        futures = c.map(two_seconds, range(n), [marks] * n, pure=False)
        results, failures, killed = _collect(futures, wait, cap)
        makespan = time.time() - t0
    return dict(results=results, failures=failures, killed=killed, twice=_marks_summary(marks), makespan=makespan,
                jobs=None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=240)
    p.add_argument("--cap", type=float, default=600, help="seconds before a run is stopped")
    p.add_argument("--only", choices=["ours", "distributed", "plain", "lifetime"], action="append")
    args = p.parse_args(argv)
    logs = tempfile.mkdtemp(prefix="bench-walltime-logs-")
    runs = {"ours": lambda: hpc_cluster_run(args.tasks, args.cap, logs, "hpc-cluster"),
            "distributed": lambda: hpc_cluster_run(args.tasks, args.cap, logs, "distributed"),
            "plain": lambda: jobqueue(args.tasks, args.cap, logs, False),
            "lifetime": lambda: jobqueue(args.tasks, args.cap, logs, True)}
    labels = {"ours": "hpc-cluster", "distributed": "hpc-cluster, engine=distributed",
              "plain": "dask-jobqueue, plain", "lifetime": "dask-jobqueue, lifetime+adapt"}
    out = {}
    for name in args.only or list(runs):
        print(f"running {labels[name]} ...", flush=True)
        out[name] = runs[name]()
        left = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout.split()
        print(f"  done; jobs of it left in squeue: {sum(1 for j in left if j.startswith('bench-'))}", flush=True)
    ideal = args.tasks * 2 / 2
    print(f"\n{args.tasks} tasks x 2 s on 2 workers, 1-minute walltime (ideal {ideal:.0f} s)")
    print(f"  {'':<32} {'correct':>8} {'failed':>7} {'KilledWorker':>13} {'ran twice':>10} {'wall time':>10} "
          f"{'jobs':>5}  failures")
    for name, o in out.items():
        correct = sum(1 for i, v in o["results"].items() if v == i * i)
        failed = sum(o["failures"].values())
        print(f"  {labels[name]:<32} {correct:>8} {failed:>7} {o['killed']:>13} {o['twice']:>10} "
              f"{o['makespan']:>9.0f}s {o['jobs'] if o['jobs'] is not None else '-':>5}  {dict(o['failures']) or '-'}")
    for name, o in out.items():
        for what, count in sorted((o.get("deaths") or {}).items()):
            print(f"  {labels[name]}: {count} x {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
