"""The settings table (`options()`) and the validators behind it.

Every core setting's name, kind, validator, default and help text lives here, once; each
batch system's own settings are declared by its adapter and joined to the table on first use
(adapter_options.py). Config files, HPC_CLUSTER_* variables and keyword arguments are all
checked against the table, and the docs' key table and `hpc-cluster config init`'s starter
file are generated from it.
Validators are pure: (key, value as written) -> parsed value, or ValueError with a message
that names the key and says what to write instead.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..plugins import LOCAL, AdapterLookupError, installed_batch_systems, unknown_batch_message
from ..units import UnitError, parse_memory, parse_walltime
from .adapter_options import adapter_classes, collect, title_of, walltime_readings
from .pools import ESCALATE_DEFAULTS, PoolKeyError, check_escalate, check_pools

class ConfigError(ValueError):
    """One or more problems in config files, environment variables or keyword arguments."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class LineError(ValueError):
    """A bad value inside a nested map (ssh) that knows its own, more precise, line."""

    def __init__(self, message: str, line: int | None):
        super().__init__(message)
        self.line = line


def did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


# ---------------------------------------------------------------------------- validators
# Each takes (key, value as written) and returns the parsed value or raises ValueError
# with a message that names the key, the value and what to write instead.

def _int(minimum: int) -> Callable[[str, Any], int]:
    def check(key, v):
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            bound = "greater than 0" if minimum == 1 else f">= {minimum}"
            raise ValueError(f"{key}={v!r} must be a whole number {bound}")
        return v
    return check


def _seconds(allow_zero: bool) -> Callable[[str, Any], float]:
    def check(key, v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if v < 0 or (v == 0 and not allow_zero):
                raise ValueError(f"{key}={v!r} must be a number of seconds "
                                 f"{'>= 0' if allow_zero else 'greater than 0'}")
            return float(v)
        if allow_zero and str(v).strip() == "0":
            return 0.0
        try:
            return float(parse_walltime(v, what=key))
        except UnitError as e:
            raise ValueError(f"{e} (here: a number of seconds)") from None
    return check


def _retention(key, v):
    """A duration, 0 (at once), or never (false): seconds, or None for never."""
    if v is False or (isinstance(v, str) and v.strip().lower() in ("never", "false")):
        return None
    try:
        return _seconds(True)(key, v)
    except ValueError as e:
        raise ValueError(f"{e}; or never to keep them") from None


def _fraction(key, v):
    if v is False:                      # dask's way to turn a memory threshold off
        return False
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ValueError(f"{key}={v!r} must be a fraction with 0 < x <= 1, e.g. 0.95, or false to turn it off")
    return float(v)


def _bool(key, v):
    if not isinstance(v, bool):
        raise ValueError(f"{key}={v!r} must be true or false")
    return v


def _str(key, v):
    if not isinstance(v, str) or not v:
        raise ValueError(f"{key}={v!r} must be a non-empty string (quote it in YAML)")
    return v


def _one_line(key, v):
    v = _str(key, v)
    if any(ord(c) < 32 for c in v):
        raise ValueError(f"{key}={v!r} must be one line of printable characters (it becomes a "
                         "job name and a worker name)")
    return v


def _path(key, v):
    return os.path.expanduser(_str(key, v))


def _str_list(key, v):
    if isinstance(v, str):
        raise ValueError(f"{key}={v!r} must be a list of strings; write [{v!r}]")
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"{key}={v!r} must be a list of strings, e.g. ['first', 'second']")
    return list(v)


def _directives(key, v):
    """A list of directives; or a map, as dask-jobqueue's HTCondorCluster takes them (submit
    description commands): each becomes 'key = value', and, written after ours, overrides ours."""
    if isinstance(v, Mapping):
        if not all(isinstance(k, str) and isinstance(x, (str, int, float, bool)) for k, x in v.items()):
            raise ValueError(f"{key}={v!r} must map submit commands to values, e.g. {{'+MyAttr': '\"x\"'}}")
        return [f"{k} = {str(x).lower() if isinstance(x, bool) else x}" for k, x in v.items()]
    return _str_list(key, v)


