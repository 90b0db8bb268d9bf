"""LocalCluster: a scheduler and worker processes on this machine, no batch system.

The scheduler runs in its own process (as it does under `hpc-cluster up`), so a busy
client cannot stall it; each worker runs under a nanny unless `nanny=False`.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import psutil

from ...engines import check_engine
from ...client.asynchronous import AwaitableMixin
from ...client.html import ClusterDisplayMixin, cluster_html
from ...lifeline import alive, process_start
from ...retry import Backoff
from ...units import parse_memory
from ...worker.flags import memory_fraction_args
from ...protocol.clusterfile import SECRET_ENV, dashboard_link, new_secret, open_private, private_directory
from ...protocol.tls import choose_security, loopback_only, resolve_security
from .dask_keywords import take_dask_keywords

_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])
_live: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()


def _child_env(secret: bytes) -> dict:
    env = dict(os.environ)
    env[SECRET_ENV] = secret.hex()
    # Workers must import this very package even when it is not installed (a source checkout).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    return env


def _stop(proc: subprocess.Popen, deadline: float) -> None:
    """SIGTERM (graceful), then SIGKILL if it is still there at the deadline."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for(condition, timeout: float, what: str, check=None):
    deadline = time.monotonic() + timeout
    backoff = Backoff(0.01, 0.2, factor=1.5)
    while True:
        value = condition()
        if value:
            return value
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {timeout:g} s")
        time.sleep(backoff.next())


OWNER_FILE = "cluster.owner"
# What a LocalCluster leaves in its log directory that the next one there must not read.
STALE = ("scheduler.address", "scheduler.address.tmp", "scheduler.dashboard", "scheduler.dashboard.tmp")


def _process_id(pid: int) -> list:
    """A pid with its start time: a pid the kernel reuses for another process is not ours."""
    return [pid, process_start(pid)]


def _running(ids) -> list[int]:
    running = []
    for pid, started in ids or ():
        try:
            if alive(int(pid), float(started)):
                running.append(pid)
        except (TypeError, ValueError):
            pass
    return running


