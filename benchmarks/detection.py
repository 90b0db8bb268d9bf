"""How fast is a lost worker noticed? hpc-cluster and dask.distributed side by side.

    python benchmarks/detection.py [--repeat 3] [--stop-wait 30]

Two ways to lose a worker, each measured from the signal to the scheduler no longer
listing the worker (as a client sees it):
  SIGKILL  the process dies, its connection closes;
  SIGSTOP  the process hangs with its connection open: only a heartbeat TTL finds it.
Both clusters run with their default settings (ours: heartbeat TTL 5 s; dask: worker-ttl
5 minutes, so its SIGSTOP wait is capped at --stop-wait seconds and shown as '>N').
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time


def _wait_gone(list_workers, address, cap):
    start = time.perf_counter()
    while time.perf_counter() - start < cap:
        if address not in list_workers():
            return time.perf_counter() - start
        time.sleep(0.01)
    return None


def measure(list_workers, pid_of, sig, cap):
    workers = list_workers()
    address = sorted(workers)[0]
    pid = pid_of(address)
    os.kill(pid, sig)
    try:
        return _wait_gone(list_workers, address, cap)
    finally:
        if sig == signal.SIGSTOP:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


def ours(repeat, cap):
    from hpc_cluster import Client, LocalCluster
    out = {"SIGKILL": [], "SIGSTOP": []}
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        for _ in range(repeat):
            with LocalCluster(n_workers=2, threads_per_worker=1, nanny=False) as cluster, Client(cluster) as c:
                info = lambda: c.scheduler_info()["workers"]  # noqa: E731
                out[sig.name].append(measure(info, lambda a: info()[a]["pid"], sig, cap))
    return out


def dask(repeat, cap):
    from distributed import Client, LocalCluster
    out = {"SIGKILL": [], "SIGSTOP": []}
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        for _ in range(repeat):
            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, nanny=False,
                              dashboard_address=None) as cluster, Client(cluster) as c:
                info = lambda: c.scheduler_info(n_workers=-1)["workers"]  # noqa: E731
                pids = c.run(os.getpid)
                out[sig.name].append(measure(info, lambda a: pids[a], sig, cap))
    return out


def fmt(values, cap):
    got = [v for v in values if v is not None]
    if not got:
        return f">{cap:.0f} s"
    text = f"{statistics.median(got):.2f} s"
    if len(got) < len(values):
        text += f" ({len(values) - len(got)} runs >{cap:.0f} s)"
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--stop-wait", type=float, default=30.0, help="cap on waiting for a SIGSTOP'd worker")
    args = p.parse_args(argv)
    a = ours(args.repeat, args.stop_wait)
    b = dask(args.repeat, args.stop_wait)
    print(f"\ndetection latency, median of {args.repeat} (signal -> worker gone from the scheduler)")
    print(f"  {'how the worker is lost':<32} {'hpc-cluster':>14} {'dask.distributed':>20}")
    for sig, label in (("SIGKILL", "SIGKILL (connection closes)"), ("SIGSTOP", "SIGSTOP (hung, connection open)")):
        print(f"  {label:<32} {fmt(a[sig], args.stop_wait):>14} {fmt(b[sig], args.stop_wait):>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