def _env_map(key, v):
    if not isinstance(v, Mapping):
        raise ValueError(f"{key}={v!r} must be a map of variable names to values, e.g. {{OMP_NUM_THREADS: '1'}}")
    out = {}
    for name, value in v.items():
        # Numbers are common (OMP_NUM_THREADS: 1) and unambiguous; booleans are not
        # (true -> "True"?), nor are lists, so those must be quoted.
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"{key}: {name!r}={value!r} must be a name and a string; quote the value")
        out[name] = str(value)
    return out


def _size(key, v):
    try:
        return parse_memory(v, what=key)
    except UnitError as e:
        raise ValueError(str(e)) from None


def _walltime(key, v):
    """Kept as written: how a walltime reads depends on the batch system ('60' is an hour to
    sbatch, a minute to qsub), which is known only once every layer is merged (resolve.py):
    here it must read as a walltime to one of them (each adapter declares its reading)."""
    errors = []
    for batch in (*walltime_readings(), None):
        try:
            parse_walltime(v, what=key, batch=batch)
            return v
        except UnitError as e:
            errors.append(str(e))
    raise ValueError(errors[-1])


# What `worker_command` may name: dask's worker module means "the standard worker", which
# here is ours; anything else (dask_cuda.cli, a custom class) cannot start our worker.
STANDARD_WORKER_COMMANDS = ("distributed.cli.dask_worker", "dask_worker", "hpc_cluster.worker")


def _worker_command(key, v):
    v = _str(key, v)
    if v.strip() not in STANDARD_WORKER_COMMANDS:
        raise ValueError(f"{key}={v!r} cannot start an hpc-cluster worker: jobs run "
                         "`python -m hpc_cluster.worker`, whose nanny and diagnosis are the point. "
                         "Remove worker_command; for GPUs ask for them with job_extra_directives "
                         "(e.g. ['--gres=gpu:1']) and label workers with worker_extra_args "
                         "['--resources', 'GPU=1']")
    return v.strip()


def _shebang(key, v):
    v = _one_line(key, v)
    if not v.startswith("#!"):
        raise ValueError(f"{key}={v!r} must be an interpreter line starting with '#!', e.g. '#!/usr/bin/env bash'")
    return v


# scheduler_options: dask passes these to distributed's Scheduler. Some have a meaning here;
# the rest are kept and reported (config/jobqueue.py says what happens to each).
SCHEDULER_OPTION_CHECKS: dict[str, Callable[[str, Any], Any]] = {}


def _scheduler_options(key, v):
    if not isinstance(v, Mapping):
        raise ValueError(f"{key}={v!r} must be a map, e.g. {{'host': '10.0.0.1', 'port': 8786}}")
    out = {}
    for sub, value in v.items():
        if not isinstance(sub, str):
            raise ValueError(f"{key}: {sub!r} must be a name")
        check = SCHEDULER_OPTION_CHECKS.get(sub)
        out[sub] = check(f"{key}.{sub}", value) if check and value is not None else value
    return out


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def check(key, v):
        if v not in choices:
            raise ValueError(f"{key}={v!r} must be one of {', '.join(choices)}"
                             + did_you_mean(str(v), choices))
        return v
    return check


def _batch(key, v):
    """'local', or the name of an installed adapter (an entry point, plugins.py): a plugin's
    batch system is as good a value as ours, and a typo names the installed ones."""
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{key}={v!r} must be the name of a batch system, or 'local'")
    name = v.strip().lower()
    if name == LOCAL:
        return name
    try:
        installed = installed_batch_systems()
    except AdapterLookupError as e:
        raise ValueError(str(e)) from None
    if name not in installed:
        raise ValueError(unknown_batch_message(v, key) + did_you_mean(name, [*installed, LOCAL]))
    return name


def _port(key, v):
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
        raise ValueError(f"{key}={v!r} must be a port number, 1-65535")
    return v


# The dashboard (issue 17): where it listens, as dask writes it; on by default.
DEFAULT_DASHBOARD_ADDRESS = ":8787"
# Where an address without a host listens (issue 34): this machine only, reached with `ssh -L`.
DASHBOARD_HOST = "127.0.0.1"
_DASHBOARD_ADDRESS = re.compile(r"(?:(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]))?:(?P<port>\d{1,5})")


