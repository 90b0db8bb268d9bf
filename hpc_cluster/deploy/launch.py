"""Starting a cluster daemon, resuming one and talking to it, for both `hpc-cluster up` and the
cluster classes (cluster.py): `launch()`, `cluster_id()` (which also finds a stopped daemon to
resume) and `control()`. What the daemon and its jobs are told is made in plan.py.

The cluster daemon (scheduler + job manager, `deploy/daemon/run.py`) runs as a child process of
SLURMCluster(...), or detached under `hpc-cluster up`: the very same process either way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from ..adapters import get_adapter
from ..adapters.base import BatchError, JobSpec
from ..protocol.clusterfile import (cluster_file_for, clusters_dir, journal_for, new_secret, open_private, private_directory,
                               read_cluster_file, tls_directory_for, write_cluster_file)
from ..lifeline import alive
from ..protocol.comm import port_of
from ..protocol.tls import Security, resolve_security
from ..config import ConfigError, ResolvedConfig
from ..engines import EngineError, check_engine
from .compat import cluster_security
from .leftovers import clean_at_start
from .daemon.scheduler_job import (SchedulerJob, daemon_command, handover_path, job_alive, owner_path, scheduler_spec,
                            touch_owner)
from .plan import ClusterError, Plan, SchedulerJobPlan, make_plan, render_job_script, shell_word, worker_python


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


def previous_log(log_path: Path) -> Path:
    """NAME.previous.log: the log of the daemon a resumed cluster's replaced."""
    return log_path.with_name(log_path.name[:-len(".log")] + ".previous.log")


# The directories of the certificates made for a cluster: beside its cluster file, or under
# shared_temp_directory.
SHARED_TLS = ".hpc-cluster-{}-tls"


def made_tls_directory(sec: Security | None, name: str) -> Path | None:
    """The directory tls_for made for cluster `name`, if `sec`'s key is in it (not a user's own
    Security, whose files are not ours to remove)."""
    if sec is None or not sec.tls_key:
        return None
    folder = Path(sec.tls_key).parent
    return folder if folder.name in (tls_directory_for(f"{name}.json").name, SHARED_TLS.format(name)) else None


def tls_for(cfg: ResolvedConfig, name: str, security, run_dir: Path) -> tuple[Security | None, Path | None]:
    """The cluster's TLS (protocol/tls.py) and the directory of the files made for it (removed
    with the cluster), if any. The jobs read them where they read the cluster file: under
    shared_temp_directory when it is set, else beside the cluster file; over ssh, the daemon
    copies them beside the login node's cluster file (deploy/remote.py place_tls)."""
    if security is None or security is False:
        return None, None
    shared = cfg.values["shared_temp_directory"]
    # Over ssh shared_temp_directory is a path on the login node, not here.
    made = (Path(shared).expanduser() / SHARED_TLS.format(name) if shared and not cfg.values["ssh"]
            else tls_directory_for(run_dir / f"{name}.json"))
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
    `security` (True, a Security, dask's) every connection is TLS (protocol/tls.py); False is
    plain TCP; None: the site's settings decide (TLS unless `security: false`).

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
    try:
        check_engine(cfg.values.get("engine") or "hpc-cluster")    # before any file or job
    except EngineError as exc:
        raise ConfigError(str(exc)) from None
    cluster_file = cluster_file_for(name)
    # Cluster files hold secrets and the daemons' logs addresses: the directory is its owner's alone.
    private_directory(cluster_file.parent, fix=True)
    # Files of ended clusters past log_retention (a class cluster leaves a log per run).
    clean_at_start(cfg.values.get("log_retention"), name)
    for pool in cfg.pools():                  # a broken template fails here, not in every submit
        render_job_script(cfg, str(cluster_file), worker_prefix or name, pool)
    old = previous_daemon(cfg, name, cluster_file, fresh)
    run_dir = cluster_file.parent
    if old is not None:
        # The same secret and certificates: the workers that kept running hold them.
        secret, sec = old["secret"], Security.from_dict(old.get("tls"))
        tls_dir = made_tls_directory(sec, name)          # still removed with the cluster at its end
    else:
        if security is None:                   # `hpc-cluster up`: the site's settings decide (compat.py)
            try:
                security = cluster_security(None, None, cfg.values)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
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
        plan.resume = True
        plan.scheduler.prefer_port = port_of(old.get("address"))
    log_path = run_dir / f"{name}.log"
    in_job = bool(cfg.values.get("scheduler_in_job"))
    plan.daemon_log, plan.plan_file, plan.tls_directory = str(log_path), str(plan_path), tls_dir and str(tls_dir)
    # A daemon on another node cannot watch our pid: it watches our heartbeat file instead.
    plan.owner_pid = None if detach or in_job else os.getpid()
    if in_job:
        v = cfg.values
        if not detach:                         # the Python owner's heartbeat (scheduler_job.py)
            plan.owner_file = str(owner_path(cluster_file))
            touch_owner(plan.owner_file)
        command = daemon_command(shell_word(worker_python(cfg)), str(plan_path), str(log_path))
        spec = scheduler_spec(plan.job, command, v["scheduler_job_walltime"] or v["walltime"],
                              v["scheduler_job_memory"], f"{v['job_name']}-scheduler")
        plan.scheduler_job = SchedulerJobPlan(job=spec, submitted=time.time())
        options = v["scheduler_options"] or {}
        if not options.get("host") and (options.get("interface") or v["interface"]):
            # The interface's address is the compute node's, known only there: the daemon reads it.
            plan.scheduler.interface = options.get("interface") or v["interface"]
    plan.save(plan_path)
    if in_job:
        return _start_in_job(cfg, name, cluster_file, plan, spec, old, secret, tls_dir, progress, job_timeout)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    if old is not None and log_path.exists() and log_path.stat().st_size:
        # The dead daemon's log says why it died: kept beside this run's, which starts empty
        # (failures quote its tail), and cleaned with the cluster's files (deploy/leftovers.py).
        os.replace(log_path, previous_log(log_path))
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


def _start_in_job(cfg: ResolvedConfig, name: str, cluster_file: Path, plan: Plan, spec: JobSpec, old: dict | None,
                  secret: bytes, tls_dir: Path | None, progress, timeout: float) -> tuple[SchedulerJob, Path]:
    """Submit the daemon as a batch job, then wait for its address in the cluster file,
    saying how its job stands meanwhile."""
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    plan_path, log_path = Path(plan.plan_file), Path(plan.daemon_log)
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
