"""Moving large results: hpc_cluster vs dask.distributed, same machine, same layout.

    python benchmarks/transfer.py                   # 200 MB and 1.2 GB arrays, a 200 MB DataFrame; best of 3
    python benchmarks/transfer.py --quick           # 50 MB array and DataFrame, 2 repetitions
    python benchmarks/transfer.py --json out.json   # also write the numbers as JSON

Each case makes a value on worker A (not timed), then measures two moves:

  w2w     a task on worker B that takes the value as its argument (B fetches it from A)
  gather  the client fetches the value (future.result())

For each: wall time, and the growth of peak RSS (the kernel's VmHWM, reset through
/proc/<pid>/clear_refs before the move) of the sending worker, the receiving worker
and the client process. A process that holds the value once grows by its size; more
means copies. Repetitions are interleaved (ours, dask, ours, ...) so that background
load hits both alike.

Both clusters: 2 worker processes x 1 thread under a nanny, no memory limit (so dask
neither spills nor pauses). Ours pins tasks with resources (A, B), dask with workers=.
dask's client is made with direct_to_workers=True, so that gathers come from the
workers as ours do (by default they pass through dask's scheduler, which here runs in
the client's process: an extra hop and an extra copy in the measured process).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# The helpers both side-by-side benchmarks share (benchmarks/ is on sys.path when run as a script).
from throughput import _git_state, _load, log, run_main


# -- the tasks (module level; cloudpickle ships them by value from __main__) ---------------
def make_array(nbytes: int, seed: int):
    import numpy as np
    x = np.arange(nbytes // 8, dtype=np.float64)
    x += seed                                  # in place: no second array while making it
    return x


def make_frame(nbytes: int, seed: int):
    import numpy as np
    import pandas as pd
    n = nbytes // 24
    return pd.DataFrame({"i": np.arange(n) + seed, "f": np.linspace(0, 1, n), "g": np.arange(n) % 7})


def size_of(value) -> int:
    """Runs on B: touches nothing, so the time is the fetch's."""
    return int(value.nbytes if hasattr(value, "nbytes") else value.memory_usage(index=False).sum())


MAKERS = {"array": make_array, "frame": make_frame}


# -- measuring ---------------------------------------------------------------------------------
def _reset_peak(pid: int) -> int:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")                           # VmHWM := current RSS
    return _status(pid, "VmRSS:")


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


@contextlib.contextmanager
def peaks(pids: dict[str, int], out: dict):
    base = {name: _reset_peak(pid) for name, pid in pids.items()}
    yield
    # max(0, ...): the RSS read just after the reset may already be a page or two above it.
    out.update({name: max(0, _status(pid, "VmHWM:") - base[name]) for name, pid in pids.items()})


class Ours:
    name = "ours"
    security = None

    def __init__(self, stack: contextlib.ExitStack):
        from hpc_cluster import Client, LocalCluster
        cluster = stack.enter_context(LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=0,
                                                   resources={"A": 1}, security=self.security))
        cluster.resources = {"B": 1}           # LocalCluster starts each new worker with its resources
        cluster.scale(2)
        self.client = stack.enter_context(Client(cluster))
        self.client.wait_for_workers(2, timeout=60)
        workers = self.client.scheduler_info()["workers"].values()
        self.pids = {next(iter(w["resources"])): w["pid"] for w in workers}

    def submit(self, func, *args, on: str):
        return self.client.submit(func, *args, resources={on: 1}, pure=False)


class Dask:
    name = "dask"
    tls = False

    def __init__(self, stack: contextlib.ExitStack):
        import logging

        import dask
        from distributed import Client, LocalCluster
        from distributed.security import Security
        logging.getLogger("distributed").setLevel(logging.ERROR)
        stack.enter_context(dask.config.set({"distributed.admin.tick.limit": "1h"}))
        tls = {"security": Security.temporary(), "protocol": "tls://"} if self.tls else {}
        cluster = stack.enter_context(LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                                   dashboard_address=None, memory_limit=0, **tls))
        self.client = stack.enter_context(Client(cluster, direct_to_workers=True, security=tls.get("security")))
        self.client.wait_for_workers(2, timeout=60)
        pids = self.client.run(os.getpid)
        self.addresses = dict(zip("AB", sorted(pids)))
        self.pids = {name: pids[a] for name, a in self.addresses.items()}

    def submit(self, func, *args, on: str):
        return self.client.submit(func, *args, workers=[self.addresses[on]], allow_other_workers=False,
                                  pure=False)


