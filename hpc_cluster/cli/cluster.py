"""`hpc-cluster up | status | scale | list | logs | why | job-script | down`.

Each command talks to a cluster daemon (deploy/daemon/run.py) found by name through its
cluster file, via `deploy/cluster.py: launch` and `control`. Kept out of cli/__init__.py so that
file stays a list of commands; it calls `add_cluster_commands(subparsers)` and runs
`args.handler` through `run_cluster_command`.

Exit codes are part of the interface (scripts test them): see EXIT_CODES.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pwd
import re
import sys
import warnings
from pathlib import Path

from ..protocol.clusterfile import cluster_file_for, read_cluster_file
from ..protocol.messages import Op
from .lookup import (_NAME_RE, DEFAULT_NAME, EXIT_CODES, FAILED, NOT_FOUND, OK, USAGE,  # noqa: F401
                         CommandError, check_name, _liveness, _not_found, _pool_limits, _processes,
                         _remove_leftovers, cluster_names, find_cluster, journal_jobs, plan_file)
from .down import cmd_down
from .startup import watch_startup
from .chart import memory_chart
from .engine import connect_hint, dashboard_lines, distributed_worker_logs, status_fields, status_lines
from .views import aligned, dur, fmt_clock, indent, jobs_table, mem, pools_tables, print_deaths, tail_lines
from ..adapters.base import BatchError
from ..deploy.launch import ClusterError, control
from ..deploy.plan import Plan
from ..config import ConfigError
from ..deploy.remote import job_log_names, job_logs
from ..runners.ssh import SSHRunner


def _jobs(path: Path, name: str, info: dict, timeout: float = 60.0) -> dict:
    try:
        return control(path, Op.JOBS, timeout=timeout)
    except Exception as exc:
        raise CommandError(f"cluster {name!r} (pid {info.get('pid')}) does not answer: {exc}\n"
                           f"its log: {info.get('daemon_log') or '?'}; `hpc-cluster down {name}` "
                           "stops it", FAILED) from None


@contextlib.contextmanager
def _notes(err):
    """Warnings raised while preparing (e.g. an ssh site without `python`) as plain notes."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            yield
        finally:
            for w in caught:
                print(f"note: {w.message}", file=err, flush=True)


# ----------------------------------------------------------------------------- commands

