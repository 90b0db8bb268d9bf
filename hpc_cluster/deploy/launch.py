"""SLURMCluster and PBSCluster: a cluster daemon plus batch jobs, driven from Python.

The keyword names are dask-jobqueue's, so switching is a change of import:

    cluster = SLURMCluster(cores=4, memory="16GB", walltime="01:00:00")
    cluster.scale(8)
    client = Client(cluster)

The cluster daemon (scheduler + job manager, `deploy/daemon.py`) runs as a child process;
`hpc-cluster up` starts the very same daemon detached. Values come from keywords, then
$HPC_CLUSTER_*, then the site config files (docs/configuration.md).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

from ..adapters import get_adapter
from ..adapters.base import BatchError, JobSpec
from ..protocol.secret import cluster_file_for, new_secret, read_cluster_file, write_cluster_file
from ..config import ConfigError, ResolvedConfig, resolve

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


def worker_command(cfg: ResolvedConfig, cluster_file: str) -> str:
    """The command a job runs: the worker(s), each under a nanny unless nanny=False."""
    v = cfg.values
    processes = v["processes"]
    nthreads = max(1, v["cores"] // processes)
    memory_limit = v["memory_limit"] or v["memory"] // processes
    args = ["-m", "hpc_cluster.worker", "--cluster-file", cluster_file,
            "--nthreads", str(nthreads), "--memory-limit", str(memory_limit),
            "--heartbeat-interval", str(v["heartbeat_interval"]),
            "--memory-terminate-fraction", str(v["memory_terminate_fraction"]),
            "--death-timeout", str(v["death_timeout"]),
            "--max-message-bytes", str(v["max_message_bytes"]), "--max-frame-bytes", str(v["max_frame_bytes"])]
    if processes > 1:
        args += ["--nworkers", str(processes)]
    if not v["nanny"]:
        args.append("--no-nanny")
    if v["interface"]:
        args += ["--interface", v["interface"]]
    else:
        args += ["--host", "0.0.0.0"]
    if v["local_directory"]:
        # Expanded ('~', $TMPDIR) and created by the worker on the node, not here.
        args += ["--local-directory", v["local_directory"]]
    args += list(v["worker_extra_args"])
    # The name carries the job id, which only the running job knows: the shell appends it
    # to the quoted name, so spaces, quotes and '$' in a name stay literal.
    name = shlex.quote(v["name"] + "-") + '"${HPC_CLUSTER_JOB_ID}"'
    return f"{shell_word(worker_python(cfg))} {shlex.join(args)} --name {name}"


def job_spec(cfg: ResolvedConfig, cluster_file: str) -> JobSpec:
    v = cfg.values
    env = dict(v["env"])
    return JobSpec(worker_command=worker_command(cfg, cluster_file), job_name=v["name"], cores=v["cores"],
                   memory=v["memory"], processes=v["processes"], walltime=v["walltime"], queue=v["queue"],
                   account=v["account"], extra_directives=list(v["job_extra_directives"]),
                   directives_skip=list(v["job_directives_skip"]), prologue=list(v["job_script_prologue"]),
                   epilogue=list(v["job_script_epilogue"]), log_directory=v["log_directory"],
                   python=worker_python(cfg), nanny=v["nanny"], env=env,
                   working_directory=v["working_directory"], template=v["template"],
                   resource_spec=v["resource_spec"])


def render_job_script(cfg: ResolvedConfig, cluster_file: str) -> str:
    """The job script `cfg` makes; a template or value the adapter refuses is a ConfigError."""
    try:
        return get_adapter(cfg.values["batch"]).render(job_spec(cfg, cluster_file))
    except BatchError as e:
        raise ConfigError([f"site {cfg.site or '(defaults)'}: {e}"]) from None


def scheduler_host(cfg: ResolvedConfig) -> str:
    if cfg.values["interface"]:
        from ..worker.__main__ import interface_address
        return interface_address(cfg.values["interface"])
    return "0.0.0.0"


def for_submission(cfg: ResolvedConfig, name: str, cluster_file: Path,
                   create: bool = True) -> tuple[ResolvedConfig, str, dict | None]:
    """(config, cluster file path, login node) as the jobs will see them.

    Locally that is `cfg` and `cluster_file` as they are. With `ssh`, the jobs run on a cluster
    that may share no filesystem with this machine: paths are resolved on the login node
    (its home, not ours), the cluster file goes under its config directory, and with
    `create` the directories are made there (the log directory too).
    """
    v = cfg.values
    if not v["ssh"]:
        if create and v["log_directory"]:
            Path(v["log_directory"]).expanduser().mkdir(parents=True, exist_ok=True)
        return cfg, str(cluster_file), None
    if not v["python"]:
        warnings.warn(f"site {cfg.site or '(defaults)'} submits over SSH and sets no `python`: jobs will "
                      f"start workers with `{REMOTE_DEFAULT_PYTHON}` from the compute node's PATH (after "
                      "job_script_prologue); set `python` to the cluster's interpreter that has hpc_cluster "
                      "installed, e.g. python: ~/venv/bin/python", UserWarning, stacklevel=3)
    from .remote import make_directories, on_login_node, probe
    from .runner import SSHRunner
    try:
        with SSHRunner(**v["ssh"]) as runner:
            login = probe(runner)
            cfg = on_login_node(cfg, login)
            if create:
                make_directories(runner, login, name, [d for d in [cfg.values["log_directory"]] if d])
    except BatchError as e:
        raise ClusterError(f"site {cfg.site or '(defaults)'}: preparing the login node over SSH failed: "
                           f"{e}") from None
    return cfg, login.cluster_file(name), login.as_dict()


def make_plan(cfg: ResolvedConfig, name: str, cluster_file: Path, n_jobs: int) -> dict:
    cfg, job_cluster_file, login = for_submission(cfg, name, cluster_file)
    v = cfg.values
    spec = job_spec(cfg, job_cluster_file)
    return {
        "name": name, "site": cfg.site, "batch": v["batch"], "ssh": v["ssh"], "login": login,
        "cluster_file": str(cluster_file), "remote_cluster_file": job_cluster_file if v["ssh"] else None,
        "scheduler": {"host": scheduler_host(cfg), "allowed_failures": v["allowed_failures"],
                      "heartbeat_ttl": v["heartbeat_ttl"], "versions": v["versions"],
                      "walltime_margin": v["walltime_margin"],
                      "max_message_bytes": v["max_message_bytes"], "max_frame_bytes": v["max_frame_bytes"]},
        "job": {k: getattr(spec, k) for k in spec.__dataclass_fields__},
        "n_jobs": n_jobs, "max_jobs_in_queue": v["max_jobs_in_queue"],
        "startup_failures": v["startup_failures"],
    }


def launch(cfg: ResolvedConfig, name: str, n_jobs: int = 0, detach: bool = False,
           timeout: float = 60.0) -> tuple[subprocess.Popen, Path]:
    """Start a cluster daemon; return its process and cluster file once it listens."""
    if cfg.values["batch"] not in ("slurm", "pbs"):
        raise ClusterError(f"site {cfg.site!r} has batch={cfg.values['batch']!r}; a job cluster needs "
                           "'slurm' or 'pbs' (use LocalCluster for this machine alone)")
    cluster_file = cluster_file_for(name)
    render_job_script(cfg, str(cluster_file))   # a broken template fails here, not in every submit
    if cluster_file.exists():
        try:
            pid = read_cluster_file(cluster_file).get("pid")
        except (OSError, ValueError):
            pid = None
        if pid and _alive(pid):
            raise ClusterError(f"a cluster named {name!r} is already running (pid {pid}); "
                               f"use another --name or `hpc-cluster down {name}` first")
        cluster_file.unlink()
    write_cluster_file(cluster_file, "", new_secret(), name=name)
    run_dir = cluster_file.parent
    plan_path = run_dir / f".{name}.plan.json"
    try:
        plan = make_plan(cfg, name, cluster_file, n_jobs)
    except BaseException:
        _forget(cluster_file)
        raise
    log_path = run_dir / f"{name}.log"
    plan.update(daemon_log=str(log_path), plan_file=str(plan_path),
                owner_pid=None if detach else os.getpid())
    fd = os.open(plan_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(plan, f)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    log = open(log_path, "wb")                 # this run's log only: failures quote its tail
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
            _forget(cluster_file, plan_path)
            raise ClusterError(f"the cluster daemon exited with code {proc.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            _forget(cluster_file, plan_path)
            raise ClusterError(f"the cluster daemon did not start within {timeout:g} s; see {log_path}")
        time.sleep(0.05)


def _forget(*paths: Path) -> None:
    for p in paths:
        Path(p).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def control(cluster_file: Path | str, op: str, timeout: float = 120.0, **fields):
    """One request to a running cluster daemon (scale, jobs, adapt, shutdown)."""
    from ..client import Client
    with Client(cluster_file=str(cluster_file), timeout=10) as c:
        reply = c._lt.run(c._request({"op": op, **fields}, timeout), timeout + 5)
    if not reply.get("ok"):
        raise ClusterError(f"{op} failed: {reply.get('error')}")
    return reply["result"]


class JobQueueCluster:
    """Jobs on a batch system, each running worker(s) that join one scheduler."""

    batch: str = ""

    def __init__(self, site: str | None = None, config: str | None = None, n_workers: int | None = None,
                 **kwargs):
        self.config = resolve(site=site, config=config, batch=self.batch, n_workers=n_workers, **kwargs)
        v = self.config.values
        self.name = f"{v['name']}-{uuid.uuid4().hex[:6]}"
        self.processes = v["processes"]
        self.status = "starting"
        self._proc, self.cluster_file = launch(self.config, self.name, n_jobs=0)
        # What the jobs get (with ssh: paths on the login node), for job_script().
        self._job = json.loads((self.cluster_file.parent / f".{self.name}.plan.json").read_text())["job"]
        info = read_cluster_file(self.cluster_file)
        self.scheduler_address, self.secret = info["address"], info["secret"]
        self.status = "running"
        if v["n_workers"]:
            self.scale(v["n_workers"])

    # -- the dask-jobqueue surface --------------------------------------------------------
    def job_script(self) -> str:
        """The script the cluster submits (with ssh: the paths on the login node)."""
        return get_adapter(self.batch).render(JobSpec(**self._job))

    def scale(self, n: int | None = None, jobs: int | None = None) -> None:
        """`scale(n)` workers (rounded up to whole jobs), or `scale(jobs=k)` jobs."""
        if (n is None) == (jobs is None):
            raise TypeError("give scale() a number of workers, or jobs=, not both")
        if jobs is None:
            jobs = math.ceil(n / self.processes)
        control(self.cluster_file, "scale", jobs=int(jobs))

    def adapt(self, minimum: int = 0, maximum: int = 10) -> None:
        """Let the cluster size itself between `minimum` and `maximum` jobs from the queued work."""
        if not 0 <= minimum <= maximum:
            raise ValueError(f"adapt(minimum={minimum}, maximum={maximum}): need 0 <= minimum <= maximum")
        control(self.cluster_file, "adapt", minimum=int(minimum), maximum=int(maximum))

    @property
    def jobs(self) -> dict[str, dict]:
        """Each job's real batch state (pending, running, completed ...) and its workers."""
        return {j["job_id"]: j for j in control(self.cluster_file, "jobs")["jobs"]}

    def status_table(self) -> dict:
        return control(self.cluster_file, "jobs")

    def close(self, timeout: float = 120.0) -> None:
        if self.status == "closed":
            return
        self.status = "closing"
        try:
            control(self.cluster_file, "shutdown", timeout=timeout)
        except Exception:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self.status = "closed"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {getattr(self, 'scheduler_address', '?')} {self.status}>"


class SLURMCluster(JobQueueCluster):
    batch = "slurm"


class PBSCluster(JobQueueCluster):
    batch = "pbs"
