"""The plan: what a cluster's daemon and its jobs are told, made from a configuration.

`make_plan(cfg, ...)` turns a ResolvedConfig into a typed `Plan` (with the worker command and
the job spec of every pool); `launch()` (launch.py) adds where the daemon logs and who owns it,
and writes it with `Plan.save()`; the daemon (deploy/daemon/run.py) reads it back with
`Plan.load()`. The file's JSON is the format daemons have always read (`to_json`/`from_json`
keep its keys), so a daemon resumed from a plan written before this module still reads it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from dask.utils import format_bytes

from ..adapters import get_adapter
from ..adapters.base import BatchError, JobSpec
from ..adapters.slurm_text import job_mem_bytes
from ..config import ConfigError, ResolvedConfig
from ..config.pools import DEFAULT_POOL
from ..config.schema import DASHBOARD_HOST, DEFAULT_DASHBOARD_ADDRESS, parse_dashboard_address
from ..worker.flags import memory_fraction_args, parse_bytes, parse_resources, read_worker_args
from .batch_options import batch_options


def spec_json(spec: JobSpec) -> dict:
    """A JobSpec as the plan writes it: every field by name."""
    return {k: getattr(spec, k) for k in spec.__dataclass_fields__}


@dataclass
class SchedulerPlan:
    """How the daemon's scheduler listens and judges (the plan's "scheduler")."""

    host: str                              # '': the daemon chooses (deploy/address.py)
    allowed_failures: int
    heartbeat_ttl: float
    versions: str
    max_message_bytes: int
    max_frame_bytes: int
    port: int = 0
    walltime_margin: float = 60.0
    dashboard: list | None = None          # [host, port] of the dashboard, or None: none
    prefer_port: int | None = None         # a resumed daemon tries its predecessor's port first
    interface: str | None = None           # a scheduler job listens on this interface of its node
    engine: str = "hpc-cluster"            # or "distributed": its Scheduler beside ours (hpc_cluster/engines/)

    def to_json(self) -> dict:
        out = {"host": self.host, "port": self.port, "allowed_failures": self.allowed_failures,
               "heartbeat_ttl": self.heartbeat_ttl, "versions": self.versions,
               "walltime_margin": self.walltime_margin, "max_message_bytes": self.max_message_bytes,
               "max_frame_bytes": self.max_frame_bytes, "dashboard": self.dashboard}
        if self.prefer_port is not None:
            out["prefer_port"] = self.prefer_port
        if self.interface:
            out["interface"] = self.interface
        if self.engine != "hpc-cluster":
            out["engine"] = self.engine
        return out

    @classmethod
    def from_json(cls, d: dict) -> "SchedulerPlan":
        return cls(host=d["host"], allowed_failures=d["allowed_failures"], heartbeat_ttl=d["heartbeat_ttl"],
                   versions=d["versions"], max_message_bytes=d["max_message_bytes"],
                   max_frame_bytes=d["max_frame_bytes"], port=d.get("port") or 0,
                   walltime_margin=d.get("walltime_margin", 60.0), dashboard=d.get("dashboard"),
                   prefer_port=d.get("prefer_port"), interface=d.get("interface"),
                   engine=d.get("engine") or "hpc-cluster")


@dataclass
class PoolPlan:
    """One pool's jobs: their spec, how many to start, max_jobs, and the scheduler's row for it
    (pool_table's: memory, walltime, threads, processes, resources; state.set_pools reads it)."""

    job: JobSpec
    max_jobs: int | None = None
    escalation_only: bool = False
    n_jobs: int = 0                        # jobs to submit at start
    scheduler: dict | None = None
    job_lifetime: float | None = None      # a job ends with its workers' --lifetime (job_lifetime())

    def to_json(self) -> dict:
        out = {"job": spec_json(self.job), "max_jobs": self.max_jobs, "escalation_only": self.escalation_only,
               "n_jobs": self.n_jobs}
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler
        out["job_lifetime"] = self.job_lifetime
        return out

    @classmethod
    def from_json(cls, d: dict) -> "PoolPlan":
        return cls(job=JobSpec(**d["job"]), max_jobs=d.get("max_jobs"), escalation_only=bool(d.get("escalation_only")),
                   n_jobs=int(d.get("n_jobs") or 0), scheduler=d.get("scheduler"), job_lifetime=d.get("job_lifetime"))


@dataclass
class SchedulerJobPlan:
    """The daemon's own batch job (scheduler_in_job, deploy/daemon/scheduler_job.py)."""

    job: JobSpec
    submitted: float | None = None         # when it was submitted: its queue wait, for renewals

    def to_json(self) -> dict:
        return {"job": spec_json(self.job), "submitted": self.submitted}

    @classmethod
    def from_json(cls, d: dict) -> "SchedulerJobPlan":
        return cls(job=JobSpec(**d["job"]), submitted=d.get("submitted"))


@dataclass
class Plan:
    """What the cluster daemon is told (deploy/daemon/run.py reads it, nothing else decides)."""

    name: str
    batch: str
    cluster_file: str
    scheduler: SchedulerPlan
    job: JobSpec                           # the default pool's jobs
    pools: dict[str, PoolPlan] = field(default_factory=dict)
    site: str | None = None
    ssh: dict | None = None                # SSHRunner's settings when jobs are submitted over SSH
    login: dict | None = None              # the login node (deploy/remote.py's LoginNode.as_dict())
    remote_cluster_file: str | None = None     # over SSH: the jobs' copy on the login node
    job_cluster_file: str | None = None        # shared_temp_directory: the jobs' copy, written by the daemon
    n_jobs: int = 0
    max_jobs_in_queue: int | None = None
    escalate: dict | None = None
    poll_interval: float | None = None
    poll_interval_fast: float | None = None
    batch_calls_per_minute: int | None = None
    startup_failures: int = 3
    journal: bool = False
    job_lifetime: float | None = None
    # Set by launch(): the daemon's log, this file, TLS files made for the cluster, its owner.
    daemon_log: str | None = None
    plan_file: str | None = None
    tls_directory: str | None = None
    owner_pid: int | None = None           # a daemon on this machine ends with this process
    owner_file: str | None = None          # a daemon in a job ends when this file goes still
    resume: bool = False                   # rebuild the state from the journal, adopt its jobs
    scheduler_job: SchedulerJobPlan | None = None
    successor_of: str | None = None        # a renewal: the scheduler job this daemon takes over from
    reattach_grace: float | None = None    # resumed: seconds nothing is placed (None: the daemon's default)

    @property
    def submit_directory(self) -> str | None:
        """Where batch commands run when no log_directory is set: the login node's home over
        SSH, else this process's directory."""
        return (self.login or {}).get("cwd") if self.ssh else os.getcwd()

    def to_json(self) -> dict:
        out = {"name": self.name, "site": self.site, "batch": self.batch, "ssh": self.ssh, "login": self.login,
               "cluster_file": self.cluster_file, "remote_cluster_file": self.remote_cluster_file,
               "job_cluster_file": self.job_cluster_file, "scheduler": self.scheduler.to_json(),
               "job": spec_json(self.job), "n_jobs": self.n_jobs, "max_jobs_in_queue": self.max_jobs_in_queue,
               "pools": {name: p.to_json() for name, p in self.pools.items()}, "escalate": self.escalate,
               "poll_interval": self.poll_interval, "poll_interval_fast": self.poll_interval_fast,
               "batch_calls_per_minute": self.batch_calls_per_minute, "startup_failures": self.startup_failures,
               "journal": self.journal, "job_lifetime": self.job_lifetime}
        if self.resume:
            out["resume"] = True
        out.update(daemon_log=self.daemon_log, plan_file=self.plan_file, tls_directory=self.tls_directory,
                   owner_pid=self.owner_pid)
        # The rest only where set, as launch() and a renewal have always written them.
        if self.owner_file is not None:
            out["owner_file"] = self.owner_file
        if self.scheduler_job is not None:
            out["scheduler_job"] = self.scheduler_job.to_json()
        if self.successor_of is not None:
            out["successor_of"] = self.successor_of
        if self.reattach_grace is not None:
            out["reattach_grace"] = self.reattach_grace
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        job = JobSpec(**d["job"])
        # A plan from before pools: its one pool is the job, its lifetime and its count.
        pools = {name: PoolPlan.from_json(p) for name, p in (d.get("pools") or {}).items()} or \
            {DEFAULT_POOL: PoolPlan(job=job, job_lifetime=d.get("job_lifetime"), n_jobs=int(d.get("n_jobs") or 0))}
        sj = d.get("scheduler_job")
        return cls(name=d["name"], batch=d["batch"], cluster_file=d["cluster_file"],
                   scheduler=SchedulerPlan.from_json(d["scheduler"]), job=job, pools=pools, site=d.get("site"),
                   ssh=d.get("ssh"), login=d.get("login"), remote_cluster_file=d.get("remote_cluster_file"),
                   job_cluster_file=d.get("job_cluster_file"), n_jobs=int(d.get("n_jobs") or 0),
                   max_jobs_in_queue=d.get("max_jobs_in_queue"), escalate=d.get("escalate"),
                   poll_interval=d.get("poll_interval"), poll_interval_fast=d.get("poll_interval_fast"),
                   batch_calls_per_minute=d.get("batch_calls_per_minute"),
                   startup_failures=d.get("startup_failures", 3), journal=bool(d.get("journal")),
                   job_lifetime=d.get("job_lifetime"), daemon_log=d.get("daemon_log"), plan_file=d.get("plan_file"),
                   tls_directory=d.get("tls_directory"), owner_pid=d.get("owner_pid"),
                   owner_file=d.get("owner_file"), resume=bool(d.get("resume")),
                   scheduler_job=SchedulerJobPlan.from_json(sj) if sj else None,
                   successor_of=None if d.get("successor_of") is None else str(d["successor_of"]),
                   reattach_grace=d.get("reattach_grace"))

    def copy(self) -> "Plan":
        """A deep copy (through the JSON: what a file would hold)."""
        return Plan.from_json(json.loads(json.dumps(self.to_json())))

    def save(self, path) -> None:
        """Write the plan (0600: it names the cluster file), replacing any file there whole."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_json(), f)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> "Plan":
        return cls.from_json(json.loads(Path(path).read_text()))


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
    if v.get("engine", "hpc-cluster") != "hpc-cluster":
        args += ["--engine", v["engine"]]          # the nanny starts that engine's worker (worker/flags.py)
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
    """The workers' --memory-limit: memory_limit, or the job's memory / processes, as dask-jobqueue
    writes it. The job's memory is SLURM's job_mem when set: what sbatch asks for, and so what
    the job's cgroup allows (memory= would tell the workers another size than they have)."""
    job = job_mem_bytes(v.get("job_mem")) or v["memory"] or 0
    return format_bytes(v["memory_limit"] or job // v["processes"]).replace(" ", "")


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
                   batch_options=batch_options(v), nodes=v.get("nodes") or 1)



def render_job_script(cfg: ResolvedConfig, cluster_file: str, name: str = "worker",
                      pool: str = DEFAULT_POOL) -> str:
    """The job script `cfg` makes (for `pool`); a template or value the adapter refuses is a ConfigError."""
    try:
        return get_adapter(cfg.values["batch"]).render(job_spec(cfg, cluster_file, name, pool))
    except BatchError as e:
        raise ConfigError([f"site {cfg.site or '(defaults)'}: {e}"]) from None


def scheduler_host(cfg: ResolvedConfig) -> str:
    """Where the scheduler listens: scheduler_options' host or interface, else the workers'
    interface (as dask-jobqueue shares it), else '': the daemon listens on the address that
    routes to the compute nodes, chosen where it runs (deploy/address.py), never on every
    interface unless host '0.0.0.0' is asked for."""
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
    return ""


def shared_cluster_file(cfg: ResolvedConfig, name: str) -> str | None:
    """With shared_temp_directory (dask-jobqueue's directory that the scheduler's machine and
    the workers' share), the jobs read their copy of the cluster file from there."""
    shared = cfg.values["shared_temp_directory"]
    return os.path.join(shared, f".hpc-cluster-{name}.json") if shared else None


def writable_directory(cfg: ResolvedConfig, key: str) -> Path:
    """The directory setting `key` (log_directory, shared_temp_directory) made and proven
    writable here, before any job: a job whose -o/-e file SLURM cannot open fails at its start
    (3 such jobs halted a cluster, with advice to read logs that could not exist). A bad one is
    a ConfigError (`up` exits 2) naming the directory and what to change. Root may write
    anywhere but on a read-only filesystem, so the proof is a file made and removed."""
    given = cfg.values[key]
    path = Path(given).expanduser()
    source = cfg.sources.get(key, "")
    source = {"keyword": "a keyword"}.get(source, source.partition(":")[2] or source)
    where = f"{key} {given!r}" + (f" ({path})" if str(path) != given else "") + (f", from {source}," if source else "")
    fix = (f"set {key} to a directory you can write (e.g. ~/hpc-cluster-logs)" if key == "log_directory"
           else f"set {key} to a directory you can write that the compute nodes share")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{where} is a file, not a directory: {fix}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # Name the part in the way: mkdir's error names the path it was making.
        ancestor = next((p for p in path.parents if p.exists()), None)
        blocker = f"{ancestor} is a file" if ancestor is not None and not ancestor.is_dir() else \
            f"{exc.filename or path}"
        raise ConfigError(f"{where} cannot be created ({exc.strerror}: {blocker}): {fix}, "
                          "or create it first") from None
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".hpc-cluster-write-test-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{where} is not writable ({exc.strerror}): the batch system could not write the "
                          f"jobs' output there and every job would fail at its start; {fix}, or make it "
                          "writable") from None
    return path


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
            for key in ("log_directory", "shared_temp_directory"):
                if v[key]:
                    writable_directory(cfg, key)
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
                     "nthreads": max(1, (v["cores"] or 1) // processes),
                     "processes": processes * (v.get("nodes") or 1),       # workers per job
                     "resources": parse_resources(settings.get("resources") or ""),
                     "max_jobs": pool.max_jobs, "escalation_only": pool.escalation_only}
    return out