def cmd_up(args, out, err) -> int:
    from ..deploy.launch import launch
    from ..config import resolve
    name = check_name(args.name)
    if args.workers < 0:
        raise CommandError(f"-n {args.workers}: give a number of workers >= 0", USAGE)
    cfg = resolve(site=args.site, config=args.config,
                  **({"scheduler_in_job": True} if args.scheduler_in_job else {}),
                  **({"engine": args.engine} if args.engine else {}),
                  **({"interface": args.interface} if args.interface else {}),
                  **({"nodes": args.nodes} if args.nodes is not None else {}))
    v = cfg.values
    if v["batch"] in (None, "local"):
        raise CommandError(f"site {cfg.site or '(defaults)'} has batch: {v['batch']}; `up` needs a "
                           "site with a batch system, e.g. batch: slurm, pbs or sge (`hpc-cluster config show` shows "
                           "what was read; pass --site or --config; coming from dask-jobqueue, "
                           "`hpc-cluster config import-jobqueue` makes a site of your jobqueue.yaml)", USAGE)
    _require_job_size(cfg)
    for note in cfg.notes:
        print(f"note: {note}", file=err)
    processes = v["processes"] * (v.get("nodes") or 1)          # workers per job: processes on each node
    n_jobs = math.ceil(args.workers / processes)
    pools = cfg.pools()
    pool_jobs = _pool_jobs(args.pool or [], pools)
    print(f"starting cluster {name!r} ({v['batch']}, site {cfg.site or 'defaults'}): {n_jobs} job(s) "
          f"x {processes} worker(s)" + (f" on {v['nodes']} nodes" if (v.get("nodes") or 1) > 1 else "")
          + f", {v['cores']} cores, {mem(v['memory'])}{' per node' if (v.get('nodes') or 1) > 1 else ''}, walltime "
          f"{dur(v['walltime'])}", file=out, flush=True)
    want = args.workers
    for pool_name, pool in list(pools.items())[1:]:
        jobs = pool_jobs.get(pool_name, pool.start_jobs)
        want += jobs * (pool.values["processes"] or 1) * (pool.values.get("nodes") or 1)
        print(f"  pool {pool_name}: {jobs} job(s) x {pool.values['processes']} worker(s), {pool.values['cores']} "
              f"cores, {mem(pool.values['memory'])}, walltime {dur(pool.values['walltime'])}"
              + (f", max {pool.max_jobs} job(s)" if pool.max_jobs is not None else ""), file=out, flush=True)
    state, old = _liveness(name)
    if state == "stopped" and not args.fresh and v["journal"]:
        left = journal_jobs(name)
        print(f"resuming cluster {name!r} from its journal: its daemon (pid {old.get('pid')}) is gone; "
              f"{len(left)} job(s) it left ({', '.join(left) or 'none'}) are adopted, not submitted again, "
              f"and their workers reattach with the results they kept (--fresh starts anew instead)",
              file=out, flush=True)
    try:
        with _notes(err):
            proc, path = launch(cfg, name, n_jobs=n_jobs, detach=True, pool_jobs=pool_jobs,
                                fresh=args.fresh, progress=lambda line: print(line, file=out, flush=True),
                                job_timeout=args.timeout)
    except ClusterError:
        # A daemon that died starting leaves its pid-less placeholder file: not a cluster.
        state, info = _liveness(name)
        if info is not None and not info.get("pid"):
            _remove_leftovers(name)
        raise
    info = read_cluster_file(path)
    where = f" in scheduler job {info['scheduler_job']}" if info.get("scheduler_job") else ""
    print(f"daemon pid {info.get('pid')}{where} listening at {info['address']} (log: {info.get('daemon_log')})",
          file=out, flush=True)
    if want and not args.no_wait:
        watch_startup(name, path, info, proc, want, args.timeout, out)
    engine = f" (engine: {info['engine']})" if info.get("engine_address") else ""
    print(f"\ncluster {name!r} is up{engine}. Connect from Python:\n"
          + connect_hint(name, info)
          + f"cluster file (address and secret; keep it private): {path}\n"
          + dashboard_lines(info)
          + f"see it:  hpc-cluster status {name}\n"
          f"stop it: hpc-cluster down {name}", file=out)
    return OK


def _pool_jobs(given: list[str], pools) -> dict[str, int]:
    """`--pool NAME=N` (jobs of pool NAME to start with) -> {NAME: N}; a pool that is not there,
    or a count that is not a whole number, is a usage error naming what there is."""
    out = {}
    for item in given:
        pool, eq, count = item.partition("=")
        if not eq or not count.strip().isdigit():
            raise CommandError(f"--pool {item!r}: write NAME=JOBS, e.g. --pool bigmem=1", USAGE)
        if pool not in pools or pool == "default":
            extra = [p for p in pools if p != "default"]
            raise CommandError(f"--pool {item!r}: no pool named {pool!r}; the site's pools: "
                               f"{', '.join(extra) or 'none (add `pools:` to the site)'} "
                               "(-n sets the default pool's workers)", USAGE)
        limit = pools[pool].max_jobs
        if limit is not None and int(count) > limit:
            raise CommandError(f"--pool {item!r}: pool {pool!r} has max_jobs {limit}", USAGE)
        out[pool] = int(count)
    return out


def _require_job_size(cfg) -> None:
    missing = [k for k in ("cores", "memory") if cfg.values[k] is None]
    if missing:
        raise CommandError(f"site {cfg.site or '(defaults)'} does not say how many cores and how much memory "
                           f"a job asks for ({' and '.join(missing)} unset): add them to the site, e.g. "
                           "`cores: 4` and `memory: 16GB` (or to jobqueue.yaml under jobqueue."
                           f"{cfg.values['config_name'] or cfg.values['batch']})", USAGE)


