"""Many light workers: 100, 250, 500 worker processes of 1 thread, hpc_cluster and
dask.distributed side by side (issue 19, point 3).

    python benchmarks/many_workers.py                          # 100,250,500; ours then dask per count
    python benchmarks/many_workers.py --counts 10,20 --quick   # a smoke run
    python benchmarks/many_workers.py --systems ours --counts 500 --json out.json
    python benchmarks/many_workers.py --idle-workers           # workers in an idle CPU group: the
                                                               # scheduler first, as on a cluster

Per system and worker count, on a fresh cluster: the scheduler as a process of its own and
N workers without a nanny (ours `python -m hpc_cluster.worker --no-nanny`, dask's `dask
worker --no-nanny`), all started at once. Reported:

  register   seconds from starting the workers until the scheduler knows all of them
  idle       the scheduler's CPU per second with all workers connected and nothing to do
             (heartbeats: ours every 0.5 s per worker; dask's interval grows with the count)
  sleep      map(sleep 0.1 s) over --sleep-rounds x N tasks: tasks/s (the ideal is N/0.1) and
             the scheduler's CPU us per task
  noop       map(noop) over --noop-tasks tasks: tasks/s and the scheduler's CPU us per task
  latency    a second client in a process of its own asks the scheduler a tiny question every
             50 ms while the tasks run (ours: who-has of no keys; dask: client.who_has([])):
             median and max in ms, how many took over 50 ms, and when the worst was asked
             (seconds into the step); the issue asks for under 50 ms at 500 workers

A count is skipped when the workers would not fit in the available memory (the mean RSS of
20 workers at the previous count, or a first guess, x1.15, plus a 3 GiB reserve), and a step
that does not end within --timeout is reported with what it reached.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

import psutil

import cluster_procs       # benchmarks/ is on sys.path when run as a script

GUESS_RSS = {"ours": 35e6, "dask": 120e6}        # per worker, before one was measured (ours: 31.7 MB)
RESERVE = 3 * 2**30            # left to everything else on the machine


def noop(x):
    return x


def sleep_01(x):
    time.sleep(0.1)
    return x


# -- the pinger: a client of its own, in a process of its own -----------------------------------
def ping_main(system: str, address: str, interval: float) -> int:
    """Ask the scheduler a tiny question every `interval` s until stdin closes; print
    [(time, seconds)] as JSON. Run by the benchmark as `many_workers.py --ping ...`."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    if system == "ours":
        from hpc_cluster import Client
        client = Client(address, secret=bytes.fromhex(os.environ.pop("BENCH_SECRET")), timeout=60)

        def ask():
            client._lt.run(client._request({"op": "who-has", "keys": []}), 30)
    else:
        import logging

        from distributed import Client
        logging.getLogger("distributed").setLevel(logging.ERROR)
        client = Client(scheduler_file=address, timeout=60)

        def ask():
            client.who_has([])
    samples = []
    print("ready", flush=True)
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            ask()
            samples.append((time.time(), time.perf_counter() - t0))
        except Exception as exc:
            samples.append((time.time(), None))
            print(f"ping failed: {exc}", file=sys.stderr)
        stop.wait(interval)
    print(json.dumps(samples), flush=True)
    client.close()
    return 0


