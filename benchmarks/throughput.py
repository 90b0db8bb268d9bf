"""Task throughput: hpc_cluster vs dask.distributed, same machine, same worker layout.

    python benchmarks/throughput.py                  # 20,000 / 4,096 / 2,000, best of 3
    python benchmarks/throughput.py --quick          # 2,000 / 512 / 200 (a smoke run)
    python benchmarks/throughput.py --json out.json  # also write the numbers as JSON

Three benchmarks, each run `--repeat` times per system (repetitions are interleaved,
ours then dask, so that load from other processes hits both alike):

  map    client.map(noop, range(N)) then gather            -> tasks/s
  tree   map(inc, range(L)) leaves, then pairwise submit(add, a, b) levels until one
         future remains (2L-1 tasks), then its result        -> tasks/s
  chain  x = submit(inc, x) C times, then x.result()         -> tasks/s and us/task

Both clusters run `--workers` worker processes with `--threads` threads each, under a
nanny, and each scheduler runs in a process of its own: ours LocalCluster's, dask's started
with `dask scheduler` and `dask worker --nanny` (cluster_procs.py), so that the CPU each
process spends over a run (psutil user+sys) is split fairly: scheduler, workers, nannies and
this client process, per task, and the scheduler's CPU seconds per 1,000 tasks (HyperQueue's
figure). "dask-local" is dask's LocalCluster, whose scheduler runs inside this (the
client's) process: its CPU is shown as one "client+scheduler" figure. dask's dashboard is
turned off; ours serves its dashboard (on a free port) unless the system is "ours-nodash",
and "ours-viewed" polls it.

`--big N` then runs big_graphs.py's N-task map and N-task dask graph (submit time, run time,
the scheduler's peak RSS per task) for ours and dask, each on a fresh cluster: minutes at
N=1,000,000, so it is off by default. Every figure issue 19 sets a goal for is printed
next to its goal (GOALS).

"ours-slurm" and "dist-slurm" are both engines as hpc-cluster deploys them (issue 32, point 8;
deployed.py): SLURMCluster() and SLURMCluster(engine="distributed"), one job per worker on the
real SLURM, the daemon as the scheduler process:

    python benchmarks/throughput.py --systems ours-slurm,dist-slurm,dask --repeat 2

Every system after the first gets a ratio line against the first (tasks/s, best and median),
and the memory table after the runs gives each system's scheduler peak RSS (VmHWM) and its
workers' and nannies' RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import signal
import statistics
import sys
import time
from pathlib import Path

import cluster_procs       # benchmarks/ is on sys.path when run as a script
import deployed


# -- the tasks (module level; cloudpickle ships them by value from __main__) ---------------
def noop(x):
    return x


def inc(x):
    return x + 1


def add(a, b):
    return a + b


# -- the benchmarks: each takes a client (ours or dask's) and returns (tasks, seconds) ------
# Every run uses fresh inputs (`_offset`), so its task keys (tokenized from the arguments,
# pure=True in both systems) never match a previous run's results still being released.
_RUNS = iter(range(1, 10**9))


def _offset() -> int:
    return next(_RUNS) * 10**7


def bench_map(client, n: int) -> tuple[int, float]:
    off = _offset()
    t0 = time.perf_counter()
    futures = client.map(noop, range(off, off + n))
    results = client.gather(futures)
    elapsed = time.perf_counter() - t0
    if len(results) != n or results[-1] != off + n - 1:
        raise AssertionError(f"map: wrong results (len {len(results)}, last {results[-1]!r})")
    del futures, results
    return n, elapsed


def bench_tree(client, leaves: int) -> tuple[int, float]:
    off = _offset()
    t0 = time.perf_counter()
    level = client.map(inc, range(off, off + leaves))
    tasks = len(level)
    while len(level) > 1:
        nxt = [client.submit(add, level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        tasks += len(level) // 2
        level = nxt
    total = level[0].result()
    elapsed = time.perf_counter() - t0
    expected = sum(range(off + 1, off + leaves + 1))
    if total != expected:
        raise AssertionError(f"tree: got {total}, expected {expected}")
    del level
    return tasks, elapsed


def bench_chain(client, n: int) -> tuple[int, float]:
    off = _offset()
    t0 = time.perf_counter()
    x = client.submit(inc, off)
    for _ in range(n - 1):
        x = client.submit(inc, x)
    value = x.result()
    elapsed = time.perf_counter() - t0
    if value != off + n:
        raise AssertionError(f"chain: got {value}, expected {n}")
    del x
    return n, elapsed


BENCHMARKS = {"map": bench_map, "tree": bench_tree, "chain": bench_chain}
SIZES = {"full": {"map": 20_000, "tree": 4_096, "chain": 2_000},
         "quick": {"map": 2_000, "tree": 512, "chain": 200}}
# Issue 19's goals, printed next to the figures they are for.
GOALS = {"map_tasks_per_s": 5_000, "chain_us_per_task": 300, "cpu_us_per_task": 250, "rss_bytes_per_task": 1_000}
DESCRIPTIONS = {"map": "map(noop, range({n})) + gather",
                "tree": "tree reduction, {n} leaves",
                "chain": "chain of {n} dependent tasks"}


# -- clusters --------------------------------------------------------------------------------
def start_ours(stack: contextlib.ExitStack, workers: int, threads: int, security: bool = False,
               journal: bool = False, dashboard: str | None = ":0", viewer: bool = False):
    from hpc_cluster import Client, LocalCluster
    cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=threads,
                                               security=bool(security), journal=journal,
                                               dashboard_address=dashboard))
    client = stack.enter_context(Client(cluster))
    client.wait_for_workers(workers, timeout=60)
    if viewer:
        stack.enter_context(DashboardViewer(cluster.dashboard_link))
    return client, cluster._scheduler.pid


def _view(host: str, port: int, token: str, paths, interval: float, max_rounds: int, stop, results) -> None:
    """The viewer's process: fetch every path, wait `interval`, again, until `stop` is set."""
    import http.client
    rounds = errors = size = 0
    seconds = slowest = 0.0
    while not stop.is_set() and rounds < max_rounds:
        for path in paths:
            t0 = time.perf_counter()
            try:
                conn = http.client.HTTPConnection(host, port, timeout=10)
                conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
                r = conn.getresponse()
                size += len(r.read())
                errors += r.status != 200
                conn.close()
            except OSError:
                errors += 1
            took = time.perf_counter() - t0
            seconds += took
            slowest = max(slowest, took)
        rounds += 1
        stop.wait(interval)
    results.put((rounds, errors, size, seconds, slowest))


