"""1,000 light workers across the bridge (issue 33, point 6): our scheduler on the login node,
our workers on the multi-node cluster's nodes, dask.distributed side by side where its
workers fit in memory.

    python benchmarks/many_nodes.py                                 # 100,500,1000; ours then dask
    python benchmarks/many_nodes.py --counts 20,40 --quick          # a smoke run
    python benchmarks/many_nodes.py --loopback --systems ours       # without the multi-node cluster

Across the bridge (the default when tests/multinode/cluster.sh's nodes are up: network namespaces
hpcn1..hpcn4 at 10.77.0.11-14, the login node 10.77.0.1 on bridge hpcmnbr0), the scheduler
listens on 10.77.0.1 and the workers are started directly inside the nodes' network namespaces
(`nsenter --net=/var/run/netns/hpcnK`), the count shared among the nodes: every message between
them crosses the bridge. (Not as SLURM jobs: the measure is the scheduler's, and a job's start
adds SLURM's own seconds.) The nodes are namespaces of this one machine: the workers still share
its 2 cores with the scheduler; --idle-workers puts them in an idle CPU group, as on real nodes.

Ours: one launcher per node, `python -m hpc_cluster.worker --nworkers K --no-nanny --nthreads 1`,
which imports once and forks its K workers (worker/forked.py). dask: `dask worker --no-nanny`
processes (dask's --nworkers needs a nanny per worker), started the same way on the nodes.

Reported per system and count (many_workers.py measures; see its docstring), and in addition:
  memory     mean RSS / PSS / USS of 20 workers (forked ones share most of their pages: USS is
             what each one adds)
  heartbeats heartbeats the idle scheduler received per second (changes of the workers' last-seen
             times, asked 4 times a second after the idle CPU was measured)
  register   the second client's answers while the workers register, as well as during the maps
Then dask / ours ratios for every count both ran.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time

import psutil

import cluster_procs       # benchmarks/ is on sys.path when run as a script
import many_workers as MW

NODES = {"hpcn1": "10.77.0.11", "hpcn2": "10.77.0.12", "hpcn3": "10.77.0.13", "hpcn4": "10.77.0.14"}
LOGIN = "10.77.0.1"
GUESS_USS = {"ours": 10e6, "dask": 60e6}        # per worker, before one was measured


def bridge_up() -> bool:
    """The multi-node cluster's namespaces exist and this host holds the login node's address."""
    here = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    return LOGIN in here and all(os.path.exists(f"/var/run/netns/{n}") for n in NODES)


def on_node(node: str | None, cmd: list[str]) -> list[str]:
    return ["nsenter", f"--net=/var/run/netns/{node}", *cmd] if node else cmd


def shares(n: int, k: int) -> list[int]:
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


class OursOnNodes(cluster_procs.OurProcesses):
    """Our scheduler on `host`, a launcher of light workers per node."""

    def __init__(self, stack, host: str, nodes: list[str | None]):
        super().__init__(stack, scheduler_args=("--host", host))
        self.nodes = nodes

    def start_workers(self, n: int, threads: int = 1, nanny: bool = False, extra: tuple = (),
                      idle: bool = False) -> None:
        for node, k in zip(self.nodes, shares(n, len(self.nodes))):
            cmd = [sys.executable, "-m", "hpc_cluster.worker", "--scheduler", self.address, "--nworkers", str(k),
                   "--no-nanny", "--nthreads", str(threads), "--name", node or "local", "--log-level", "WARNING",
                   "--host", "0.0.0.0" if node else "127.0.0.1", "--owner-pid", str(os.getpid())]   # end with us
            self.workers.append(subprocess.Popen(on_node(node, cmd), env=self.env, stdout=self.log, stderr=self.log,
                                                 preexec_fn=self._idle_group().enter if idle else None))

    def worker_pids(self) -> list[int]:
        out = []
        for launcher in self.workers:
            with contextlib.suppress(psutil.Error):
                out += [c.pid for c in psutil.Process(launcher.pid).children()]
        return out


class DaskOnNodes(cluster_procs.DaskProcesses):
    """dask's scheduler on `host`, its workers as processes on the nodes, round robin."""

    def __init__(self, stack, host: str, nodes: list[str | None]):
        super().__init__(stack, host=host)
        self.nodes = nodes

    def start_workers(self, n: int, threads: int = 1, nanny: bool = False, memory_limit: str = "0",
                      idle: bool = False) -> None:
        for i in range(n):
            node = self.nodes[i % len(self.nodes)]
            cmd = [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", self.scheduler_file,
                   "--nthreads", str(threads), "--memory-limit", memory_limit, "--no-nanny", "--no-dashboard",
                   "--host", NODES[node] if node else "127.0.0.1"]
            self.workers.append(subprocess.Popen(on_node(node, cmd), env=self.env, stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.DEVNULL,
                                                 preexec_fn=self._idle_group().enter if idle else None))

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.workers]       # nsenter execs the worker: the same process