def cmd_status(args, out, err) -> int:
    from ..client.client import Client
    name, path, info = find_cluster(args.name)
    table = _jobs(path, name, info)
    rows = table["jobs"]
    live = [r for r in rows if r["state"] in ("pending", "running")]
    workers = sum(len(r.get("workers") or []) for r in live)
    adaptive = table.get("adaptive")
    if args.json:
        # For scripts: the daemon's job table as it is, plus the deaths (all of them).
        with Client(cluster_file=str(path), timeout=30) as client:
            deaths = client.deaths()
        json.dump({"name": name, "address": info.get("address"), "batch": info.get("batch"),
                   "site": info.get("site"), "daemon_pid": info.get("pid"),
                   "scheduler_job": info.get("scheduler_job"), "dashboard": info.get("dashboard"),
                   **status_fields(info), **table,
                   "deaths": deaths},
                  out, indent=1, default=str)
        print(file=out)
        return OK
    in_job = f" in scheduler job {info['scheduler_job']}" if info.get("scheduler_job") else ""
    print(f"cluster {name!r} at {info['address']} ({info.get('batch')}, site {info.get('site') or 'defaults'}, "
          f"daemon pid {info.get('pid')}{in_job})", file=out)
    for line in status_lines(info):            # a distributed cluster: its scheduler, file, dashboard
        print(line, file=out)
    if info.get("dashboard"):
        print(f"dashboard: {info['dashboard']}", file=out)
    print(f"target {table.get('target')} job(s); {len(live)} in the queue; {workers} worker(s) connected"
          + (f"; adaptive {adaptive[0]}..{'no limit' if adaptive[1] is None else adaptive[1]} jobs"
             if adaptive else ""), file=out)
    print("", file=out)
    if len(table.get("pools") or {}) > 1:
        print(pools_tables(table, max_finished=args.finished), file=out)
    else:
        print(jobs_table(rows, max_finished=args.finished), file=out)
    if table.get("halted"):
        print(f"\nHALTED: {table['halted']}", file=out)
    for e in table.get("errors") or []:
        print(f"submit error at {fmt_clock(e.get('time'))}: {e.get('message')}", file=out)
    with Client(cluster_file=str(path), timeout=30) as client:
        deaths = client.deaths()
    if deaths:
        shown = deaths[-args.deaths:] if args.deaths else []
        print(f"\nrecent worker deaths ({len(shown)} of {len(deaths)}; `hpc-cluster why` for evidence):",
              file=out)
        print_deaths(shown, out, detail=False)
    else:
        print("\nno worker deaths", file=out)
    return OK


def cmd_scale(args, out, err) -> int:
    if args.n < 0:
        raise CommandError(f"scale {args.n}: give a number >= 0", USAGE)
    jobs = " --jobs" if getattr(args, "jobs", False) else ""
    name, path, info = find_cluster(args.name, f"scale{jobs} {args.n} {{name}}")
    pools = _pool_limits(name)
    if args.pool and pools is not None and args.pool not in pools:
        raise CommandError(f"--pool {args.pool}: cluster {name!r} has no such pool; its pools: {', '.join(pools)}",
                           USAGE)
    processes = 1 if args.jobs else _processes(name, args.pool)
    jobs = args.n if args.jobs else math.ceil(args.n / processes)
    limit = (pools or {}).get(args.pool or "default")
    if limit is not None and jobs > limit:
        raise CommandError(f"scale {args.n}{' --jobs' if args.jobs else ''}: {jobs} job(s) of pool "
                           f"{args.pool or 'default'!r} is more than its max_jobs {limit}", USAGE)
    table = control(path, Op.SCALE, jobs=jobs, **({"pool": args.pool} if args.pool else {}))
    live = [r for r in table["jobs"] if r["state"] in ("pending", "running") and not r.get("retiring")
            and (r.get("pool") or "default") == (args.pool or "default")]
    print(f"cluster {name!r}{f', pool {args.pool}' if args.pool else ''}: target {jobs} job(s) "
          f"({jobs * processes} worker(s)); "
          f"{sum(r['state'] == 'pending' for r in live)} pending, "
          f"{sum(r['state'] == 'running' for r in live)} running", file=out)
    if table.get("halted"):
        print(f"HALTED: {table['halted']}", file=out)
    return OK


