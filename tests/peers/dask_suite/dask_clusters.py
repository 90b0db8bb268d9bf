"""The clusters dask's tests compute on: ours, or distributed's for the comparison.

Both are a scheduler process and WORKERS worker processes of THREADS threads each, every
worker under its nanny, and every worker (nanny and worker process) in its own mount
namespace with a private tmpfs on /tmp, as separate nodes have: a test that writes a file
in /tmp on one side and reads it on the other fails here as it would on a real cluster.

The private /tmp is a wrapper around the worker's command (`unshare` then `mount`), so
nothing in hpc_cluster needs to know about it (what the worker itself lives in under /tmp,
a clone and its venv there, stays visible in it): `PrivateTmpLocalCluster` is our
LocalCluster with `_worker_command` wrapped, and `DistributedProcesses` starts
distributed's `dask scheduler` and `dask worker` (what LocalCluster(processes=True)
runs) as commands, the workers wrapped the same way.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from helpers.wait import WaitTimeout, wait_until
from hpc_cluster import LocalCluster

WORKERS = 2
THREADS = 1

# `unshare` enters a new mount namespace (private propagation: nothing mounted inside is
# seen outside) and runs sh, which mounts a fresh tmpfs on /tmp and execs the worker's
# command: the process id stays the same, so stopping it stops the worker.
_MOUNT_TMP = 'mount -t tmpfs -o mode=1777 tmpfs /tmp && exec "$@"'
_UNSHARE = {
    "root": ["--mount", "--propagation", "private"],
    # A user namespace lets a non-root user mount in its own mount namespace, where the
    # kernel allows unprivileged user namespaces.
    "userns": ["--user", "--map-root-user", "--mount", "--propagation", "private"],
}


def private_tmp_wrapper(mode: str, keep: Iterable[str] = ()) -> list[str]:
    """The words put before a worker's command for `mode` ('root', 'userns'; 'off': none).
    Of the paths in `keep`, those under /tmp (a clone and its .venv there, as CI may make)
    stay visible in the private /tmp: their top directories there are bound into it."""
    if mode == "off":
        return []
    script = _MOUNT_TMP
    tops = sorted({rel.split(os.sep)[0] for rel in (os.path.relpath(os.path.realpath(p), "/tmp") for p in keep)
                   if rel != "." and not rel.startswith("..")})
    if tops:
        # The old /tmp is seen through a bind mount made before the tmpfs covers it, the
        # directories to keep are bound from there, and that mount is taken away again.
        binds = "".join(f' && mkdir -p /tmp/{shlex.quote(t)} && mount --bind "$old"/{shlex.quote(t)} /tmp/{shlex.quote(t)}'
                        for t in tops)
        script = ('old=$(mktemp -d /var/tmp/hpc-cluster-old-tmp-XXXXXX) && mount --bind /tmp "$old"'
                  f' && {_MOUNT_TMP.split(" && exec")[0]}{binds} && umount "$old" && rmdir "$old" && exec "$@"')
    return ["unshare", *_UNSHARE[mode], "--", "sh", "-c", script, "private-tmp"]


def own_network(mode: str, command: list[str]) -> list[str]:
    """`command` run in a network namespace of its own (loopback only), as root: dask's tests
    start distributed clusters of their own on its default port 8787, and two runs side by
    side (or anything else on the machine) holding it turns distributed's "Port 8787 is
    already in use" warning into a failure under dask's `filterwarnings = error`. As another
    user, the command as it is."""
    if mode != "root" or not shutil.which("ip"):
        return command
    return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "own-network", *command]


def kept_under_tmp() -> list[str]:
    """What a worker of this process's must still see if it lives under /tmp: Python, the
    venv, this checkout's hpc_cluster, everything on PYTHONPATH (the extracted tests), and
    the working directory (the run's)."""
    import hpc_cluster
    return [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
            os.path.dirname(os.path.dirname(hpc_cluster.__file__)), os.getcwd(),
            *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]


def private_tmp_mode() -> tuple[str, str]:
    """How workers get a private /tmp on this machine: ('root' or 'userns', ''), or
    ('off', why not) when neither works (a non-root user where user namespaces are off)."""
    if os.environ.get("TEST_DASK_SUITE_PRIVATE_TMP") == "off":
        return "off", ("TEST_DASK_SUITE_PRIVATE_TMP=off: the workers share this machine's /tmp, so a test that "
                       "assumes a shared /tmp can pass here though it would fail across nodes")
    tried = []
    modes = ["root", "userns"] if os.geteuid() == 0 else ["userns"]
    for mode in modes:
        # The check: inside, /tmp is empty (a fresh tmpfs) and writable.
        check = [*private_tmp_wrapper(mode), "sh", "-c", 'test -z "$(ls -A /tmp)" && touch /tmp/x']
        try:
            proc = subprocess.run(check, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            tried.append(f"unshare {' '.join(_UNSHARE[mode])}: {e}")
            continue
        if proc.returncode == 0:
            return mode, ""
        tried.append(f"unshare {' '.join(_UNSHARE[mode])}: exit {proc.returncode}: "
                     f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()} (not root)"
    return "off", (f"workers cannot get a private /tmp here as {who}, so dask's tests run with "
                   "the workers sharing this machine's /tmp and a test that assumes a shared /tmp "
                   "can pass here though it would fail across nodes (CI runs as root, where it works). "
                   "Tried: " + "; ".join(tried))


class PrivateTmpLocalCluster(LocalCluster):
    """Our LocalCluster with each worker's command wrapped in `wrapper`."""

    def __init__(self, *args, wrapper: list[str] = (), **kwargs):
        self.wrapper = list(wrapper)          # before LocalCluster starts the workers
        super().__init__(*args, **kwargs)

    def _worker_command(self, name: str) -> list[str]:
        return [*self.wrapper, *super()._worker_command(name)]


def _stop(procs: list[subprocess.Popen], timeout: float = 15) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class DistributedProcesses:
    """distributed's scheduler and nanny'd workers, each a process started by command."""

    def __init__(self, directory: Path, n_workers: int, threads_per_worker: int, memory_limit: int,
                 wrapper: list[str] = (), timeout: float = 60):
        self.directory = directory
        self.procs: list[subprocess.Popen] = []
        scheduler_file = directory / "distributed-scheduler.json"
        try:
            self.procs.append(self._start("scheduler", [
                sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                # Its HTTP server listens even without a dashboard, by default on 8787, where a
                # test's own distributed.LocalCluster would then fail to start.
                "--no-dashboard", "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)]))
            self.address = self._wait(lambda: scheduler_file.exists() and json.loads(scheduler_file.read_text() or "{}")
                                      .get("address"), timeout, "distributed's scheduler")
            for i in range(n_workers):
                self.procs.append(self._start(f"worker-{i}", [
                    *wrapper, sys.executable, "-m", "distributed.cli.dask_worker", self.address,
                    "--name", f"worker-{i}", "--nthreads", str(threads_per_worker), "--nworkers", "1",
                    "--nanny", "--memory-limit", str(memory_limit), "--host", "127.0.0.1", "--no-dashboard"]))
        except BaseException:
            self.close()
            raise

    def _start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        with open(self.directory / f"distributed-{name}.log", "ab") as log:
            return subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def _wait(self, condition, timeout: float, what: str):
        def up():
            value = condition()
            dead = [p.args[2] for p in self.procs if p.poll() is not None] if not value else []
            if dead:             # it will not come up: say so now, not at the deadline
                raise RuntimeError(f"{what} not up: {dead} exited; logs in {self.directory}")
            return value
        try:
            return wait_until(up, timeout, what, interval=0.05)
        except WaitTimeout:
            raise RuntimeError(f"{what} not up within {timeout} s; logs in {self.directory}") from None

    def close(self) -> None:
        _stop(self.procs[1:])            # the workers first, so they leave the scheduler cleanly
        _stop(self.procs[:1])


# -- the check that computes reach the workers, each with its own /tmp ------------------------
def probe_task(shared: str, index: int, n: int, timeout: float) -> dict:
    """Runs on a worker. Waits (at most `timeout`) until `n` of these run at once, so each
    runs on its own worker (one thread each), then leaves a file in its /tmp and reports
    what it sees."""
    # Its own deadline loop: it runs in distributed's workers, which cannot import tests/helpers.
    pid = os.getpid()
    Path(shared, f"{index}.pid").write_text(str(pid))
    deadline = time.monotonic() + timeout
    while len(list(Path(shared).glob("*.pid"))) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(list(Path(shared).glob('*.pid')))} of {n} probe tasks ran at once "
                               f"within {timeout} s: are there {n} workers?")
        time.sleep(0.02)
    marker = f"hpc-cluster-probe-{index}-{pid}"
    Path("/tmp", marker).write_text("")
    return {"pid": pid, "mount_namespace": os.readlink("/proc/self/ns/mnt"), "tmp_fstype": tmp_fstype(),
            "marker": marker, "tmp": sorted(os.listdir("/tmp"))}


def tmp_fstype() -> str:
    """The type of the filesystem mounted on /tmp in this process's mount namespace."""
    fstype = "(no mount of its own: part of /)"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/tmp":                 # the last such line is the one on top
            fstype = fields[fields.index("-") + 1]
    return fstype


def check_probe(results: list[dict], private_tmp: bool) -> list[str]:
    """What is wrong with the probe's results (empty: all is as it should be)."""
    wrong = []
    pids = {r["pid"] for r in results}
    if os.getpid() in pids:
        wrong.append("a probe task ran in the test process itself: computes do not reach the cluster")
    if len(pids) != len(results):
        wrong.append(f"the {len(results)} probe tasks ran in {len(pids)} process(es), not one each")
    if private_tmp:
        mine = os.readlink("/proc/self/ns/mnt")
        spaces = [r["mount_namespace"] for r in results]
        if mine in spaces or len(set(spaces)) != len(spaces):
            wrong.append(f"workers' mount namespaces {spaces} are not each their own (the tests': {mine})")
        for r in results:
            if r["tmp_fstype"] != "tmpfs":
                wrong.append(f"worker pid {r['pid']}: /tmp is {r['tmp_fstype']}, not a private tmpfs")
            others = [o["marker"] for o in results if o is not r and o["marker"] in r["tmp"]]
            if others:
                wrong.append(f"worker pid {r['pid']} sees other workers' files in its /tmp: {others}")
            if os.path.exists(os.path.join("/tmp", r["marker"])):
                wrong.append(f"the tests' /tmp has worker pid {r['pid']}'s file {r['marker']}")
    return wrong
