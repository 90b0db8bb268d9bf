"""What one open dashboard page costs the scheduler, in its own CPU time (issue 17, point 6).

    python benchmarks/dashboard_cost.py                 # 20,000 tasks held, 100 rounds
    python benchmarks/dashboard_cost.py --tasks 100000

A LocalCluster (2 workers x 1 thread) runs a map of `--tasks` tasks and keeps the results (so
the scheduler knows that many tasks, and the task stream is full); then, with the cluster
otherwise idle, every /api endpoint is fetched `--rounds` times and the scheduler process's
CPU time (user + system, psutil) is read before and after each endpoint's requests. CPU time,
not wall time: other load on the machine does not change it much, where it swamps
throughput comparisons. The answer: CPU milliseconds per request, and the share of one core a
page that asks for everything every 2 s takes.
"""

from __future__ import annotations

import argparse
import http.client
import sys
import time
import urllib.parse

import psutil

PATHS = ("/api/workers", "/api/tasks", "/api/jobs", "/api/deaths")


def noop(x):
    return x


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20_000, help="tasks the scheduler holds (default 20,000)")
    p.add_argument("--rounds", type=int, default=100, help="requests per endpoint (default 100)")
    args = p.parse_args(argv)
    from hpc_cluster import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        kept = client.map(noop, range(args.tasks))
        client.gather(kept)
        url = urllib.parse.urlsplit(cluster.dashboard_link)
        token = urllib.parse.parse_qs(url.query)["token"][0]
        sched = psutil.Process(cluster._scheduler.pid)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)

        def fetch(path: str) -> int:
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise SystemExit(f"{path}: {r.status}")
            return len(body)

        def cpu() -> float:
            t = sched.cpu_times()
            return t.user + t.system

        for path in PATHS:                      # warm: the prefix map is built once
            fetch(path)
        idle_start = cpu()
        time.sleep(3.0)
        idle_rate = (cpu() - idle_start) / 3.0  # the scheduler's own ticking (heartbeats), per second
        print(f"{args.tasks:,} tasks held; scheduler CPU while idle: {idle_rate * 2e3:.1f} ms per 2 s")
        total = 0.0
        for path in PATHS:
            size = fetch(path)
            # /api/tasks reuses its per-prefix counts for 1 s: its requests are spaced past that,
            # so each one pays for a fresh count, as a page refreshing every 2.5 s does.
            spaced = path == "/api/tasks"
            rounds = min(args.rounds, 20) if spaced else args.rounds
            before, t0 = cpu(), time.perf_counter()
            for _ in range(rounds):
                if spaced:
                    time.sleep(1.05)
                fetch(path)
            wall = time.perf_counter() - t0
            used = max(0.0, cpu() - before - idle_rate * wall) / rounds
            total += used
            print(f"{path:14s} {size / 1024:8.1f} KiB  {used * 1e3:6.2f} ms CPU per request "
                  f"({rounds} requests, the idle ticking taken out)")
        print(f"a page asking for all four every 2 s: {total * 1e3:.1f} ms of scheduler CPU per 2 s, "
              f"{total / 2.0:.2%} of one core")
        del kept
    return 0


if __name__ == "__main__":
    sys.exit(main())
