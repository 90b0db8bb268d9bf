"""SLURMCluster, PBSCluster, SGECluster (LSF's, HTCondor's: batch_clusters.py): dask-jobqueue's classes.

    cluster = SLURMCluster(cores=4, memory="16GB", walltime="01:00:00")
    cluster.scale(8)                      # 8 workers: 2 jobs of 4 processes, as dask-jobqueue
    client = Client(cluster)

Every keyword of dask-jobqueue 0.9's JobQueueCluster, SLURMCluster, PBSCluster and SGECluster is
accepted with its meaning; values also come from the site config files and from dask's
`jobqueue.<name>` configuration, as dask-jobqueue reads it (config/jobqueue.py). What has
no meaning here is said, never dropped in silence. A cluster is a cluster daemon (scheduler
+ job manager, deploy/daemon/run.py) run as a child process; `launch.py` starts it.
"""

from __future__ import annotations

import asyncio
import enum
import math
import signal
import subprocess
import warnings
from pathlib import Path
from typing import Any

from ..adapters import get_adapter
from ..adapters.base import JobSpec
from ..config import ConfigError, canonical_key, did_you_mean, option_by_name, resolve
from ..config.jobqueue import DEPRECATED
from ..config.pools import DEFAULT_POOL
from ..protocol.clusterfile import cluster_file_for, read_cluster_file
from ..protocol.messages import Op
from ..protocol.tls import Security
from ..client.html import ClusterDisplayMixin, cluster_html
from ..units import UnitError, format_memory, format_walltime, parse_memory
from ..engines import check_engine
from .adaptive import Adaptive, adapt_seconds
from .compat import check_security, cluster_security, silence_logs_note
from .keeper import DaemonKeeper
from .launch import ClusterError, cluster_id, control, launch  # noqa: F401  (ClusterError: public)
from .plan import Plan, job_spec


class Status(str, enum.Enum):
    """A cluster's state, named as distributed names it (and equal to those strings)."""

    created = "created"
    running = "running"
    closing = "closing"
    closed = "closed"
    failed = "failed"

    def __str__(self) -> str:
        return self.value


class JobqueueConfigWarning(UserWarning):
    """Something in the user's dask-jobqueue setup that has no meaning here (and what happens)."""


class SchedulerInfo:
    """Where the scheduler listens (dask-jobqueue's `cluster.scheduler.ip`, read-only)."""

    def __init__(self, address: str, host: str):
        self.address, self.ip = address, host
        self.port = int(address.rsplit(":", 1)[1]) if ":" in address else None

    def __repr__(self) -> str:
        return f"<Scheduler {self.address} listening on {self.ip}>"


_CLUSTER_KEYWORDS = ("n_workers", "job_cls", "loop", "security", "shared_temp_directory", "silence_logs",
                     "name", "asynchronous", "dashboard_address", "host", "scheduler_options",
                     "scheduler_cls", "interface", "protocol", "config_name", "site", "config")

JOB_PARAMETERS = """
    cores : int
        Total number of cores per job (required: a keyword, the site config or jobqueue.yaml)
    memory : str
        Total amount of memory per job, e.g. "16GB" (required likewise)
    processes : int
        Worker processes per job; by default about sqrt(cores), as in dask-jobqueue
    walltime : str
        Time limit per job, read as the batch system reads it
    queue, account : str
        Partition/queue and account (project) the jobs are charged to
    job_name : str
        The batch job's name (default "dask-worker")
    name : str
        The cluster's name; workers are named NAME-<job index>[-<process>]
    job_extra_directives, job_directives_skip, job_script_prologue : list of str
        Extra batch directives; directives to drop; shell lines before the worker starts
    worker_extra_args : list of str
        dask-worker flags for the workers (--lifetime, --resources, ...)
    log_directory, local_directory, shared_temp_directory, interface, death_timeout, nanny,
    python, shebang, scheduler_options, config_name, security, protocol, asynchronous
        As in dask-jobqueue; see docs/migrating-from-dask-jobqueue.md
    site, config : str
        hpc-cluster's site and config file (docs/configuration.md)
    pools : dict
        Extra worker pools, each the cluster's job spec with what it names changed, e.g.
        {"bigmem": {"memory": "64GB", "queue": "bigmem", "max_jobs": 2}}; a pool also takes
        max_jobs, escalation_only, resources and n_workers/jobs to start with
        (docs/pools-and-retries.md). scale(), adapt() and job_script() take pool=
    escalate : dict
        Retry by cause: {"memory": True, "walltime": True, "margin": 1.5} (the defaults)
    scheduler_in_job : bool
        Run the scheduler itself as a small batch job (1 core, scheduler_job_memory, for
        scheduler_job_walltime), for sites that forbid long processes on login nodes; it hands
        over to a successor job before its walltime. close() ends it, or a minute without
        this process's heartbeat file (docs/reliability.md)
"""