def cmd_list(args, out, err) -> int:
    clusters = []
    for name in cluster_names():
        state, info = _liveness(name)
        if state == "stale":
            removed = _remove_leftovers(name)
            pid = (info or {}).get("pid")
            print(f"removed the stale cluster file of {name!r} (its daemon{f', pid {pid},' if pid else ''} "
                  f"is gone): {', '.join(map(str, removed))}", file=err)
            continue
        entry = {"name": name, "state": state, "address": info.get("address"), "batch": info.get("batch"),
                 "site": info.get("site"), "pid": info.get("pid"), "scheduler_job": info.get("scheduler_job"),
                 "answering": None, "jobs": None, "left_jobs": journal_jobs(name) if state == "stopped" else None}
        if state == "running":
            try:
                t = control(cluster_file_for(name), Op.JOBS, timeout=20)
                entry["jobs"] = {"running": sum(r["state"] == "running" for r in t["jobs"]),
                                 "pending": sum(r["state"] == "pending" for r in t["jobs"])}
                entry["answering"] = True
            except Exception:
                entry["answering"] = False
        clusters.append(entry)
    if args.json:                              # docs/cli-json.md: `list`
        json.dump({"clusters": clusters}, out, indent=1, default=str)
        print(file=out)
        return OK if clusters else NOT_FOUND
    if not clusters:
        print("no cluster is running; start one with `hpc-cluster up`", file=err)
        return NOT_FOUND
    rows = [_list_row(c) for c in clusters]
    head = ("NAME", "ADDRESS", "BATCH", "SITE", "PID", "JOBS")
    print(aligned([head, *rows]), file=out)
    return OK


def _list_row(c: dict) -> tuple:
    name = c["name"]
    if c["state"] == "stopped":               # resumable: kept, and said so
        return (name, f"(daemon gone; `hpc-cluster up --name {name}` resumes it)", c["batch"] or "?",
                c["site"] or "-", "-", f"{len(c['left_jobs'] or [])} left by the daemon")
    jobs = "?" if c["answering"] is None else "not answering" if not c["answering"] else \
        f"{c['jobs']['running']} running, {c['jobs']['pending']} pending"
    return (name, c["address"] or "(starting)", c["batch"] or "?", c["site"] or "-", str(c["pid"] or "-"), jobs)


_JOB_ID_RE = re.compile(r"^\d+([._\[].*)?$")      # 123, 123_4 (array), 123.server, 123[].server


def cmd_logs(args, out, err) -> int:
    name, path, info = find_cluster(args.name, f"logs {args.target + ' ' if args.target else ''}{{name}}")
    target = args.target
    if target == "daemon":
        log = info.get("daemon_log")
        if not log or not Path(log).exists():
            raise CommandError(f"cluster {name!r} has no daemon log on this machine ({log})")
        print(f"== daemon log {log} ==", file=out)
        print("\n".join(tail_lines(log, args.tail)), file=out)
        return OK
    if _JOB_ID_RE.match(target):
        return _job_logs(name, info, target, args.tail, out)
    return _worker_logs(path, info, target, args.tail, out)


def _job_log_files(directory: Path, job_id: str) -> list[Path]:
    try:
        names = [p.name for p in directory.iterdir() if p.is_file()]
    except OSError:
        return []
    return [directory / n for n in job_log_names(names, job_id)]


