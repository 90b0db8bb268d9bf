"""dask-worker's flags as one table: which ones our worker honours (and how), which it
accepts and ignores (with a note), and which it refuses (why, and what to do instead).

dask-jobqueue users pass dask-worker flags in `worker_extra_args`. The cluster classes run
`check_worker_args` on them when they are constructed, so a flag we cannot honour fails
before a job is queued; the worker's own argument parser is built from this same table,
so the two cannot disagree. Values are read the way dask reads them: durations like
'55m' or '4 minutes', memory limits like '6.52GiB', 'auto' or a fraction of the node's memory.

Pure: no I/O, no clock, no randomness. Facts about the node (its memory, its cores) and the
random draw of a lifetime come in as arguments.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Callable

SUPPORTED, IGNORED, REFUSED = "supported", "ignored", "refused"


# -- values, read as dask reads them ----------------------------------------------------

DURATION_FORMS = "seconds ('90') or a number with a unit: '90s', '55m', '4 minutes', '1h', '2d'"
MEMORY_LIMIT_FORMS = ("bytes ('4GB', '6.52GiB', '4000M', 4000000000), a fraction of the node's memory "
                      "('0.5'), 'auto' (the node's memory times threads / cores), or 0 for no limit")
# What dask's parsers raise for a text they cannot read (an empty one: IndexError; 1e999: OverflowError).
_UNREADABLE = (ValueError, KeyError, IndexError, TypeError, OverflowError)


# dask's own parsers, not copies: a value means here what it means to dask-worker. Imported when
# a value is read, not with the flag table: dask's import takes 0.1 s a worker need not spend.
def parse_duration(text: str) -> float:
    """Seconds for '55m', '4 minutes', '1h', '90s', '300ms' or plain seconds (dask's parse_timedelta)."""
    from dask.utils import parse_timedelta
    try:
        seconds = float(parse_timedelta(str(text)))
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError
        return seconds
    except _UNREADABLE:
        raise ValueError(f"not a duration; use {DURATION_FORMS}") from None


def parse_bytes(text: str) -> int:
    """Bytes for '4GB', '6.52GiB', '5000M', '1e9', '5 kB' (dask's parse_bytes: kB = 1000, KiB = 1024).
    Stricter than dask in two ways: no negative size, and no empty text (dask reads '' as 1)."""
    from dask.utils import parse_bytes as dask_parse_bytes
    try:
        if not str(text).strip():
            raise ValueError
        n = dask_parse_bytes(str(text))
        if n < 0:
            raise ValueError
        return int(n)
    except _UNREADABLE:
        raise ValueError(f"not an amount of memory; use {MEMORY_LIMIT_FORMS}") from None


def _memory_limit(text: str) -> tuple[str, float]:
    """('auto', 0), ('fraction', 0.5) or ('bytes', 4e9), as dask's parse_memory_limit tells them apart:
    a number up to 1 is a fraction of the node's memory (so 0 is no limit), a larger one bytes."""
    t = str(text).strip().lower()
    if t == "auto":
        return "auto", 0
    try:
        x = float(t)
    except ValueError:
        return "bytes", parse_bytes(t)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"not a memory limit; use {MEMORY_LIMIT_FORMS}")
    return ("fraction", x) if x <= 1 else ("bytes", int(x))


def check_memory_limit(text: str) -> str:
    _memory_limit(text)
    return text


def memory_limit_bytes(text: str, *, nthreads: int, cpus: int, system_memory: int) -> tuple[int, str | None]:
    """The worker's memory limit in bytes (0: none) on a node with `system_memory` bytes and
    `cpus` cores, and a note when a limit above the node's memory was lowered to it (as dask does)."""
    kind, x = _memory_limit(text)
    if kind == "auto":
        limit = int(system_memory * min(1.0, nthreads / max(1, cpus)))
    elif kind == "fraction":
        limit = int(x * system_memory)
    else:
        limit = int(x)
    if limit > system_memory:
        return system_memory, (f"--memory-limit {text} is more than this node's {system_memory} bytes; "
                               f"using {system_memory}")
    return limit, None


def parse_resources(text: str) -> dict[str, float]:
    """'GPU=2 MEM=10e9' (or comma-separated) -> {'GPU': 2.0, 'MEM': 1e10}."""
    out = {}
    for item in filter(None, str(text).replace(",", " ").split()):
        name, eq, value = item.partition("=")
        try:
            if not name or not eq:
                raise ValueError
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"{item!r} is not NAME=NUMBER; write pairs like 'GPU=2 MEM=10e9'") from None
    return out