class DashboardViewer:
    """An open dashboard page, as far as the scheduler can tell: every `interval` s it fetches
    every /api endpoint the pages read (more than one page does), until the benchmark ends. It
    runs in a process of its own, as a browser would: a thread here would take the GIL and a
    core from the client that the benchmark times. Bounded: at most `max_rounds` rounds, on
    loopback only (the cluster's own dashboard)."""

    PATHS = ("/api/workers", "/api/tasks", "/api/jobs", "/api/deaths")

    def __init__(self, link: str, interval: float = 2.0, max_rounds: int = 5000):
        import multiprocessing
        import urllib.parse
        url = urllib.parse.urlsplit(link)
        token = urllib.parse.parse_qs(url.query)["token"][0]
        ctx = multiprocessing.get_context("spawn")
        self._stop, self._results = ctx.Event(), ctx.Queue()
        self._process = ctx.Process(target=_view, name="dashboard-viewer", daemon=True, args=(
            url.hostname, url.port, token, self.PATHS, interval, max_rounds, self._stop, self._results))

    def __enter__(self):
        self._process.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        try:
            rounds, errors, size, seconds, slowest = self._results.get(timeout=30)
        except Exception:
            print("dashboard viewer: no report (it did not stop in time)", file=sys.stderr)
            self._process.terminate()
            return
        self._process.join(15)
        n = max(1, rounds * len(self.PATHS))
        print(f"dashboard viewer: {rounds} rounds of {len(self.PATHS)} requests, {errors} errors, "
              f"{size / n / 1024:.1f} KiB per answer, {seconds / n * 1e3:.1f} ms per request "
              f"(slowest {slowest * 1e3:.1f} ms)", file=sys.stderr)


