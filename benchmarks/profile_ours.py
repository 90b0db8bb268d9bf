"""Where a task's microseconds go in hpc_cluster: CPU per process, then cProfile per process.

    python benchmarks/profile_ours.py [--tasks 20000] [--repeat 3] [--out DIR]

Starts a scheduler and `--workers` workers (no nanny) by hand, connects a Client from
this process and runs `client.map(noop, range(N))` + gather `--repeat` times, twice:

1. unprofiled: CPU seconds (user+sys, from psutil) of the scheduler, each worker and this
   client process over the runs, divided by the task count -> CPU us per task per process;
2. under cProfile: the scheduler and workers run as `python -m cProfile -o DIR/x.prof -m
   ...` and are stopped with SIGINT/SIGTERM so that their profiles are written; in the
   client both the user's thread and the client's event-loop thread are profiled.

Prints the CPU table and the top functions of every profile (tottime and cumtime).
cProfile only sees a process's main thread (plus, here, the client's loop thread):
the worker's task thread is not in its profile, which is fine for noop tasks.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def noop(x):
    return x


def start_processes(secret_hex: str, workers: int, threads: int, out: Path | None, tag: str):
    env = dict(os.environ, HPC_CLUSTER_SECRET=secret_hex,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    addr_file = Path(tempfile.mkdtemp(prefix="hpc-prof-")) / "address"

    def cmd(name, module, *args):
        prof = ["-m", "cProfile", "-o", str(out / f"{tag}-{name}.prof")] if out else []
        return [sys.executable, *prof, "-m", module, *args]

    logs = open(addr_file.parent / "log", "ab")
    sched = subprocess.Popen(cmd("scheduler", "hpc_cluster.scheduler", "--address-file", str(addr_file),
                                 "--log-level", "WARNING"), env=env, stdout=logs, stderr=logs)
    deadline = time.monotonic() + 30
    while not addr_file.exists():
        if sched.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("scheduler did not start: " + (addr_file.parent / "log").read_text()[-2000:])
        time.sleep(0.05)
    address = addr_file.read_text()
    procs = [sched]
    for i in range(workers):
        procs.append(subprocess.Popen(cmd(f"worker{i}", "hpc_cluster.worker", "--scheduler", address,
                                          "--nthreads", str(threads), "--no-nanny", "--log-level", "WARNING"),
                                      env=env, stdout=logs, stderr=logs))
    return address, procs


def stop_processes(procs) -> None:
    for p in procs[1:]:                       # workers first (SIGTERM: they close, exit 0)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs[1:]:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    sched = procs[0]
    if sched.poll() is None:
        sched.send_signal(signal.SIGINT)      # handled: closes, asyncio.run returns, profile written
        try:
            sched.wait(20)
        except subprocess.TimeoutExpired:
            sched.kill()


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def run_maps(client, n: int, repeat: int, base: int) -> list[float]:
    walls = []
    for r in range(repeat):
        off = (base + r) * 10**7
        t0 = time.perf_counter()
        futures = client.map(noop, range(off, off + n))
        client.gather(futures)
        walls.append(time.perf_counter() - t0)
        del futures
        time.sleep(0.5)
    return walls


def phase(args, out: Path | None, tag: str) -> dict:
    from hpc_cluster import Client
    from hpc_cluster.protocol.clusterfile import new_secret
    secret = new_secret()
    address, procs = start_processes(secret.hex(), args.workers, args.threads, out, tag)
    result = {}
    try:
        client = Client(address, secret=secret)
        client.wait_for_workers(args.workers, timeout=30)
        client.submit(noop, 1).result()
        run_maps(client, 2000, 1, 999)        # warm up (imports, function caches)
        time.sleep(0.5)
        names = ["scheduler"] + [f"worker{i}" for i in range(args.workers)]
        before = {n: cpu(p.pid) for n, p in zip(names, procs)}
        before["client"] = cpu(os.getpid())
        if out:
            main_prof, loop_prof = cProfile.Profile(), cProfile.Profile()
            client._loop.call_soon_threadsafe(loop_prof.enable)   # profiles the loop thread
            time.sleep(0.1)
            main_prof.enable()
        walls = run_maps(client, args.tasks, args.repeat, 0)
        if out:
            main_prof.disable()
            client._loop.call_soon_threadsafe(loop_prof.disable)
            time.sleep(0.1)
            main_prof.dump_stats(out / f"{tag}-client-main.prof")
            loop_prof.dump_stats(out / f"{tag}-client-loop.prof")
        after = {n: cpu(p.pid) for n, p in zip(names, procs)}
        after["client"] = cpu(os.getpid())
        total = args.tasks * args.repeat
        result = {"walls": walls, "tasks_per_s": [args.tasks / w for w in walls],
                  "cpu_us_per_task": {n: (after[n] - before[n]) / total * 1e6 for n in after}}
        client.close()
    finally:
        stop_processes(procs)
    return result


def top(path: Path, n: int, sort: str) -> str:
    buf = io.StringIO()
    st = pstats.Stats(str(path), stream=buf)
    st.strip_dirs().sort_stats(sort).print_stats(n)
    text = buf.getvalue()
    return text[text.find("   ncalls"):] if "   ncalls" in text else text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default="/tmp/hpc-profile", help="directory for the .prof files")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    print(f"load before: {os.getloadavg()}")
    plain = phase(args, None, "plain")
    print(f"\n== unprofiled: {args.repeat} x map({args.tasks}) ==")
    print("tasks/s per run:", ", ".join(f"{x:,.0f}" for x in plain["tasks_per_s"]))
    for name, us in plain["cpu_us_per_task"].items():
        print(f"  {name:10s} {us:8.1f} CPU us/task")
    print(f"  {'sum':10s} {sum(plain['cpu_us_per_task'].values()):8.1f} CPU us/task")

    prof = phase(args, out, "prof")
    print(f"\n== under cProfile (inflated): tasks/s {', '.join(f'{x:,.0f}' for x in prof['tasks_per_s'])} ==")
    for name, us in prof["cpu_us_per_task"].items():
        print(f"  {name:10s} {us:8.1f} CPU us/task")
    print(f"load after: {os.getloadavg()}")
    for f in sorted(out.glob("prof-*.prof")):
        for sort in ("tottime", "cumulative"):
            print(f"\n===== {f.name} by {sort} =====")
            print(top(f, args.top, sort))
    return 0


if __name__ == "__main__":
    sys.exit(main())