class JobQueueCluster(ClusterDisplayMixin):
    __doc__ = ("""Workers as batch jobs, joining one scheduler that explains their deaths.

    Use SLURMCluster or PBSCluster; this base class has no batch system.

    Parameters
    ----------
""" + JOB_PARAMETERS)

    batch: str = ""

    def __init__(self, n_workers: int | None = None, job_cls: Any = None, loop: Any = None, security: Any = None,
                 shared_temp_directory: str | None = None, silence_logs: Any = "error", name: str | None = None,
                 asynchronous: bool = False, dashboard_address: str | None = None, host: str | None = None,
                 scheduler_options: dict | None = None, scheduler_cls: Any = None, interface: str | None = None,
                 protocol: str | None = None, config_name: str | None = None, *, site: str | None = None,
                 config: str | None = None, **job_kwargs):
        cls = type(self).__name__
        # dask-jobqueue's own refusals first, with its meaning (and before n_workers is read:
        # its tests pass a class there and expect these).
        for given, key in ((dashboard_address, "dashboard_address"), (host, "host")):
            if given is not None:
                raise ValueError(f"Please pass {key!r} through 'scheduler_options': use\n"
                                 f"cluster = {cls}(..., scheduler_options={{{key!r}: {given!r}}}) "
                                 f"rather than\ncluster = {cls}(..., {key}={given!r})")
        if job_cls is not None:
            raise ValueError(f"job_cls={job_cls!r}: hpc-cluster has no Job classes; a batch system is an "
                             "adapter (SLURMCluster, PBSCluster, SGECluster, LSFCluster, HTCondorCluster, or batch= "
                             "'slurm'/'pbs'/'sge'/'lsf'/'htcondor' or a plugin's name in a site)")
        if not self.batch and not job_kwargs.get("batch"):
            raise ValueError(f"You need to specify a Job type (dask-jobqueue's job_cls), that is a batch system, "
                             f"for {cls}: use SLURMCluster, PBSCluster, SGECluster, LSFCluster or HTCondorCluster, "
                             "or pass batch='slurm', 'pbs', 'sge', 'lsf', 'htcondor' or an installed plugin's name")
        if scheduler_cls is not None:
            raise ValueError(f"scheduler_cls={scheduler_cls!r}: hpc-cluster runs its own scheduler in the "
                             "cluster daemon; remove scheduler_cls")
        self._check_keywords(job_kwargs)
        options = scheduler_options or {}             # the scheduler's own protocol/security, checked alike
        notes = [*check_security(security), *check_security(options.get("security")),
                 *silence_logs_note(silence_logs)]
        given = {"interface": interface, "shared_temp_directory": shared_temp_directory,
                 "scheduler_options": scheduler_options, "config_name": config_name}
        kwargs = {"batch": self.batch or None, **{k: v for k, v in given.items() if v is not None}, **job_kwargs}
        with warnings.catch_warnings():
            warnings.simplefilter("always", FutureWarning)   # renamed keywords: say so every time
            self.config = cfg = resolve(site=site, config=config, **kwargs)
        v = cfg.values
        # TLS unless security=False, protocol='tcp://' or the site's `security: false` (compat.py).
        self._security = cluster_security(security, protocol, v)
        self.batch = v["batch"]
        self.engine = check_engine(v.get("engine") or "hpc-cluster")   # EngineError: what to install or write
        self._require_cores_and_memory(job_kwargs)
        notes += self._check_worker_args(v["worker_extra_args"])
        notes += cfg.notes
        if notes:
            warnings.warn(JobqueueConfigWarning(
                f"{cls}: parts of your dask-jobqueue setup have no meaning here:\n  " + "\n  ".join(notes)),
                stacklevel=2)
        self.name = name or cls
        # The cluster file's name, unique: what `hpc-cluster status|why|logs|down ID` take.
        self.id = cluster_id(self.name, explicit=name is not None)
        self.cluster_file: Path = cluster_file_for(self.id)
        self.processes = v["processes"]
        self.pools = cfg.pools()               # name -> config/pools.py's Pool, "default" first
        self.asynchronous = bool(asynchronous)
        self.loop = loop                      # accepted for dask's signature; nothing runs on it
        self.status = Status.created
        self.scheduler_address: str | None = None
        self.secret: bytes | None = None
        self.security = None                  # protocol/tls.py's Security once started, with security=
        self._proc: subprocess.Popen | None = None
        self._keeper: DaemonKeeper | None = None       # restarts a daemon that died, once (keeper.py)
        self._job: JobSpec | None = None
        self._pool_jobs: dict[str, JobSpec] = {}
        self._starting: asyncio.Future | None = None
        self._pending: list[asyncio.Future] = []
        self._n_workers = v["n_workers"] if n_workers is None else n_workers
        if not isinstance(self._n_workers, int) or isinstance(self._n_workers, bool) or self._n_workers < 0:
            raise ValueError(f"n_workers={n_workers!r} must be a whole number >= 0")
        if not self.asynchronous:
            self._start()

    # -- construction checks ------------------------------------------------------------
    def _check_keywords(self, job_kwargs: dict) -> None:
        known = set(option_by_name()) | set(DEPRECATED)   # with the installed adapters' own
        unknown = [k for k in job_kwargs if k not in DEPRECATED and (canonical_key(k) is None or "-" in k)]
        if unknown:
            k = unknown[0]
            shown = {key: val for key, val in job_kwargs.items()}
            raise ValueError(f"Got an unexpected keyword argument {k!r} for {type(self).__name__}"
                             f"{did_you_mean(k, sorted(known | set(_CLUSTER_KEYWORDS)))}. The job keywords "
                             f"it was given (job_kwargs): {shown}; docs/migrating-from-dask-jobqueue.md "
                             "lists every keyword")

    def _require_cores_and_memory(self, job_kwargs: dict) -> None:
        v = self.config.values
        if v["cores"] is not None and v["memory"] is not None:
            return
        cls = type(self).__name__
        missing = " and ".join(k for k in ("cores", "memory") if v[k] is None)
        cores = v["cores"] or 8
        memory = job_kwargs.get("memory") if v["memory"] is not None else "24GB"
        section = v["config_name"] or self.batch
        raise ValueError(f"You must specify how much cores and memory per job you want to use "
                         f"({missing} not given by a keyword, a site config or dask's "
                         f"jobqueue.{section} configuration), for example:\n"
                         f"cluster = {cls}(cores={cores}, memory={memory!r})")

    def _check_worker_args(self, args: list[str]) -> list[str]:
        """dask-worker flags are checked here, before any job is submitted, not when every
        worker fails to start; returns notes on flags accepted but without effect."""
        from ..worker.flags import check_worker_args, ignored_worker_args
        problems = check_worker_args(list(args))
        if problems:
            raise ValueError("worker_extra_args: " + "; ".join(problems))
        return [f"worker_extra_args: {note}" for note in ignored_worker_args(list(args))]

    # -- starting -------------------------------------------------------------------------
    def _start(self) -> None:
        try:
            self._proc, path = launch(self.config, self.id, n_jobs=0, worker_prefix=self.name,
                                      security=self._security)
        except BaseException:
            self.status = Status.failed
            raise
        plan = Plan.load(path.parent / f".{self.id}.plan.json")
        self._job = plan.job
        self._pool_jobs = {name: p.job for name, p in plan.pools.items()}
        info = self._read_addresses()
        self.daemon_log = info.get("daemon_log")
        # A daemon in a scheduler job watches this file, touched by the keeper, instead of our pid.
        self.owner_file = plan.owner_file
        self.status = Status.running
        self._keeper = DaemonKeeper(self, lambda: launch(self.config, self.id, n_jobs=0, worker_prefix=self.name,
                                                         security=self._security)[0])
        self._keeper.start()
        if self._n_workers:
            control(self.cluster_file, Op.SCALE, jobs=math.ceil(self._n_workers / self._processes(None)))

    def _read_addresses(self) -> dict:
        """The scheduler's address, secret and security from the cluster file; read again after
        the keeper restarts the daemon (engine='distributed': its scheduler starts anew, elsewhere)."""
        info = read_cluster_file(self.cluster_file)
        self.scheduler_address, self.secret = info["address"], info["secret"]
        self.security = Security.from_dict(info.get("tls"))
        if info.get("engine_address"):
            # distributed's scheduler: the address and security its Client takes (Client(cluster))
            from ..engines.dask_scheduler import distributed_security
            self.scheduler_address = info["engine_address"]
            self.security = distributed_security(self.security, "client")
        return info

    async def _start_async(self) -> "JobQueueCluster":
        if self._starting is None and self.status is Status.running:
            # Started in __init__ (asynchronous=False), and distributed's Client(cluster) awaits the
            # cluster all the same: a second launch would find our own daemon and mark us failed.
            return self
        if self._starting is None:
            self._starting = asyncio.ensure_future(asyncio.to_thread(self._start))
        await self._starting
        return self

    def __await__(self):
        async def ready():
            await self._start_async()
            while self._pending:
                await asyncio.gather(*self._pending.copy(), return_exceptions=False)
                self._pending = [f for f in self._pending if not f.done()]
            return self
        return ready().__await__()

    def _op(self, fn):
        """Run `fn` (which talks to the daemon) now, or, with asynchronous=True, as a task on
        the running loop after the cluster started: awaitable, and done even if not awaited."""
        if not self.asynchronous:
            return fn()

        async def run():
            await self._start_async()
            return await asyncio.to_thread(fn)
        task = asyncio.ensure_future(run())
        self._pending.append(task)
        return task

    # -- the dask-jobqueue surface ---------------------------------------------------------
    def _pool(self, pool: str | None) -> str:
        name = pool or DEFAULT_POOL
        if name not in self.pools:
            raise ValueError(f"no pool named {name!r}; this cluster's pools: {', '.join(self.pools)} "
                             "(add one with pools={...})")
        return name

    def _processes(self, pool: str | None) -> int:
        """Workers per job of `pool`: `processes` on each of its `nodes`."""
        v = self.config.values if pool in (None, DEFAULT_POOL) else self.pools[self._pool(pool)].values
        return (v["processes"] or 1) * (v.get("nodes") or 1)

    def _spec(self, pool: str | None = None) -> JobSpec:
        pool = self._pool(pool)
        if pool in self._pool_jobs:           # what the jobs get (with ssh: the login node's paths)
            return self._pool_jobs[pool]
        if self._job is not None and pool == DEFAULT_POOL:
            return self._job
        return job_spec(self.config, str(self.cluster_file), self.name, pool)

    def job_script(self, pool: str | None = None) -> str:
        """The script each job runs (of `pool`; with ssh: the paths on the login node)."""
        return get_adapter(self.batch).render(self._spec(pool))

    @property
    def job_header(self) -> str:
        """The batch directives of the job script."""
        return "\n".join(get_adapter(self.batch).template_context(self._spec())["directives"])

    @property
    def job_name(self) -> str:
        return self.config.values["job_name"]

    def _jobs_for(self, n: int | None, jobs: int, memory: Any, cores: int | None, pool: str | None = None) -> int:
        v = self.config.values if pool in (None, DEFAULT_POOL) else self.pools[pool].values
        processes, nodes = self._processes(pool), v.get("nodes") or 1
        if n is not None:
            jobs = math.ceil(n / processes)
        if memory is not None:
            try:
                wanted = 0 if str(memory).strip().rstrip("BbKkMmGgTtIi ").strip() in ("0", "0.0") \
                    else parse_memory(memory, "memory")
            except UnitError as e:
                raise ValueError(str(e)) from None
            jobs = max(jobs, math.ceil(wanted / (v["memory"] * nodes)))     # memory and cores are per node
        if cores is not None:
            jobs = max(jobs, math.ceil(cores / (v["cores"] * nodes)))
        if jobs < 0:
            raise ValueError(f"scale(): {jobs} jobs; give numbers >= 0")
        return int(jobs)

    def scale(self, n: int | None = None, jobs: int = 0, memory: Any = None, cores: int | None = None,
              pool: str | None = None):
        """Scale to `n` workers (rounded up to whole jobs of `processes`), or `jobs` jobs, or
        enough jobs for `memory` in total or `cores` in total; dask-jobqueue's meanings. With
        `pool`, that pool's jobs (default: the cluster's own, pool "default")."""
        pool = self._pool(pool)
        target = self._jobs_for(n, jobs, memory, cores, pool)
        limit = self.pools[pool].max_jobs
        if limit is not None and target > limit:
            raise ValueError(f"scale(): {target} job(s) of pool {pool!r} is more than its max_jobs={limit}; "
                             f"ask for fewer or raise max_jobs in pools={{{pool!r}: {{'max_jobs': ...}}}}")
        extra = {} if pool == DEFAULT_POOL else {"pool": pool}
        return self._op(lambda: control(self.cluster_file, Op.SCALE, jobs=target, **extra))

    def adapt(self, minimum: int = 0, maximum: float | None = math.inf, minimum_jobs: int | None = None,
              maximum_jobs: int | None = None, interval: Any = "1s", wait_count: int = 3,
              target_duration: Any = "5s", minimum_cores: int | None = None, maximum_cores: int | None = None,
              minimum_memory: Any = None, maximum_memory: Any = None, pool: str | None = None,
              **unknown) -> Adaptive:
        """Size the cluster to the queued work, between `minimum` and `maximum` workers (or
        jobs, cores, memory), as dask's Adaptive does: up at once, down after `wait_count`
        decisions `interval` apart agree; `target_duration` is how long the queued work should
        take. Workers are counted in whole jobs of `processes`. With `pool`, that pool is sized
        to the work that would go to it."""
        if unknown:
            raise ValueError(f"adapt() got an unexpected keyword argument {next(iter(unknown))!r}")
        pool = self._pool(pool)
        processes = self._processes(pool)
        lo = math.ceil(minimum / processes) if minimum else 0
        hi = None if maximum is None or maximum == math.inf else math.floor(maximum / processes)
        if minimum_jobs is not None:
            lo = int(minimum_jobs)
        if maximum_jobs is not None:
            hi = int(maximum_jobs)
        if minimum_cores is not None or minimum_memory is not None:
            lo = max(lo, self._jobs_for(None, 0, minimum_memory, minimum_cores, pool))
        if maximum_cores is not None or maximum_memory is not None:
            cap = self._jobs_for(None, 0, maximum_memory, maximum_cores, pool)
            hi = cap if hi is None else min(hi, cap)
        if hi is not None and hi < lo:
            raise ValueError(f"adapt(): a minimum of {lo} job(s) is above the maximum of {hi}")
        policy = {"minimum": lo, "maximum": hi, "interval": adapt_seconds(interval, "interval"),
                  "wait_count": int(wait_count), "target_duration": adapt_seconds(target_duration, "target_duration")}
        if pool != DEFAULT_POOL:
            policy["pool"] = pool
        self._op(lambda: control(self.cluster_file, Op.ADAPT, **policy))
        return Adaptive(self, **policy)

    def _table(self, timeout: float = 60.0) -> dict:
        return control(self.cluster_file, Op.JOBS, timeout=timeout)

    @property
    def jobs(self) -> dict[str, dict]:
        """Each job's real batch state (pending, running, completed ...) and its workers."""
        return {j["job_id"]: j for j in self._table()["jobs"]}

    def status_table(self) -> dict:
        return self._table()

    @property
    def workers(self) -> dict[str, dict]:
        """The jobs in the queue or running, by worker-group name (NAME-<index>), as
        dask-jobqueue keys its Job objects; each value is the job's row (id, state, workers).
        A job we asked to go whose workers have all left is gone here, as dask-jobqueue drops
        a Job once it closed it, even while the batch system still ends it."""
        if self.status is not Status.running:
            return {}
        return {f"{self.name}-{j['index']}": j for j in self._table()["jobs"]
                if j["state"] in ("pending", "running", "unknown") and not (j["retiring"] and not j["workers"])}

    @property
    def worker_spec(self) -> dict[str, dict]:
        """The jobs the cluster wants (not the ones leaving): what scale() asked for."""
        return {k: j for k, j in self.workers.items() if not j.get("retiring")}

    @property
    def scheduler(self) -> SchedulerInfo | None:
        if self.scheduler_address is None:
            return None
        plan = self.cluster_file.parent / f".{self.id}.plan.json"
        host = Plan.load(plan).scheduler.host if plan.exists() else None
        return SchedulerInfo(self.scheduler_address, host or self.scheduler_address.split("://")[-1].rsplit(":", 1)[0])

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's URL with its access token (docs/dashboard.md), served by the cluster
        daemon; None when scheduler_options turned it off or the cluster is not running. Read
        from the cluster file each time: a daemon restarted by the keeper may have a new port."""
        try:
            info = read_cluster_file(self.cluster_file)
        except (OSError, ValueError):
            return None
        # engine='distributed': distributed's own dashboard (ours, the deaths page, beside it:
        # `hpc-cluster status` prints both)
        return info.get("engine_dashboard") or info.get("dashboard") or None

    def get_logs(self, cluster: bool = True, scheduler: bool = True, workers=True) -> dict[str, str]:
        """Logs by name, as dask's Cluster.get_logs: the cluster daemon's under "Cluster" and
        "Scheduler" (the daemon is the scheduler too: one log), and each worker's (of the
        addresses in `workers` if it is a list), dead ones included."""
        out: dict[str, str] = {}
        log = (read_cluster_file(self.cluster_file).get("daemon_log") if self.cluster_file.exists() else None)
        if (cluster or scheduler) and log and Path(log).exists():
            text = Path(log).read_text(errors="replace")
            out.update({name: text for name, wanted in (("Cluster", cluster), ("Scheduler", scheduler)) if wanted})
        if workers and self.status is Status.running:
            from ..client.client import Client
            with Client(self, timeout=30, set_as_default=False) as client:
                for key, lines in client.get_worker_logs(workers=None if workers is True else workers).items():
                    out[key] = "\n".join(lines)
        return out

    def close(self, timeout: float = 120.0):
        if not self.asynchronous:
            return self._close(timeout)
        return asyncio.ensure_future(self._close_async(timeout))

    async def _close_async(self, timeout: float = 120.0) -> None:
        # What was asked of the cluster before (scale, adapt) is done first, even if nobody
        # awaited it: closing under it would leave its request waiting on a daemon that left.
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending, return_exceptions=True)
        if self._starting is not None:
            await asyncio.gather(self._starting, return_exceptions=True)
        await asyncio.to_thread(self._close, timeout)

    def _close(self, timeout: float = 120.0) -> None:
        if self.status in (Status.closed, Status.created) and self._proc is None:
            self.status = Status.closed
            return
        if self.status is Status.closed:
            return
        self.status = Status.closing
        if self._keeper is not None:
            self._keeper.stop()
        try:
            control(self.cluster_file, Op.SHUTDOWN, timeout=timeout)
        except Exception:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self.status = Status.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    async def __aenter__(self):
        await self
        return self

    async def __aexit__(self, *exc):
        await self._close_async()

    def __del__(self):
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            # Not closed: the daemon also watches us and ends with us; this is sooner.
            proc.send_signal(signal.SIGTERM)

    def __repr__(self) -> str:
        counts = ""
        if self.status is Status.running:
            try:
                rows = [r for r in self._table(timeout=5)["jobs"] if r["state"] == "running"]
                workers = sum(len(r.get("workers") or []) for r in rows)
                v = self.config.values
                counts = (f", workers={workers}, threads={workers * max(1, v['cores'] // self.processes)}, "
                          f"memory={format_memory(workers * (v['memory'] // self.processes))}")
            except Exception:
                pass
        return f"{type(self).__name__}({self.name!r}, {self.scheduler_address!r}{counts}, status={self.status})"

    def _repr_html_(self) -> str:
        """The notebook's summary (client/html.py): the scheduler's word, and the jobs with their states."""
        v = self.config.values
        walltime = f", walltime={format_walltime(v['walltime'])}" if v.get("walltime") else ""
        each = (f"cores={v['cores']}, memory={format_memory(v['memory'], decimal=True, significant=3, sep='')}, "
                f"processes={self.processes}{walltime}")
        return cluster_html(self, {"Batch system": self.batch, "Job name": self.job_name, "Each job": each},
                            jobs=lambda: self._table(timeout=5)["jobs"])


class SLURMCluster(JobQueueCluster):
    __doc__ = """Workers as SLURM jobs (sbatch), joining one scheduler that explains their deaths.

    dask-jobqueue's SLURMCluster, keyword for keyword; `job_cpu` and `job_mem` set
    --cpus-per-task and --mem instead of cores and memory.

    Parameters
    ----------