def _job_logs(name: str, info: dict, job_id: str, tail: int, out) -> int:
    log_dir = info.get("log_directory")
    if info.get("ssh"):
        # The files are on the cluster, which may share no filesystem with us: read them
        # over SSH, as the daemon does (the plan holds the ssh settings and the login node).
        plan = Plan.load(plan_file(name))
        directory = info.get("job_log_directory") or log_dir or plan.login["cwd"]
        host = f" on {plan.ssh['host']}"
        try:
            with SSHRunner(**plan.ssh) as runner:
                found = job_logs(runner, directory, job_id, tail)
        except BatchError as e:
            raise CommandError(f"could not read the logs of job {job_id}{host}: {e}") from None
    else:
        directory = Path(info.get("job_log_directory") or log_dir or Path.cwd()).expanduser()
        host = ""
        found = [(str(f), tail_lines(f, tail)) for f in _job_log_files(directory, job_id)]
    if not found:
        where = (f"in {directory}{host}" if log_dir else
                 f"in {directory}{host} (the cluster has no log_directory, so the batch system wrote them "
                 "to the job's working directory; set log_directory in the site to keep them together)")
        raise CommandError(f"no log files of job {job_id} {where}. A job that has not started yet "
                           f"has none; `hpc-cluster status {name}` lists the jobs")
    for path, lines in found:
        print(f"== {path} ==", file=out)
        print("\n".join(lines) if lines else "(empty)", file=out)
    return OK


def _worker_logs(path: Path, info: dict, target: str, tail: int, out) -> int:
    from ..client.client import Client
    if info.get("engine_address"):            # distributed's workers: asked through its scheduler
        logs, names = distributed_worker_logs(info, path, tail)
    else:
        with Client(cluster_file=str(path), timeout=30) as client:
            names = {a: w.get("name") for a, w in client.scheduler_info()["workers"].items()}
            names.update({d["worker"]: d.get("name") for d in client.deaths() if d.get("worker")})
            logs = client.get_worker_logs(n=tail)
    found = 0
    for key, lines in logs.items():
        addr = key.split(" ", 1)[0]           # dead workers come as "<address> (died: <cause>)"
        if target in (addr, key, names.get(addr)):
            found += 1
            print(f"== worker {names.get(addr) or addr} ({key}) ==", file=out)
            print("\n".join(lines) if lines else "(no lines)", file=out)
    if not found:
        known = sorted({n or a for a, n in names.items()})
        raise CommandError(f"no worker, job or 'daemon' matches {target!r}; workers: "
                           f"{', '.join(known) or 'none yet'}. Give a job id for the job's own "
                           "stdout/stderr files")
    return OK


def cmd_why(args, out, err) -> int:
    from ..client.client import Client
    target, name = args.target, args.name
    # `why NAME` alone: the one positional is the cluster when a cluster has that name.
    if name is None and target is not None and _NAME_RE.match(target) and cluster_file_for(target).exists():
        target, name = None, target
    name, path, info = find_cluster(name, f"why {target + ' ' if target else ''}{{name}}")
    with Client(cluster_file=str(path), timeout=30) as client:
        deaths = client.deaths()
    if target is not None:
        deaths = [d for d in deaths if _death_matches(d, target)]
        if not deaths:
            raise CommandError(f"no worker death in cluster {name!r} matches {target!r} (a worker "
                               "name or address, a job id or a task key); `hpc-cluster why "
                               f"{name}` lists them all")
    deaths = sorted(deaths, key=lambda d: d.get("time") or 0)
    if args.json:                              # docs/cli-json.md: `why`
        json.dump({"cluster": name, "target": target, "deaths": deaths}, out, indent=1, default=str)
        print(file=out)
        return OK
    if not deaths:
        print(f"no worker has died in cluster {name!r}", file=out)
        return OK
    for d in deaths:
        print_deaths([d], out, detail=True, tail=args.tail)
        # One worker, job or task asked about: its memory over its life too.
        if target is not None and d.get("memory"):
            print("", file=out)
            print(indent(memory_chart(d["memory"]), "    "), file=out)
    if target is None and any(d.get("memory") for d in deaths):
        print(f"\n`hpc-cluster why WORKER {name}` charts that worker's memory over its life", file=out)
    return OK