def make_plan(cfg: ResolvedConfig, name: str, cluster_file: Path, n_jobs: int,
              worker_prefix: str | None = None, pool_jobs: dict[str, int] | None = None) -> Plan:
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
        plan_pools[pool_name] = PoolPlan(job=pspec, max_jobs=pool.max_jobs, escalation_only=pool.escalation_only,
                                         n_jobs=start, scheduler=table[pool_name],
                                         job_lifetime=job_lifetime(pool.values["worker_extra_args"]))
    options = v["scheduler_options"] or {}
    return Plan(
        name=name, site=cfg.site, batch=v["batch"], ssh=v["ssh"], login=login, cluster_file=str(cluster_file),
        remote_cluster_file=job_cluster_file if v["ssh"] else None,
        # The jobs' own copy (shared_temp_directory), written and removed by the daemon.
        job_cluster_file=job_cluster_file if not v["ssh"] and job_cluster_file != str(cluster_file) else None,
        scheduler=SchedulerPlan(host=scheduler_host(cfg), port=options.get("port") or 0,
                                allowed_failures=v["allowed_failures"], heartbeat_ttl=v["heartbeat_ttl"],
                                versions=v["versions"], walltime_margin=v["walltime_margin"],
                                max_message_bytes=v["max_message_bytes"], max_frame_bytes=v["max_frame_bytes"],
                                dashboard=dashboard_bind(options), engine=v.get("engine") or "hpc-cluster"),
        job=spec, n_jobs=n_jobs, max_jobs_in_queue=v["max_jobs_in_queue"], pools=plan_pools, escalate=v["escalate"],
        poll_interval=v["poll_interval"], poll_interval_fast=v["poll_interval_fast"],
        batch_calls_per_minute=v["batch_calls_per_minute"], startup_failures=v["startup_failures"],
        journal=v["journal"], job_lifetime=job_lifetime(v["worker_extra_args"]))


def dashboard_bind(options: dict) -> list | None:
    """[host, port] the daemon's dashboard listens on, or None: scheduler_options'
    dashboard_address (':8787' by default) and dashboard=False. An address without a host
    listens on 127.0.0.1 (issue 34): its pages and token stay off the network, and users reach
    it through `ssh -L` (docs/dashboard.md); a host given ('0.0.0.0:8787') is taken as is."""
    if options.get("dashboard") is False:
        return None
    bind = parse_dashboard_address(options.get("dashboard_address", DEFAULT_DASHBOARD_ADDRESS),
                                   "scheduler_options['dashboard_address']")
    return [bind[0] or DASHBOARD_HOST, bind[1]] if bind else None


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
