"""Light workers: `--nworkers N --no-nanny` as one launcher process that imports once and forks
its N workers (issue 33, point 6).

A worker process started on its own costs ~0.2-0.3 s of CPU to start Python and import, and
~31 MB of memory of its own: 1,000 of them neither start within a minute on a 2-core node nor
fit. Forked from one process that has imported everything a worker needs (and frozen those
objects out of the garbage collector's reach, so that collections in the children do not write
to, and so copy, the pages they share), each worker starts in milliseconds and shares the
interpreter, the modules and their code with its siblings.

Each child is a whole worker of its own: its own event loop, connection, listening port and
name (NAME-0, NAME-1...), exactly what `--no-nanny` runs. The launcher only waits:
- a child that ends (killed, retired, lost) is reaped and logged; its siblings go on;
- SIGTERM or SIGINT to the launcher is passed to every child, which leaves cleanly, and the
  launcher ends when they have (after GRACE seconds it kills what is left);
- a launcher killed outright (SIGKILL, a job's end) takes its children with it: each asked the
  kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG) and watches it as its owner.

With a nanny (the default) each worker keeps its own nanny process instead (`run_several` in
__main__.py): the nanny's memory watch and exit report need a process per worker anyway.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import time
from typing import Callable

logger = logging.getLogger("hpc_cluster.worker")

GRACE = 10.0                   # seconds the children get to leave after SIGTERM before SIGKILL
REAP_INTERVAL = 0.2            # seconds between looks for ended children
PR_SET_PDEATHSIG = 1
# What a worker imports later, when it starts, reads or runs its first task: imported once
# here so that the children share them instead of each importing its own copy.
PRELOAD = ("psutil", "msgpack", "cloudpickle", "tornado.iostream", "tornado.tcpserver", "tornado.platform.asyncio",
           "concurrent.futures", "ctypes.util", "hpc_cluster.worker.run", "hpc_cluster.worker.nanny",
           "hpc_cluster.protocol.clusterfile", "hpc_cluster.lifeline", "dask.utils", "dask.sizeof")


def preload() -> None:
    import importlib
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:            # an optional one (dask): the child imports it if it needs it
            pass
    from ..protocol.versions import get_versions
    from .memory import tune_malloc
    get_versions()                     # read from the installed packages' metadata once, then cached
    tune_malloc()                      # its settings and its libc handle are inherited


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send `sig` to this process when its parent thread ends (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def child_argv(argv: list[str], i: int, name: str | None, nthreads: int, port: str | None,
               owner: int) -> list[str]:
    """The command line of the i-th forked worker: one worker, its own name, threads and port
    share, owned by the launcher (pure)."""
    from .flags import drop_flags
    out = drop_flags(argv, "--nworkers", "--name", "--nthreads", "--worker-port", "--owner-pid")
    out += ["--nworkers", "1", "--name", f"{name or 'worker'}-{i}", "--nthreads", str(nthreads),
            "--owner-pid", str(owner)]
    if port is not None:
        out += ["--worker-port", port]
    return out


def run_forked(argv: list[str], n: int, name: str | None, nthreads: int, ports: list[str] | None,
               main: Callable[[list[str]], int], owner_pid: int | None = None) -> int:
    """Fork n workers, each running `main(its argv)`; wait for all of them. The exit code is the
    children's worst (0 when all left cleanly; a signal's as its negative number, as run_several's)."""
    preload()
    gc.collect()
    gc.freeze()                        # the shared objects stay out of the children's collections
    launcher = os.getpid()
    children: dict[int, int] = {}      # pid -> index
    stopping: list[float] = []         # when SIGTERM was passed on

    def pass_on(sig, _frame):
        if not stopping:
            stopping.append(time.monotonic())
        for pid in list(children):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    # Before the first fork: a signal that arrives while forking is passed to those forked so far
    # (the rest see `stopping` and are not started).
    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    for i in range(n):
        if stopping:
            break
        args = child_argv(argv, i, name, nthreads, ports[i] if ports else None, launcher)
        pid = os.fork()
        if pid == 0:
            _become_worker(launcher, args, main)     # never returns
        children[pid] = i
    logger.info("started %d workers (pids %d-%d)", len(children), min(children, default=0),
                max(children, default=0))
    if owner_pid:                                  # after the forks: no thread is copied into a child
        from ..lifeline import watch_owner
        watch_owner(owner_pid, lambda _why: pass_on(signal.SIGTERM, None) or True, "worker launcher",
                    grace=GRACE + 5)
    worst = 0
    while children:
        if stopping and time.monotonic() > stopping[0] + GRACE:
            pass_on(signal.SIGKILL, None)          # the grace is over
            stopping[0] = float("inf")
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if not pid:
            time.sleep(REAP_INTERVAL)
            continue
        i = children.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        how = f"exit code {code}" if code >= 0 else signal.Signals(-code).name
        if i is not None and not stopping:
            logger.warning("worker %s-%d (pid %d) ended (%s); %d workers go on", name or "worker", i, pid, how,
                           len(children))
        elif i is not None and code:
            logger.warning("worker %s-%d (pid %d) did not leave cleanly (%s)", name or "worker", i, pid, how)
        worst = max(worst, code, key=abs)
    return worst


def _become_worker(launcher: int, args: list[str], main: Callable[[list[str]], int]) -> None:
    code = 1
    try:
        die_with_parent()
        if os.getppid() != launcher:               # it died before prctl: nothing to serve
            os._exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # run_worker sets its own once registered
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
