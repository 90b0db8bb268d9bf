"""Clusters of separate processes, and the CPU each process spends: what throughput.py,
big_graphs.py and many_workers.py share (benchmarks/ is on sys.path when they run as scripts).

Both systems are started the same way here: the scheduler as a process of its own (dask's
LocalCluster runs its scheduler inside the client's process, which would mix the two in one
CPU figure), workers as processes of their own, with or without a nanny.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def end_all(procs: list, timeout: float = 20) -> None:
    """SIGTERM every process, then wait for all (killing what is left at the deadline): 500
    workers ended one by one would take minutes. (tests/peers/dask_suite has the same few lines;
    benchmarks do not import the tests' helpers.)"""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# -- dask.distributed: `dask scheduler` + `dask worker` processes -----------------------------

def sched_idle() -> None:
    """In a worker process before it starts: Linux's SCHED_IDLE, so that it runs only when the
    scheduler and the client do not need the CPU. Hundreds of workers on this machine's two
    cores otherwise leave the scheduler one turn in every run-queue round (500 processes: over
    a second), which a cluster, whose workers are on other nodes, never does."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


class IdleGroup:
    """All of a run's workers in one CPU cgroup marked idle (cpu.idle = 1), when this machine
    lets us make one (root, a cpu controller); each worker also runs under SCHED_IDLE.

    SCHED_IDLE alone is not enough with hundreds of workers: each SCHED_IDLE task still weighs
    3 against a normal task's 1,024, so 500 busy workers (1,500) took more than half of the
    scheduler's CPU (a 500-placement pass, 6 ms alone, took 100 ms in the 500-worker run). An
    idle group weighs as one idle task, whatever it holds."""

    def __init__(self):
        self.path: str | None = None
        self.why = ""
        v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        root = "/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/cpu"
        path = os.path.join(root, f"hpc-bench-workers-{os.getpid()}-{time.monotonic_ns()}")
        try:
            os.mkdir(path)
            with open(os.path.join(path, "cpu.idle"), "w") as f:
                f.write("1")
            self.path = path
        except OSError as exc:
            self.why = f"no idle CPU group ({exc}): workers under SCHED_IDLE only"
            with contextlib.suppress(OSError):
                os.rmdir(path)

    def enter(self) -> None:
        """In a worker process before it starts (preexec_fn)."""
        if self.path:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        sched_idle()

    def remove(self, timeout: float = 20) -> None:
        """Once its workers ended (a cgroup is removed empty; exits take a moment to show)."""
        if not self.path:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.rmdir(self.path)
                return
            except OSError:
                if time.monotonic() > deadline:
                    print(f"could not remove {self.path}", file=sys.stderr)
                    return
                time.sleep(0.1)


class _Processes:
    """What both systems' process sets share: ending them, and the workers' idle CPU group."""

    workers: list
    scheduler: subprocess.Popen
    idle_group: IdleGroup | None = None

    def _idle_group(self) -> IdleGroup:
        if self.idle_group is None:
            self.idle_group = IdleGroup()
            if self.idle_group.why:
                print(self.idle_group.why, file=sys.stderr)
        return self.idle_group

    def close(self) -> None:
        end_all(self.workers)
        end_all([self.scheduler])
        if self.idle_group is not None:
            self.idle_group.remove()


class DaskProcesses(_Processes):
    """dask's scheduler and workers as processes (the scheduler file names the address)."""

    def __init__(self, stack: contextlib.ExitStack, env_extra: dict | None = None, host: str = "127.0.0.1"):
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-dask-"))
        self.scheduler_file = os.path.join(tmp, "scheduler.json")
        self.env = dict(os.environ, DASK_DISTRIBUTED__ADMIN__TICK__LIMIT="1h", **(env_extra or {}))
        self.workers: list[subprocess.Popen] = []
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", host, "--port", "0",
             "--no-dashboard", "--scheduler-file", self.scheduler_file],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(self.close)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.scheduler_file):
            if self.scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dask's scheduler did not start")
            time.sleep(0.05)

    def start_workers(self, n: int, threads: int = 1, nanny: bool = True, memory_limit: str = "0",
                      idle: bool = False) -> None:
        for _ in range(n):
            self.workers.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", self.scheduler_file,
                 "--nthreads", str(threads), "--memory-limit", memory_limit, "--nanny" if nanny else "--no-nanny",
                 "--no-dashboard", "--host", "127.0.0.1"],
                env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                preexec_fn=self._idle_group().enter if idle else None))

    def client(self, stack: contextlib.ExitStack, timeout: float = 120):
        from distributed import Client
        return stack.enter_context(Client(scheduler_file=self.scheduler_file, timeout=timeout))