def check_resources(text: str) -> str:
    parse_resources(text)
    return text


def parse_ports(text: str) -> list[int]:
    """'8786' -> [8786]; '3000:3003' -> [3000, 3001, 3002, 3003]; '0' -> [0] (any free port)."""
    try:
        first, colon, last = str(text).strip().partition(":")
        lo, hi = int(first), int(last) if colon else int(first)
    except ValueError:
        raise ValueError("not a port; use a port number (8788) or a range FIRST:LAST (3000:3026)") from None
    if not (0 <= lo <= hi <= 65535) or (colon and lo == 0):
        raise ValueError("ports run from 1 to 65535 (0: any free port), and a range FIRST:LAST needs FIRST <= LAST")
    return list(range(lo, hi + 1))


def check_ports(text: str) -> str:
    parse_ports(text)
    return text


def port_shares(text: str, n: int) -> list[str]:
    """Split a --worker-port range among n workers: each gets its own run of ports to try."""
    ports = parse_ports(text)
    if ports == [0]:
        return ["0"] * n
    k = len(ports) // n
    runs = [ports[i * k:(i + 1) * k] for i in range(n - 1)] + [ports[(n - 1) * k:]]
    return [str(r[0]) if len(r) == 1 else f"{r[0]}:{r[-1]}" for r in runs]


