"""The scheduler dies mid-run (issue 16, point 6): hpc-cluster next to dask.distributed, same SLURM.

2,000 tasks of 0.2 s on 2 one-worker SLURM jobs; one client waits in a single gather. Once 600
tasks have started, the scheduler's process is SIGKILLed and, 5 s later, started again:

  ours, sigkill  `hpc-cluster up --name N` again: it resumes from the journal
  ours, reboot   the same, after also deleting the daemon's log and plan files (the state of
                 the machine it ran on): only the cluster file and the journal remain
  distributed    `dask scheduler --scheduler-file F --port P` killed and started again on the
                 same port; the workers are `dask worker --scheduler-file F` in sbatch jobs

For each: whether the gather returned every result (or what it raised), the tasks that ran
more than once (each task appends its index to a file when it starts), the batch jobs before
and after (the same ids = nothing resubmitted), and the time from the kill to the last result.

    python benchmarks/restart.py [--setup ours-sigkill|ours-reboot|distributed] [--tasks 2000] [--json out.json]

Needs the SLURM test cluster up (root: tests/batch/slurm/cluster.sh up).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

KILL_AT = 0.3                    # of the tasks started
RESTART_AFTER = 5.0              # seconds
CAP = 900.0                      # seconds a gather may take before it is counted as failed


def task(i, log):
    import time
    with open(log, "a") as f:
        f.write(f"{i}\n")
    time.sleep(0.2)
    return i * i


def _runs(log: Path) -> list[int]:
    try:
        return [int(x) for x in log.read_text().split()]
    except FileNotFoundError:
        return []


def _wait(cond, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise TimeoutError(f"{what} within {timeout:.0f} s")


def _squeue(name: str) -> set[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def _gather_in_thread(client, futures, got: dict) -> threading.Thread:
    def run():
        try:
            got["result"] = client.gather(futures)
        except BaseException as exc:          # reported, whatever it is
            got["error"] = f"{type(exc).__name__}: {exc}"[:300]
        got["done_at"] = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _report(n: int, log: Path, got: dict, killed_at: float, started_at_kill: int, before: set, after: set) -> dict:
    runs = _runs(log)
    result = got.get("result")
    return {"results_correct": result == [i * i for i in range(n)], "error": got.get("error"),
            "tasks_started_at_kill": started_at_kill, "reruns": len(runs) - len(set(runs)),
            "rerun_fraction_of_started": round((len(runs) - len(set(runs))) / max(1, started_at_kill), 4),
            "jobs_before": sorted(before), "jobs_after": sorted(after), "same_jobs": before == after and bool(before),
            "kill_to_done_s": round(got["done_at"] - killed_at, 1) if "done_at" in got else None}


def ours(n: int, reboot: bool, home: Path) -> dict:
    from hpc_cluster import Client
    name = f"rs-{'reboot' if reboot else 'kill'}"
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"))
    os.environ.update(XDG_CONFIG_HOME=env["XDG_CONFIG_HOME"], HOME=env["HOME"])
    site = home / "site.yaml"
    site.write_text(f"default: t\nsites:\n  t:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n"
                    f"    walltime: '00:30:00'\n    job_name: {name}\n    log_directory: {home / 'logs'}\n")
    run_dir = home / "xdg" / "hpc-cluster" / "clusters"
    log = home / f"{name}.runs"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "hpc_cluster.cli", *args], capture_output=True, text=True,
                              env=env, stdin=subprocess.DEVNULL, timeout=600)
    up = cli("up", "--config", str(site), "-n", "2", "--name", name, "--timeout", "300")
    if up.returncode:
        raise RuntimeError(up.stdout + up.stderr)
    try:
        pid = json.loads((run_dir / f"{name}.json").read_text())["pid"]
        before = _squeue(name)
        got: dict = {}
        with Client(name) as client:
            futures = client.map(task, range(n), log=str(log))
            waiter = _gather_in_thread(client, futures, got)
            _wait(lambda: len(_runs(log)) >= KILL_AT * n, 600, "tasks to start")
            os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            started = len(set(_runs(log)))
            if reboot:
                for p in (run_dir / f".{name}.plan.json", run_dir / f"{name}.log"):
                    p.unlink(missing_ok=True)
            time.sleep(RESTART_AFTER)
            again = cli("up", "--config", str(site), "-n", "2", "--name", name, "--timeout", "300")
            if again.returncode:
                raise RuntimeError(again.stdout + again.stderr)
            waiter.join(CAP)
            after = _squeue(name)
        return _report(n, log, got, killed_at, started, before, after)
    finally:
        cli("down", name)


def distributed(n: int, home: Path) -> dict:
    from distributed import Client
    name = "rs-distributed"
    sched_file, log = home / "scheduler.json", home / "distributed.runs"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def scheduler():
        return subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                 "--port", str(port), "--scheduler-file", str(sched_file), "--no-dashboard"],
                                stdout=subprocess.DEVNULL, stderr=open(home / "scheduler.log", "ab"))
    proc = scheduler()
    _wait(sched_file.exists, 60, "the distributed scheduler")
    worker = (f"{sys.executable} -m distributed.cli.dask_worker --scheduler-file {sched_file} --nthreads 1 "
              f"--memory-limit 1GB --no-dashboard")
    before = set()
    for _ in range(2):
        out = subprocess.run(["sbatch", "--parsable", "-J", name, "-c", "1", "--mem", "1G", "-t", "30",
                              "-o", str(home / "worker-%j.out"), "--wrap", worker],
                             capture_output=True, text=True, check=True)
        before.add(out.stdout.strip().split(";")[0])
    got: dict = {}
    try:
        with Client(scheduler_file=str(sched_file), timeout=60) as client:
            client.wait_for_workers(2, timeout=300)
            futures = client.map(task, range(n), log=str(log), pure=False)
            waiter = _gather_in_thread(client, futures, got)
            _wait(lambda: len(_runs(log)) >= KILL_AT * n, 600, "tasks to start")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed_at = time.monotonic()
            started = len(set(_runs(log)))
            time.sleep(RESTART_AFTER)
            proc = scheduler()
            waiter.join(CAP)
            if waiter.is_alive():
                got["error"] = f"the gather had not returned {CAP:.0f} s after the kill"
            time.sleep(10)                       # the jobs' fate a moment after (reported, not asserted)
            after = _squeue(name)
        return _report(n, log, got, killed_at, started, before, after)
    finally:
        subprocess.run(["scancel", *before], capture_output=True)
        proc.kill()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setup", action="append", choices=["ours-sigkill", "ours-reboot", "distributed"])
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--json")
    args = p.parse_args(argv)
    setups = args.setup or ["ours-sigkill", "ours-reboot", "distributed"]
    results = {}
    for setup in setups:
        with tempfile.TemporaryDirectory(prefix=f"bench-{setup}-", dir="/tmp") as tmp:
            home = Path(tmp)
            os.chmod(home, 0o755)
            print(f"== {setup}: {args.tasks} tasks of 0.2 s on 2 SLURM jobs; SIGKILL the scheduler after "
                  f"{int(KILL_AT * args.tasks)} started, start it again {RESTART_AFTER:.0f} s later", flush=True)
            t0 = time.monotonic()
            if setup == "distributed":
                r = distributed(args.tasks, home)
            else:
                r = ours(args.tasks, setup == "ours-reboot", home)
            r["wall_s"] = round(time.monotonic() - t0, 1)
            results[setup] = r
            print(json.dumps(r, indent=1), flush=True)
    print("\nsetup          all results  reruns (of started at kill)  same jobs  kill->done")
    for setup, r in results.items():
        print(f"{setup:<14} {'yes' if r['results_correct'] else 'NO':<12} "
              f"{r['reruns']:>5} ({r['rerun_fraction_of_started']:.1%} of {r['tasks_started_at_kill']})"
              f"{'':<8} {'yes' if r['same_jobs'] else 'no':<10} "
              f"{r['kill_to_done_s'] if r['kill_to_done_s'] is not None else '-'} s"
              + (f"   error: {r['error']}" if r["error"] else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["results_correct"] for s, r in results.items() if s.startswith("ours")) else 1


if __name__ == "__main__":
    sys.exit(main())