def start_dask(stack: contextlib.ExitStack, workers: int, threads: int = 1, nanny: bool = True,
               memory_limit: str = "0", timeout: float = 120):
    """A dask cluster of processes and its client, all workers registered: (client, scheduler pid)."""
    import logging
    logging.getLogger("distributed").setLevel(logging.ERROR)
    procs = DaskProcesses(stack)
    procs.start_workers(workers, threads, nanny, memory_limit)
    client = procs.client(stack, timeout)
    client.wait_for_workers(workers, timeout=timeout)
    return client, procs.scheduler.pid


# -- ours: `python -m hpc_cluster.scheduler` + `python -m hpc_cluster.worker` processes -------
class OurProcesses(_Processes):
    """Our scheduler and workers started by hand (as a batch job's script would)."""

    def __init__(self, stack: contextlib.ExitStack, scheduler_args: tuple = (), scheduler_path: str | None = None):
        """`scheduler_path`: a directory holding another hpc_cluster package (e.g. `git archive`
        of an older commit) for the scheduler alone, to compare two schedulers on the same
        workers and client."""
        from hpc_cluster.protocol.clusterfile import new_secret
        self.secret = new_secret()
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-ours-")))
        self.env = dict(os.environ, HPC_CLUSTER_SECRET=self.secret.hex(),
                        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        self.log = open(tmp / "log", "ab")
        stack.callback(self.log.close)
        self.log_path = tmp / "log"
        addr_file = tmp / "address"
        self.workers: list[subprocess.Popen] = []
        env = dict(self.env, PYTHONPATH=os.pathsep.join([scheduler_path, self.env["PYTHONPATH"]])) \
            if scheduler_path else self.env
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "hpc_cluster.scheduler", "--address-file", str(addr_file),
             "--log-level", "WARNING", *scheduler_args], env=env, stdout=self.log, stderr=self.log,
            cwd=scheduler_path or None)
        stack.callback(self.close)
        deadline = time.monotonic() + 60
        while not addr_file.exists() or not addr_file.read_text():
            if self.scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("our scheduler did not start: " + self.log_path.read_text()[-2000:])
            time.sleep(0.05)
        self.address = addr_file.read_text()

    def start_workers(self, n: int, threads: int = 1, nanny: bool = False, extra: tuple = (),
                      idle: bool = False) -> None:
        for _ in range(n):
            self.workers.append(subprocess.Popen(
                [sys.executable, "-m", "hpc_cluster.worker", "--scheduler", self.address, "--nthreads", str(threads),
                 "--nanny" if nanny else "--no-nanny", "--log-level", "WARNING", *extra],
                env=self.env, stdout=self.log, stderr=self.log, preexec_fn=self._idle_group().enter if idle else None))

    def client(self, stack: contextlib.ExitStack, timeout: float = 120):
        from hpc_cluster import Client
        return stack.enter_context(Client(self.address, secret=self.secret, timeout=timeout))



# -- CPU per process ----------------------------------------------------------------------------
class CPUMeter:
    """User+sys CPU seconds of named groups of processes ("scheduler", "workers", ...) between
    `start()` and `stop()` (psutil; a process gone meanwhile counts what it had at start)."""

    def __init__(self, groups: dict[str, list[int]]):
        self.procs = {}
        for name, pids in groups.items():
            self.procs[name] = []
            for pid in dict.fromkeys(pids):
                with contextlib.suppress(psutil.Error):
                    self.procs[name].append(psutil.Process(pid))
        self._start: dict = {}

    @staticmethod
    def _cpu(p) -> float | None:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return None

    def start(self) -> None:
        self._start = {name: [self._cpu(p) for p in procs] for name, procs in self.procs.items()}

    def stop(self) -> dict[str, float]:
        out = {}
        for name, procs in self.procs.items():
            total = 0.0
            for p, before in zip(procs, self._start[name]):
                after = self._cpu(p)
                if before is not None and after is not None:
                    total += after - before
            out[name] = total
        return out


def worker_groups(client, scheduler_pid: int, client_pid: int | None = None) -> dict[str, list[int]]:
    """{"scheduler", "workers", "nannies", "client"}: pids of a cluster's processes, from the
    workers the scheduler knows (ours report their pid; dask's are asked with client.run) and their parents (a
    nanny is the worker's parent process, unless the parent is the client or the scheduler, as
    in dask's LocalCluster, whose nannies live in the client's process)."""
    client_pid = client_pid or os.getpid()
    info = client.scheduler_info()["workers"].values()
    workers = [w["pid"] for w in info if w.get("pid")]
    if len(workers) < len(info) and hasattr(client, "run"):
        workers = list(client.run(os.getpid).values())      # dask's worker table has no pid
    nannies = []
    for pid in workers:
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(pid).ppid()
            if parent not in (client_pid, scheduler_pid, 1) and psutil.Process(parent).name().startswith("python"):
                nannies.append(parent)
    return {"scheduler": [scheduler_pid], "workers": workers, "nannies": nannies, "client": [client_pid]}