class OursTLS(Ours):          # every connection under TLS (security=True)
    name, security = "ours-tls", True


class DaskTLS(Dask):          # dask's Security.temporary(), tls://
    name, tls = "dask-tls", True


def run_case(system, kind: str, nbytes: int, seed: int) -> dict:
    """One value made on A, moved to B, then to the client; times and peak RSS growths."""
    me = os.getpid()
    value = system.submit(MAKERS[kind], nbytes, seed, on="A")
    system.submit(size_of, value, on="A").result()       # made, and pandas imported on A
    # B imports pandas too before anything is measured (not the transfer's memory).
    system.submit(size_of, system.submit(MAKERS[kind], 4096, seed, on="B"), on="B").result()
    gc.collect()
    out: dict = {}
    w2w: dict = {}
    with peaks({"sender": system.pids["A"], "receiver": system.pids["B"]}, w2w):
        t0 = time.perf_counter()
        got = system.submit(size_of, value, on="B").result()
        out["w2w_s"] = time.perf_counter() - t0
    if got < nbytes * 0.9:
        raise AssertionError(f"{system.name}: B saw {got} bytes, expected about {nbytes}")
    out["w2w_rss"] = w2w
    gathered: dict = {}
    with peaks({"sender": system.pids["A"], "client": me}, gathered):
        t0 = time.perf_counter()
        local = value.result()
        out["gather_s"] = time.perf_counter() - t0
    if size_of(local) < nbytes * 0.9:
        raise AssertionError(f"{system.name}: gathered {size_of(local)} bytes, expected about {nbytes}")
    out["gather_rss"] = gathered
    del local, value
    gc.collect()
    return out


# -- the run -----------------------------------------------------------------------------------
CASES = {"full": [("array", 200 * 10**6), ("array", 1200 * 10**6), ("frame", 200 * 10**6)],
         "quick": [("array", 50 * 10**6), ("frame", 50 * 10**6)]}


def case_name(kind: str, nbytes: int) -> str:
    return f"{'numpy float64' if kind == 'array' else 'DataFrame 3 cols'} {nbytes / 1e6:,.0f} MB"


def run(args) -> dict:
    cases = CASES["quick" if args.quick else "full"]
    systems = [s for s in args.systems.split(",") if s]
    starters = {"ours": Ours, "dask": Dask, "ours-tls": OursTLS, "dask-tls": DaskTLS}
    for s in systems:
        if s not in starters:
            raise SystemExit(f"--systems: unknown system {s!r}; choose from {', '.join(starters)}")
    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version(), "load_before": _load()},
              "config": {"repeat": args.repeat, "quick": bool(args.quick),
                         "cases": [case_name(*c) for c in cases]},
              "versions": _versions(systems), "results": {}}
    samples: dict = {s: {case_name(*c): [] for c in cases} for s in systems}
    with contextlib.ExitStack() as stack:
        clusters = {}
        for s in systems:
            t0 = time.perf_counter()
            clusters[s] = starters[s](stack)
            log(args, f"{s}: cluster up in {time.perf_counter() - t0:.1f} s")
        seed = 0
        for kind, nbytes in cases:
            name = case_name(kind, nbytes)
            for rep in range(args.repeat):
                for s in systems:
                    seed += 1
                    r = run_case(clusters[s], kind, nbytes, seed)
                    samples[s][name].append(r)
                    log(args, f"{name} rep {rep + 1}/{args.repeat} {s:4s}: w2w {r['w2w_s']:.2f} s "
                              f"(sender +{_mb(r['w2w_rss']['sender'])}, receiver +{_mb(r['w2w_rss']['receiver'])}), "
                              f"gather {r['gather_s']:.2f} s (sender +{_mb(r['gather_rss']['sender'])}, "
                              f"client +{_mb(r['gather_rss']['client'])})")
                    time.sleep(args.pause)
    report["machine"]["load_after"] = _load()
    for s in systems:
        report["results"][s] = {name: summarise(rs, nbytes)
                                for (kind, nbytes), (name, rs) in zip(cases, samples[s].items())}
    if "ours" in systems and "dask" in systems:
        report["ratios"] = {name: ratios(report["results"]["ours"][name], report["results"]["dask"][name])
                            for name in samples["ours"]}
    return report


