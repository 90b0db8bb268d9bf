"""dask collections on hpc_cluster vs dask.distributed: same machine, one run, interleaved.

    python benchmarks/collections.py                 # every workload, 2 workers x 1 thread
    python benchmarks/collections.py --quick         # smaller sizes: a smoke run
    python benchmarks/collections.py --only a,d      # some workloads
    python benchmarks/collections.py --json out.json

Workloads (issue 13, point 7), each run once per system, ours then distributed:

  a  (x + x.T).mean(axis=0).sum() on a 20000 x 20000 random array in 2000 x 2000 chunks
  b  a 1.5 GB array rechunked from rows to columns, then summed
  c  groupby-mean of a 10M-row dataframe in 20 partitions
  d  5,000 delayed tasks of ~1 ms, summed
  e  persist 1.5 x the workers' memory, then reduce it (workers of 1 GiB each): it must
     finish, with no worker death

Reported: wall time and the peak RSS of any worker process (sampled at 20 Hz with psutil,
the same way for both), and ours/distributed ratios. Both clusters run 2 worker processes
of 1 thread under a nanny; distributed's dashboard is off. Each system's Client is dask's
default scheduler while its workload runs, so the workloads are plain dask code.

Warm-up: before the timed run, each fresh cluster runs the workload's --quick version once.
Without it the comparison was not of the engines: distributed starts its workers with
multiprocessing's spawn, which imports this script (and so numpy and dask.array) into every
worker before the clock starts, while our workers import them inside the first task (0.5 s
for dask.array, 0.8 s for dask.dataframe and pandas, per worker, on this machine).
`--cold` times the first run instead. `--repeat N` runs each pair N times, interleaved
(ours, distributed, ours, ...), each time on fresh clusters, and reports the median.

Both engines as hpc-cluster deploys them (issue 32, point 8; deployed.py): `--systems
ours-slurm,dist-slurm` runs each workload on SLURMCluster() and on SLURMCluster(engine=
"distributed"), 2 one-process jobs of 1 core each (memory per job: --job-memory, or 1GiB for
(e)), the user's Client ours or distributed's. Every system after the first is compared with
the first, one table per pair; deaths are our records on either engine.

    python benchmarks/collections.py --quick --systems ours-slurm,dist-slurm,distributed
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import deployed  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

GiB = 2**30


# -- workloads: plain dask code, run on whichever client is the default -------------------
def work_a(q):
    n, c = (20_000, 2_000) if not q else (6_000, 1_000)
    x = da.random.random((n, n), chunks=(c, c))
    return float((x + x.T).mean(axis=0).sum().compute())


def work_b(q):
    rows = 1.5e9 / 8 if not q else 2e8 / 8
    n = int(rows ** 0.5)
    x = da.random.random((n, n), chunks=(n // 10, n))          # row blocks
    return float(x.rechunk((n, n // 10)).sum().compute())      # to column blocks


def work_c(q):
    import dask.dataframe as dd
    import pandas as pd
    rows = 10_000_000 if not q else 1_000_000
    parts = 20

    def part(i):
        rng = np.random.default_rng(i)
        return pd.DataFrame({"k": rng.integers(0, 1000, rows // parts), "v": rng.random(rows // parts)})
    meta = pd.DataFrame({"k": np.array([], dtype=np.int64), "v": np.array([], dtype=float)})
    df = dd.from_delayed([dask.delayed(part)(i) for i in range(parts)], meta=meta)
    return float(df.groupby("k")["v"].mean().compute().sum())


def _one_ms(i):
    t = time.perf_counter() + 0.001
    while time.perf_counter() < t:
        pass
    return i


def work_d(q):
    n = 5_000 if not q else 1_000
    tasks = [dask.delayed(_one_ms)(i) for i in range(n)]
    return float(dask.delayed(sum)(tasks).compute())


def work_e(q):
    total = 3 * GiB if not q else GiB // 2               # 1.5 x 2 workers of 1 GiB (quick: less)
    chunk = 32 * 2**20 // 8                               # 32 MiB chunks
    x = da.random.random((total // 8,), chunks=chunk)
    (xp,) = dask.persist(x)
    return float(xp.sum().compute())


WORKLOADS = {"a": work_a, "b": work_b, "c": work_c, "d": work_d, "e": work_e}
SMALL_WORKERS = {"e": "1GiB"}                           # per worker; others: the machine's share


# -- the two systems ------------------------------------------------------------------------
@contextlib.contextmanager
def ours(memory: str | None):
    from hpc_cluster import Client, LocalCluster
    kw = {"memory_limit": memory} if memory else {}
    with LocalCluster(n_workers=2, threads_per_worker=1, **kw) as cluster, Client(cluster) as client:
        yield client, lambda: client.deaths()


@contextlib.contextmanager
def theirs(memory: str | None):
    from distributed import Client, LocalCluster
    kw = {"memory_limit": memory} if memory else {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, **kw) as cluster, \
            Client(cluster) as client:
        yield client, lambda: []


@contextlib.contextmanager
def on_batch(system: str, memory: str):
    """One of deployed.py's systems: 2 jobs of one 1-thread worker, `memory` each."""
    with contextlib.ExitStack() as stack:
        d = deployed.start(stack, system, 2, 1, memory=memory)
        yield d.client, d.deaths