""" + JOB_PARAMETERS + """    job_cpu : int
        SLURM --cpus-per-task (default: cores)
    job_mem : str
        SLURM --mem as sbatch reads it (default: memory, rounded up)
"""
    batch = "slurm"


class PBSCluster(JobQueueCluster):
    __doc__ = """Workers as PBS jobs (qsub), joining one scheduler that explains their deaths.

    dask-jobqueue's PBSCluster, keyword for keyword; `resource_spec` replaces the
    select=1:ncpus=..:mem=.. request.

    Parameters
    ----------
""" + JOB_PARAMETERS + """    resource_spec : str
        The -l resource request (default: select=1:ncpus={cores}:mem={memory})
"""
    batch = "pbs"


class SGECluster(JobQueueCluster):
    __doc__ = """Workers as Grid Engine jobs (qsub), joining one scheduler that explains their deaths.

    dask-jobqueue's SGECluster, keyword for keyword: `project` is qsub's -P (our `account`),
    `resource_spec` the -l request. As there, memory= asks Grid Engine for nothing by itself:
    give resource_spec='h_vmem={memory}' (or your site's memory complex) to have the job's
    memory enforced; {memory}, {cores} and {processes} are filled in (docs/sge.md).

    Parameters
    ----------
""" + JOB_PARAMETERS + """    project : str
        Project the jobs are charged to (qsub -P)
    resource_spec : str
        The -l resource request, e.g. 'h_vmem={memory}' or 'mem_free=16G'
"""
    batch = "sge"


__all__ = ["JobQueueCluster", "SLURMCluster", "PBSCluster", "SGECluster", "ClusterError", "ConfigError", "Status",
           "JobqueueConfigWarning"]