def run_count(system: str, n: int, args) -> dict:
    nodes = list(NODES) if args.across_bridge else [None] * 4
    host = LOGIN if args.across_bridge else "127.0.0.1"
    out: dict = {"system": system, "workers": n, "where": "across the bridge" if args.across_bridge else "loopback"}
    with contextlib.ExitStack() as stack:
        if system == "ours":
            procs = OursOnNodes(stack, host, nodes)
            address, ping_env = procs.address, dict(os.environ, BENCH_SECRET=procs.secret.hex())
        else:
            import logging
            logging.getLogger("distributed").setLevel(logging.ERROR)
            procs = DaskOnNodes(stack, host, nodes)
            address, ping_env = procs.scheduler_file, dict(os.environ)
        pinger = MW.Pinger(system, address, ping_env)     # answers while the workers register, too
        t0 = time.perf_counter()
        procs.start_workers(n, threads=1, nanny=False, idle=args.idle_workers)
        if args.idle_workers:
            out["idle_workers"] = procs.idle_group.why or "one idle CPU cgroup (cpu.idle) + SCHED_IDLE"
        return MW.measure(system, n, procs, stack, address, ping_env, t0, args, out,
                          worker_pids=procs.worker_pids, pinger=pinger)


def fits(system: str, n: int, per_worker: dict) -> tuple[bool, str]:
    need = n * per_worker.get(system, GUESS_USS[system]) * 1.15 + MW.RESERVE
    avail = psutil.virtual_memory().available
    return need <= avail, f"needs ~{need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available"


def _lat(x: dict) -> str:
    la = (x or {}).get("latency") or {}
    if not la.get("samples"):
        return "-"
    return f"{la['median_ms']:.1f} / {la['max_ms']:.1f} ms ({la['over_50ms']} of {la['samples']})"


def _num(x: dict, key: str, unit: str = "") -> str:
    return f"{x[key]:,}{unit}" if x and key in x else "-"


def format_markdown(report: dict) -> str:
    lines = ["| workers | system | register | memory RSS / PSS / USS | idle sched CPU | heartbeats/s | "
             "no-op tasks/s | sched CPU/no-op | sleep(0.1) tasks/s (ideal) | sched CPU/sleep | "
             "answers med / max (over 50 ms of all): registering | sleep map | no-op map | outcome |",
             "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|---|"]
    for r in report["results"]:
        s, z = r.get("sleep") or {}, r.get("noop") or {}
        mem = (f"{r['worker_rss_mb']} / {r['worker_pss_mb']} / {r['worker_uss_mb']} MB"
               if "worker_uss_mb" in r else "-")
        lines.append(f"| {r['workers']} | {r['system']} | {_num(r, 'register_s', ' s')} | {mem} | "
                     f"{_num(r, 'idle_cpu_per_s', ' s/s')} | {_num(r, 'heartbeats_per_s')} | "
                     f"{_num(z, 'tasks_per_s')} | {_num(z, 'scheduler_cpu_us_per_task', ' us')} | "
                     f"{_num(s, 'tasks_per_s')} ({_num(s, 'ideal_tasks_per_s')}) | "
                     f"{_num(s, 'scheduler_cpu_us_per_task', ' us')} | {_lat(r.get('register'))} | {_lat(s)} | "
                     f"{_lat(z)} | {r.get('outcome', '')} |")
    return "\n".join(lines)