def parse_dashboard_address(value, key: str = "dashboard_address") -> tuple[str, int] | None:
    """dask's dashboard_address -> (host, port), or None (no dashboard). ':8787' (host ''
    means: DASHBOARD_HOST, 127.0.0.1, where dask means every interface), ':0' (any free port),
    'HOST:PORT', a port number; None or False turns the dashboard off."""
    if value is None or value is False:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = f":{value}"
    text = value.strip() if isinstance(value, str) else None
    if text is not None and text.isdigit():
        text = ":" + text
    m = _DASHBOARD_ADDRESS.fullmatch(text) if text is not None else None
    if m is None or int(m["port"]) > 65535:
        raise ValueError(f"{key}={value!r} is not a dashboard address: write ':PORT' (':8787'; ':0' for any "
                         "free port), 'HOST:PORT' (e.g. '127.0.0.1:8787', '0.0.0.0:8787'), or None to turn the "
                         "dashboard off")
    return (m["host"] or "").strip("[]"), int(m["port"])


def _dashboard_address(key, v):
    parse_dashboard_address(v, key)
    return v


SCHEDULER_OPTION_CHECKS.update({"host": _str, "interface": _str, "port": lambda k, v: 0 if v == 0 else _port(k, v),
                                "dashboard_address": _dashboard_address, "dashboard": _bool})

SSH_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "host": _str, "user": _str, "key": _path, "port": _port, "known_hosts": _path,
    "host_key_policy": _choice("reject", "auto-add", "warn"),
}


def _ssh(key, v):
    if not isinstance(v, Mapping):
        raise ValueError(f"{key}={v!r} must be a map, e.g. {{host: login.cluster.org, user: alice}}")
    lines = getattr(v, "lines", {})
    out = {}
    for sub, value in v.items():
        if sub not in SSH_FIELDS:
            raise LineError(f"unknown key '{sub}' in {key}" + did_you_mean(str(sub), SSH_FIELDS)
                             + f" (allowed: {', '.join(SSH_FIELDS)})", lines.get(sub))
        try:
            out[sub] = SSH_FIELDS[sub](f"{key}.{sub}", value)
        except ValueError as e:
            raise LineError(str(e), lines.get(sub)) from None
    if "host" not in out:
        raise ValueError(f"{key} needs a host, e.g. {{host: login.cluster.org}}")
    return out


def _pools(key, v):
    try:
        return check_pools(key, v, option_by_name(), canonical_key)
    except PoolKeyError as e:
        raise LineError(str(e), e.line) from None


# ---------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Option:
    name: str
    kind: str                 # for docs and for parsing env values: int, seconds, size, ...
    check: Callable[[str, Any], Any]
    default: Any              # as a user would write it; parsed through `check` when used
    help: str
    scope: str = "site"       # "site": only in a site; "both": also in top-level settings
    example: Any = None       # shown (commented) by `config init` when the default is None
    aliases: tuple[str, ...] = ()
    # An adapter's own setting (adapters/options.py): the batch systems that declare it (they
    # alone read it: resolve.py refuses it on the others), what to write there instead, its key
    # in dask-jobqueue's jobqueue.<section> (None: not read there), and whether a pool may set it.
    owners: tuple[str, ...] = ()
    instead: str = ""
    elsewhere: str = "refuse"
    jobqueue_key: str | None = None
    per_pool: bool = False
    ours: bool = True         # False: a plugin's (left out of our docs' table)