def _death_matches(d: dict, target: str) -> bool:
    # A job id matches the job's record, not a worker's name: names are NAME-<index in the
    # cluster> (dask-jobqueue's), so 'why 1' must not find worker 'default-1' of job 6231.
    job_id = str(d.get("job_id") or "")
    if target in (d.get("worker"), d.get("name")) or job_id == target:
        return True
    if _JOB_ID_RE.match(target) and "." in job_id and job_id.split(".")[0] == target.split(".")[0]:
        return True                            # PBS: '123' for '123.server'
    return target in (d.get("executing") or []) or target in (d.get("processing") or [])


def cmd_job_script(args, out, err) -> int:
    from ..deploy.plan import for_submission, render_job_script
    from ..config import resolve
    cfg = resolve(site=args.site, config=args.config)
    batch = cfg.values["batch"]
    if batch in (None, "local"):
        raise CommandError(f"site {cfg.site or '(defaults)'} has batch: {batch}; a job script needs "
                           "a batch system, e.g. batch: slurm, pbs or sge (pass --site or --config)", USAGE)
    name = check_name(args.name)
    _require_job_size(cfg)
    pools = cfg.pools()
    if args.pool not in pools:
        raise CommandError(f"--pool {args.pool}: no such pool; the site's pools: {', '.join(pools)}", USAGE)
    render_job_script(cfg, str(cluster_file_for(name)), name, args.pool)   # template problems first, before any SSH
    with _notes(err):
        cfg, cluster_file, _ = for_submission(cfg, name, cluster_file_for(name), create=False)
    print(render_job_script(cfg, cluster_file, name, args.pool), file=out, end="")
    return OK


# ----------------------------------------------------------------------------- argparse

def _sub(subparsers, name: str, help: str, examples: str, handler):
    p = subparsers.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                              epilog="examples:\n" + examples + "\n" + EXIT_CODES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=handler)
    return p