RATIOS = (("register", lambda r: r.get("register_s")), ("idle sched CPU", lambda r: r.get("idle_cpu_per_s")),
          ("sched CPU/no-op", lambda r: (r.get("noop") or {}).get("scheduler_cpu_us_per_task")),
          ("sched CPU/sleep", lambda r: (r.get("sleep") or {}).get("scheduler_cpu_us_per_task")),
          ("no-op tasks/s", lambda r: (r.get("noop") or {}).get("tasks_per_s")),
          ("sleep tasks/s", lambda r: (r.get("sleep") or {}).get("tasks_per_s")),
          ("worker USS", lambda r: r.get("worker_uss_mb")))


def format_ratios(report: dict) -> str:
    """dask / ours for every count both completed (above 1: ours smaller; for tasks/s, dask faster)."""
    by = {(r["workers"], r["system"]): r for r in report["results"]}
    lines = []
    for n in sorted({r["workers"] for r in report["results"]}):
        ours, dask = by.get((n, "ours")), by.get((n, "dask"))
        if not ours or not dask or ours.get("outcome") != "completed" or dask.get("outcome") != "completed":
            continue
        parts = []
        for name, get in RATIOS:
            a, b = get(ours), get(dask)
            if a and b:
                parts.append(f"{name} {b / a:.2f}x")
        lines.append(f"dask / ours at {n} workers: " + ", ".join(parts))
    return "\n".join(lines) or "no count ran on both systems"


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--ping":
        return MW.ping_main(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", default="100,500,1000", help="worker counts (default 100,500,1000)")
    p.add_argument("--systems", default="ours,dask", help="ours, dask or both (default)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--across-bridge", action="store_true", default=None,
                       help="scheduler on 10.77.0.1, workers in the nodes' namespaces (default when they are up)")
    where.add_argument("--loopback", dest="across_bridge", action="store_false", help="everything on 127.0.0.1")
    p.add_argument("--sleep-rounds", type=int, default=5, help="sleep(0.1) tasks per worker (default 5)")
    p.add_argument("--noop-tasks", type=int, default=20_000, help="no-op tasks (default 20,000)")
    p.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured (default 10)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any one step may take (default 300)")
    p.add_argument("--idle-workers", action="store_true", help="workers in one idle CPU group (as root): the "
                   "scheduler and the clients first, as when the workers are on machines of their own")
    p.add_argument("--quick", action="store_true", help="1 sleep round, 2,000 no-op tasks, 3 s idle")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--profile", metavar="DIR", help="sample the scheduler with py-spy while the tasks run")
    args = p.parse_args(argv)
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # clean up (the ExitStacks) when told to stop
    args.ours_scheduler_from = None
    if args.across_bridge is None:
        args.across_bridge = bridge_up()
    elif args.across_bridge and not bridge_up():
        p.error("the multi-node cluster's namespaces are not up: `bash tests/multinode/cluster.sh up` (as root), "
                "or run with --loopback")
    if args.quick:
        args.sleep_rounds, args.noop_tasks, args.idle = 1, 2_000, 3.0
    report = MW.run_counts(args, run_count, fits, "worker_uss_mb")   # USS: what each worker adds
    print(f"{'across the bridge (nsenter into hpcn1-4)' if args.across_bridge else 'loopback'}; "
          f"cpus={report['machine']['cpus']} load before={report['machine']['load_before']} "
          f"after={report['machine']['load_after']}\n")
    print(format_markdown(report))
    print()
    print(format_ratios(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
