"""The scheduler's state machine alone, CPU per task as the worker count grows: no sockets,
no processes, only SchedulerState driven as workers would drive it (issue 19, point 3).

    python benchmarks/placement_cost.py
    PYTHONPATH=/tmp/old python benchmarks/placement_cost.py     # another copy of the package
                                                                # (git archive OLD hpc_cluster | tar -x -C /tmp/old)

Per case: N one-thread workers and 20,000 tasks without inputs, each with a known duration
(0.1 s: root tasks that wait at the scheduler for a free thread, one per worker, as with
sleep(0.1); 0.1 ms: tiny tasks, prefetched up to threads + 2). Every round each busy
worker starts and finishes one task. Printed: the CPU microseconds (process time) the state
machine spent per task, best of --repeat. What grows with N here grows in the real
scheduler too (many_workers.py measures that, with everything else a scheduler does).
"""

from __future__ import annotations

import argparse
import sys
import time

from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.scheduler.state import SchedulerState

F, A = Opaque(b"f"), Opaque(b"a")


def run(workers: int, tasks: int, duration: float) -> float:
    s = SchedulerState(prefetch=2)
    for i in range(workers):
        s.add_worker(f"tcp://w{i:04d}", nthreads=1, now=0)
    keys = [f"f-{i}" for i in range(tasks)]
    specs = [{"key": k, "func": F, "args": A, "deps": [], "priority": 0, "retries": 0, "resources": {},
              "duration": duration} for k in keys]
    t0 = time.process_time()
    s.update_graph("c", specs, keys)
    done = 0
    while done < tasks:
        for addr, msgs in s.take_outbox().items():
            for m in msgs:
                if m["op"] == "compute":
                    s.task_started(addr, m["key"], now=0)
        busy = [(a, next(iter(ws.processing)).key) for a, ws in s.workers.items() if ws.processing]
        for addr, key in busy:
            s.task_finished(addr, key, nbytes=8, duration=duration)
            done += 1
    return (time.process_time() - t0) / tasks * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="2,100,250,500,1000")
    p.add_argument("--tasks", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    import hpc_cluster
    print(f"hpc_cluster from {hpc_cluster.__file__}")
    print(f"{'workers':>7s} {'sleep(0.1)-like us/task':>24s} {'tiny us/task':>13s}")
    for n in (int(x) for x in args.workers.split(",")):
        root = min(run(n, args.tasks, 0.1) for _ in range(args.repeat))
        tiny = min(run(n, args.tasks, 0.0001) for _ in range(args.repeat))
        print(f"{n:7d} {root:24.1f} {tiny:13.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