def start_dask(stack: contextlib.ExitStack, workers: int, threads: int):
    """dask's scheduler and workers (under nannies) as processes of their own, as ours are."""
    return cluster_procs.start_dask(stack, workers, threads, nanny=True, timeout=60)


def start_dask_local(stack: contextlib.ExitStack, workers: int, threads: int, security: bool = False):
    """dask's LocalCluster: its scheduler runs in this process (the scheduler pid is ours)."""
    import logging

    import dask
    from distributed import Client, LocalCluster
    from distributed.security import Security
    logging.getLogger("distributed").setLevel(logging.ERROR)
    stack.enter_context(dask.config.set({"distributed.admin.tick.limit": "1h"}))
    tls = {"security": Security.temporary(), "protocol": "tls://"} if security else {}
    cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=threads,
                                               processes=True, dashboard_address=None, **tls))
    client = stack.enter_context(Client(cluster, security=tls.get("security")))
    client.wait_for_workers(workers, timeout=60)
    return client, os.getpid()


def start_deployed(system: str):
    """One of deployed.py's systems (both engines on the real SLURM): (client, daemon pid)."""
    def starter(stack: contextlib.ExitStack, workers: int, threads: int):
        d = deployed.start(stack, system, workers, threads)
        return d.client, d.scheduler_pid
    return starter


# "-tls": the same cluster with every connection under TLS (security=True; dask's Security.temporary(),
# on dask's LocalCluster: its scheduler in this process).
# "ours-journal": the scheduler keeps its journal (issue 16; LocalCluster(journal=True)).
# "ours-nodash": no dashboard (dashboard_address=None); "ours-viewed": the dashboard (as in "ours")
# with a page open on it, fetching every /api endpoint every 2 s (issue 17's cost).
STARTERS = {"ours": start_ours, "dask": start_dask, "dask-local": start_dask_local,
            "ours-nodash": lambda *a: start_ours(*a, dashboard=None),
            "ours-viewed": lambda *a: start_ours(*a, viewer=True),
            "ours-journal": lambda *a: start_ours(*a, journal=True),
            "ours-tls": lambda *a: start_ours(*a, security=True),
            "dask-tls": lambda *a: start_dask_local(*a, security=True),
            **{name: start_deployed(name) for name in deployed.SYSTEMS}}


def warm_up(client) -> None:
    if client.submit(inc, 1).result() != 2:
        raise AssertionError("warm-up task returned a wrong value")


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def summarise(samples: list[tuple]) -> dict:
    """(tasks, seconds, {process group: CPU seconds}) per run -> best and median figures; the
    CPU per task is the median run's over each group (psutil user+sys, whole processes)."""
    tasks = samples[0][0]
    times = [s[1] for s in samples]
    best, median = min(times), statistics.median(times)
    out = {"tasks": tasks, "seconds": [round(t, 4) for t in times],
           "best_s": round(best, 4), "median_s": round(median, 4),
           "best_tasks_per_s": round(tasks / best, 1), "median_tasks_per_s": round(tasks / median, 1),
           "best_us_per_task": round(best / tasks * 1e6, 1), "median_us_per_task": round(median / tasks * 1e6, 1)}
    cpus = [s[2] for s in samples if len(s) > 2 and s[2]]
    if cpus:
        groups = list(cpus[0])
        per_task = {g: round(statistics.median(c[g] for c in cpus) / tasks * 1e6, 1) for g in groups}
        per_task["total"] = round(statistics.median(sum(c.values()) for c in cpus) / tasks * 1e6, 1)
        out["cpu_us_per_task"] = per_task
        sched = next((g for g in ("scheduler", "client+scheduler") if g in per_task), None)
        if sched:
            # HyperQueue's figure: the server's CPU seconds per 1,000 tasks
            out["scheduler_cpu_s_per_1000_tasks"] = round(per_task[sched] / 1000, 3)
    return out


