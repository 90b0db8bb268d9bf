"""Big submissions: a 1,000,000-task map and a 1,000,000-task dask graph, hpc_cluster and
dask.distributed side by side in one run (issue 14, point 4).

    python benchmarks/big_graphs.py                       # 1,000,000 tasks each, both systems
    python benchmarks/big_graphs.py --tasks 20000         # a smoke run
    python benchmarks/big_graphs.py --json out.json --dask-timeout 900

Per system and scenario, on a fresh cluster (2 worker processes x 1 thread, nannies):

  map    client.map(noop, range(N)), then wait for every future
  graph  a dask graph of N tasks: N - N/1000 leaves (inc i) and N/1000 sums over 1000 leaves
         each, strided so that every sum reads leaves from all over the graph; client.get(...,
         sync=False), then wait for the sums

reported: submit time (until map()/get() returns), run time (from then until all are done),
the scheduler's peak RSS over its RSS before the submission, per task (sampled every 0.25 s,
so a short peak may be missed), its RSS at the first moment it holds every task (most still
waiting), per task, and what happened when a run does not end within --timeout
(the futures done by then; --dask-timeout for dask's, 480 s by default, --timeout for ours). Both schedulers run in a process of their own (dask's started
with `dask scheduler`, its workers with `dask worker --nanny`), so their RSS is theirs alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import threading
import time

import psutil

import cluster_procs      # benchmarks/ is on sys.path when run as a script


def noop(x):
    return x


def inc(x):
    return x + 1


def total(*xs):
    return sum(xs)


def make_graph(n: int) -> tuple[dict, list]:
    sums = max(1, n // 1000)
    leaves = n - sums
    graph = {("leaf", i): (inc, i) for i in range(leaves)}
    for j in range(sums):
        graph[("sum", j)] = (total, *[("leaf", i) for i in range(j, leaves, sums)])
    return graph, [("sum", j) for j in range(sums)]


class PeakRSS:
    """The peak RSS of one process, sampled in a thread."""

    def __init__(self, pid: int, interval: float = 0.25):
        self.proc = psutil.Process(pid)
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self.base = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            self._stop.wait(self.interval)

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        self._thread.join()
        return self.base, self.peak


# -- clusters: (client, scheduler pid) ------------------------------------------------------
def start_ours(stack: contextlib.ExitStack, workers: int):
    from hpc_cluster import Client, LocalCluster
    cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=1, memory_limit="2GB"))
    client = stack.enter_context(Client(cluster, timeout=120))
    return client, cluster._scheduler.pid


def start_dask(stack: contextlib.ExitStack, workers: int):
    # `dask scheduler` and `dask worker --nanny` processes (cluster_procs.py, shared with
    # throughput.py and many_workers.py), so the scheduler's RSS is its own
    return cluster_procs.start_dask(stack, workers, threads=1, nanny=True, memory_limit="2GB", timeout=120)


STARTERS = {"ours": start_ours, "dask": start_dask}


def run_scenario(system: str, scenario: str, n: int, workers: int, timeout: float) -> dict:
    out: dict = {"system": system, "scenario": scenario, "tasks": n}
    with contextlib.ExitStack() as stack:
        client, pid = STARTERS[system](stack, workers)
        if client.submit(inc, 1).result(timeout=60) != 2:
            raise AssertionError("warm-up task returned a wrong value")
        graph = keys = None
        if scenario == "graph":
            graph, keys = make_graph(n)
        rss = PeakRSS(pid)
        t0 = time.perf_counter()
        try:
            if scenario == "map":
                futures = client.map(noop, range(n))
            else:
                futures = client.get(graph, keys, sync=False)
        except Exception as exc:
            out["outcome"] = f"submission failed: {type(exc).__name__}: {exc}"[:300]
            out["rss_base"], out["rss_peak"] = rss.stop()
            return out
        t1 = time.perf_counter()
        out["submit_s"] = round(t1 - t0, 1)
        out.update(_all_known(system, client, pid, n, rss.base))
        done = _wait(futures, timeout, client)
        t2 = time.perf_counter()
        out["rss_base"], out["rss_peak"] = rss.stop()
        out["rss_per_task_bytes"] = round((out["rss_peak"] - out["rss_base"]) / n)
        if done == len(futures):
            out["run_s"] = round(t2 - t1, 1)
            out["total_s"] = round(t2 - t0, 1)
            out["tasks_per_s"] = round(n / (t2 - t0))
            if scenario == "graph":
                got = sum(client.gather(futures))
                leaves = n - len(keys)
                if got != leaves * (leaves + 1) // 2:
                    raise AssertionError(f"graph: wrong sum {got}")
            out["outcome"] = "completed"
        else:
            out["outcome"] = (f"not done after {timeout:.0f} s of running: {done} of {len(futures)} "
                              f"futures done, client {getattr(client, 'status', '?')}")
        del futures
    return out


def _all_known(system: str, client, pid: int, n: int, base: int, timeout: float = 120) -> dict:
    """The scheduler's RSS once it holds every submitted task (the first moment it does; the
    parts may still be arriving when map() returns), per task, and how many were done by then:
    the figure for issue 19's "bytes per waiting task" (the peak also holds every result's record)."""
    def known() -> int:
        if system == "ours":
            return sum(client._lt.run(client._request({"op": "counts"}), 60).values())
        return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    deadline = time.monotonic() + timeout
    while (count := known()) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    rss = psutil.Process(pid).memory_info().rss
    return {"rss_all_known": rss, "known_tasks": count,
            "rss_all_known_per_task_bytes": round((rss - base) / max(count, 1))}


def _wait(futures, timeout: float, client) -> int:
    deadline = time.monotonic() + timeout
    pending = list(futures)
    while pending and time.monotonic() < deadline:
        pending = [f for f in pending if not f.done()]
        if pending and client.status not in ("running", "connecting"):
            break
        time.sleep(0.5)
    return len(futures) - len(pending)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds our run may take after its submission")
    ap.add_argument("--dask-timeout", type=float, default=480.0, help="seconds dask's run may take after its submission")
    ap.add_argument("--systems", default="ours,dask")
    ap.add_argument("--scenarios", default="map,graph")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version(), "load_before": list(os.getloadavg())},
              "config": vars(args), "results": []}
    for scenario in args.scenarios.split(","):
        for system in args.systems.split(","):
            t = time.perf_counter()
            try:
                res = run_scenario(system, scenario, args.tasks, args.workers,
                                   args.dask_timeout if system == "dask" else args.timeout)
            except Exception as exc:
                res = {"system": system, "scenario": scenario, "tasks": args.tasks,
                       "outcome": f"failed: {type(exc).__name__}: {exc}"[:300]}
            res["wall_s"] = round(time.perf_counter() - t, 1)
            report["results"].append(res)
            print(json.dumps(res), flush=True)
    report["machine"]["load_after"] = list(os.getloadavg())
    from importlib.metadata import version
    report["versions"] = {p: version(p) for p in ("hpc-cluster", "distributed", "dask")}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report["versions"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
