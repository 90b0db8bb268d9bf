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
nanny. dask's scheduler runs inside this (the client's) process, as dask's LocalCluster
always does; ours runs in its own process. dask's dashboard is turned off; ours serves its
dashboard (on a free port) unless the system is "ours-nodash", and "ours-viewed" polls it.
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
DESCRIPTIONS = {"map": "map(noop, range({n})) + gather",
                "tree": "tree reduction, {n} leaves",
                "chain": "chain of {n} dependent tasks"}


# -- clusters --------------------------------------------------------------------------------
def start_ours(stack: contextlib.ExitStack, workers: int, threads: int, security: bool = False,
               journal: bool = False, dashboard: str | None = ":0", viewer: bool = False):
    from hpc_cluster import Client, LocalCluster
    cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=threads,
                                               security=security or None, journal=journal,
                                               dashboard_address=dashboard))
    client = stack.enter_context(Client(cluster))
    client.wait_for_workers(workers, timeout=60)
    if viewer:
        stack.enter_context(DashboardViewer(cluster.dashboard_link))
    return client


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


def start_dask(stack: contextlib.ExitStack, workers: int, threads: int, security: bool = False):
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
    return client


# "-tls": the same cluster with every connection under TLS (security=True; dask's Security.temporary()).
# "ours-journal": the scheduler keeps its journal (issue 16; LocalCluster(journal=True)).
# "ours-nodash": no dashboard (dashboard_address=None); "ours-viewed": the dashboard (as in "ours")
# with a page open on it, fetching every /api endpoint every 2 s (issue 17's cost).
STARTERS = {"ours": start_ours, "dask": start_dask,
            "ours-nodash": lambda *a: start_ours(*a, dashboard=None),
            "ours-viewed": lambda *a: start_ours(*a, viewer=True),
            "ours-journal": lambda *a: start_ours(*a, journal=True),
            "ours-tls": lambda *a: start_ours(*a, security=True), "dask-tls": lambda *a: start_dask(*a, security=True)}


def warm_up(client) -> None:
    if client.submit(inc, 1).result() != 2:
        raise AssertionError("warm-up task returned a wrong value")


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def summarise(samples: list[tuple[int, float]]) -> dict:
    tasks = samples[0][0]
    times = [s for _, s in samples]
    best, median = min(times), statistics.median(times)
    return {"tasks": tasks, "seconds": [round(t, 4) for t in times],
            "best_s": round(best, 4), "median_s": round(median, 4),
            "best_tasks_per_s": round(tasks / best, 1), "median_tasks_per_s": round(tasks / median, 1),
            "best_us_per_task": round(best / tasks * 1e6, 1), "median_us_per_task": round(median / tasks * 1e6, 1)}


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
              "versions": {}, "results": {}}
    samples: dict[str, dict[str, list]] = {s: {b: [] for b in benches} for s in systems}
    with contextlib.ExitStack() as stack:
        clients = {}
        for s in systems:
            t0 = time.perf_counter()
            clients[s] = STARTERS[s](stack, args.workers, args.threads)
            warm_up(clients[s])
            log(args, f"{s}: cluster up and warm in {time.perf_counter() - t0:.1f} s")
        report["versions"] = _versions(systems)
        for b in benches:
            for rep in range(args.repeat):
                for s in systems:
                    gc.collect()
                    tasks, seconds = BENCHMARKS[b](clients[s], sizes[b])
                    samples[s][b].append((tasks, seconds))
                    log(args, f"{b:5s} rep {rep + 1}/{args.repeat} {s:11s}: {tasks} tasks in {seconds:.3f} s "
                              f"({tasks / seconds:,.0f} tasks/s)")
                    time.sleep(args.pause)          # let releases settle before the next run
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
    return report


def _git_state() -> str:
    import subprocess
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parents[1],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _versions(systems) -> dict:
    out = {}
    if any(s.startswith("dask") for s in systems):
        import dask
        import distributed
        out["dask"], out["distributed"] = dask.__version__, distributed.__version__
    if any(s.startswith("ours") for s in systems):
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


def format_table(report: dict) -> str:
    cfg = report["config"]
    systems = list(report["results"])
    lines = [f"workers={cfg['workers']} threads/worker={cfg['threads']} repeat={cfg['repeat']} "
             f"cpus={report['machine']['cpus']} load before={report['machine']['load_before']} "
             f"after={report['machine']['load_after']}", ""]
    head = f"{'benchmark':34s} {'system':11s} {'tasks':>6s} {'best tasks/s':>13s} {'median tasks/s':>15s} " \
           f"{'best us/task':>13s}"
    lines += [head, "-" * len(head)]
    for b, n in cfg["sizes"].items():
        for s in systems:
            r = report["results"][s][b]
            lines.append(f"{DESCRIPTIONS[b].format(n=n):34s} {s:11s} {r['tasks']:6d} {r['best_tasks_per_s']:13,.0f} "
                         f"{r['median_tasks_per_s']:15,.0f} {r['best_us_per_task']:13,.1f}")
        ratio = report.get("ratio_ours_over_dask", {}).get(b)
        if ratio:
            lines.append(f"{'':34s} {'ours/dask':>13s} best {ratio['best']:.2f}x, median {ratio['median']:.2f}x")
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
    p.add_argument("--systems", default="ours,dask", help="comma-separated: ours, dask, ours-tls, dask-tls "
                   "(TLS on every connection), ours-journal (the scheduler keeps its journal), ours-nodash (no dashboard), "
                   "ours-viewed (the dashboard polled every 2 s as an open page does); default ours,dask")
    p.add_argument("--pause", type=float, default=0.5, help="seconds to idle between runs (default 0.5)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
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