def ratios(results: dict, systems: list[str], benches: list[str]) -> dict:
    """Each system's tasks/s over the first's (best and median; over 1: faster), except dask over
    ours, which has its own line (ratio_ours_over_dask)."""
    out: dict = {}
    for s in systems[1:]:
        if (systems[0], s) == ("ours", "dask"):
            continue
        out[f"{s}/{systems[0]}"] = {
            b: {k: round(results[s][b][f"{k}_tasks_per_s"] / results[systems[0]][b][f"{k}_tasks_per_s"], 3)
                for k in ("best", "median")} for b in benches}
    return out


def paired(samples: dict, systems: list[str], benches: list[str]) -> dict:
    """Each system against the first, repetition by repetition: a repetition's runs follow each
    other within seconds, so their ratio cancels most of a busy machine's drift (the spread
    between repetitions of one system is 10-30% when other work runs). Per benchmark: the
    median and mean of the paired throughput ratios (this / first, over 1: faster) and of the
    paired CPU-per-task ratios (over 1: more CPU)."""
    out: dict = {}
    base = systems[0] if systems else None
    for s in systems[1:]:
        for b in benches:
            pairs = list(zip(samples[base][b], samples[s][b]))
            speed = [a[1] / o[1] for a, o in pairs]
            cpu = [sum(o[2].values()) / sum(a[2].values()) for a, o in pairs
                   if len(a) > 2 and len(o) > 2 and a[2] and o[2] and sum(a[2].values())]
            out.setdefault(f"{s}/{base}", {})[b] = {
                "pairs": len(pairs),
                "speed_median": round(statistics.median(speed), 3), "speed_mean": round(statistics.fmean(speed), 3),
                **({"cpu_median": round(statistics.median(cpu), 3), "cpu_mean": round(statistics.fmean(cpu), 3)}
                   if cpu else {})}
    return out


def _groups(client, scheduler_pid: int) -> dict[str, list[int]]:
    groups = cluster_procs.worker_groups(client, scheduler_pid)
    if scheduler_pid == os.getpid():             # dask's LocalCluster: one process for both
        del groups["scheduler"]
        groups["client+scheduler"] = groups.pop("client")
    return groups