def add_cluster_commands(sub) -> None:
    p = _sub(sub, "up", "start a cluster on the batch system and wait for its workers", """\
  hpc-cluster up -n 4                      4 workers, site from your config, named 'default'
  hpc-cluster up --site mylab -n 8 --name big
  hpc-cluster up --config ./site.yaml -n 2 --timeout 1800
  hpc-cluster up -n 16 --no-wait           submit and return; watch with `hpc-cluster status`
  hpc-cluster up -n 8 --pool bigmem=1      and 1 job of the site's pool 'bigmem'
  hpc-cluster up --name big                after its daemon died: resumes it from its journal
  hpc-cluster up -n 4 --scheduler-in-job   the scheduler too runs as a batch job (no login-node process)
  hpc-cluster up -n 4 --engine distributed  dask.distributed runs the tasks (connect with its Client)
  hpc-cluster up -n 4 --interface ib0      scheduler and workers on the InfiniBand network
  hpc-cluster up -n 12 --nodes 3           SLURM: jobs of 3 nodes, `processes` workers on each
""", cmd_up)
    p.add_argument("-n", "--workers", type=int, default=1, metavar="N",
                   help="workers to start (rounded up to whole jobs of `processes` each; default 1)")
    p.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default: {DEFAULT_NAME})")
    p.add_argument("--site", metavar="S", help="site from the config files (default: their default)")
    p.add_argument("--config", metavar="PATH", help="read this config file (plus the system file)")
    p.add_argument("--timeout", type=float, default=600, metavar="SECONDS",
                   help="how long to wait for the workers (default 600); the cluster stays up after")
    p.add_argument("--no-wait", action="store_true", help="return once the jobs are submitted")
    p.add_argument("--pool", action="append", metavar="NAME=JOBS",
                   help="jobs of the site's pool NAME to start with (repeat for several pools)")
    p.add_argument("--engine", metavar="NAME", choices=("hpc-cluster", "distributed"),
                   help="hpc-cluster (the default) or distributed: dask.distributed's scheduler and workers, "
                        "deployed and diagnosed alike (docs/choosing-an-engine.md)")
    p.add_argument("--interface", metavar="NAME",
                   help="the network interface (ib0, eth1) the scheduler and workers listen on, as the "
                        "site's interface: (default: the address that routes to the compute nodes)")
    p.add_argument("--nodes", type=int, metavar="N",
                   help="nodes per job (SLURM; the site's nodes:): each job starts `processes` workers on each "
                        "of its N nodes, so -n counts in jobs of N x processes workers (docs/slurm.md)")
    p.add_argument("--scheduler-in-job", action="store_true",
                   help="run the scheduler itself as a batch job, not on this machine (the site's "
                        "scheduler_in_job: true); for sites that forbid long processes on login nodes")
    p.add_argument("--fresh", action="store_true",
                   help="start anew even if a daemon of this name died leaving its journal (default: resume it)")

    p = _sub(sub, "status", "show a cluster's jobs, workers and recent worker deaths", """\
  hpc-cluster status                       the only running cluster
  hpc-cluster status big
  hpc-cluster status big --finished 50     also the last 50 finished jobs
  hpc-cluster status --json                the same as JSON, for scripts (docs/cli-json.md)
""", cmd_status)
    p.add_argument("--json", action="store_true",
                   help="print JSON (jobs, workers' memory, deaths) instead (schema: docs/cli-json.md)")
    p.add_argument("name", nargs="?", metavar="NAME", help="cluster name (optional if only one runs)")
    p.add_argument("--finished", type=int, default=10, metavar="K", help="finished jobs to show (default 10)")
    p.add_argument("--deaths", type=int, default=10, metavar="K", help="recent deaths to show (default 10)")

    p = _sub(sub, "scale", "ask for N workers (or N jobs with --jobs)", """\
  hpc-cluster scale 8                      8 workers in the only running cluster
  hpc-cluster scale 0 big                  release every job of cluster 'big'
  hpc-cluster scale --jobs 3 big           3 jobs, whatever `processes` is
  hpc-cluster scale 2 --pool bigmem        2 workers of the pool 'bigmem'
""", cmd_scale)
    p.add_argument("n", type=int, metavar="N", help="workers (jobs with --jobs)")
    p.add_argument("name", nargs="?", metavar="NAME", help="cluster name (optional if only one runs)")
    p.add_argument("--jobs", action="store_true", help="N counts jobs, not workers")
    p.add_argument("--pool", metavar="NAME", help="scale this pool of the cluster (default: its default pool)")

    p = _sub(sub, "list", "list the running clusters (and remove stale cluster files)", """\
  hpc-cluster list
  hpc-cluster list --json                  the same as JSON, for scripts (docs/cli-json.md)
""", cmd_list)
    p.add_argument("--json", action="store_true", help="print JSON instead (schema: docs/cli-json.md)")

    p = _sub(sub, "logs", "print a job's stdout/stderr, a worker's log, or the daemon's log", """\
  hpc-cluster logs 1234                    job 1234's .out/.err files from log_directory
  hpc-cluster logs default-0               the worker's recent log lines (also of dead workers)
  hpc-cluster logs daemon big --tail 200   the cluster daemon's own log
""", cmd_logs)
    p.add_argument("target", metavar="WORKER|JOB|daemon")
    p.add_argument("name", nargs="?", metavar="NAME", help="cluster name (optional if only one runs)")
    p.add_argument("--tail", type=int, default=50, metavar="N", help="last N lines (default 50)")

    p = _sub(sub, "why", "explain worker deaths: cause, blame, evidence, log tail", """\
  hpc-cluster why                          every death in the only running cluster, latest last
  hpc-cluster why big                      the same for cluster 'big'
  hpc-cluster why 1234 big                 the deaths of job 1234's workers
  hpc-cluster why default-0                one worker (name or tcp:// address), with a chart of its memory
  hpc-cluster why 'parse-3a9c0e'           deaths while that task was executing
  hpc-cluster why default-0 --json         the death records as JSON, memory timeline included
""", cmd_why)
    p.add_argument("--json", action="store_true",
                   help="print the matching death records as JSON instead (schema: docs/cli-json.md)")
    p.add_argument("target", nargs="?", metavar="WORKER|JOB|KEY")
    p.add_argument("name", nargs="?", metavar="NAME", help="cluster name (optional if only one runs)")
    p.add_argument("--tail", type=int, default=20, metavar="N", help="log lines per death (default 20)")

    p = _sub(sub, "job-script", "print the job script `up` would submit", """\
  hpc-cluster job-script
  hpc-cluster job-script --site mylab
  hpc-cluster job-script --pool bigmem     the script of the pool 'bigmem's jobs
  hpc-cluster job-script --config ./site.yaml > job.sh && sbatch --test-only job.sh
""", cmd_job_script)
    p.add_argument("--site", metavar="S")
    p.add_argument("--config", metavar="PATH")
    p.add_argument("--name", default=DEFAULT_NAME, help="cluster name the script would join")
    p.add_argument("--pool", default="default", metavar="NAME", help="the script of this pool's jobs")

    p = _sub(sub, "down", "stop a cluster: retire workers, cancel its jobs, stop its daemon", """\
  hpc-cluster down                         the only running cluster
  hpc-cluster down big
  hpc-cluster down --all
""", cmd_down)
    p.add_argument("name", nargs="?", metavar="NAME", help="cluster name (optional if only one runs)")
    p.add_argument("--all", action="store_true", help="every cluster of yours on this machine")
    p.add_argument("--timeout", type=float, default=180, metavar="SECONDS",
                   help="how long to wait for jobs to end and the daemon to exit (default 180)")


