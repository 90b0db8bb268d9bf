"""`python -m hpc_cluster.worker`: the command a job script (or LocalCluster) runs.

With a nanny (the default) this process is the nanny and the worker runs as its child;
with --no-nanny it is the worker itself.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys

from ..units import parse_memory
from ..protocol.frames import Limits
from ..protocol.secret import read_cluster_file, secret_from_env


def parse_resources(text: str | None) -> dict:
    out = {}
    for item in filter(None, (text or "").replace(",", " ").split()):
        name, _, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            raise SystemExit(f"--resources {text!r}: use NAME=NUMBER pairs, e.g. 'GPU=2 MEM=10e9'") from None
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hpc_cluster.worker")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--scheduler", help="scheduler address (secret from $HPC_CLUSTER_SECRET)")
    where.add_argument("--cluster-file", help="cluster file with the address and the secret")
    p.add_argument("--nthreads", type=int, default=1)
    p.add_argument("--memory-limit", default="0", help="e.g. 4GB; 0 for no limit")
    p.add_argument("--name", default=None)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on for peers")
    p.add_argument("--interface", default=None, help="listen on this network interface's address (e.g. ib0)")
    p.add_argument("--nworkers", type=int, default=1, help="worker processes to start (each with its nanny)")
    p.add_argument("--local-directory", default=None, metavar="DIR",
                   help="scratch directory for the worker's files, created if missing and made the "
                        "working directory; '~' and $VARIABLES are expanded here, on the node")
    p.add_argument("--death-timeout", type=float, default=60.0,
                   help="seconds to keep trying to reach the scheduler before giving up")
    p.add_argument("--resources", default=None, help="abstract resources, e.g. 'GPU=2'")
    p.add_argument("--nanny", dest="nanny", action="store_true", default=True)
    p.add_argument("--no-nanny", dest="nanny", action="store_false")
    p.add_argument("--nanny-id", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)   # the nanny's pipe
    p.add_argument("--heartbeat-interval", type=float, default=0.5)
    p.add_argument("--memory-terminate-fraction", type=float, default=0.95)
    p.add_argument("--max-message-bytes", type=int, default=2**31)
    p.add_argument("--max-frame-bytes", type=int, default=2**30)
    p.add_argument("--log-level", default="INFO")
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


def run_several(argv: list[str], n: int, name: str | None) -> int:
    """Start n workers (processes per job), each a copy of this command; end with them."""
    import signal
    import subprocess
    base = _drop_option(argv, "--nworkers")
    base = _drop_option(base, "--name")
    procs = []
    for i in range(n):
        child = base + ["--name", f"{name or 'worker'}-{i}"]
        procs.append(subprocess.Popen([sys.executable, "-m", "hpc_cluster.worker", *child]))

    def forward(sig, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [p.wait() for p in procs]
    return max((c for c in codes), key=abs, default=0)


def _drop_option(argv: list[str], option: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == option:
            skip = True
        elif not a.startswith(option + "="):
            out.append(a)
    return out


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
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    # Paths are made absolute before the chdir into the local directory, in argv too: the
    # nanny and the other workers of the job run the same argv from there.
    if args.cluster_file:
        args.cluster_file = os.path.abspath(args.cluster_file)
        argv = _drop_option(argv, "--cluster-file") + ["--cluster-file", args.cluster_file]
    if args.local_directory:
        # Before the nanny or the other workers start: they inherit it as their cwd.
        args.local_directory = use_local_directory(args.local_directory)
        argv = _drop_option(argv, "--local-directory") + ["--local-directory", args.local_directory]
    if args.nworkers > 1:
        return run_several(argv, args.nworkers, args.name)
    if args.interface:
        args.host = interface_address(args.interface)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.cluster_file:
        info = read_cluster_file(args.cluster_file)
        address, secret = info["address"], info["secret"]
    else:
        address, secret = args.scheduler, secret_from_env()
        if secret is None:
            print("hpc-cluster worker: set $HPC_CLUSTER_SECRET or use --cluster-file", file=sys.stderr)
            return 2
    memory_limit = parse_memory(args.memory_limit) if args.memory_limit not in ("0", "", "none") else 0
    if args.nanny:
        from .nanny import run_nanny
        child = [a for a in argv if a != "--nanny"] + ["--no-nanny"]
        return run_nanny(address, secret, child, memory_limit=memory_limit,
                         terminate_fraction=args.memory_terminate_fraction, name=args.name)
    from .worker import run_worker
    # A task that crashes the process (SIGSEGV in a C extension, say) leaves its Python stack
    # on stderr: the nanny and the job log keep it, and the diagnosis names the crash site.
    # Only the crashing thread, so it stays short enough for the log tail.
    faulthandler.enable(all_threads=False)
    extra = {"job_id": os.environ.get("HPC_CLUSTER_JOB_ID") or None, "nanny_id": args.nanny_id,
             "job_walltime": _number(os.environ.get("HPC_CLUSTER_JOB_WALLTIME")),
             "job_start": _number(os.environ.get("HPC_CLUSTER_JOB_START"))}
    code = run_worker(address, secret, nthreads=args.nthreads, memory_limit=memory_limit, name=args.name,
                      host=args.host, resources=parse_resources(args.resources),
                      heartbeat_interval=args.heartbeat_interval, nanny=bool(args.nanny_id), extra_info=extra,
                      limits=Limits(max_frame_bytes=args.max_frame_bytes, max_message_bytes=args.max_message_bytes),
                      death_timeout=args.death_timeout, on_registered=_ready_signal(args.ready_fd))
    # A task thread may still be running user code; it must not keep a closed worker alive.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
