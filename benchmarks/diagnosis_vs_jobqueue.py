"""What the user is told when a worker dies: dask-jobqueue next to hpc-cluster, same SLURM.

Two scenarios, each run through both tools on the same batch system:

  memory    one task needs 1 GB in a 300 MB job, next to 20 normal tasks
  walltime  1-minute jobs on 2 workers running 2-second tasks (80 of them, so that the
            time limit ends the first jobs in the middle of the work)

For each: the exception the user gets (type and first lines of its message), what else the
tool says about the deaths, how many innocent tasks failed (tasks that did nothing wrong),
and the wall time. Both tools use their defaults for retries (allowed failures: 3).
dask-jobqueue does not replace dead jobs after scale(n) (its SpecCluster keeps the job in
its spec), so it gets adapt(minimum=2, maximum=2), which does; hpc-cluster keeps scale(2).

    python benchmarks/diagnosis_vs_jobqueue.py [--only memory|walltime] [--tool jq|ours] [--json out.json]

Needs the SLURM test cluster (tests/batch/slurm/cluster.sh up) and `pip install dask-jobqueue`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMEOUT = 300          # cap per scenario and tool; ours needs ~2.5 min for the walltime one
MEMORY, WALLTIME = "300MB", "00:01:00"


def grow(limit_bytes, chunk=4 << 20, pause=0.02):
    held = []
    while len(held) * chunk < limit_bytes:
        held.append(b"x" * chunk)
        time.sleep(pause)
    return len(held) * chunk


def inc(x):
    time.sleep(0.1)
    return x + 1


def slow_square(x):
    time.sleep(2)
    return x * x


def squeue_ids(name: str) -> set[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, timeout=60)
    return set(out.stdout.split())


def wait_gone(name: str, timeout: float = 120) -> set[str]:
    deadline = time.monotonic() + timeout
    while (left := squeue_ids(name)) and time.monotonic() < deadline:
        time.sleep(1)
    if left:
        subprocess.run(["scancel", *left], timeout=60)
    return left


def abbreviate(exc: BaseException, lines: int = 4) -> str:
    text = f"{type(exc).__name__}: {exc}"
    shown = [ln for ln in text.splitlines() if ln.strip()][:lines]
    return "\n".join(ln if len(ln) < 220 else ln[:217] + "..." for ln in shown)


def run_workload(client, scenario: str) -> dict:
    """Submit the scenario's tasks through a dask-style client; count what failed."""
    t0 = time.monotonic()
    if scenario == "memory":
        hog = client.submit(grow, 1 << 30, key="hog-1GB", pure=False)
        normal = client.map(inc, range(20), pure=False)
        culprits, expected = [hog], [x + 1 for x in range(20)]
    else:
        hog, normal, culprits = None, client.map(slow_square, range(80), pure=False), []
        expected = [x * x for x in range(80)]
    told, innocent_failed, wrong, unfinished = [], 0, 0, 0
    deadline = t0 + TIMEOUT                     # one cap for the whole computation
    for f in culprits:
        try:
            f.result(timeout=max(1.0, deadline - time.monotonic()))
            told.append("the hog finished?!")
        except Exception as exc:
            told.append(abbreviate(exc))
    for f, want in zip(normal, expected):
        try:
            got = f.result(timeout=max(0.1, deadline - time.monotonic()))
            wrong += got != want
        except Exception as exc:
            if "imeout" in type(exc).__name__ or "imed out" in str(exc):
                unfinished += 1                 # still not done when the cap ran out
                continue
            innocent_failed += 1
            if len(told) < 3:
                told.append("innocent task: " + abbreviate(exc, 2))
    if unfinished:
        told.append(f"{unfinished} of {len(normal)} tasks still unfinished after {TIMEOUT} s (no error raised)")
    return {"told": told, "innocent_failed": innocent_failed, "wrong_results": wrong,
            "unfinished": unfinished, "wall": round(time.monotonic() - t0, 1)}


def with_jobqueue(scenario: str, log_dir: Path) -> dict:
    from dask_jobqueue import SLURMCluster as JQ
    from distributed import Client
    name = f"bench-jq-{scenario}"
    cluster = JQ(cores=1, memory=MEMORY, walltime=WALLTIME, processes=1, log_directory=str(log_dir / name),
                 python=sys.executable, job_name=name)
    try:
        cluster.adapt(minimum=2, maximum=2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=240)
            out = run_workload(client, scenario)
            out["deaths_explained"] = "no: dask-jobqueue keeps no record of why a job ended"
    finally:
        cluster.close()
        out_left = wait_gone(name)
    out["left_in_squeue"] = sorted(out_left)
    return out


def with_ours(scenario: str, log_dir: Path) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hpc_cluster import Client
    from hpc_cluster.deploy.cluster import SLURMCluster
    name = f"bench-ours-{scenario}"
    cluster = SLURMCluster(cores=1, memory=MEMORY, walltime=WALLTIME, log_directory=str(log_dir / name), name=name)
    try:
        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=240)
            out = run_workload(client, scenario)
            # Verdicts are refined in the background: wait (bounded) until the last is final.
            deadline = time.monotonic() + 120
            while any(d.get("final_at") is None for d in client.deaths()) and time.monotonic() < deadline:
                time.sleep(0.5)
            deaths = client.deaths()
            out["deaths_explained"] = [f"{d['name']}: {d['cause']} ({'charged' if d['blame'] else 'not charged'})"
                                       f": {d['text'][:160]}" for d in deaths]
    finally:
        cluster.close()
        out_left = wait_gone(name)
    out["left_in_squeue"] = sorted(out_left)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=("memory", "walltime"))
    p.add_argument("--tool", choices=("jq", "ours"))
    p.add_argument("--json")
    a = p.parse_args()
    home = Path(tempfile.mkdtemp(prefix="diag-bench-"))
    os.environ.setdefault("XDG_CONFIG_HOME", str(home / "xdg"))
    os.environ.setdefault("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(home / "etc"))
    results = {}
    for scenario in ("memory", "walltime"):
        if a.only and scenario != a.only:
            continue
        for tool, fn in (("dask-jobqueue", with_jobqueue), ("hpc-cluster", with_ours)):
            if a.tool and {"jq": "dask-jobqueue", "ours": "hpc-cluster"}[a.tool] != tool:
                continue
            t0 = time.monotonic()
            try:
                r = fn(scenario, home / "logs")
            except Exception as exc:
                r = {"crashed": abbreviate(exc, 6)}
            r["total_wall"] = round(time.monotonic() - t0, 1)
            results[f"{scenario}/{tool}"] = r
            print(f"\n=== {scenario}: {tool} (total {r['total_wall']} s incl. start/close) ===")
            for k, v in r.items():
                if isinstance(v, list):
                    print(f"{k}:")
                    for item in v:
                        print("  " + str(item).replace("\n", "\n    "))
                else:
                    print(f"{k}: {v}")
            sys.stdout.flush()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