CORE_OPTIONS: tuple[Option, ...] = (
    Option("batch", "slurm|pbs|sge|lsf|htcondor|<plugin>|local", _batch, None,
           "batch system that runs the workers; unset: the cluster class decides", example="slurm"),
    Option("cores", "int > 0", _int(1), None, "cores per job, shared by its worker processes (required, "
           "as in dask-jobqueue)", example=4),
    Option("memory", "size", _size, None, "memory per job: the batch request and the workers' total budget "
           "(required, as in dask-jobqueue)", example="16GB"),
    Option("processes", "int > 0", _int(1), None, "worker processes per job; unset: about sqrt(cores), "
           "as dask-jobqueue splits them (cores <= 4: one per core)", example=1),
    Option("nodes", "int > 0", _int(1), 1, "nodes per job (SLURM): the job asks for so many nodes and starts "
           "`processes` workers on each (cores and memory are per node), so a job holds nodes x processes "
           "workers; docs/slurm.md"),
    Option("walltime", "duration", _walltime, "00:30:00", "time limit per job, read as the batch system "
           "reads it (SLURM: '60' is 60 minutes; PBS: '60' is 60 seconds)"),
    Option("queue", "str", _str, None, "SLURM partition or PBS queue", example="normal"),
    Option("account", "str", _str, None, "account (project) the jobs are charged to", example="lab123"),
    Option("job_extra_directives", "list of str", _directives, [], "extra batch directives, e.g. ['--gres=gpu:1'] "
           "(HTCondor: a map of submit commands, e.g. {'+MyAttr': '\"x\"'}, as in dask-jobqueue)"),
    Option("job_directives_skip", "list of str", _str_list, [], "drop generated directives containing any of "
           "these strings (matched against both spellings of a directive: '-J' and '--job-name')"),
    Option("shebang", "str", _shebang, "#!/usr/bin/env bash", "the job script's first line"),
    Option("job_script_prologue", "list of str", _str_list, [], "shell lines run before the worker starts (module load, venv)"),
    Option("job_script_epilogue", "list of str", _str_list, [], "shell lines run after the worker exits"),
    # Here come the batch systems' own settings, each declared by its adapter (ADAPTERS_AFTER).
    Option("log_directory", "path", _path, None, "directory for the jobs' stdout/stderr", example="~/hpc-cluster-logs"),
    Option("engine", "hpc-cluster|distributed", _choice("hpc-cluster", "distributed"), "hpc-cluster",
           "what runs as scheduler and workers: hpc-cluster's own engine, or dask.distributed's Scheduler and "
           "Worker (for libraries that need distributed itself: xgboost, lightgbm, dask-ml, optuna), deployed, "
           "watched and diagnosed alike; docs/choosing-an-engine.md", example="distributed"),
    Option("nanny", "bool", _bool, True, "run each worker under a nanny that watches memory and reports its death"),
    Option("python", "str", _str, None, "Python executable that starts the worker on the compute node; "
           "unset: the Python running hpc-cluster (with ssh: python3 from the job's PATH)",
           example="~/venv/bin/python"),
    Option("local_directory", "path", _str, None, "node-local scratch directory for worker files: created if "
           "missing, the workers' working directory; '~' and $VARS are expanded on the node", example="$TMPDIR"),
    Option("worker_extra_args", "list of str", _str_list, [], "extra arguments to the worker command: the "
           "dask-worker flags of docs/migrating-from-dask-jobqueue.md, e.g. ['--lifetime', '55m']"),
    Option("worker_command", "str", _worker_command, None, "dask-jobqueue's worker module: only "
           "'distributed.cli.dask_worker' (the standard worker, which here is ours) is accepted",
           example="distributed.cli.dask_worker"),
    Option("interface", "str", _str, None, "network interface the scheduler and workers listen on, e.g. ib0; unset: "
           "the scheduler listens on its address that routes to the compute nodes (docs/admin-guide.md)",
           example="ib0"),
    Option("security", "bool", _bool, True, "encrypt every connection with TLS under a certificate made for "
           "the cluster (dask's security=True); false: plain TCP, each connection still proving the cluster's "
           "secret. The keywords security= (False, True, a Security of your own) and protocol= ('tcp://', "
           "'tls://') win over it"),
    Option("death_timeout", "seconds", _seconds(False), 60,
           "seconds a worker waits for an unreachable scheduler before exiting at its start; a worker that "
           "loses its scheduler later keeps its results and tries to reattach for reconnect_window (by default "
           "the larger of this and 10 minutes)"),
    Option("reconnect_window", "seconds", _seconds(False), None,
           "seconds a worker that lost its scheduler keeps its results and tries to reattach (re-reading the "
           "cluster file for a new address) before exiting with 'scheduler-lost'; never past its job's walltime; "
           "unset: the larger of 10 minutes and death_timeout", example="30m"),
    Option("job_name", "str", _one_line, "dask-worker", "the batch job's name (sbatch -J, qsub -N)",
           aliases=("name",)),
    Option("n_workers", "int >= 0", _int(0), 0, "workers started with a cluster from Python (rounded up to "
           "whole jobs of `processes`)"),
    Option("template", "path", _path, None, "the site's own jinja2 job-script template (relative: to the config file)",
           example="job.sh.j2"),
    Option("env", "map str->str", _env_map, {}, "environment variables exported in the job before the prologue"),
    Option("working_directory", "path", _path, None, "directory the job starts in", example="~/work"),
    Option("ssh", "map", _ssh, None, "submit through a login node: host (required), user, key, port, "
           "known_hosts, host_key_policy (reject|auto-add|warn)",
           example={"host": "login.cluster.org", "user": "alice"}),
    Option("job_array", "bool", _bool, False, "a scale-up of several jobs is submitted as one job array "
           "(sbatch --array, qsub -J or -t) instead of one submission each; every element is still a job of its "
           "own (id, workers, cancel, accounting, diagnosis). A batch system without arrays submits jobs one by "
           "one and says so in the daemon's log (docs/configuration.md)"),
    Option("max_jobs_in_queue", "int > 0", _int(1), None, "at most this many of our jobs queued or running", example=50),
    Option("scheduler_options", "map", _scheduler_options, {}, "the scheduler's host, port and interface, "
           "and the dashboard's dashboard_address (':8787' by default, on 127.0.0.1 without a host; None: off) (dask-jobqueue's "
           "scheduler_options; other keys are reported, not used)", example={"port": 8786}),
    Option("shared_temp_directory", "path", _path, None, "a directory the login node and the compute "
           "nodes share: the jobs' copy of the cluster file (address and secret, 0600) goes there",
           example="~/scratch"),
    Option("jobqueue_config", "path", _path, None, "a dask-jobqueue jobqueue.yaml to read beneath this site "
           "(dask's own config files are read too)", example="~/.config/dask/jobqueue.yaml"),
    Option("config_name", "str", _one_line, None, "which jobqueue.<NAME> section of dask's configuration "
           "to read; unset: the batch system's (slurm, pbs)", example="slurm"),
    Option("pools", "map", _pools, {}, "extra worker pools, each the cluster's job spec with what it names "
           "changed (cores, memory, processes, walltime, queue, account, job_extra_directives, ...) plus "
           "max_jobs, escalation_only, resources and n_workers/jobs to start with; docs/pools-and-retries.md",
           example={"bigmem": {"memory": "64GB", "queue": "bigmem", "max_jobs": 2}}),
    # Scheduler and nanny knobs: valid in a site and in top-level `settings`.
    Option("escalate", "map", check_escalate, dict(ESCALATE_DEFAULTS), "retry by cause: a task charged for "
           "memory (memory) or cut by walltime again and again (walltime) moves to a pool with margin x its "
           "observed peak memory, or more time", "both"),
    Option("allowed_failures", "int >= 0", _int(0), 3, "worker deaths a task may cause before it is failed", "both"),
    Option("heartbeat_interval", "seconds", _seconds(False), 0.5, "seconds between a worker's heartbeats; in a "
           "larger cluster the scheduler asks for fewer, as dask's does: 1 s from 11 workers, 2 s from 50, "
           "workers/200 + 1 s from 200 (3.5 s at 500), and a worker beats at the longer of the two", "both"),
    Option("heartbeat_ttl", "seconds", _seconds(False), 5,
           "a worker silent this long is declared lost; its nanny ends and replaces it. From 50 workers on, at "
           "least three of the scheduler's heartbeat intervals (10.5 s at 500 workers)", "both"),
    # dask's distributed.worker.memory.target/spill/pause/terminate, with its defaults
    Option("memory_target_fraction", "0 < x <= 1 or false", _fraction, 0.6,
           "a worker writes stored results to disk (least recently used first) when they take more than "
           "this fraction of its memory budget (false: never)", "both"),
    Option("memory_spill_fraction", "0 < x <= 1 or false", _fraction, 0.7,
           "a worker whose process memory is above this fraction of its budget writes results to disk until "
           "it is below the target fraction (false: never)", "both"),
    Option("memory_pause_fraction", "0 < x <= 1 or false", _fraction, 0.8,
           "a worker above this fraction of its memory budget starts no new task until its memory falls "
           "(false: never)", "both"),
    Option("memory_terminate_fraction", "0 < x <= 1 or false", _fraction, 0.95,
           "the nanny stops a worker above this fraction of its memory budget (false: never)", "both"),
    Option("memory_limit", "size", _size, None, "memory budget per worker; unset: memory / processes", "both",
           example="4GB"),
    Option("versions", "warn|strict", _choice("warn", "strict"), "warn",
           "on a version mismatch between client, scheduler and workers: warn, or refuse", "both"),
    Option("max_message_bytes", "size", _size, "64GiB", "largest message a connection accepts (a peer's claimed "
           "size costs nothing until its bytes arrive)", "both"),
    Option("max_frame_bytes", "size", _size, "1GiB", "largest single frame a connection accepts", "both"),
    Option("walltime_margin", "seconds", _seconds(True), 60,
           "workers stop taking tasks and drain this many seconds before walltime ends", "both",
           aliases=("drain_margin",)),
    Option("startup_failures", "int >= 0", _int(0), 3,
           "jobs ending before their worker registers, in a row, before resubmission stops", "both"),
    # How often the cluster daemon asks the batch system (deploy/daemon/polling.py, docs/admin-guide.md).
    Option("poll_interval", "seconds", _seconds(False), 30,
           "seconds between job-state polls when every job runs with its workers registered (the workers "
           "report their own start and death; polls are fast only while jobs start or end)", "both"),
    Option("poll_interval_fast", "seconds", _seconds(False), 2,
           "seconds between job-state polls while a job is starting, ending, or just after a worker died; "
           "at most poll_interval", "both"),
    Option("batch_calls_per_minute", "int >= 6", _int(6), 60,
           "most batch-system commands (squeue, sacct, sbatch, scancel, qstat ...) the cluster daemon runs in "
           "any minute; a command over it waits. Default: half of Slurm's rl_enable allowance of 2 per second",
           "both"),
    Option("scheduler_in_job", "bool", _bool, False,
           "run the cluster daemon (the scheduler) itself as a small batch job instead of a process on this "
           "machine, for sites that forbid long processes on login nodes; it renews its own job before its "
           "walltime (docs/reliability.md)"),
    Option("scheduler_job_walltime", "duration", _walltime, None,
           "with scheduler_in_job: the scheduler job's time limit, read as walltime is; unset: the workers' "
           "walltime. A successor job takes over before it ends", example="04:00:00"),
    Option("scheduler_job_memory", "size", _size, "2GB",
           "with scheduler_in_job: the memory the scheduler job asks for (it runs on 1 core)"),
    Option("journal", "bool", _bool, True,
           "the cluster daemon keeps a journal of its state beside the cluster file, and a daemon started "
           "again with the same name after one died resumes from it (docs/reliability.md)", "both"),
    Option("log_retention", "duration|never", _retention, "7d",
           "how long the files of an ended cluster (its daemon log; a crashed one's cluster file, journal and "
           "plan too) stay in ~/.config/hpc-cluster/clusters: older ones are removed when a cluster starts and "
           "by `hpc-cluster clean`; never: only `hpc-cluster clean --all` or `--older-than` removes them", "both"),
)
TOP_LEVEL_KEYS = ("default", "sites", "settings")
# The adapters' own settings follow this core one in the table (and in the docs, `config init`
# and `config show`), where dask-jobqueue's job keywords are.
ADAPTERS_AFTER = "job_script_epilogue"
# The checks of adapters/options.py's STANDARD_KINDS: an adapter option of one of these kinds
# needs no check of its own.
STANDARD_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "int > 0": _int(1), "int >= 0": _int(0), "size": _size, "seconds": _seconds(False), "bool": _bool,
    "str": _str, "path": _path, "list of str": _str_list, "map str->str": _env_map,
}