class PeakRSS:
    """The largest RSS of the given processes, sampled at 20 Hz in a thread."""

    def __init__(self, pids):
        self.procs = [psutil.Process(p) for p in pids]
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.05):
            for p in self.procs:
                with contextlib.suppress(psutil.Error):
                    self.peak = max(self.peak, p.memory_info().rss)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def worker_pids(client, system: str) -> list[int]:
    if system not in ("ours", "ours-slurm"):   # distributed's scheduler_info() has no pids: ask the workers
        return list(client.run(os.getpid).values())
    info = client.scheduler_info()["workers"].values()
    return [w["pid"] for w in info if w.get("pid")]


def run(system: str, name: str, quick: bool, warm: bool = True, job_memory: str = "4GiB") -> dict:
    if system in deployed.SYSTEMS:
        cluster = on_batch(system, SMALL_WORKERS.get(name) or job_memory)
    else:
        cluster = (ours if system == "ours" else theirs)(SMALL_WORKERS.get(name))
    with cluster as (client, deaths):
        client.wait_for_workers(2, timeout=120)
        pids = worker_pids(client, system)
        assert len(pids) == 2, pids
        if warm:
            WORKLOADS[name](True)
        with PeakRSS(pids) as peak:
            t0 = time.perf_counter()
            try:
                value, error = WORKLOADS[name](quick), None
            except Exception as exc:                    # reported, not fatal: (e) is expected to fail before spilling
                value, error = None, f"{type(exc).__name__}: {str(exc)[:200]}"
            seconds = time.perf_counter() - t0
        return {"system": system, "workload": name, "seconds": seconds, "peak_rss": peak.peak,
                "value": value, "error": error, "deaths": len(deaths())}


def _median_run(runs: list[dict]) -> dict | None:
    """One row for several runs: median time and median peak RSS; errors and deaths of any run."""
    if not runs:
        return None
    mid = lambda xs: sorted(xs)[len(xs) // 2]     # noqa: E731  (the upper median for even counts)
    errors = [r["error"] for r in runs if r["error"]]
    return dict(runs[0], seconds=mid([r["seconds"] for r in runs]), peak_rss=mid([r["peak_rss"] for r in runs]),
                error="; ".join(errors) or None, deaths=sum(r["deaths"] for r in runs))


def _note(r: dict) -> str:
    parts = [r["error"]] if r["error"] else []
    if r["deaths"]:
        parts.append(f"{r['deaths']} worker deaths")
    return f"{r['system']}: " + ", ".join(parts)


def table(results: list[dict], workloads: list[str], base: str, other: str, repeat: int) -> None:
    """`other` against `base`, workload by workload (medians of the repeats)."""
    w = max(len(base), len(other)) + 6
    print(f"\n{'workload':<10}{base + ' s':>{w}}{other + ' s':>{w}}{'speed':>8}{base + ' GiB':>{w}}"
          f"{other + ' GiB':>{w}}{'memory':>8}  notes" + ("   (medians of %d runs each)" % repeat if repeat > 1 else ""))
    for name in workloads:
        o, d = (_median_run([r for r in results if r["workload"] == name and r["system"] == s]) for s in (base, other))
        if not (o and d):
            continue
        speed = d["seconds"] / o["seconds"] if o["seconds"] else float("nan")
        mem = o["peak_rss"] / d["peak_rss"] if d["peak_rss"] else float("nan")
        notes = "; ".join(_note(r) for r in (o, d) if r["error"] or r["deaths"])
        print(f"{name:<10}{o['seconds']:>{w}.1f}{d['seconds']:>{w}.1f}{speed:>7.2f}x{o['peak_rss'] / GiB:>{w}.2f}"
              f"{d['peak_rss'] / GiB:>{w}.2f}{mem:>7.2f}x  {notes}")
    print(f"\nspeed: {other}'s time / {base}'s (above 1: {base} is faster); memory: {base}'s peak worker RSS / "
          f"{other}'s (below 1: {base} uses less)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="a,b,c,d,e")
    p.add_argument("--systems", default="ours,distributed",
                   help="comma-separated: ours, distributed (LocalCluster each), " + deployed.DESCRIPTION
                   + "; each compared with the first")
    p.add_argument("--job-memory", default="4GiB", help="memory per job for the batch systems (not (e))")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--repeat", type=int, default=1, help="runs of each system per workload, interleaved")
    p.add_argument("--cold", action="store_true", help="time the first run on fresh workers (no warm-up)")
    args = p.parse_args(argv)
    results = []
    for name in args.only.split(","):
        for i in range(args.repeat):
            for system in args.systems.split(","):
                print(f"{name} on {system} ({i + 1}/{args.repeat}) ...", file=sys.stderr, flush=True)
                results.append(dict(run(system, name, args.quick, warm=not args.cold, job_memory=args.job_memory),
                                    repeat=i))
                r = results[-1]
                print(f"  {r['seconds']:.2f} s, peak worker RSS {r['peak_rss'] / GiB:.2f} GiB"
                      + (f", ERROR {r['error']}" if r["error"] else "")
                      + (f", {r['deaths']} deaths" if r["deaths"] else ""), file=sys.stderr, flush=True)
    systems = args.systems.split(",")
    for other in systems[1:]:
        table(results, args.only.split(","), systems[0], other, args.repeat)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": {"cpus": os.cpu_count(),
                                                           "memory": psutil.virtual_memory().total},
                                               "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
