"""`hpc-cluster demo`: the README's first command. Work done, then a worker death explained."""

from __future__ import annotations

import random
import sys
import time


def _sample(seed: int, n: int = 200_000) -> int:
    rng = random.Random(seed)
    return sum(1 for _ in range(n) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)


def _add(a: int, b: int) -> int:
    return a + b


def _crash_in_c_extension(x: int) -> int:
    import ctypes
    ctypes.string_at(0)          # reads address 0: SIGSEGV, as a buggy C extension would
    return x


def run(n_workers: int = 2, out=sys.stdout) -> int:
    from .. import Client, KilledWorker, LocalCluster

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    say("hpc-cluster demo: a LocalCluster on this machine (no batch system needed)")
    t0 = time.time()
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, memory_limit="2GB") as cluster, \
            Client(cluster) as client:
        say(f"  scheduler {cluster.scheduler_address}, {n_workers} workers with a nanny each "
            f"(started in {time.time() - t0:.1f} s)")

        say("\n1. Estimate pi with 64 Monte Carlo tasks, summed by a tree of tasks")
        t1 = time.time()
        parts = client.map(_sample, range(64))
        while len(parts) > 1:
            parts = [client.submit(_add, *parts[i:i + 2]) if i + 1 < len(parts) else parts[i]
                     for i in range(0, len(parts), 2)]
        hits = parts[0].result()
        say(f"   pi ~ {4 * hits / (64 * 200_000):.5f}  (127 tasks in {time.time() - t1:.2f} s)")

        say("\n2. A task that segfaults (like a buggy C extension), next to 20 healthy tasks")
        healthy = client.map(_add, range(20), range(20))
        bad = client.submit(_crash_in_c_extension, 1)
        try:
            bad.result(timeout=120)
            say("   unexpected: the crashing task returned")
            return 1
        except KilledWorker as exc:
            say(f"   KilledWorker, cause={exc.cause!r}:")
            for line in str(exc).splitlines():
                say(f"     {line}")
        ok = client.gather(healthy)
        say(f"   the 20 healthy tasks all finished: {ok == [2 * i for i in range(20)]}")

        say("\n3. Every worker death the scheduler saw, with its evidence (client.deaths())")
        for d in client.deaths():
            say(f"   {d['name']:<10} {d['cause']:<16} blamed={str(d['blame']):<5} {d['text']}")
            for fact in d.get("evidence") or []:
                say(f"   {'':<10} {fact}")
    say(f"\ndone in {time.time() - t0:.1f} s")
    return 0
