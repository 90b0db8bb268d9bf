"""`python -m hpc_cluster.worker`: the command a job script (or LocalCluster) runs.

With a nanny (the default) this process is the nanny and the worker runs as its child;
with --no-nanny it is the worker itself. It takes dask-worker's flags (worker/flags.py
says which are honoured, ignored or refused) and our own.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys

from ..protocol.admission import raise_open_file_limit
from ..protocol.frames import Limits
from ..protocol.clusterfile import SECRET_ENV, read_cluster_file, take_secret_from_env
from ..protocol.tls import Security
from .memory import tune_malloc
from .output import flush_quietly, guard_std_streams
from .route import listen_host
from .slot import RunningSlot
from .store import MemoryFractions
from .flags import (DEFAULTS, ENGINE_WORKERS, FLAGS, IGNORED, REFUSED, Flag, check_worker_args, draw_lifetime, drop_flags,
                    ignored_worker_args, memory_limit_bytes, parse_ports, parse_resources, port_shares,
                    threads_per_worker)

logger = logging.getLogger("hpc_cluster.worker")
PROG = "python -m hpc_cluster.worker"


def _value_type(flag: Flag):
    """argparse's type for a flag: its reader, with the reader's advice as the error."""
    def read(text: str):
        try:
            return flag.read(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    read.__name__ = flag.setting
    return read


def _refusal(flag: Flag):
    class Refuse(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            parser.error(f"{option_string} is not supported: {flag.text}")
    return Refuse


def build_parser() -> argparse.ArgumentParser:
    """The worker's arguments, from the table in flags.py. Later flags win over earlier ones."""
    p = argparse.ArgumentParser(prog=PROG, allow_abbrev=False)
    where = p.add_mutually_exclusive_group(required=True)
    for flag in FLAGS:
        group = where if flag.setting in ("scheduler", "cluster_file") else p
        names = (flag.name, *flag.aliases)
        shown = argparse.SUPPRESS if flag.hidden else flag.text.replace("%", "%%")
        if flag.kind == REFUSED:
            group.add_argument(*names, action=_refusal(flag), nargs=None if flag.takes_value else 0,
                               help=argparse.SUPPRESS)
        elif flag.takes_value:
            group.add_argument(*names, dest=flag.setting, type=_value_type(flag), metavar=flag.metavar,
                               help=shown)
        else:
            group.add_argument(*names, dest=flag.setting, action="store_const", const=flag.const, help=shown)
    p.set_defaults(**DEFAULTS)
    return p


def interface_address(name: str) -> str:
    import psutil
    import socket
    addrs = psutil.net_if_addrs()
    if name not in addrs:
        raise SystemExit(f"--interface {name!r}: no such network interface; this host has "
                         f"{', '.join(sorted(addrs))}")
    for a in addrs[name]:
        if a.family == socket.AF_INET:
            return a.address
    raise SystemExit(f"--interface {name!r} has no IPv4 address")