def _not_yours(exc: PermissionError) -> str:
    """Another user's cluster files (0600 in a 0700 directory) refuse a command run by someone
    else, e.g. with $XDG_CONFIG_HOME pointed at that user's: said, with the owner, not a traceback."""
    if not exc.filename:                       # a signal to another user's daemon (EPERM)
        return f"{exc}: the cluster belongs to another user; run the command as that user"
    path, owner = Path(exc.filename), ""
    for p in [path, *path.parents]:
        try:
            uid = p.stat().st_uid
        except OSError:                        # inside the directory we may not enter
            continue
        if uid != os.getuid():
            try:
                owner = f", which belongs to user {pwd.getpwuid(uid).pw_name} (uid {uid})"
            except KeyError:
                owner = f", which belongs to uid {uid}"
        break
    return (f"permission denied on {path}{owner}: a cluster's files are readable by the user who "
            "started it only. Run the command as that user; for a cluster of yours, check that $HOME and "
            "$XDG_CONFIG_HOME are your own")


def run_cluster_command(args, out=None, err=None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        return args.handler(args, out, err)
    except CommandError as e:
        print(f"hpc-cluster {args.command}: {e}", file=err)
        return e.code
    except PermissionError as e:
        print(f"hpc-cluster {args.command}: {_not_yours(e)}", file=err)
        return FAILED
    except ConfigError as e:
        print(f"hpc-cluster {args.command}: bad configuration:", file=err)
        for p in e.problems:
            print(f"  {p}", file=err)
        return USAGE
    except ClusterError as e:
        print(f"hpc-cluster {args.command}: {e}", file=err)
        return FAILED
    except KeyboardInterrupt:
        print(f"\nhpc-cluster {args.command}: interrupted; a started cluster keeps running "
              "(`hpc-cluster list`, `hpc-cluster down NAME`)", file=err)
        return 130