def adapter_option(declared, owners: tuple[str, ...], titles: str, ours: bool) -> Option:
    """An adapter's declaration (adapters/options.py's AdapterOption) as a row of the table."""
    check = declared.check or STANDARD_CHECKS.get(declared.kind)
    if check is None:
        raise ValueError(f"the setting {declared.name!r} of the {'/'.join(owners)} adapter has the kind "
                         f"{declared.kind!r} and no check: give it check=, or one of {', '.join(STANDARD_CHECKS)}")
    return Option(declared.name, declared.kind, check, declared.default, f"{titles} only: {declared.help}",
                  example=declared.example, aliases=tuple(declared.aliases), owners=owners,
                  instead=declared.instead, elsewhere=declared.elsewhere, jobqueue_key=declared.jobqueue_key, per_pool=declared.per_pool,
                  ours=ours)


def table_with(classes: Mapping[str, type]) -> tuple[Option, ...]:
    """The core table with the settings `classes` (batch system -> adapter class) declare. Pure;
    an adapter setting that clashes with another is a ValueError naming both."""
    declared = collect(classes, {n for o in CORE_OPTIONS for n in (o.name, *o.aliases)})
    rows = []
    for name, d in declared.items():
        titles = "/".join(title_of(classes[b], b) for b in d.owners)
        ours = all(classes[b].__module__.startswith("hpc_cluster.") for b in d.owners)
        rows.append(adapter_option(d.option, d.owners, titles, ours))
    at = next(i for i, o in enumerate(CORE_OPTIONS) if o.name == ADAPTERS_AFTER) + 1
    return CORE_OPTIONS[:at] + tuple(rows) + CORE_OPTIONS[at:]