def run(args) -> dict:
    sizes = dict(SIZES["quick" if args.quick else "full"])
    for name in BENCHMARKS:
        override = getattr(args, name)
        if override is not None:
            sizes[name] = override
    benches = [b for b in args.benchmarks.split(",") if b]
    systems = [s for s in args.systems.split(",") if s]
    for b in benches:
        if b not in BENCHMARKS:
            raise SystemExit(f"--benchmarks: unknown benchmark {b!r}; choose from {', '.join(BENCHMARKS)}")
    for s in systems:
        if s not in STARTERS:
            raise SystemExit(f"--systems: unknown system {s!r}; choose from {', '.join(STARTERS)}")

    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version(), "load_before": _load()},
              "config": {"workers": args.workers, "threads": args.threads, "repeat": args.repeat,
                         "quick": bool(args.quick), "sizes": {b: sizes[b] for b in benches}},
              "versions": {}, "results": {}, "goals": GOALS}
    samples: dict[str, dict[str, list]] = {s: {b: [] for b in benches} for s in systems}
    with contextlib.ExitStack() as stack:
        clients, meters = {}, {}
        for s in systems:
            t0 = time.perf_counter()
            clients[s], scheduler_pid = STARTERS[s](stack, args.workers, args.threads)
            warm_up(clients[s])
            meters[s] = cluster_procs.CPUMeter(_groups(clients[s], scheduler_pid))
            log(args, f"{s}: cluster up and warm in {time.perf_counter() - t0:.1f} s")
        report["versions"] = _versions(systems)
        for b in benches:
            for rep in range(args.repeat):
                for s in systems:
                    gc.collect()
                    meters[s].start()
                    tasks, seconds = BENCHMARKS[b](clients[s], sizes[b])
                    cpu = meters[s].stop()
                    samples[s][b].append((tasks, seconds, cpu))
                    log(args, f"{b:5s} rep {rep + 1}/{args.repeat} {s:11s}: {tasks} tasks in {seconds:.3f} s "
                              f"({tasks / seconds:,.0f} tasks/s, {sum(cpu.values()) / tasks * 1e6:,.0f} CPU us/task)")
                    time.sleep(args.pause)          # let releases settle before the next run
        report["memory"] = {s: deployed.memory_after(meters[s]) for s in systems}
    report["machine"]["load_after"] = _load()
    for s in systems:
        report["results"][s] = {b: summarise(samples[s][b]) for b in benches}
    if "ours" in systems and "dask" in systems:
        report["ratio_ours_over_dask"] = {
            b: {"best": round(report["results"]["ours"][b]["best_tasks_per_s"]
                              / report["results"]["dask"][b]["best_tasks_per_s"], 3),
                "median": round(report["results"]["ours"][b]["median_tasks_per_s"]
                                / report["results"]["dask"][b]["median_tasks_per_s"], 3)}
            for b in benches}
    report["ratios"] = ratios(report["results"], systems, benches)
    report["paired"] = paired(samples, systems, benches)
    if args.big:
        report["big"] = run_big(args, [s for s in systems if s in ("ours", "dask")])
    return report


def run_big(args, systems: list[str]) -> list[dict]:
    """big_graphs.py's scenarios, by running it (not a copy of its code): an N-task map and an
    N-task dask graph per system, each on a fresh cluster of --workers workers. As a script of
    its own its task functions live in __main__ and travel by value, which dask needs: its
    scheduler unpickles graphs, and could not import a benchmark module by reference."""
    import subprocess
    import tempfile
    if not systems:
        return []
    with tempfile.TemporaryDirectory(prefix="throughput-big-") as tmp:
        out = os.path.join(tmp, "big.json")
        cmd = [sys.executable, str(Path(__file__).with_name("big_graphs.py")), "--tasks", str(args.big),
               "--workers", str(args.workers), "--systems", ",".join(systems), "--timeout", str(args.big_timeout),
               "--dask-timeout", str(args.big_dask_timeout), "--json", out]
        log(args, f"big: {' '.join(cmd[1:])}")
        proc = subprocess.run(cmd, stdout=None if not args.quiet else subprocess.DEVNULL)
        if proc.returncode != 0 or not os.path.exists(out):
            return [{"system": ",".join(systems), "scenario": "map,graph", "tasks": args.big,
                     "outcome": f"big_graphs.py failed (exit {proc.returncode})"}]
        with open(out) as f:
            return json.load(f)["results"]


def _git_state() -> str:
    import subprocess
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parents[1],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _versions(systems) -> dict:
    out = {}
    if any(s.startswith(("dask", "dist")) for s in systems):
        import dask
        import distributed
        out["dask"], out["distributed"] = dask.__version__, distributed.__version__
    if any(s.startswith("ours") or s in deployed.SYSTEMS for s in systems):
        try:
            from importlib.metadata import version
            out["hpc_cluster"] = version("hpc-cluster")
        except Exception:
            out["hpc_cluster"] = "source"
        out["hpc_cluster_git"] = _git_state()      # "-dirty": uncommitted changes were measured
    return out