def summarise(rs: list[dict], nbytes: int) -> dict:
    out = {"bytes": nbytes}
    for move, procs in (("w2w", ("sender", "receiver")), ("gather", ("sender", "client"))):
        times = [r[f"{move}_s"] for r in rs]
        out[move] = {"seconds": [round(t, 3) for t in times], "best_s": round(min(times), 3),
                     "median_s": round(statistics.median(times), 3),
                     "best_MB_per_s": round(nbytes / min(times) / 1e6, 1),
                     # the largest growth seen: a copy made even once shows
                     "peak_rss_growth": {p: max(r[f"{move}_rss"][p] for r in rs) for p in procs}}
    return out


def ratios(ours: dict, dask: dict) -> dict:
    """speed: dask's time / ours (above 1: ours is faster); rss: ours / dask (below 1: ours uses
    less), only where dask's process grew by a tenth of the value or more (a ratio of two
    near-zero growths says nothing)."""
    out = {}
    for move in ("w2w", "gather"):
        o, d = ours[move], dask[move]
        out[move] = {"speed_best": round(d["best_s"] / o["best_s"], 2),
                     "speed_median": round(d["median_s"] / o["median_s"], 2),
                     "rss": {p: round(o["peak_rss_growth"][p] / d["peak_rss_growth"][p], 2)
                             if d["peak_rss_growth"][p] >= ours["bytes"] / 10 else None
                             for p in o["peak_rss_growth"]}}
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def _growth(n: int, size: int) -> str:
    """'1,200 MB 1.00x': the growth, and in values held (2.00x: a copy too many)."""
    return f"{_mb(n)} {n / size:.2f}x"


def format_table(report: dict) -> str:
    cfg = report["config"]
    lines = [f"repeat={cfg['repeat']} cpus={report['machine']['cpus']} load before={report['machine']['load_before']} "
             f"after={report['machine']['load_after']}; peak RSS growth is the largest of the repetitions", ""]
    head = (f"{'case':26s} {'move':6s} {'system':6s} {'best s':>7s} {'median s':>9s} {'best MB/s':>10s} "
            f"{'sender +RSS':>16s} {'receiver +RSS':>16s}")
    lines += [head + "   (receiver: worker B for w2w, the client for gather; x: values held)", "-" * len(head)]
    for name in cfg["cases"]:
        for move, recv in (("w2w", "receiver"), ("gather", "client")):
            for s, res in report["results"].items():
                r = res[name][move]
                g, size = r["peak_rss_growth"], res[name]["bytes"]
                lines.append(f"{name:26s} {move:6s} {s:6s} {r['best_s']:7.2f} {r['median_s']:9.2f} "
                             f"{r['best_MB_per_s']:10,.0f} {_growth(g['sender'], size):>16s} "
                             f"{_growth(g[recv], size):>16s}")
            rt = report.get("ratios", {}).get(name, {}).get(move)
            if rt:
                rss = ", ".join(f"{p} {v:.2f}x" for p, v in rt["rss"].items() if v is not None) or "-"
                lines.append(f"{'':26s} {'':6s} ours/dask: speed best {rt['speed_best']:.2f}x, median "
                             f"{rt['speed_median']:.2f}x (above 1: ours faster); peak RSS growth {rss}")
    return "\n".join(lines)


def _versions(systems) -> dict:
    import numpy
    import pandas
    out = {"numpy": numpy.__version__, "pandas": pandas.__version__}
    if any(s.startswith("dask") for s in systems):
        import dask
        import distributed
        out["dask"], out["distributed"] = dask.__version__, distributed.__version__
    if any(s.startswith("ours") for s in systems):
        out["hpc_cluster_git"] = _git_state()      # "-dirty": uncommitted changes were measured
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="runs per case and system (default 3)")
    p.add_argument("--quick", action="store_true", help="50 MB cases only, for a smoke test")
    p.add_argument("--systems", default="ours,dask", help="comma-separated: ours, dask, ours-tls, dask-tls "
                   "(TLS on every connection; default ours,dask)")
    p.add_argument("--pause", type=float, default=0.5, help="seconds to idle between runs (default 0.5)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    p.add_argument("--quiet", action="store_true", help="no per-run progress on stderr")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if not Path("/proc/self/clear_refs").exists():
        p.error("peak RSS is read from /proc/<pid>/status and reset through /proc/<pid>/clear_refs: Linux only")
    return args


def main(argv=None) -> int:
    return run_main(parse_args, run, format_table, argv)


if __name__ == "__main__":
    sys.exit(main())
