"""Starting a cluster daemon and talking to it, for both `hpc-cluster up` and the cluster
classes (cluster.py): the worker command and job spec a configuration makes, the plan the
daemon reads, `launch()` and `control()`.

The cluster daemon (scheduler + job manager, `deploy/daemon/run.py`) runs as a child process of
SLURMCluster(...), or detached under `hpc-cluster up`: the very same process either way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

from dask.utils import format_bytes

from ..adapters import get_adapter
from ..adapters.base import BatchError, JobSpec
from ..protocol.clusterfile import (cluster_file_for, clusters_dir, journal_for, new_secret, open_private, private_directory,
                               read_cluster_file, write_cluster_file)
from ..lifeline import alive
from ..protocol.comm import port_of
from ..protocol.tls import Security, resolve_security
from ..config import ConfigError, ResolvedConfig
from ..config.pools import DEFAULT_POOL
from ..config.schema import DEFAULT_DASHBOARD_ADDRESS, parse_dashboard_address
from ..worker.flags import memory_fraction_args, parse_bytes, parse_resources, read_worker_args
from .batch_options import batch_options
from .daemon.scheduler_job import (SchedulerJob, daemon_command, handover_path, job_alive, owner_path, scheduler_spec,
                            touch_owner)


_NAME_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SUFFIXED = re.compile(r"-[0-9a-f]{6}")
_CLAIMED: set[str] = set()              # ids resumed by a cluster of this process: not twice
_CLAIM_LOCK = threading.Lock()


def cluster_id(name: str, explicit: bool) -> str:
    """The cluster file's name: what `hpc-cluster status|why|logs|down ID` take: the name and a
    random suffix, unique even for clusters of one name started at the same moment. A name the
    user gave resumes a cluster of that name whose daemon died leaving its journal (issue 16):
    the most recent such id is taken again."""
    safe = _NAME_SAFE.sub('-', name).strip('-.') or 'cluster'
    if explicit:
        with _CLAIM_LOCK:
            stopped = []
            for path in clusters_dir().glob(f"{safe}*.json"):
                if path.stem != safe and not _SUFFIXED.fullmatch(path.stem[len(safe):]):
                    continue
                try:
                    info = read_cluster_file(path)
                except (OSError, ValueError):
                    continue
                # A daemon that never wrote its pid is starting, not stopped.
                if (info.get("pid") or info.get("scheduler_job")) and journal_for(path).exists() \
                        and path.stem not in _CLAIMED and not daemon_running(info, path):
                    stopped.append((path.stat().st_mtime, path.stem))
            if stopped:
                _CLAIMED.add(max(stopped)[1])
                return max(stopped)[1]
    return f"{safe}-{uuid.uuid4().hex[:6]}"


_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


class ClusterError(RuntimeError):
    """The cluster could not start, or a request to it failed; the message says what to do."""


# What a job runs when `python` is unset and jobs are submitted over SSH: the laptop's own
# interpreter path means nothing on the cluster, the login shell's python3 usually does.
REMOTE_DEFAULT_PYTHON = "python3"


def worker_python(cfg: ResolvedConfig) -> str:
    """The interpreter the job script starts: `python`, else this one, else (ssh) python3."""
    v = cfg.values
    if v["python"]:
        return v["python"]
    return REMOTE_DEFAULT_PYTHON if v["ssh"] else sys.executable


def shell_word(path: str) -> str:
    """`path` quoted for the job's shell, keeping a leading '~/' unquoted so the node expands it."""
    # bash expands '~' only when nothing up to the first slash is quoted.
    if path == "~":
        return path
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:]) if path[2:] else "~/"
    return shlex.quote(path)


def double_quoted(text: str) -> str:
    """`text` in double quotes for the job's shell: spaces and quotes stay literal, but
    $VARIABLES expand there, as they do in dask-jobqueue's (unquoted) worker names, so a name
    like 'run-$SLURM_ARRAY_TASK_ID' or one set by the prologue works the same."""
    return '"' + re.sub(r'(["\\`])', r"\\\1", text) + '"'


def worker_name_prefix(name: str) -> str:
    if "\n" in name or "\r" in name:
        raise ConfigError(f"name={name!r} must be one line: it names the workers")
    return name