class Pinger:
    def __init__(self, system: str, address: str, env: dict, interval: float = 0.05):
        self.proc = subprocess.Popen([sys.executable, __file__, "--ping", system, address, str(interval)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the pinger did not connect")

    def stop(self) -> list:
        try:
            out, _ = self.proc.communicate("", timeout=60)
            return json.loads(out.strip().splitlines()[-1])
        except Exception:
            self.proc.kill()
            return []


def latency(samples: list, t0: float, t1: float) -> dict:
    inside = [(t, s) for t, s in samples if t0 <= t <= t1 and s is not None]
    failed = sum(1 for t, s in samples if t0 <= t <= t1 and s is None)
    if not inside:
        return {"samples": 0, "failed": failed}
    vals = [s for _, s in inside]
    worst_at, worst = max(inside, key=lambda x: x[1])
    # A sample's time is when its answer came: the worst one asked `worst` earlier.
    return {"samples": len(vals), "failed": failed, "median_ms": round(statistics.median(vals) * 1e3, 1),
            "max_ms": round(worst * 1e3, 1), "over_50ms": sum(v > 0.05 for v in vals),
            "worst_asked_at_s": round(worst_at - worst - t0, 2)}


# -- one system at one worker count ---------------------------------------------------------
def _wait(system: str, client, futures, timeout: float) -> int:
    """Wait for the futures (up to `timeout`); the number done."""
    if system == "ours":
        from hpc_cluster import wait
    else:
        from distributed import wait
    with contextlib.suppress(Exception):
        wait(futures, timeout=timeout)
    return sum(f.done() for f in futures)


def run_count(system: str, n: int, args) -> dict:
    out: dict = {"system": system, "workers": n}
    with contextlib.ExitStack() as stack:
        if system == "ours":
            procs = cluster_procs.OurProcesses(stack, scheduler_path=args.ours_scheduler_from)
            address, ping_env = procs.address, dict(os.environ, BENCH_SECRET=procs.secret.hex())
        else:
            import logging
            logging.getLogger("distributed").setLevel(logging.ERROR)
            procs = cluster_procs.DaskProcesses(stack)
            address, ping_env = procs.scheduler_file, dict(os.environ)
        t0 = time.perf_counter()
        procs.start_workers(n, threads=1, nanny=False, idle=args.idle_workers)
        if args.idle_workers:
            out["idle_workers"] = procs.idle_group.why or "one idle CPU cgroup (cpu.idle) + SCHED_IDLE"
        return measure(system, n, procs, stack, address, ping_env, t0, args, out,
                       worker_pids=lambda: [w.pid for w in procs.workers])


def worker_memory(pids: list[int]) -> dict:
    """Mean RSS, PSS and USS of up to 20 workers, in MB: RSS counts the pages a worker shares with
    others (forked ones share most) each time, PSS its share of them, USS only its own."""
    rows = []
    for pid in pids[:20]:
        with contextlib.suppress(psutil.Error):
            rows.append(psutil.Process(pid).memory_full_info())
    if not rows:
        return {}
    return {f"worker_{k}_mb": round(statistics.mean(getattr(r, k) for r in rows) / 1e6, 1) for k in ("rss", "pss", "uss")}


def heartbeats_per_s(client, seconds: float, every: float = 0.25) -> float:
    """Heartbeats the scheduler received per second, idle: changes of each worker's last-seen time
    (ours: last_seen, dask: last-seen), looked at every `every` s (both pace theirs at >= 0.5 s)."""
    seen: dict = {}
    changes = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for addr, w in client.scheduler_info()["workers"].items():
            t = w.get("last_seen", w.get("last-seen"))
            changes += addr in seen and t != seen[addr]
            seen[addr] = t
        time.sleep(every)
    return changes / seconds


def measure(system: str, n: int, procs, stack, address: str, ping_env: dict, t0: float, args, out: dict,
            worker_pids, pinger: Pinger | None = None) -> dict:
    """Everything after the workers were started at `t0`: registration, idle cost, the two maps
    and the second client's answers (what many_workers.py and many_nodes.py share). A `pinger`
    started before the workers also times the answers while they register."""
    registering = time.time() - (time.perf_counter() - t0)
    sched = psutil.Process(procs.scheduler.pid)
    client = procs.client(stack, timeout=args.timeout)
    try:
        client.wait_for_workers(n, timeout=args.timeout)
    except Exception as exc:
        out["outcome"] = f"not all registered within {args.timeout:.0f} s: {type(exc).__name__}"
        out["registered"] = len(client.scheduler_info()["workers"])
        return out
    out["register_s"] = round(time.perf_counter() - t0, 1)
    windows = {"register": (registering, time.time())} if pinger else {}
    out.update(worker_memory(worker_pids()))
    _wait(system, client, client.map(noop, range(-n, 0)), args.timeout)       # warm: functions, connections
    time.sleep(2)
    c0 = _cpu(sched)
    time.sleep(args.idle)
    out["idle_cpu_per_s"] = round((_cpu(sched) - c0) / args.idle, 3)
    out["heartbeats_per_s"] = round(heartbeats_per_s(client, args.idle))     # after: its asking costs CPU
    pinger = pinger or Pinger(system, address, ping_env)
    spy = Profile(procs.scheduler.pid, args.profile, f"{system}-{n}") if args.profile else None
    for name, func, count in (("sleep", sleep_01, args.sleep_rounds * n), ("noop", noop, args.noop_tasks)):
        off = 10**7 * (1 + len(windows))
        c0, w0, t0 = _cpu(sched), time.time(), time.perf_counter()
        futures = client.map(func, range(off, off + count))
        done = _wait(system, client, futures, args.timeout)
        secs = time.perf_counter() - t0
        windows[name] = (w0, time.time())
        res = {"tasks": count, "seconds": round(secs, 2), "tasks_per_s": round(done / secs),
               "scheduler_cpu_us_per_task": round((_cpu(sched) - c0) / max(done, 1) * 1e6)}
        if name == "sleep":
            res["ideal_tasks_per_s"] = round(n / 0.1)
        if done < count:
            res["outcome"] = f"{done} of {count} done after {args.timeout:.0f} s"
        out[name] = res
        del futures
        time.sleep(1)
    samples = pinger.stop()
    if spy is not None:
        out["profile"] = spy.stop()
    for name, (w0, w1) in windows.items():
        out.setdefault(name, {})["latency"] = latency(samples, w0, w1)
    out["outcome"] = "completed" if all("outcome" not in out[k] for k in windows) else "timed out"
    if system == "ours":              # workers lost on the way (e.g. silent past the heartbeat TTL)
        causes = [d.get("cause") for d in client.deaths()]
        out["deaths"] = {c: causes.count(c) for c in set(causes)}
    client.close()
    return out


class Profile:
    """py-spy sampling the scheduler (--nonblocking: it is not paused) while the tasks run; the
    result is summarised as the functions with the most samples on top (self) and anywhere
    on the stack (total), in percent of the samples."""

    def __init__(self, pid: int, directory: str, tag: str):
        import shutil
        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"{tag}.txt")
        self.proc = subprocess.Popen([spy, "record", "-p", str(pid), "-r", "50", "--nonblocking", "-f", "raw",
                                      "-o", self.path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self, top: int = 12) -> dict:
        import signal
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return {"file": self.path, "error": "py-spy did not stop"}
        own: dict = {}
        anywhere: dict = {}
        total = 0
        with contextlib.suppress(OSError), open(self.path) as f:
            for line in f:
                stack, _, count = line.rstrip().rpartition(" ")
                if not count.isdigit():
                    continue
                frames = [_frame(fr) for fr in stack.split(";")]
                n = int(count)
                total += n
                own[frames[-1]] = own.get(frames[-1], 0) + n
                for fr in set(frames):
                    anywhere[fr] = anywhere.get(fr, 0) + n

        def pct(d):
            return [(k, round(100 * v / total, 1)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]
        return {"file": self.path, "samples": total, "self": pct(own) if total else [],
                "total": pct(anywhere) if total else []}


def _frame(text: str) -> str:
    """py-spy's 'function (path/to/file.py:123)' -> 'function (file.py)': a function's lines together."""
    name, _, where = text.partition(" (")
    return f"{name} ({os.path.basename(where.rstrip(')').rsplit(':', 1)[0])})" if where else name


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def fits(system: str, n: int, per_worker: dict) -> tuple[bool, str]:
    need = n * per_worker.get(system, GUESS_RSS[system]) * 1.15 + RESERVE
    avail = psutil.virtual_memory().available
    return need <= avail, f"needs ~{need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available"


def format_table(report: dict) -> str:
    lines = [f"cpus={report['machine']['cpus']} load before={report['machine']['load_before']} "
             f"after={report['machine']['load_after']}", ""]
    head = (f"{'workers':>7s} {'system':6s} {'register s':>10s} {'idle CPU/s':>10s} {'sleep tasks/s':>13s} "
            f"{'(ideal)':>7s} {'sched us/task':>13s} {'noop tasks/s':>12s} {'sched us/task':>13s} "
            f"{'latency ms med/max (sleep)':>26s} {'(noop)':>14s}  outcome")
    lines += [head, "-" * len(head)]
    for r in report["results"]:
        s, z = r.get("sleep") or {}, r.get("noop") or {}

        def lat(x):
            la = x.get("latency") or {}
            return f"{la['median_ms']:.1f} / {la['max_ms']:.1f}" if la.get("samples") else "-"
        lines.append(f"{r['workers']:7d} {r['system']:6s} {r.get('register_s', '-')!s:>10s} "
                     f"{r.get('idle_cpu_per_s', '-')!s:>10s} {s.get('tasks_per_s', '-')!s:>13s} "
                     f"{s.get('ideal_tasks_per_s', '-')!s:>7s} {s.get('scheduler_cpu_us_per_task', '-')!s:>13s} "
                     f"{z.get('tasks_per_s', '-')!s:>12s} {z.get('scheduler_cpu_us_per_task', '-')!s:>13s} "
                     f"{lat(s):>26s} {lat(z):>14s}  {r.get('outcome', '')}")
    return "\n".join(lines)


def format_markdown(report: dict) -> str:
    """The same table as BENCHMARKS.md has it."""
    lines = ["| workers | system | register | idle CPU | sleep(0.1) tasks/s (ideal) | sched CPU/task | "
             "no-op tasks/s | sched CPU/task | latency sleep med / max | latency no-op med / max | outcome |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in report["results"]:
        s, z = r.get("sleep") or {}, r.get("noop") or {}

        def lat(x):
            la = x.get("latency") or {}
            return f"{la['median_ms']:.1f} / {la['max_ms']:.1f} ms" if la.get("samples") else "-"

        def num(x, key, unit=""):
            return f"{x[key]:,}{unit}" if key in x else "-"
        lines.append(f"| {r['workers']} | {r['system']} | {num(r, 'register_s', ' s')} | "
                     f"{num(r, 'idle_cpu_per_s', ' s/s')} | {num(s, 'tasks_per_s')} ({num(s, 'ideal_tasks_per_s')}) | "
                     f"{num(s, 'scheduler_cpu_us_per_task', ' us')} | {num(z, 'tasks_per_s')} | "
                     f"{num(z, 'scheduler_cpu_us_per_task', ' us')} | {lat(s)} | {lat(z)} | {r.get('outcome', '')} |")
    return "\n".join(lines)


def run_counts(args, run_count, fits, memory_key: str) -> dict:
    """Each system at each of args.counts, skipping a count whose workers would not fit (by the
    per-worker memory `memory_key` measured at the previous count); the report with every result."""
    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version(), "load_before": list(os.getloadavg()),
                          "memory_available_gib": round(psutil.virtual_memory().available / 2**30, 1)},
              "config": vars(args), "results": []}
    per_worker: dict[str, float] = {}
    for n in (int(c) for c in args.counts.split(",")):
        for system in args.systems.split(","):
            ok, why = fits(system, n, per_worker)
            if not ok:
                res = {"system": system, "workers": n, "outcome": f"skipped: does not fit ({why})"}
            else:
                t = time.perf_counter()
                try:
                    res = run_count(system, n, args)
                except Exception as exc:
                    res = {"system": system, "workers": n, "outcome": f"failed: {type(exc).__name__}: {exc}"[:300]}
                res["wall_s"] = round(time.perf_counter() - t, 1)
                if res.get(memory_key):
                    per_worker[system] = res[memory_key] * 1e6
            report["results"].append(res)
            print(json.dumps(res), file=sys.stderr, flush=True)
    report["machine"]["load_after"] = list(os.getloadavg())
    from importlib.metadata import version
    report["versions"] = {p: version(p) for p in ("hpc-cluster", "distributed", "dask")}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--ping":
        return ping_main(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", default="100,250,500", help="worker counts (default 100,250,500)")
    p.add_argument("--systems", default="ours,dask", help="ours, dask or both (default)")
    p.add_argument("--sleep-rounds", type=int, default=10, help="sleep(0.1) tasks per worker (default 10)")
    p.add_argument("--noop-tasks", type=int, default=20_000, help="no-op tasks (default 20,000)")
    p.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU measured (default 5)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any one step may take (default 300)")
    p.add_argument("--idle-workers", action="store_true",
                   help="workers in one idle CPU cgroup (cpu.idle; as root) and under SCHED_IDLE: the scheduler "
                        "and the clients run first, as when the workers are on other nodes (without it, 500 "
                        "workers on 2 cores starve the scheduler)")
    p.add_argument("--quick", action="store_true", help="2 sleep rounds, 2,000 no-op tasks, 2 s idle")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--markdown", action="store_true", help="print the table as BENCHMARKS.md has it")
    p.add_argument("--ours-scheduler-from", metavar="DIR", help="run our scheduler from the hpc_cluster package in "
                   "DIR (e.g. `git archive OLD hpc_cluster | tar -x -C DIR`): an A/B of two schedulers")
    p.add_argument("--profile", metavar="DIR", help="sample the scheduler with py-spy while the tasks run "
                   "(pip install py-spy); raw stacks to DIR, a summary in the results")
    args = p.parse_args(argv)
    if args.quick:
        args.sleep_rounds, args.noop_tasks, args.idle = 2, 2_000, 2.0
    report = run_counts(args, run_count, fits, "worker_rss_mb")   # RSS counts shared pages each time: an upper bound
    print(format_markdown(report) if args.markdown else format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