@functools.lru_cache(maxsize=None)
def _tables() -> tuple[tuple[Option, ...], dict[str, Option], dict[str, str], list[str]]:
    # Built on first use, not at import: it loads the installed adapters (their entry points).
    table = table_with(adapter_classes())
    return (table, {o.name: o for o in table}, {a: o.name for o in table for a in o.aliases},
            [o.name for o in table if o.scope == "both"])


def options() -> tuple[Option, ...]:
    """Every setting: the core table and the installed adapters' own (ADAPTERS_AFTER)."""
    return _tables()[0]


def option_by_name() -> dict[str, Option]:
    return _tables()[1]


def aliases() -> dict[str, str]:
    return _tables()[2]


def settings_names() -> list[str]:
    return _tables()[3]


def __getattr__(name: str):
    # OPTIONS, OPTION_BY_NAME, ALIASES, SETTINGS_NAMES as they were: computed on first use.
    lazy = {"OPTIONS": options, "OPTION_BY_NAME": option_by_name, "ALIASES": aliases,
            "SETTINGS_NAMES": settings_names}
    if name in lazy:
        return lazy[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def canonical_key(key: str) -> str | None:
    """The option a key names, or None. Hyphens are accepted (dask-jobqueue's YAML uses them)."""
    k = key.replace("-", "_")
    k = aliases().get(k, k)
    return k if k in option_by_name() else None


def parse_value(key: str, value: Any) -> Any:
    """Validate one setting and return it parsed (sizes in bytes, durations in seconds)."""
    return option_by_name()[key].check(key, value)


def default_values() -> dict[str, Any]:
    return {o.name: (None if o.default is None else o.check(o.name, o.default)) for o in options()}


def options_markdown() -> str:
    """The key table of docs/configuration.md (a test keeps the two identical).

    Regenerate: python -c "from hpc_cluster.config import options_markdown as m; print(m())"
    """
    def cell(v: Any) -> str:
        if v is None:
            return "unset"
        return f"`{str(v).lower()}`" if isinstance(v, bool) else f"`{v}`"
    rows = ["| key | type | default | where | meaning |", "|---|---|---|---|---|"]
    for o in options():
        if not o.ours:                # a plugin's setting: its own docs tell of it
            continue
        where = "site or settings" if o.scope == "both" else "site"
        alias = f" (alias: {', '.join(f'`{a}`' for a in o.aliases)})" if o.aliases else ""
        rows.append(f"| `{o.name}`{alias} | {o.kind.replace('|', ' or ')} | {cell(o.default)} | "
                    f"{where} | {o.help.replace('|', ' or ')} |")
    return "\n".join(rows)