def threads_per_worker(nthreads: int, nworkers: int, cpus: int) -> int:
    """--nthreads 0 means the node's cores shared among the workers, as in dask."""
    return nthreads if nthreads > 0 else max(1, cpus // max(1, nworkers))


def draw_lifetime(lifetime: float | None, stagger: float | None, u: float) -> float | None:
    """dask's draw: the lifetime plus uniform(-stagger, +stagger), from a `u` uniform in [0, 1).
    None when there is no lifetime (dask reads 0 as none too)."""
    if not lifetime:
        return None
    return lifetime + (2 * u - 1) * (stagger or 0)


def _int_at_least(low: int, what: str) -> Callable[[str], int]:
    def read(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise ValueError(f"not a whole number; give {what}") from None
        if n < low:
            raise ValueError(f"must be at least {low}; give {what}")
        return n
    return read


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("not a number") from None


def _fraction_or_false(text: str) -> float:
    """dask's memory fractions: a number in (0, 1], or false (0 here) to turn it off."""
    if str(text).strip().lower() in ("false", "none", "0"):
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a fraction; use a number in (0, 1], or false to turn it off") from None
    if not 0 < value <= 1:
        raise ValueError("must be in (0, 1], or false to turn it off")
    return value


def _tcp(text: str) -> str:
    if str(text).strip().lower() not in ("tcp", "tcp://", "tls", "tls://"):
        raise ValueError("only tcp and tls are offered (UCX, websockets and inproc are not): "
                         "use --protocol tcp (tls: with --tls-ca-file, --tls-cert and --tls-key), or leave it out")
    return text


STANDARD_WORKER_CLASSES = ("dask.distributed.Worker", "distributed.Worker", "distributed.worker.Worker")


def _standard_worker_class(text: str) -> str:
    if text not in STANDARD_WORKER_CLASSES:
        raise ValueError("only dask's standard worker runs here, and it is hpc-cluster's own; custom "
                         "worker classes (dask_cuda's CUDAWorker...) cannot. Ask for GPUs with "
                         "job_extra_directives and label workers with --resources GPU=1; put setup "
                         "code in job_script_prologue")
    return text


def _text(text: str) -> str:
    return text


def _pool_name(text: str) -> str:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", text):
        raise ValueError("not a pool name; pools are named with letters, digits, '_', '.' and '-' (pools= of the cluster)")
    return text


# The module each engine's worker process runs (`python -m ...`), by name: the nanny starts it. A
# name, not an import: the worker layer stands below hpc_cluster/engines/ (tests/unit/test_layering.py).
ENGINE_WORKERS = {"hpc-cluster": "hpc_cluster.worker", "distributed": "hpc_cluster.engines.dask_worker"}


def _engine_name(text: str) -> str:
    if text not in ENGINE_WORKERS:
        raise ValueError(f"no engine named {text!r}; use {' or '.join(ENGINE_WORKERS)}")
    return text


# -- the table -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Flag:
    name: str
    kind: str                                   # SUPPORTED, IGNORED or REFUSED
    text: str                                   # how we honour it / why it is ignored / why refused and what instead
    read: Callable[[str], object] | None = _text   # reads (and checks) its value; None: it takes no value
    dest: str | None = None                     # the setting it changes (default: from the name)
    const: object = None                        # what a flag without a value sets
    dask: bool = True                           # one of dask-worker's flags (False: ours only)
    aliases: tuple[str, ...] = ()
    hidden: bool = False                        # set by the nanny, not by users
    metavar: str | None = None

    @property
    def takes_value(self) -> bool:
        return self.read is not None

    @property
    def setting(self) -> str:
        return self.dest or self.name.lstrip("-").replace("-", "_")


# The cluster's dashboard is the scheduler's process's (issue 17); a worker serves none.
_NO_DASHBOARD = "workers serve no dashboard (the scheduler's process does: cluster.dashboard_link): ignored"
_PRELOAD = ("code cannot be preloaded into the {}: run setup code in job_script_prologue, or import it "
            "inside the task")

FLAGS: tuple[Flag, ...] = (
    # dask-worker's flags that we honour
    Flag("--nthreads", SUPPORTED, "threads per worker process; 0: the node's cores divided by --nworkers",
         _int_at_least(0, "a number of threads, e.g. --nthreads 4"), metavar="N"),
    Flag("--nworkers", SUPPORTED, "worker processes in this job, each under its own nanny and named NAME-0, NAME-1...; "
         "with --no-nanny, light workers: one process imports once and forks them (~8 MB and a few ms each)",
         _int_at_least(1, "a number of worker processes, e.g. --nworkers 4 (processes= of the cluster)"),
         aliases=("--nprocs",), metavar="N"),
    Flag("--name", SUPPORTED, "the worker's name (NAME-0, NAME-1... with --nworkers)"),
    Flag("--memory-limit", SUPPORTED, "memory per worker process: " + MEMORY_LIMIT_FORMS + "; the nanny stops "
         "the worker at --memory-terminate-fraction of it", check_memory_limit, metavar="LIMIT"),
    Flag("--nanny", SUPPORTED, "run the worker under a nanny that watches its memory and reports how it ended "
         "(the default)", None, const=True),
    Flag("--no-nanny", SUPPORTED, "run the worker without a nanny: no memory watch, no exit report",
         None, dest="nanny", const=False),
    Flag("--resources", SUPPORTED, "abstract resources for tasks that ask for them, e.g. 'GPU=2 MEM=10e9'",
         check_resources, metavar="'NAME=N ...'"),
    Flag("--death-timeout", SUPPORTED, "how long to keep trying to reach the scheduler before exiting "
         "(60, '2m')", parse_duration, metavar="DURATION"),
    Flag("--reconnect-window", SUPPORTED, "how long a worker that lost its scheduler keeps its results and "
         "tries to reattach (re-reading --cluster-file for a new address) before exiting with 'scheduler-lost'; "
         "never past its job's walltime or --lifetime (default: the larger of 10 minutes and --death-timeout)",
         parse_duration, metavar="DURATION", dask=False),
    Flag("--local-directory", SUPPORTED, "scratch directory for the worker's files, created if missing and "
         "made the working directory; '~' and $VARIABLES are expanded here, on the node", metavar="DIR"),
    Flag("--lifetime", SUPPORTED, "leave after this long ('55m', '1h'): the scheduler drains the worker "
         "before then as before a walltime (no task that cannot finish is started, queued tasks go to "
         "other workers, results are copied to peers, nothing is charged) and retires it",
         parse_duration, metavar="DURATION"),
    Flag("--lifetime-stagger", SUPPORTED, "spread the lifetimes by up to +/- this much, drawn once per worker, "
         "so the workers do not all leave at once", parse_duration, metavar="DURATION"),
    Flag("--lifetime-restart", SUPPORTED, "when the lifetime ends the nanny starts a fresh worker in the same "
         "job (with a new lifetime) instead of ending the job", None, const=True),
    Flag("--no-lifetime-restart", SUPPORTED, "when the lifetime ends the worker and its nanny exit, and so "
         "does the job (the default)", None, dest="lifetime_restart", const=False),
    Flag("--no-dashboard", SUPPORTED, "nothing to turn off: workers serve no dashboard (the scheduler's is "
         "turned off by scheduler_options={'dashboard_address': None})", None,
         dest="dashboard", const=False),
    Flag("--interface", SUPPORTED, "listen on this network interface's IPv4 address (e.g. ib0)", metavar="NAME"),
    Flag("--protocol", SUPPORTED, "tcp or tls; the scheduler's address says which is spoken (tls:// with the "
         "--tls-* flags or a cluster file that names certificates)", _tcp),
    Flag("--tls-ca-file", SUPPORTED, "TLS: the CA that signed the cluster's certificates (every peer's is "
         "checked against it)", metavar="PATH"),
    Flag("--tls-cert", SUPPORTED, "TLS: this worker's certificate", metavar="PATH"),
    Flag("--tls-key", SUPPORTED, "TLS: the certificate's private key", metavar="PATH"),
    Flag("--host", SUPPORTED, "the address to listen on and give to the scheduler and peers; default (and "
         "0.0.0.0): this node's address that routes to the scheduler, as dask-worker's", metavar="ADDRESS"),
    Flag("--worker-port", SUPPORTED, "the port to listen on, or a range FIRST:LAST shared out among the "
         "--nworkers workers (each tries the ports of its share in turn); default: any free port",
         check_ports, metavar="PORT[:LAST]"),
    Flag("--pid-file", SUPPORTED, "write the command's process id (the nanny's, or the first process's with "
         "--nworkers) to this file, removed when it exits", metavar="PATH"),
    Flag("--worker-class", SUPPORTED, "only dask's standard worker ('distributed.Worker'), which here is "
         "hpc-cluster's own", _standard_worker_class, metavar="CLASS"),
    # accepted, with a note in the worker's log
    Flag("--dashboard", IGNORED, _NO_DASHBOARD, None, const=True),
    Flag("--dashboard-address", IGNORED, _NO_DASHBOARD, metavar="ADDRESS"),
    Flag("--dashboard-prefix", IGNORED, "workers serve no dashboard (and dask deprecated this flag): ignored"),
    Flag("--nanny-port", IGNORED, "the nanny listens on no port (it connects to the scheduler): ignored",
         check_ports, metavar="PORT[:LAST]"),
    # refused, saying what to do instead
    Flag("--scheduler-sni", REFUSED, "host names are not checked under TLS here (the cluster's CA is the "
         "trust, as in dask), so there is no server name to indicate; drop --scheduler-sni"),
    Flag("--listen-address", REFUSED, "the worker listens where --host (or --interface) and --worker-port say, "
         "and gives that address to the scheduler: use --host ADDRESS --worker-port PORT"),
    Flag("--contact-address", REFUSED, "the worker gives the scheduler the address it listens on; a separate "
         "contact address (NAT, containers) is not supported: use --host with an address that the scheduler "
         "and the other workers can reach"),
    Flag("--scheduler-file", REFUSED, "the worker finds the scheduler in the cluster file hpc-cluster writes "
         "(--cluster-file, set for you): drop --scheduler-file"),
    Flag("--preload", REFUSED, _PRELOAD.format("worker")),
    Flag("--preload-nanny", REFUSED, _PRELOAD.format("nanny")),
    # ours: how the job command and LocalCluster start the worker
    Flag("--scheduler", SUPPORTED, "scheduler address (the secret from $HPC_CLUSTER_SECRET)", dask=False,
         metavar="ADDRESS"),
    Flag("--cluster-file", SUPPORTED, "cluster file with the scheduler's address and the secret", dask=False,
         metavar="PATH"),
    Flag("--pool", SUPPORTED, "the worker pool this worker belongs to (the cluster's `pools`); the scheduler "
         "places tasks that need that pool's memory, time or resources on it", _pool_name, dask=False,
         metavar="NAME"),
    Flag("--heartbeat-interval", SUPPORTED, "seconds between heartbeats to the scheduler", _float, dask=False),
    # dask's distributed.worker.memory.target/spill/pause/terminate, as flags (false: off)
    Flag("--memory-target-fraction", SUPPORTED, "results held in memory above this fraction of "
         "--memory-limit go to disk, least recently used first (false: never)", _fraction_or_false, dask=False),
    Flag("--memory-spill-fraction", SUPPORTED, "when the process's memory is above this fraction of "
         "--memory-limit, results go to disk until it is under the target fraction (false: never)",
         _fraction_or_false, dask=False),
    Flag("--memory-pause-fraction", SUPPORTED, "above this fraction of --memory-limit the worker starts no "
         "new task until its memory falls (false: never)", _fraction_or_false, dask=False),
    Flag("--memory-terminate-fraction", SUPPORTED, "the nanny stops the worker at this fraction of "
         "--memory-limit (false: never)", _fraction_or_false, dask=False),
    Flag("--max-message-bytes", SUPPORTED, "largest message accepted", _int_at_least(1, "bytes"), dask=False),
    Flag("--max-frame-bytes", SUPPORTED, "largest frame accepted", _int_at_least(1, "bytes"), dask=False),
    Flag("--log-level", SUPPORTED, "DEBUG, INFO, WARNING or ERROR", dask=False),
    Flag("--nanny-id", SUPPORTED, "set by the nanny", dask=False, hidden=True),
    Flag("--engine", SUPPORTED, "hpc-cluster (this worker) or distributed (dask.distributed's Worker under our "
         "nanny: the cluster's engine setting)", _engine_name, dask=False, metavar="NAME"),
    Flag("--executing-fd", SUPPORTED, "set by the nanny: the pipe a distributed worker names its executing "
         "tasks on", _int_at_least(0, "a file descriptor"), dask=False, hidden=True),
    Flag("--owner-pid", SUPPORTED, "set by LocalCluster and the nanny: exit when this process is gone",
         _int_at_least(1, "a process id"), dask=False, hidden=True),
    Flag("--running-fd", SUPPORTED, "set by the nanny: the memory the worker names the task it runs on its "
         "event loop in (worker/slot.py)", _int_at_least(0, "a file descriptor"), dask=False, hidden=True),
    Flag("--ready-fd", SUPPORTED, "set by the nanny: the pipe to say the scheduler accepted the worker",
         _int_at_least(0, "a file descriptor"), dask=False, hidden=True),
)

BY_NAME: dict[str, Flag] = {n: f for f in FLAGS for n in (f.name, *f.aliases)}

# Where a flag is not given. Ours where they differ from dask-worker's: the job command
# always gives --nthreads and --memory-limit.
DEFAULTS = {"nthreads": 1, "nworkers": 1, "name": None, "memory_limit": "0", "nanny": True, "resources": None,
            "death_timeout": 60.0, "reconnect_window": None, "local_directory": None, "lifetime": None,
            "lifetime_stagger": None,
            "lifetime_restart": False, "dashboard": False, "interface": None, "protocol": None,
            "host": None, "worker_port": None, "pid_file": None, "worker_class": None,
            "dashboard_address": None, "dashboard_prefix": None, "nanny_port": None, "scheduler": None,
            "cluster_file": None, "heartbeat_interval": 0.5, "memory_terminate_fraction": 0.95,
            "memory_target_fraction": 0.6, "memory_spill_fraction": 0.7, "memory_pause_fraction": 0.8,
            "max_message_bytes": 64 * 2**30, "max_frame_bytes": 2**30, "log_level": "INFO", "nanny_id": None,
            "engine": "hpc-cluster", "executing_fd": None,
            "ready_fd": None, "running_fd": None, "tls_ca_file": None, "tls_cert": None, "tls_key": None,
            "owner_pid": None, "pool": "default"}

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _is_flag(token: str) -> bool:
    """As argparse tells options from values: '-1' and '-' are values."""
    return token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token)


# -- reading an argument list ---------------------------------------------------------------

def read_worker_args(args: list[str]) -> tuple[dict, list[str]]:
    """The settings an argument list gives (later flags win, as in dask-worker and argparse)
    and the problems in it, each naming the flag and what to do instead."""
    values, problems = {}, []
    i = 0
    while i < len(args):
        token = str(args[i])
        i += 1
        if token in ("-h", "--help"):
            problems.append(f"{token} prints the worker's help and exits instead of starting a worker: drop it")
            continue
        if not _is_flag(token):
            problems.append(_stray(token))
            continue
        name, eq, inline = token.partition("=")
        flag = BY_NAME.get(name)
        if flag is None:
            problems.append(_unknown(name))
            if not eq and i < len(args) and not _is_flag(str(args[i])):
                i += 1                          # its value, most likely: one problem, not two
            continue
        value = None
        if flag.takes_value and eq:
            value = inline
        elif flag.takes_value and i < len(args) and not _is_flag(str(args[i])):
            value = str(args[i])
            i += 1
        if flag.kind == REFUSED:
            problems.append(f"{name} is not supported: {flag.text}")
        elif not flag.takes_value and eq:
            problems.append(f"{name} takes no value: write {name} alone, not {token}")
        elif flag.takes_value and value is None:
            problems.append(f"{name} needs a value ({flag.metavar or 'VALUE'}): {flag.text}")
        else:
            try:
                values[flag.setting] = flag.const if value is None else flag.read(value)
            except ValueError as exc:
                problems.append(f"{name} {value!r}: {exc}")
    return values, problems + _conflicts(values)


def check_worker_args(args: list[str]) -> list[str]:
    """Problems with worker arguments (dask-worker's flags and ours), each naming the flag and
    saying what to use instead; empty when the worker would accept them all."""
    return read_worker_args(list(args))[1]


def ignored_worker_args(args: list[str]) -> list[str]:
    """Notes on flags that are accepted but do nothing here (the worker logs them at start)."""
    seen = [BY_NAME[str(a).partition("=")[0]] for a in args if str(a).partition("=")[0] in BY_NAME]
    return [f"{f.name}: {f.text}" for f in dict.fromkeys(seen) if f.kind == IGNORED]


MEMORY_FRACTIONS = ("target", "spill", "pause", "terminate")


def memory_fraction_args(values: dict) -> list[str]:
    """--memory-{target,spill,pause,terminate}-fraction from the settings (False: 'false')."""
    out = []
    for name in MEMORY_FRACTIONS:
        value = values[f"memory_{name}_fraction"]
        out += [f"--memory-{name}-fraction", "false" if value is False else f"{value:g}"]
    return out


def drop_flags(args: list[str], *names: str) -> list[str]:
    """`args` without these flags (any of their names) and their values."""
    drop = {n for name in names for n in (BY_NAME[name].name, *BY_NAME[name].aliases)}
    out, i = [], 0
    while i < len(args):
        name, eq, _ = args[i].partition("=")
        if name in drop:
            takes = BY_NAME[name].takes_value
            i += 2 if takes and not eq and i + 1 < len(args) and not _is_flag(args[i + 1]) else 1
        else:
            out.append(args[i])
            i += 1
    return out


def _conflicts(values: dict) -> list[str]:
    """Flags that are fine alone but not together (the effective values: last ones win)."""
    v = {**DEFAULTS, **values}
    out = []
    if v["scheduler"] and v["cluster_file"]:
        out.append("--scheduler and --cluster-file both say where the scheduler is: give one")
    tls = [f"--{k.replace('_', '-')}" for k in ("tls_ca_file", "tls_cert", "tls_key") if v[k]]
    if tls and len(tls) < 3:
        out.append(f"{', '.join(tls)} without the others: TLS needs --tls-ca-file, --tls-cert and --tls-key")
    if v["lifetime_restart"] and not v["lifetime"]:
        out.append("--lifetime-restart does nothing without --lifetime: add --lifetime DURATION (e.g. 55m)")
    if v["lifetime_stagger"] and not v["lifetime"]:
        out.append("--lifetime-stagger does nothing without --lifetime: add --lifetime DURATION (e.g. 55m)")
    elif v["lifetime_stagger"] and v["lifetime_stagger"] >= v["lifetime"]:
        out.append(f"--lifetime-stagger ({v['lifetime_stagger']:g} s) must be less than --lifetime "
                   f"({v['lifetime']:g} s), or some workers would leave at once")
    if v["lifetime_restart"] and v["lifetime"] and not v["nanny"]:
        out.append("--lifetime-restart needs the nanny, which starts the fresh worker: drop --no-nanny "
                   "(nanny=False), or drop --lifetime-restart to end the job when the lifetime ends")
    if v["worker_port"] is not None and v["nworkers"] > 1:
        ports = parse_ports(v["worker_port"])
        if ports != [0] and len(ports) < v["nworkers"]:
            out.append(f"--worker-port {v['worker_port']} has {len(ports)} port(s) for --nworkers {v['nworkers']}: "
                       f"give a range FIRST:LAST with at least {v['nworkers']} ports, or 0 for any free port")
    return out


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name, list(BY_NAME), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return (f"{name} is not a worker flag{hint} (the worker takes dask-worker's flags; "
            "see docs/migrating-from-dask-jobqueue.md)")


def _stray(token: str) -> str:
    if "://" in token or re.match(r"^[\w.-]+:\d+$", token):
        return (f"unexpected argument {token!r}: the worker finds the scheduler in the cluster file "
                "hpc-cluster gives it; drop the address")
    return f"unexpected argument {token!r}: worker arguments are flags with values, like --nthreads 4"