def worker_command(cfg: ResolvedConfig, cluster_file: str, name: str, pool: str = DEFAULT_POOL) -> str:
    """The command a job runs: its worker(s), each under a nanny unless nanny=False.

    The flags and their order are dask-jobqueue's (name, threads, memory per process,
    processes, nanny, death timeout, local directory, then the user's worker_extra_args, which
    win over ours); the scheduler's address and secret come from the cluster file. Workers
    are named NAME-<index of the job in this cluster>, and NAME-<index>-<i> with several
    processes per job, as dask-jobqueue names them. A pool's workers (other than the
    default pool's) are told their pool with --pool NAME.
    """
    v = cfg.values
    processes = v["processes"]
    nthreads = max(1, v["cores"] // processes)
    head = [shell_word(worker_python(cfg)), "-m", "hpc_cluster.worker", "--cluster-file", shlex.quote(cluster_file),
            "--name", double_quoted(worker_name_prefix(name) + "-")[:-1] + '${HPC_CLUSTER_WORKER_INDEX:-0}"']
    args = ["--nthreads", str(nthreads), "--memory-limit", memory_limit_flag(v)]
    if processes > 1:
        args += ["--nworkers", str(processes)]
    args.append("--nanny" if v["nanny"] else "--no-nanny")
    args += ["--death-timeout", f"{v['death_timeout']:g}"]
    if v.get("reconnect_window") is not None:      # else the worker's own default (worker/reattach.py)
        args += ["--reconnect-window", f"{v['reconnect_window']:g}"]
    if v["local_directory"]:
        # Expanded ('~', $TMPDIR) and created by the worker on the node, not here.
        args += ["--local-directory", v["local_directory"]]
    if v["interface"]:
        args += ["--interface", v["interface"]]
    else:
        args += ["--host", "0.0.0.0"]
    args += ["--heartbeat-interval", f"{v['heartbeat_interval']:g}",
             *memory_fraction_args(v),
             "--max-message-bytes", str(v["max_message_bytes"]), "--max-frame-bytes", str(v["max_frame_bytes"])]
    if pool != DEFAULT_POOL:
        args += ["--pool", pool]
    args += list(v["worker_extra_args"])
    return " ".join(head) + " " + shlex.join(args)


def pool_config(cfg: ResolvedConfig, pool: str = DEFAULT_POOL) -> ResolvedConfig:
    """`cfg` as one pool's jobs see it: the cluster's settings with the pool's changes."""
    if pool == DEFAULT_POOL:
        return cfg
    pools = cfg.pools()
    if pool not in pools:
        raise ConfigError(unknown_pool(pool, pools))
    return dataclasses.replace(cfg, values=pools[pool].values)


def unknown_pool(pool: str, pools) -> str:
    return f"no pool named {pool!r}; this cluster's pools: {', '.join(pools)} (pools= or the site's `pools:`)"


def memory_limit_flag(v: dict) -> str:
    """The workers' --memory-limit: memory_limit, or the job's memory / processes, as dask-jobqueue writes it."""
    return format_bytes(v["memory_limit"] or (v["memory"] or 0) // v["processes"]).replace(" ", "")


def job_spec(cfg: ResolvedConfig, cluster_file: str, name: str = "worker", pool: str = DEFAULT_POOL) -> JobSpec:
    cfg = pool_config(cfg, pool)
    v = cfg.values
    return JobSpec(worker_command=worker_command(cfg, cluster_file, name, pool), job_name=v["job_name"],
                   cores=v["cores"], memory=v["memory"], processes=v["processes"], walltime=v["walltime"],
                   queue=v["queue"], account=v["account"], extra_directives=list(v["job_extra_directives"]),
                   directives_skip=list(v["job_directives_skip"]), prologue=list(v["job_script_prologue"]),
                   epilogue=list(v["job_script_epilogue"]), log_directory=v["log_directory"],
                   python=worker_python(cfg), nanny=v["nanny"], env=dict(v["env"]),
                   working_directory=v["working_directory"], template=v["template"],
                   resource_spec=v["resource_spec"], shebang=v["shebang"], job_cpu=v["job_cpu"],
                   job_mem=v["job_mem"], job_array=v["job_array"], worker_name=name,
                   batch_options=batch_options(v))



def render_job_script(cfg: ResolvedConfig, cluster_file: str, name: str = "worker",
                      pool: str = DEFAULT_POOL) -> str:
    """The job script `cfg` makes (for `pool`); a template or value the adapter refuses is a ConfigError."""
    try:
        return get_adapter(cfg.values["batch"]).render(job_spec(cfg, cluster_file, name, pool))
    except BatchError as e:
        raise ConfigError([f"site {cfg.site or '(defaults)'}: {e}"]) from None


def scheduler_host(cfg: ResolvedConfig) -> str:
    """Where the scheduler listens: scheduler_options' host or interface, else the workers'
    interface (as dask-jobqueue shares it), else every interface."""
    options = cfg.values["scheduler_options"] or {}
    if options.get("host"):
        return options["host"]
    interface = options.get("interface") or cfg.values["interface"]
    if interface:
        from ..worker.__main__ import interface_address
        try:
            return interface_address(interface)
        except SystemExit as e:               # its message names the interfaces this host has
            raise ConfigError(f"scheduler interface: {e}") from None
    return "0.0.0.0"


def shared_cluster_file(cfg: ResolvedConfig, name: str) -> str | None:
    """With shared_temp_directory (dask-jobqueue's directory that the scheduler's machine and
    the workers' share), the jobs read their copy of the cluster file from there."""
    shared = cfg.values["shared_temp_directory"]
    return os.path.join(shared, f".hpc-cluster-{name}.json") if shared else None


def for_submission(cfg: ResolvedConfig, name: str, cluster_file: Path,
                   create: bool = True) -> tuple[ResolvedConfig, str, dict | None]:
    """(config, cluster file path, login node) as the jobs will see them.

    Locally that is `cfg` and `cluster_file` (or its copy in shared_temp_directory). With
    `ssh`, the jobs run on a cluster that may share no filesystem with this machine: paths
    are resolved on the login node (its home, not ours), the cluster file goes under its
    config directory (or its shared_temp_directory), and with `create` the directories are
    made there (the log directory too).
    """
    v = cfg.values
    if not v["ssh"]:
        if create:
            for d in (v["log_directory"], v["shared_temp_directory"]):
                if d:
                    Path(d).expanduser().mkdir(parents=True, exist_ok=True)
        return cfg, shared_cluster_file(cfg, name) or str(cluster_file), None
    if not v["python"]:
        warnings.warn(f"site {cfg.site or '(defaults)'} submits over SSH and sets no `python`: jobs will "
                      f"start workers with `{REMOTE_DEFAULT_PYTHON}` from the compute node's PATH (after "
                      "job_script_prologue); set `python` to the cluster's interpreter that has hpc_cluster "
                      "installed, e.g. python: ~/venv/bin/python", UserWarning, stacklevel=3)
    from .remote import make_directories, on_login_node, probe
    from ..runners.ssh import SSHRunner
    try:
        with SSHRunner(**v["ssh"]) as runner:
            login = probe(runner)
            cfg = on_login_node(cfg, login)
            if create:
                make_directories(runner, login, name, [d for d in [cfg.values["log_directory"],
                                                                   cfg.values["shared_temp_directory"]] if d])
    except BatchError as e:
        raise ClusterError(f"site {cfg.site or '(defaults)'}: preparing the login node over SSH failed: "
                           f"{e}") from None
    return cfg, shared_cluster_file(cfg, name) or login.cluster_file(name), login.as_dict()


def pool_table(cfg: ResolvedConfig) -> dict[str, dict]:
    """What the scheduler is told of each pool (state.set_pools, docs/pools-and-retries.md):
    memory per worker process (0: no limit), walltime in seconds, threads per worker,
    workers per job, the workers' resources, max_jobs and escalation_only."""
    out = {}
    for name, pool in cfg.pools().items():
        v = pool.values
        processes = v["processes"] or 1
        settings, _ = read_worker_args(list(v["worker_extra_args"]))
        # What the workers register with: the --memory-limit as written (1.40GiB for 1.5 GB).
        out[name] = {"memory": parse_bytes(memory_limit_flag(v)),
                     "walltime": float(v["walltime"]) if v["walltime"] else None,
                     "nthreads": max(1, (v["cores"] or 1) // processes), "processes": processes,
                     "resources": parse_resources(settings.get("resources") or ""),
                     "max_jobs": pool.max_jobs, "escalation_only": pool.escalation_only}
    return out


def make_plan(cfg: ResolvedConfig, name: str, cluster_file: Path, n_jobs: int,
              worker_prefix: str | None = None, pool_jobs: dict[str, int] | None = None) -> dict:
    """The daemon's plan. `pool_jobs`: jobs to start per extra pool, over the pools' own
    n_workers/jobs settings."""
    cfg, job_cluster_file, login = for_submission(cfg, name, cluster_file)
    v = cfg.values
    spec = job_spec(cfg, job_cluster_file, worker_prefix or name)
    pools = cfg.pools()
    for pool in pool_jobs or {}:
        if pool not in pools:
            raise ConfigError(unknown_pool(pool, pools))
    table = pool_table(cfg)
    plan_pools = {}
    for pool_name, pool in pools.items():
        pspec = spec if pool_name == DEFAULT_POOL else job_spec(cfg, job_cluster_file, worker_prefix or name, pool_name)
        start = (pool_jobs or {}).get(pool_name, n_jobs if pool_name == DEFAULT_POOL else pool.start_jobs)
        plan_pools[pool_name] = {"job": {k: getattr(pspec, k) for k in pspec.__dataclass_fields__},
                                 "max_jobs": pool.max_jobs, "escalation_only": pool.escalation_only,
                                 "n_jobs": start, "scheduler": table[pool_name],
                                 "job_lifetime": job_lifetime(pool.values["worker_extra_args"])}
    return {
        "name": name, "site": cfg.site, "batch": v["batch"], "ssh": v["ssh"], "login": login,
        "cluster_file": str(cluster_file), "remote_cluster_file": job_cluster_file if v["ssh"] else None,
        # The jobs' own copy (shared_temp_directory), written and removed by the daemon.
        "job_cluster_file": job_cluster_file if not v["ssh"] and job_cluster_file != str(cluster_file) else None,
        "scheduler": {"host": scheduler_host(cfg), "port": (v["scheduler_options"] or {}).get("port") or 0,
                      "allowed_failures": v["allowed_failures"],
                      "heartbeat_ttl": v["heartbeat_ttl"], "versions": v["versions"],
                      "walltime_margin": v["walltime_margin"],
                      "max_message_bytes": v["max_message_bytes"], "max_frame_bytes": v["max_frame_bytes"],
                      "dashboard": dashboard_bind(v["scheduler_options"] or {})},
        "job": {k: getattr(spec, k) for k in spec.__dataclass_fields__},
        "n_jobs": n_jobs, "max_jobs_in_queue": v["max_jobs_in_queue"],
        "pools": plan_pools, "escalate": v["escalate"],
        "poll_interval": v["poll_interval"], "poll_interval_fast": v["poll_interval_fast"],
        "batch_calls_per_minute": v["batch_calls_per_minute"],
        "startup_failures": v["startup_failures"], "journal": v["journal"], "job_lifetime": job_lifetime(v["worker_extra_args"]),
    }


def dashboard_bind(options: dict) -> list | None:
    """[host, port] the daemon's dashboard listens on ('' host: where the scheduler does), or
    None: scheduler_options' dashboard_address (dask's ':8787' by default) and dashboard=False."""
    if options.get("dashboard") is False:
        return None
    bind = parse_dashboard_address(options.get("dashboard_address", DEFAULT_DASHBOARD_ADDRESS),
                                   "scheduler_options['dashboard_address']")
    return list(bind) if bind else None


def job_lifetime(worker_extra_args: list[str]) -> float | None:
    """How long a job lasts when its workers have a --lifetime and no --lifetime-restart: its
    workers retire at their lifetime (the earliest draw, lifetime - stagger) and the job ends,
    so the job manager renews it ahead of that, not of the walltime."""
    from ..worker.flags import read_worker_args
    settings, _ = read_worker_args(list(worker_extra_args))
    lifetime = settings.get("lifetime")
    if not lifetime or settings.get("lifetime_restart"):
        return None
    return max(1.0, lifetime - (settings.get("lifetime_stagger") or 0))


def tls_for(cfg: ResolvedConfig, name: str, security, run_dir: Path) -> tuple[Security | None, Path | None]:
    """The cluster's TLS (protocol/tls.py) and the directory of the files made for it (removed
    with the cluster), if any. The jobs read them where they read the cluster file: under
    shared_temp_directory when it is set, else beside the cluster file."""
    if security is None or security is False:
        return None, None
    if cfg.values["ssh"]:
        raise ClusterError("security= with a site that submits over ssh is not supported yet: the "
                           "certificates would have to be copied to the login node; use a Security whose "
                           "files are already there, run the cluster on the login node, or drop security=")
    shared = cfg.values["shared_temp_directory"]
    made = Path(shared).expanduser() / f".hpc-cluster-{name}-tls" if shared else run_dir / f"{name}.tls"
    try:
        sec = resolve_security(security, made)
    except ValueError as exc:
        raise ClusterError(str(exc)) from None
    return sec, (made if made.exists() else None)


def launch(cfg: ResolvedConfig, name: str, n_jobs: int = 0, detach: bool = False,
           timeout: float = 60.0, worker_prefix: str | None = None,
           security=None, pool_jobs: dict[str, int] | None = None,
           fresh: bool = False, progress=None,
           job_timeout: float = 600.0) -> tuple[subprocess.Popen | SchedulerJob, Path]:
    """Start a cluster daemon; return its process and cluster file once it listens. With
    `security` (True, a Security, dask's) every connection is TLS (protocol/tls.py).

    With `scheduler_in_job` the daemon is submitted as a batch job instead (scheduler_job.py)
    and the process returned is a `SchedulerJob` handle (Popen's poll/wait/kill, pid None);
    `progress(line)` hears its job's states while it waits in the queue (`job_timeout`
    seconds at most: then the job is cancelled).

    A daemon of this name that died (SIGKILL, a reboot) and left its journal is *resumed*
    (issue 16): the new one keeps the secret (its workers authenticate with it), tries the old
    address first, adopts the jobs still in the queue and rebuilds the state from the journal.
    `fresh` discards the journal instead."""
    if cfg.values["batch"] in (None, "local"):
        raise ClusterError(f"site {cfg.site!r} has batch={cfg.values['batch']!r}; a job cluster needs "
                           "a batch system ('slurm', 'pbs', 'sge' or a plugin's; use LocalCluster for this "
                           "machine alone)")
    cluster_file = cluster_file_for(name)
    # Cluster files hold secrets and the daemons' logs addresses: the directory is its owner's alone.
    private_directory(cluster_file.parent, fix=True)
    for pool in cfg.pools():                  # a broken template fails here, not in every submit
        render_job_script(cfg, str(cluster_file), worker_prefix or name, pool)
    old = previous_daemon(cfg, name, cluster_file, fresh)
    run_dir = cluster_file.parent
    if old is not None:
        # The same secret and certificates: the workers that kept running hold them.
        secret, sec, tls_dir = old["secret"], Security.from_dict(old.get("tls")), None
    else:
        if security is None and cfg.values.get("security"):     # the site's `security: true`
            security = True
        sec, tls_dir = tls_for(cfg, name, security, run_dir)
        secret = new_secret()
    write_cluster_file(cluster_file, "", secret, name=name, **({"tls": sec.to_dict()} if sec else {}))
    plan_path = run_dir / f".{name}.plan.json"
    try:
        plan = make_plan(cfg, name, cluster_file, n_jobs, worker_prefix, pool_jobs)
    except BaseException:
        if old is None:
            _forget(cluster_file, tls_dir)
        raise
    if old is not None:
        plan["resume"] = True
        plan["scheduler"]["prefer_port"] = port_of(old.get("address"))
    log_path = run_dir / f"{name}.log"
    in_job = bool(cfg.values.get("scheduler_in_job"))
    plan.update(daemon_log=str(log_path), plan_file=str(plan_path), tls_directory=tls_dir and str(tls_dir),
                # A daemon on another node cannot watch our pid: it watches our heartbeat file instead.
                owner_pid=None if detach or in_job else os.getpid())
    if in_job:
        v = cfg.values
        if not detach:                         # the Python owner's heartbeat (scheduler_job.py)
            plan["owner_file"] = str(owner_path(cluster_file))
            touch_owner(plan["owner_file"])
        command = daemon_command(shell_word(worker_python(cfg)), str(plan_path), str(log_path))
        spec = scheduler_spec(plan["job"], command, v["scheduler_job_walltime"] or v["walltime"],
                              v["scheduler_job_memory"], f"{v['job_name']}-scheduler")
        plan["scheduler_job"] = {"job": {k: getattr(spec, k) for k in spec.__dataclass_fields__},
                                 "submitted": time.time()}
        options = v["scheduler_options"] or {}
        if not options.get("host") and (options.get("interface") or v["interface"]):
            # The interface's address is the compute node's, known only there: the daemon reads it.
            plan["scheduler"]["interface"] = options.get("interface") or v["interface"]
    fd = os.open(plan_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(plan, f)
    if in_job:
        return _start_in_job(cfg, name, cluster_file, plan, spec, old, secret, tls_dir, progress, job_timeout)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    log = open_private(log_path, "wb")         # this run's log only: failures quote its tail
    proc = subprocess.Popen([sys.executable, "-m", "hpc_cluster.deploy.daemon", str(plan_path)],
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=detach)
    log.close()
    deadline = time.monotonic() + timeout
    while True:
        try:
            if read_cluster_file(cluster_file)["address"]:
                return proc, cluster_file
        except (OSError, ValueError):
            pass
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            if old is not None:                  # what a resumed cluster had stays, to try again
                write_cluster_file(cluster_file, old.get("address") or "", secret,
                                   **{k: v for k, v in old.items() if k not in ("address", "secret")})
                raise ClusterError(f"the cluster daemon exited with code {proc.returncode} while resuming "
                                   f"{name!r} from its journal (kept: `hpc-cluster up --name {name}` tries "
                                   f"again, `--fresh` starts anew):\n{tail}")
            _forget(cluster_file, plan_path, tls_dir)
            raise ClusterError(f"the cluster daemon exited with code {proc.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            _forget(cluster_file, plan_path, tls_dir)
            raise ClusterError(f"the cluster daemon did not start within {timeout:g} s; see {log_path}")
        time.sleep(0.05)


def _start_in_job(cfg: ResolvedConfig, name: str, cluster_file: Path, plan: dict, spec: JobSpec, old: dict | None,
                  secret: bytes, tls_dir: Path | None, progress, timeout: float) -> tuple[SchedulerJob, Path]:
    """Submit the daemon as a batch job, then wait for its address in the cluster file,
    saying how its job stands meanwhile."""
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    plan_path, log_path = Path(plan["plan_file"]), Path(plan["daemon_log"])
    adapter = get_adapter(cfg.values["batch"])
    handover_path(cluster_file).unlink(missing_ok=True)     # a renewal's, from an earlier run of this name

    def give_up() -> None:
        if old is None:
            _forget(cluster_file, plan_path, tls_dir)
        else:                                  # what a resumed cluster had stays, to try again
            write_cluster_file(cluster_file, old.get("address") or "", secret,
                               **{k: v for k, v in old.items() if k not in ("address", "secret")})
    open_private(log_path, "ab").close()       # the job appends; it is ours alone (0600)
    log_start = log_path.stat().st_size        # failures quote this run's part only
    try:
        job_id = adapter.submit(adapter.render(spec))
    except BatchError as exc:
        give_up()
        raise ClusterError(f"could not submit the scheduler job (scheduler_in_job: true): {exc}") from None
    # The placeholder names the job, so that `list` and `down` know the cluster while it queues.
    placeholder = {k: v for k, v in read_cluster_file(cluster_file).items() if k not in ("address", "secret")}
    write_cluster_file(cluster_file, "", secret, **{**placeholder, "batch": cfg.values["batch"], "scheduler_job": job_id})
    handle = SchedulerJob(adapter, job_id, cluster_file)
    say(f"scheduler job {job_id} submitted ({spec.job_name}, 1 core, walltime {spec.walltime} s); waiting for "
        "it to start")
    deadline, seen = time.monotonic() + timeout, None
    while True:
        try:
            if read_cluster_file(cluster_file)["address"]:
                return handle, cluster_file
        except (OSError, ValueError, KeyError):
            pass
        code = handle.poll()
        shown = f"{handle.state}"
        if shown != seen:
            seen = shown
            say(f"scheduler job {job_id}: {shown}")
        if code is not None:
            tail = _tail(log_path, log_start)
            give_up()
            raise ClusterError(f"the scheduler job {job_id} ended ({handle.state}) before its daemon listened; "
                               f"the end of the daemon log {log_path}:\n{tail or '(empty)'}\n"
                               + _job_output(spec, job_id))
        if time.monotonic() > deadline:
            handle.kill()
            give_up()
            raise ClusterError(f"the scheduler job {job_id} did not start its daemon within {timeout:g} s (last "
                               f"state: {handle.state}); it was cancelled. A busy queue needs a longer wait, or "
                               f"scheduler_in_job: false to run the daemon here")
        time.sleep(0.2)


def _job_output(spec: JobSpec, job_id: str, lines: int = 20) -> str:
    """The end of a job's own stdout/stderr (a failing prologue writes there, not in the daemon
    log), from its log_directory or the directory it was submitted from."""
    from .remote import job_logs
    from ..runners.local import LocalRunner
    directory = os.path.expanduser(spec.log_directory or os.getcwd())
    found = [(path, text) for path, text in job_logs(LocalRunner(), directory, job_id, lines) if text]
    if not found:
        return f"the job left no output in {directory}"
    return "\n".join(f"the end of {path}:\n" + "\n".join(text) for path, text in found)


def _tail(path: Path, start: int = 0, size: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(start, path.stat().st_size - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def daemon_running(info: dict, cluster_file: Path) -> bool:
    """Whether a cluster's daemon lives: its scheduler job's state when it runs as a job (a pid
    means nothing on another node), else its pid."""
    in_job = job_alive(info, cluster_file)
    if in_job is not None:
        return in_job
    pid = info.get("pid")
    # Its start time beside its pid: after a reboot the pid may be another process's.
    return bool(pid) and alive(int(pid), info.get("pid_started"))


def previous_daemon(cfg: ResolvedConfig, name: str, cluster_file: Path, fresh: bool) -> dict | None:
    """The cluster file of a daemon of this name that died leaving a journal (to resume), or
    None (nothing there, or `fresh`: its leftovers are removed). A live daemon is an error."""
    if not cluster_file.exists():
        journal_for(cluster_file).unlink(missing_ok=True)   # a journal without its secret resumes nothing
        return None
    try:
        info = read_cluster_file(cluster_file)
    except (OSError, ValueError):
        info = {}
    pid = info.get("pid")
    if daemon_running(info, cluster_file):
        where = f"scheduler job {info['scheduler_job']}" if info.get("scheduler_job") else f"pid {pid}"
        raise ClusterError(f"a cluster named {name!r} is already running ({where}); "
                           f"use another --name or `hpc-cluster down {name}` first")
    journal = journal_for(cluster_file)
    if fresh or not cfg.values.get("journal") or not info.get("secret") or not journal.exists():
        cluster_file.unlink()
        journal.unlink(missing_ok=True)
        return None
    return info


def _forget(*paths: Path | None) -> None:
    for p in paths:
        if p is not None and Path(p).is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p is not None:
            Path(p).unlink(missing_ok=True)


def control(cluster_file: Path | str, op: str, timeout: float = 120.0, **fields):
    """One request to a running cluster daemon (scale, jobs, adapt, shutdown)."""
    from ..client.client import Client
    with Client(cluster_file=str(cluster_file), timeout=10) as c:
        reply = c._lt.run(c._request({"op": op, **fields}, timeout), timeout + 5)
    if not reply.get("ok"):
        raise ClusterError(f"{op} failed: {reply.get('error')}")
    return reply["result"]