def cpu_count() -> int:
    """The cores this job may use (its CPU affinity, which batch systems set), as dask counts them."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def system_memory() -> int:
    """The node's memory as dask counts it: the least of its RAM, this process's memory cgroup
    limit (the job's, under a batch system) and RLIMIT_RSS."""
    import resource

    import psutil

    from .nanny import cgroup_memory_dir
    limits = [psutil.virtual_memory().total]
    cgroup = cgroup_memory_dir(os.getpid())
    for name in ("memory.limit_in_bytes", "memory.max"):     # cgroup v1, v2 ("max": none)
        try:
            limits.append(int((cgroup / name).read_text()))
        except (TypeError, OSError, ValueError):
            pass
    limits += [x for x in resource.getrlimit(resource.RLIMIT_RSS) if 0 < x != resource.RLIM_INFINITY]
    return min(limits)


def run_several(argv: list[str], n: int, name: str | None, nthreads: int, worker_port: str | None) -> int:
    """Start n workers (processes per job), each a copy of this command; end with them."""
    import signal
    import subprocess
    base = drop_flags(argv, "--nworkers", "--name", "--nthreads", "--worker-port")
    ports = port_shares(worker_port, n) if worker_port is not None else None
    procs = []
    for i in range(n):
        # Threads are counted here, where --nworkers is known (0: the cores shared among them).
        child = drop_flags(base, "--owner-pid") + ["--name", f"{name or 'worker'}-{i}", "--nthreads", str(nthreads),
                                                   "--owner-pid", str(os.getpid())]     # they end with us
        if ports:
            child += ["--worker-port", ports[i]]
        procs.append(subprocess.Popen([sys.executable, "-m", "hpc_cluster.worker", *child]))

    def forward(sig, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [p.wait() for p in procs]
    return max((c for c in codes), key=abs, default=0)


def use_local_directory(path: str) -> str:
    """Create `path` (after expanding ~ and $VARS in this job's environment) and chdir into it."""
    expanded = os.path.expandvars(os.path.expanduser(path))
    if "$" in expanded:
        raise SystemExit(f"--local-directory {path!r}: {expanded!r} still names an unset variable "
                         "on this node; set local_directory to a directory that exists here, or "
                         "one whose variables the job sets")
    try:
        os.makedirs(expanded, exist_ok=True)
        os.chdir(expanded)
    except OSError as e:
        raise SystemExit(f"--local-directory {path!r}: cannot use {expanded!r} on this node: "
                         f"{e.strerror or e}; set local_directory to a writable node-local directory "
                         "(/tmp, $TMPDIR)") from None
    return os.getcwd()


def write_pid_file(path: str) -> str:
    """dask-worker's --pid-file: this process's id, removed at exit (see main for os._exit)."""
    import atexit
    path = os.path.abspath(path)
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    atexit.register(remove_pid_file, path)
    return path


def remove_pid_file(path: str | None) -> None:
    if path:
        try:
            os.remove(path)
        except OSError:
            pass


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _ready_signal(fd: int | None):
    """Tell the nanny, through the pipe it gave us, that the scheduler accepted this worker."""
    if fd is None:
        return None

    def signal_ready() -> None:
        try:
            os.write(fd, b"1")
            os.close(fd)
        except OSError:
            pass
    return signal_ready


def main(argv=None) -> int:
    raise_open_file_limit()          # a soft 1024 under a far higher hard limit is common
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        build_parser().print_help()
        return 0
    # The table's own words, all problems at once, rather than argparse's first complaint
    # (in argparse's form, which job logs and the nanny's log tail already show).
    problems = check_worker_args(argv)
    if problems:
        for problem in problems:
            print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    for note in ignored_worker_args(argv):
        print(f"hpc-cluster worker: {note}", file=sys.stderr)
    # What the nanny and the other workers of the job run: without the flags only this
    # process acts on (they would note them again, or write the pid file over).
    argv = drop_flags(argv, "--pid-file", *(f.name for f in FLAGS if f.kind == IGNORED))
    pid_file = write_pid_file(args.pid_file) if args.pid_file else None
    # Paths are made absolute before the chdir into the local directory, in argv too: the
    # nanny and the other workers of the job run the same argv from there.
    if args.cluster_file:
        args.cluster_file = os.path.abspath(args.cluster_file)
        argv = drop_flags(argv, "--cluster-file") + ["--cluster-file", args.cluster_file]
    if args.local_directory:
        # Before the nanny or the other workers start: they inherit it as their cwd.
        args.local_directory = use_local_directory(args.local_directory)
        argv = drop_flags(argv, "--local-directory") + ["--local-directory", args.local_directory]
    cpus = cpu_count()
    nthreads = threads_per_worker(args.nthreads, args.nworkers, cpus)
    if args.nworkers > 1 and not args.nanny and args.engine == "hpc-cluster":
        # Light workers: one process imports, N forked workers share it (worker/forked.py).
        from .forked import run_forked
        logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        ports = port_shares(args.worker_port, args.nworkers) if args.worker_port is not None else None
        code = run_forked(argv, args.nworkers, args.name, nthreads, ports, main, owner_pid=args.owner_pid)
        remove_pid_file(pid_file)
        return code
    if args.nworkers > 1:
        return run_several(argv, args.nworkers, args.name, nthreads, args.worker_port)
    if args.interface:
        args.host = interface_address(args.interface)
    guard_std_streams()                    # a task's print into a full log directory says so
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    security = Security(args.tls_ca_file, args.tls_cert, args.tls_key) if args.tls_ca_file else None
    if args.cluster_file:
        info = read_cluster_file(args.cluster_file)
        address, secret = info["address"], info["secret"]
        security = security or Security.from_dict(info.get("tls"))
        os.environ.pop(SECRET_ENV, None)       # not the one we use, but a secret all the same
    else:
        address, secret = args.scheduler, take_secret_from_env()
        if secret is None:
            print("hpc-cluster worker: set $HPC_CLUSTER_SECRET or use --cluster-file", file=sys.stderr)
            return 2
    args.host = listen_host(args.host, address)     # not every interface: the one towards the scheduler
    memory_limit, note = memory_limit_bytes(args.memory_limit, nthreads=nthreads, cpus=cpus,
                                            system_memory=system_memory())
    if note:
        logger.warning(note)
    if args.nanny:
        from .nanny import run_nanny
        # The nanny restarts the worker when its lifetime ends; the worker only says so.
        # Its worker is told the nanny's pid as its owner, not ours.
        child = drop_flags(argv, "--nanny", "--no-nanny", "--lifetime-restart", "--no-lifetime-restart",
                           "--owner-pid", "--engine")
        # The secret left our environment (tasks must not inherit it); the worker gets it in its own.
        child_env = None if args.cluster_file else {**os.environ, SECRET_ENV: secret.hex()}
        return run_nanny(address, secret, child + ["--no-nanny"], memory_limit=memory_limit, child_env=child_env,
                         security=security,
                         terminate_fraction=args.memory_terminate_fraction, name=args.name,
                         lifetime_restart=args.lifetime_restart, local_directory=args.local_directory,
                         owner_pid=args.owner_pid, cluster_file=args.cluster_file,
                         module=ENGINE_WORKERS[args.engine])
    if args.engine != "hpc-cluster":              # another engine's worker, without our nanny
        os.execv(sys.executable, [sys.executable, "-m", ENGINE_WORKERS[args.engine],
                                  *drop_flags(argv, "--engine")])
    from .run import run_worker
    # A task that crashes the process (SIGSEGV in a C extension, say) leaves its Python stack
    # on stderr: the nanny and the job log keep it, and the diagnosis names the crash site.
    # Only the crashing thread, so it stays short enough for the log tail.
    faulthandler.enable(all_threads=False)
    tune_malloc()                          # freed results go back to the OS (worker/store.py)
    extra = {**registration_info(args, os.environ), **lifetime_info(args)}
    code = run_worker(address, secret, nthreads=nthreads, memory_limit=memory_limit, name=args.name,
                      host=args.host, port=_ports(args.worker_port), resources=parse_resources(args.resources or ""),
                      heartbeat_interval=args.heartbeat_interval, nanny=bool(args.nanny_id), extra_info=extra,
                      limits=Limits(max_frame_bytes=args.max_frame_bytes, max_message_bytes=args.max_message_bytes),
                      death_timeout=args.death_timeout, on_registered=_ready_signal(args.ready_fd),
                      reconnect_window=args.reconnect_window, cluster_file=args.cluster_file,
                      memory_fractions=MemoryFractions.read(args.memory_target_fraction, args.memory_spill_fraction,
                                                            args.memory_pause_fraction,
                                                            args.memory_terminate_fraction),
                      local_directory=args.local_directory, security=security, owner_pid=args.owner_pid,
                      running_slot=RunningSlot.attach(args.running_fd))
    # A task thread may still be running user code; it must not keep a closed worker alive.
    logging.shutdown()
    remove_pid_file(pid_file)              # os._exit skips atexit
    flush_quietly()
    os._exit(code)


def registration_info(args, environ) -> dict:
    """What the worker tells the scheduler beyond its threads and memory: its job (from the
    job script's HPC_CLUSTER_* variables), its nanny, and its pool (--pool, "default")."""
    return {"job_id": environ.get("HPC_CLUSTER_JOB_ID") or None, "nanny_id": args.nanny_id,
            "pool": args.pool or "default",
            "job_walltime": _number(environ.get("HPC_CLUSTER_JOB_WALLTIME")),
            "job_start": _number(environ.get("HPC_CLUSTER_JOB_START"))}


def lifetime_info(args) -> dict:
    """The lifetime this worker process draws once, at its start (a restarted worker draws
    again), and when it ends: the scheduler treats that end like an earlier walltime."""
    import random
    import time
    lifetime = draw_lifetime(args.lifetime, args.lifetime_stagger, random.random())
    if lifetime is None:
        return {}
    end = time.time() + lifetime
    logger.info("this worker's lifetime is %.1f s: it leaves by %s", lifetime,
                time.strftime("%H:%M:%S", time.localtime(end)))
    return {"lifetime": lifetime, "lifetime_end": end}


def _ports(spec: str | None):
    return parse_ports(spec) if spec is not None else 0


if __name__ == "__main__":
    exit_code = main()
    # The nanny returns here: a log that cannot take its last lines must not turn its exit
    # code into 120 (Python's own flush at exit failing).
    flush_quietly()
    sys.stdout = sys.stderr = None
    sys.exit(exit_code)