def claim_log_directory(directory: Path) -> Path:
    """Make `directory` this cluster's: refuse one a running cluster uses, and remove what a
    cluster that is gone left there (its address file: read, it sent the new cluster to a dead
    scheduler). Logs stay and grow: nothing of the earlier run is lost."""
    private_directory(directory)
    owner = directory / OWNER_FILE
    try:
        previous = json.loads(owner.read_text())
    except (OSError, ValueError):
        previous = {}
    alive = _running(previous.get("processes") if isinstance(previous, dict) else None)
    if alive:
        raise RuntimeError(
            f"log_directory {str(directory)!r} is in use by a running LocalCluster (processes "
            f"{', '.join(map(str, alive))}, scheduler {previous.get('address') or 'starting'}); close that "
            "cluster first, or give this one another log_directory (or none: a temporary one)")
    for name in (OWNER_FILE, *STALE):
        (directory / name).unlink(missing_ok=True)
    try:        # exclusive: of two clusters starting here at once, one is refused
        fd = os.open(owner, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise RuntimeError(f"log_directory {str(directory)!r} was claimed by another LocalCluster starting "
                           "at the same moment; give this one another log_directory") from None
    with os.fdopen(fd, "w") as f:
        json.dump({"processes": [_process_id(os.getpid())]}, f)
    return owner


KNOBS = ("allowed_failures", "heartbeat_ttl", "heartbeat_interval", "memory_target_fraction",
         "memory_spill_fraction", "memory_pause_fraction", "memory_terminate_fraction",
         "versions", "max_message_bytes", "max_frame_bytes")


def cluster_settings(config=None, **given) -> dict:
    """The scheduler/nanny knobs: keywords > $HPC_CLUSTER_* > config files' settings > defaults."""
    from ...config import check_keywords, env_overrides, find_config_files, load_config_files, merge
    keywords = check_keywords({k: v for k, v in given.items() if v is not None})
    files = load_config_files(find_config_files(config))
    merged = merge(files, None, env_overrides(), keywords)
    return {k: merged[k].value for k in KNOBS}


class LocalCluster(AwaitableMixin, ClusterDisplayMixin):
    """Scheduler and workers on this machine.

    The fault-tolerance knobs (`allowed_failures`, `heartbeat_ttl`, `heartbeat_interval`,
    `memory_target_fraction`, `memory_spill_fraction`, `memory_pause_fraction`,
    `memory_terminate_fraction` (dask's 0.6 / 0.7 / 0.8 / 0.95, False: off), `versions`,
    `max_message_bytes`, `max_frame_bytes`) left as None come from $HPC_CLUSTER_<KNOB> or the
    config files' `settings` (docs/configuration.md). `local_directory`, as in dask: where the
    workers run and spill results to disk (default: the temp directory). `security`, as in
    dask: True encrypts every connection with TLS under a certificate made for this cluster
    (tls:// addresses); or a Security (ours or dask's) naming a CA, a certificate and its key;
    False: plain TCP. By default a cluster whose `host` is not a loopback address is TLS, one
    on 127.0.0.1 (the default) plain TCP (docs/reliability.md, "Encryption").
    `journal=True`: the scheduler keeps a journal of its state (`scheduler.journal` in the log
    directory; scheduler/journal.py), removed when the cluster closes. `dashboard_address`, as
    in dask: where the scheduler's process serves the dashboard (docs/dashboard.md): ':8787'
    (on 127.0.0.1; a free port if that one is taken), ':0', 'HOST:PORT', or None for none;
    the link, with its token, is `cluster.dashboard_link`.
    """

    def __init__(self, n_workers: int | None = None, threads_per_worker: int | None = None,
                 memory_limit: int | str | None = "auto", nanny: bool | None = None, host: str = "127.0.0.1",
                 resources: dict | None = None, log_directory: str | None = None, timeout: float = 30.0,
                 config: str | None = None, allowed_failures: int | None = None,
                 heartbeat_ttl: float | None = None, heartbeat_interval: float | None = None,
                 memory_terminate_fraction: float | None = None, versions: str | None = None,
                 max_message_bytes: int | str | None = None, max_frame_bytes: int | str | None = None,
                 memory_target_fraction: float | None = None, memory_spill_fraction: float | None = None,
                 memory_pause_fraction: float | None = None, local_directory: str | None = None,
                 security=None, journal: bool = False, dashboard_address: str | int | None = ":8787",
                 processes: bool = True, asynchronous: bool = False, scheduler_port: int = 0,
                 name: str | None = None, engine: str = "hpc-cluster", **unknown):
        if check_engine(engine) != "hpc-cluster":
            raise ValueError("LocalCluster(engine='distributed') is not supported: LocalCluster runs hpc-cluster's "
                             "engine on this machine. For distributed's engine here use distributed.LocalCluster "
                             "(without our diagnosis); on a batch system, SLURMCluster(..., engine='distributed') "
                             "and the other cluster classes deploy and diagnose it (docs/choosing-an-engine.md)")
        protocol = unknown.pop("protocol", None)      # distributed's: tls:// or tcp:// (choose_security)
        if unknown:                    # distributed's other keywords (dask_keywords.py), or a mistake
            import inspect
            known = [p for p in inspect.signature(LocalCluster.__init__).parameters if p not in ("self", "unknown")]
            host = take_dask_keywords(unknown, host, known)
        # TLS unless the scheduler listens on loopback alone (docs/reliability.md, "Encryption").
        wanted = choose_security(security, protocol, default=not loopback_only(host))
        # processes=False: the workers are threads of this process (threads.py), with no nanny.
        self.processes, self.name, self.scheduler_port = bool(processes), name, int(scheduler_port)
        if not self.processes and nanny:
            raise ValueError("LocalCluster(processes=False) runs the workers as threads of this process: there is "
                             "no worker process for a nanny to watch; drop nanny=True, or use processes=True")
        nanny = self.processes if nanny is None else bool(nanny)
        self._asynchronous = bool(asynchronous)
        self.settings = cluster_settings(
            config, allowed_failures=allowed_failures, heartbeat_ttl=heartbeat_ttl,
            heartbeat_interval=heartbeat_interval, memory_terminate_fraction=memory_terminate_fraction,
            memory_target_fraction=memory_target_fraction, memory_spill_fraction=memory_spill_fraction,
            memory_pause_fraction=memory_pause_fraction,
            versions=versions, max_message_bytes=max_message_bytes, max_frame_bytes=max_frame_bytes)
        cpus = os.cpu_count() or 1
        # distributed's processes=False default: one worker with a thread per core.
        self.n_workers = (cpus if self.processes else 1) if n_workers is None else int(n_workers)
        self.threads_per_worker = threads_per_worker or max(1, cpus // max(1, self.n_workers))
        if memory_limit == "auto":
            self.memory_limit = psutil.virtual_memory().total // max(1, self.n_workers)
        elif memory_limit in (None, 0, "0"):
            self.memory_limit = 0
        else:
            self.memory_limit = parse_memory(memory_limit, "memory_limit")
        self.nanny, self.host, self.timeout = nanny, host, timeout
        from ...config.schema import DASHBOARD_HOST, parse_dashboard_address   # config loads at use
        # (host, port) of the dashboard, None: no dashboard. No host: 127.0.0.1 (DASHBOARD_HOST)
        # wherever the scheduler listens, so that its token never crosses a network in clear.
        bind = parse_dashboard_address(dashboard_address, "LocalCluster(dashboard_address=...)")
        self._dashboard_bind = (bind[0] or DASHBOARD_HOST, bind[1]) if bind else None
        self.dashboard_address: str | None = None          # http://host:port/ once it listens
        self.journal = bool(journal)
        self.local_directory = None if local_directory is None else os.path.abspath(local_directory)
        self.resources = resources or {}
        self.secret = new_secret()
        self._tmp = tempfile.TemporaryDirectory(prefix="hpc-cluster-")
        self.log_directory = Path(log_directory or self._tmp.name)
        # security=True, or by default a host beyond this machine: a certificate for this cluster
        # alone, in its private temp directory.
        self.security = resolve_security(wanted, Path(self._tmp.name) / "tls")
        self.workers: dict[str, subprocess.Popen] = {}       # or threads.ThreadWorkerHandle, processes=False
        self._threads = None                                  # threads.WorkerThreads, processes=False
        self._counter = 0
        self._owner_file: Path | None = None
        self.scheduler_address: str | None = None
        self.status = "starting"
        if self._asynchronous:
            self._start_in_background(self._start)           # `await cluster` waits for it (AwaitableMixin)
        else:
            self._start()

    # distributed's methods that give awaitables in async code of an asynchronous cluster.
    AWAITABLE_METHODS = frozenset({"close", "wait_for_workers"})

    def _start(self) -> None:
        try:
            self._owner_file = claim_log_directory(self.log_directory)
        except BaseException:
            self.status = "closed"
            self._tmp.cleanup()
            raise
        _live.add(self)
        try:
            self._scheduler = self._start_scheduler()
            self.scale(self.n_workers)
            if self.n_workers:
                self.wait_for_workers(self.n_workers, self.timeout)
        except BaseException:
            self.close()
            raise
        self.status = "running"

    @staticmethod
    def _owner_args() -> list[str]:
        """Our processes end with this Python process, even one killed with SIGKILL (lifeline.py)."""
        return ["--owner-pid", str(os.getpid())]

    def _limit_args(self) -> list[str]:
        tls = []
        if self.security is not None:
            s = self.security
            tls = ["--tls-ca-file", s.tls_ca_file, "--tls-cert", s.tls_cert, "--tls-key", s.tls_key]
        return ["--max-message-bytes", str(self.settings["max_message_bytes"]),
                "--max-frame-bytes", str(self.settings["max_frame_bytes"]), *tls]

    def _start_scheduler(self) -> subprocess.Popen:
        st = self.settings
        address_file = self.log_directory / "scheduler.address"
        log = open_private(self.log_directory / "scheduler.log", "ab")
        dashboard_file = self.log_directory / "scheduler.dashboard"
        dashboard = []
        if self._dashboard_bind is not None:
            host, port = self._dashboard_bind
            dashboard = ["--dashboard-port", str(port), "--dashboard-file", str(dashboard_file),
                         "--dashboard-host", host]
        # The scheduler with the dashboard beside it (deploy/local/scheduler.py).
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpc_cluster.deploy.local.scheduler", "--host", self.host, *dashboard,
             "--port", str(self.scheduler_port),
             "--address-file", str(address_file), "--heartbeat-ttl", str(st["heartbeat_ttl"]),
             "--allowed-failures", str(st["allowed_failures"]), "--versions", st["versions"],
             *self._limit_args(), *self._owner_args(),
             *(["--journal", str(self.journal_path)] if self.journal else [])],
            env=_child_env(self.secret), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        # The scheduler is ours too: while it runs (even past a killed owner) the directory is in use.
        self._owner_file.write_text(json.dumps({"processes": [_process_id(os.getpid()), _process_id(proc.pid)]}))

        def check():
            if proc.poll() is not None:
                tail = (self.log_directory / "scheduler.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the scheduler exited with code {proc.returncode}:\n{tail}")

        try:
            self.scheduler_address = _wait_for(lambda: address_file.exists() and address_file.read_text(),
                                               self.timeout, "the scheduler", check)
        except BaseException:
            _stop(proc, time.monotonic() + 10)
            raise
        self._owner_file.write_text(json.dumps({"processes": [_process_id(os.getpid()), _process_id(proc.pid)],
                                                "address": self.scheduler_address}))
        if dashboard:                               # written before the address file
            self.dashboard_address = json.loads(dashboard_file.read_text())["address"]
        return proc

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's URL with its access token (docs/dashboard.md); None without one."""
        if self.dashboard_address is None:
            return None
        return dashboard_link(self.dashboard_address, self.secret)

    @property
    def journal_path(self) -> Path:
        return self.log_directory / "scheduler.journal"

    def _worker_command(self, name: str) -> list[str]:
        cmd = [sys.executable, "-m", "hpc_cluster.worker", "--scheduler", self.scheduler_address,
               "--nthreads", str(self.threads_per_worker), "--memory-limit", str(self.memory_limit),
               "--name", name, "--host", self.host, "--no-nanny" if not self.nanny else "--nanny",
               "--heartbeat-interval", str(self.settings["heartbeat_interval"]),
               *memory_fraction_args(self.settings), *self._limit_args(), *self._owner_args()]
        if self.local_directory:
            cmd += ["--local-directory", self.local_directory]
        if self.resources:
            cmd += ["--resources", " ".join(f"{k}={v}" for k, v in self.resources.items())]
        return cmd

    def _start_worker(self) -> str:
        name = f"worker-{self._counter}"
        self._counter += 1
        if not self.processes:
            from .threads import WorkerThreads, thread_worker_keywords
            self._threads = self._threads or WorkerThreads()
            self.workers[name] = self._threads.start(self.timeout, **thread_worker_keywords(self, name))
            return name
        log = open_private(self.log_directory / f"{name}.log", "ab")
        self.workers[name] = subprocess.Popen(self._worker_command(name), env=_child_env(self.secret),
                                              stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        return name

    def _stop_worker(self, name: str) -> None:
        proc = self.workers.pop(name, None)
        if proc is not None:
            _stop(proc, time.monotonic() + 10)

    def scale(self, n: int) -> None:
        """Run `n` worker processes (started or stopped to match). Ends adapt(), as our batch
        clusters' scale() does: an explicit size is what the user wants now."""
        self._stop_adapting()
        for name, proc in list(self.workers.items()):
            if proc.poll() is not None:                 # it ended on its own: not counted
                del self.workers[name]
        while len(self.workers) < n:
            self._start_worker()
        while len(self.workers) > n:
            self._stop_worker(sorted(self.workers, key=lambda s: int(s.split("-")[1]))[-1])

    def adapt(self, Adaptive=None, minimum: float = 0, maximum: float = math.inf, minimum_cores: int | None = None,
              maximum_cores: int | None = None, minimum_memory=None, maximum_memory=None, **kwargs):
        """Start and retire workers to fit the queued work, between `minimum` and `maximum`
        workers (or cores, memory), as distributed's LocalCluster.adapt; `interval` ("1s"),
        `wait_count` (3) and `target_duration` ("5s") as its Adaptive's. Returns what stops it
        (`.stop()`); scale() and close() stop it too (deploy/local/adapt.py)."""
        from .adapt import LocalAdaptive, adapt_settings
        settings = adapt_settings(self, Adaptive, minimum, maximum, minimum_cores, maximum_cores,
                                  minimum_memory, maximum_memory, **kwargs)
        self._stop_adapting()
        self._adaptive = LocalAdaptive(self, settings)
        return self._adaptive

    def _stop_adapting(self) -> None:
        adaptive = getattr(self, "_adaptive", None)
        if adaptive is not None:
            adaptive.stop()
            self._adaptive = None

    def worker_pids(self) -> dict[str, int]:
        """Process id of each worker process (the nanny's, when there is one). Workers that are
        threads of this process (processes=False) have none of their own and are not listed:
        their pid is the user's, which whoever signals "a worker's pid" must never get."""
        return {name: p.pid for name, p in self.workers.items()
                if p.poll() is None and isinstance(p, subprocess.Popen)}

    def wait_for_workers(self, n: int, timeout: float | None = None) -> None:
        from ...client.client import Client
        with Client(self, timeout=self.timeout) as c:
            c.wait_for_workers(n, timeout or self.timeout)

    def logs(self) -> dict[str, str]:
        return {p.stem: p.read_text(errors="replace") for p in sorted(self.log_directory.glob("*.log"))}

    def get_logs(self, cluster: bool = True, scheduler: bool = True, workers=True) -> dict[str, str]:
        """As dask's Cluster.get_logs: "Cluster" (a LocalCluster logs nothing of its own: empty),
        "Scheduler", and each worker's log under its address (its name once it is gone), of the
        addresses or names in `workers` if it is a list. Whole files from log_directory: a
        worker's holds its nanny's lines too."""
        files = self.logs()
        out = {"Cluster": ""} if cluster else {}
        if scheduler:
            out["Scheduler"] = files.get("scheduler", "")
        if not workers:
            return out
        addresses = {}
        if self.status == "running":
            from ...client.client import Client
            with Client(self, timeout=self.timeout, set_as_default=False) as c:
                addresses = {w.get("name"): a for a, w in c.scheduler_info()["workers"].items()}
        wanted = None if workers is True else set(workers)
        for name, text in files.items():
            label = addresses.get(name, name)
            if name.startswith("worker-") and (wanted is None or label in wanted or name in wanted):
                out[label] = text
        return out

    def close(self) -> None:
        if self.status == "closed":
            return
        self._stop_adapting()
        self.status = "closing"
        for proc in self.workers.values():          # all at once: they stop in parallel
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name in list(self.workers):
            _stop(self.workers.pop(name), deadline)
        if self._threads is not None:
            self._threads.close()
        sched = getattr(self, "_scheduler", None)
        if sched is not None:
            _stop(sched, time.monotonic() + 10)
        if self._owner_file is not None:            # the directory is free again; its logs stay
            for name in (OWNER_FILE, *STALE):
                (self.log_directory / name).unlink(missing_ok=True)
        self.status = "closed"
        try:
            self._tmp.cleanup()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"<LocalCluster {getattr(self, 'scheduler_address', '?')} workers={len(self.workers)} "
                f"threads={self.threads_per_worker} {self.status}>")

    def _repr_html_(self) -> str:
        """The notebook's summary (client/html.py): the scheduler's word on workers and deaths."""
        from ...units import format_memory
        memory = format_memory(self.memory_limit) if self.memory_limit else "no limit"
        return cluster_html(self, {"Workers started": len(self.workers), "Threads per worker": self.threads_per_worker,
                                   "Memory per worker": memory, "Nanny": "yes" if self.nanny else "no"})


@atexit.register
def _close_all() -> None:
    for cluster in list(_live):
        cluster.close()