def log(args, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def _goal(value: float | None, goal: float, at_least: bool) -> str:
    if value is None:
        return ""
    met = value >= goal if at_least else value <= goal
    return f"goal {'>=' if at_least else '<='} {goal:,}: {'met' if met else 'NOT met'}"


def format_table(report: dict) -> str:
    cfg = report["config"]
    systems = list(report["results"])
    lines = [f"workers={cfg['workers']} threads/worker={cfg['threads']} repeat={cfg['repeat']} "
             f"cpus={report['machine']['cpus']} load before={report['machine']['load_before']} "
             f"after={report['machine']['load_after']}", ""]
    head = f"{'benchmark':34s} {'system':11s} {'tasks':>6s} {'best tasks/s':>13s} {'median tasks/s':>15s} " \
           f"{'best us/task':>13s} {'median us/task':>15s}"
    lines += [head, "-" * len(head)]
    for b, n in cfg["sizes"].items():
        for s in systems:
            r = report["results"][s][b]
            goal = ""
            if b == "map" and s.startswith("ours"):
                goal = "  " + _goal(r["best_tasks_per_s"], GOALS["map_tasks_per_s"], True) + " tasks/s"
            elif b == "chain" and s.startswith("ours"):
                goal = "  " + _goal(r["best_us_per_task"], GOALS["chain_us_per_task"], False) + " us/task"
            lines.append(f"{DESCRIPTIONS[b].format(n=n):34s} {s:11s} {r['tasks']:6d} {r['best_tasks_per_s']:13,.0f} "
                         f"{r['median_tasks_per_s']:15,.0f} {r['best_us_per_task']:13,.1f} "
                         f"{r['median_us_per_task']:15,.1f}{goal}")
        ratio = report.get("ratio_ours_over_dask", {}).get(b)
        if ratio:
            lines.append(f"{'':34s} {'ours/dask':>13s} best {ratio['best']:.2f}x, median {ratio['median']:.2f}x")
        for name, per_bench in (report.get("ratios") or {}).items():
            r = per_bench[b]
            lines.append(f"{'':34s} {name} tasks/s: best {r['best']:.2f}x, median {r['median']:.2f}x")
    for name, per_bench in (report.get("paired") or {}).items():
        lines += ["", f"paired by repetition, {name} (speed over 1: faster; CPU over 1: more CPU per task)"]
        for b, r in per_bench.items():
            cpu = f", CPU median {r['cpu_median']:.3f} mean {r['cpu_mean']:.3f}" if "cpu_median" in r else ""
            lines.append(f"  {b:6s} {r['pairs']} pairs: speed median {r['speed_median']:.3f} "
                         f"mean {r['speed_mean']:.3f}{cpu}")
    lines += ["", "CPU us per task, per process (psutil user+sys over the median run; nannies: the workers' "
              "nannies; client: this process)"]
    head = f"{'benchmark':10s} {'system':11s} {'scheduler':>10s} {'workers':>9s} {'nannies':>9s} {'client':>9s} " \
           f"{'total':>9s} {'sched s/1k tasks':>17s}"
    lines += [head, "-" * len(head)]
    for b in cfg["sizes"]:
        for s in systems:
            r = report["results"][s][b]
            c = r.get("cpu_us_per_task")
            if not c:
                continue
            sched = c.get("scheduler")
            client = c.get("client")
            if sched is None:                     # dask's LocalCluster: one process for both
                sched, client = None, c.get("client+scheduler")
            cell = (lambda v: f"{v:,.0f}" if v is not None else "(in client)")
            goal = "  " + _goal(c["total"], GOALS["cpu_us_per_task"], False) + " us" if s.startswith("ours") else ""
            lines.append(f"{b:10s} {s:11s} {cell(sched):>10s} {c.get('workers', 0):9,.0f} {c.get('nannies', 0):9,.0f} "
                         f"{cell(client):>9s} {c['total']:9,.0f} {r.get('scheduler_cpu_s_per_1000_tasks', 0):17.3f}"
                         f"{goal}")
    if report.get("memory"):
        lines += ["", "Memory after the runs (RSS, MiB; scheduler peak: its VmHWM; dask-local: the client's "
                      "process holds the scheduler)"]
        head = f"{'system':11s} {'scheduler':>10s} {'sched peak':>11s} {'workers':>9s} {'nannies':>9s}"
        lines += [head, "-" * len(head)]
        mib = (lambda v: f"{v / 2**20:,.0f}" if v is not None else "-")
        for s, m in report["memory"].items():
            sched = m.get("scheduler", m.get("client+scheduler"))
            lines.append(f"{s:11s} {mib(sched):>10s} {mib(m.get('scheduler_peak')):>11s} "
                         f"{mib(m.get('workers')):>9s} {mib(m.get('nannies')):>9s}")
    if report.get("big"):
        lines += ["", f"Big submissions (big_graphs.py; scheduler peak RSS over its start, per task: goal "
                      f"<= {GOALS['rss_bytes_per_task']:,} B per waiting task)"]
        head = f"{'scenario':8s} {'system':7s} {'tasks':>10s} {'submit s':>9s} {'run s':>8s} {'tasks/s':>8s} " \
               f"{'B/task':>7s}  outcome"
        lines += [head, "-" * len(head)]
        for r in report["big"]:
            per = r.get("rss_per_task_bytes")
            goal = f" ({_goal(per, GOALS['rss_bytes_per_task'], False)})" if per is not None and r["system"] == "ours" else ""
            lines.append(f"{r['scenario']:8s} {r['system']:7s} {r['tasks']:10,d} {r.get('submit_s', '-')!s:>9s} "
                         f"{r.get('run_s', '-')!s:>8s} {r.get('tasks_per_s', '-')!s:>8s} {per if per is not None else '-'!s:>7s}"
                         f"  {r.get('outcome', '')}{goal}")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="worker processes per cluster (default 2)")
    p.add_argument("--threads", type=int, default=1, help="threads per worker (default 1)")
    p.add_argument("--repeat", type=int, default=3, help="runs per benchmark and system (default 3)")
    p.add_argument("--quick", action="store_true", help="small sizes (2,000 / 512 / 200) for a smoke test")
    p.add_argument("--map", type=int, help="tasks in the map benchmark")
    p.add_argument("--tree", type=int, help="leaves in the tree reduction")
    p.add_argument("--chain", type=int, help="length of the dependent chain")
    p.add_argument("--benchmarks", default="map,tree,chain", help="comma-separated subset to run")
    p.add_argument("--systems", default="ours,dask", help="comma-separated: ours, dask, dask-local (dask's "
                   "LocalCluster, its scheduler in this process), ours-tls, dask-tls "
                   "(TLS on every connection), ours-journal (the scheduler keeps its journal), ours-nodash (no dashboard), "
                   "ours-viewed (the dashboard polled every 2 s as an open page does), " + deployed.DESCRIPTION
                   + "; default ours,dask")
    p.add_argument("--pause", type=float, default=0.5, help="seconds to idle between runs (default 0.5)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    p.add_argument("--big", type=int, metavar="N", default=0,
                   help="also run big_graphs.py's N-task map and N-task dask graph (ours and dask, fresh clusters; "
                        "1,000,000 takes most of an hour on 2 cores); off by default")
    p.add_argument("--big-timeout", type=float, default=1800.0, help="seconds our big run may take after its submission")
    p.add_argument("--big-dask-timeout", type=float, default=480.0,
                   help="seconds dask's big run may take after its submission (default 480)")
    p.add_argument("--quiet", action="store_true", help="no per-run progress on stderr")
    args = p.parse_args(argv)
    if args.repeat < 1 or args.workers < 1 or args.threads < 1:
        p.error("--repeat, --workers and --threads must be at least 1")
    if any(n is not None and n < 2 for n in (args.map, args.tree, args.chain)):
        p.error("--map, --tree and --chain must be at least 2")
    return args


def run_main(parse_args, run, format_table, argv=None) -> int:
    """A benchmark script's main: arguments, SIGTERM unwinds (the clusters close), the
    table on stdout, the JSON if asked. Shared with transfer.py."""
    args = parse_args(argv)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)
    report = run(args)
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        log(args, f"wrote {args.json}")
    return 0


def main(argv=None) -> int:
    return run_main(parse_args, run, format_table, argv)


if __name__ == "__main__":
    sys.exit(main())
