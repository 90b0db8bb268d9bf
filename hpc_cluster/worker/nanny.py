"""The nanny: starts the worker process, watches it, and reports how it ended.

It samples the worker's memory (RSS of the process tree) ten times a second, stops it
at a fraction of its memory limit, restarts it after an unexpected exit (and at the end of
its --lifetime, with --lifetime-restart), keeps the tail of its log, and for every exit
builds a report: exit code or signal, peak RSS, the last seconds of samples, whether the
nanny killed it, and whether the kernel's OOM killer fired in its memory cgroup. The
report is what `scheduler/diagnosis.py` reads first.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import psutil

from ..lifeline import watch_owner
from ..memseries import MemoryTimeline
from ..retry import Backoff
from ..protocol.messages import Op
from .plugins import worker_directory
from .running import run_in_nanny
from .slot import RunningSlot
from .store import remove_spill_directory, spill_directory
from .worker import EXIT_LIFETIME, EXIT_LOST_SCHEDULER

logger = logging.getLogger("hpc_cluster.nanny")

SAMPLE_INTERVAL = 0.1
SAMPLE_SECONDS = 10
LOG_LINES = 200
WORKER_OOM_SCORE_ADJ = 1000     # the most: the OOM killer's first choice in its cgroup


def cgroup_memory_dir(pid: int) -> Path | None:
    """The memory cgroup directory of `pid` (v1 `memory` controller, or the v2 unified one)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if d.is_dir():
                return d
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                d = root / path.lstrip("/")
                if (d / "memory.events").is_file():
                    return d
    return None


def parse_oom_kills(text: str) -> int | None:
    """The `oom_kill N` count in a cgroup v1 `memory.oom_control` or v2 `memory.events`
    file; None when the kernel does not count (v1 before Linux 4.13 has no such line)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "oom_kill" and parts[1].isdigit():
            return int(parts[1])
    return None


def oom_kills(cgroup: Path | None) -> int | None:
    """The kernel's count of OOM kills in this cgroup (v1 memory.oom_control, v2 memory.events)."""
    if cgroup is None:
        return None
    for name in ("memory.oom_control", "memory.events"):
        try:
            text = (cgroup / name).read_text()
        except OSError:
            continue
        count = parse_oom_kills(text)
        if count is not None:
            return count
    return None


def prefer_as_oom_victim(pid: int) -> None:
    """Ask the kernel's OOM killer to pick the worker, not us: its oom_score_adj raised to the
    maximum, which any process may do to its own user's processes (only lowering needs
    privilege), and which the processes it starts inherit. In a job's memory cgroup the killer
    otherwise takes the largest process, and a worker whose memory is spread over children
    smaller than us (a task's subprocesses) would lose its nanny, and with it the exit report
    and the restart. Where it cannot be set (no /proc, not ours), the kernel's own choice stands.
    It cannot keep us from a second kill: an allocation of ours in the milliseconds before the
    killed worker's memory is uncharged makes the kernel kill again, and then we are the largest
    left (seen once in ~80 cgroup OOM kills on the test cluster: the job ends OUT_OF_MEMORY)."""
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(WORKER_OOM_SCORE_ADJ))
    except OSError as exc:
        logger.debug("could not raise the OOM score of worker pid %d: %s", pid, exc)


CHILDREN_REFRESH = 1.0     # seconds between looks for the worker's descendants


class ProcessTree:
    """RSS of a process and its descendants. Finding descendants reads every process in
    /proc (2 ms with 75 processes here, far more on a busy node), so it is done once a
    second; each 10 Hz sample only reads the memory of the processes already known."""

    def __init__(self, proc: psutil.Process | None):
        self.proc = proc
        self.children: list[psutil.Process] = []
        self._next_scan = float("-inf")

    def rss(self, now: float) -> int | None:
        """None once the process cannot be read (gone, or a zombie holding no memory)."""
        if self.proc is None:
            return None
        try:
            total = self.proc.memory_info().rss
            if now >= self._next_scan:
                self.children = self.proc.children(recursive=True)
                self._next_scan = now + CHILDREN_REFRESH
        except psutil.Error:
            return None
        if total == 0:
            return None
        for child in self.children:
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        return total


class Nanny:
    def __init__(self, child_argv: list[str], memory_limit: int = 0, terminate_fraction: float = 0.95,
                 name: str | None = None, max_startup_failures: int = 5, lifetime_restart: bool = False,
                 local_directory: str | None = None, child_env: dict | None = None,
                 module: str = "hpc_cluster.worker"):
        self.child_argv = child_argv
        # What runs as the worker: ours, or another engine's worker (worker/flags.py's ENGINE_WORKERS),
        # which names its executing tasks on a pipe: our scheduler does not see its tasks.
        self.module = module
        self.executing: dict[str, float] = {}       # that engine's executing tasks (key as JSON -> started)
        # Ours names the task it runs on its event loop here (worker/slot.py): read at its death.
        self.slot = RunningSlot.create() if module == "hpc_cluster.worker" else None
        self.child_env = child_env                  # None: ours (the worker reads the cluster file)
        self.memory_limit = memory_limit
        self.terminate_fraction = terminate_fraction
        self.name = name
        self.id = uuid.uuid4().hex[:12]
        self.max_startup_failures = max_startup_failures
        self.lifetime_restart = lifetime_restart
        self.local_directory = local_directory      # where the worker spills (store.spill_directory)
        self.log_tail: collections.deque = collections.deque(maxlen=LOG_LINES)
        self.samples: collections.deque = collections.deque(maxlen=int(SAMPLE_SECONDS / SAMPLE_INTERVAL))
        # The whole life at 10 Hz, downsampled in bounded space (the scheduler's heartbeats see
        # ~1 Hz): the report carries it for the death's memory record (scheduler/state/timeline.py).
        self.timeline = MemoryTimeline()
        self.reports: list[dict] = []
        self.stopping = False
        self.restarting = False
        self.proc: asyncio.subprocess.Process | None = None
        self.unresponsive: dict | None = None       # set when we end a worker the scheduler lost
        self.on_report = None                       # set by whoever forwards reports to the scheduler

    async def _pump_log(self, stream: asyncio.StreamReader) -> None:
        while True:
            line = await stream.readline()
            if not line:
                return
            text = line.decode(errors="replace")
            self.log_tail.append(text.rstrip("\n"))
            try:
                sys.stderr.write(text)              # still reaches the job's log file
                sys.stderr.flush()
            except OSError as exc:
                # A full (or gone) log filesystem must not end the nanny: its worker's death
                # would then go unreported ("exited with code 120" instead of the SIGSEGV).
                # The lines stay in the log tail the exit report carries.
                self._log_unwritable(exc)

    def _log_unwritable(self, exc: OSError) -> None:
        if not getattr(self, "_log_lost", False):
            self._log_lost = True
            note = (f"nanny: the worker's log could not be written ({exc.strerror or exc}): its log "
                    f"directory is full or gone; its last lines are kept for the scheduler")
            self.log_tail.append(note)
            logger.error("%s", note)      # to the scheduler-side handlers, if stderr takes nothing

    async def run_once(self) -> dict:
        """Start the worker, watch it until it exits, return the exit report."""
        # The worker writes a byte to this pipe once the scheduler accepted it: a worker that
        # never got that far is a startup failure, which restarting will not cure.
        ready_r, ready_w = os.pipe()
        os.set_blocking(ready_r, False)
        # --owner-pid: the worker ends with us, even if we are SIGKILLed (lifeline.py).
        argv = [sys.executable, "-m", self.module, *self.child_argv, "--nanny-id", self.id,
                "--ready-fd", str(ready_w), "--owner-pid", str(os.getpid())]
        fds, watching = [ready_w], None
        if self.slot is not None:
            self.slot.clear()                       # the last worker's task is not this one's
            argv += ["--running-fd", str(self.slot.fd)]
            fds.append(self.slot.fd)
        if self.module != "hpc_cluster.worker":
            watching = ExecutingPipe(self.executing)
            argv += ["--executing-fd", str(watching.write_end)]
            fds.append(watching.write_end)
        try:
            self.proc = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE,
                                                             start_new_session=False, pass_fds=tuple(fds),
                                                             env=self.child_env)
        finally:
            os.close(ready_w)
            if watching is not None:
                watching.started()
        if self.stopping:                           # told to stop while this one was starting
            self._terminate()
        pid = self.proc.pid
        prefer_as_oom_victim(pid)
        cgroup = cgroup_memory_dir(pid)
        oom_before = oom_kills(cgroup)
        pump = asyncio.create_task(self._pump_log(self.proc.stderr))
        exited = asyncio.ensure_future(self.proc.wait())
        started, peak, killed_by_nanny = time.time(), 0, False
        self.unresponsive = None
        self.samples.clear()
        self.timeline = MemoryTimeline()
        try:
            ps = psutil.Process(pid)
        except psutil.Error:
            ps = None
        budget = int(self.memory_limit * self.terminate_fraction) if self.memory_limit else 0
        # Samples fall on fixed deadlines (t0, t0 + 0.1 s, ...) so the rate stays 10 Hz however
        # long a sample takes; a loop late by more than a slot samples at once and skips the rest.
        t0, tick = time.monotonic(), 0
        tree = ProcessTree(ps)
        while True:
            rss = tree.rss(time.monotonic())        # None: it is exiting; not a sample
            if rss is not None:
                peak = max(peak, rss)
                sampled_at = round(time.time(), 3)
                self.samples.append((sampled_at, rss))
                self.timeline.add(sampled_at, rss)
            if budget and rss is not None and rss > budget and not killed_by_nanny:
                pct = round(self.terminate_fraction * 100)
                logger.warning("Worker exceeded %d%% memory budget. Restarting", pct)
                self.log_tail.append(f"nanny: Worker exceeded {pct}% memory budget ({rss} of "
                                     f"{self.memory_limit} bytes). Restarting")
                killed_by_nanny = True
                self._kill_tree(ps)
            tick += 1
            now = time.monotonic()
            if now - (t0 + tick * SAMPLE_INTERVAL) > SAMPLE_INTERVAL:
                tick = int((now - t0) / SAMPLE_INTERVAL)
            done, _ = await asyncio.wait({exited}, timeout=max(0.0, t0 + tick * SAMPLE_INTERVAL - now))
            if done:
                break
        ended = time.time()
        code = exited.result()
        # A worker that was killed (by us over its budget, by the kernel) could not remove
        # its spill files; they are of no use to its successor.
        remove_spill_directory(spill_directory(self.local_directory, pid))
        remove_spill_directory(worker_directory(self.local_directory, pid))     # its uploads (plugins.py)
        await asyncio.wait_for(pump, 5)
        executing = watching.finish() if watching is not None else None
        try:
            registered = os.read(ready_r, 1) == b"1"
        except BlockingIOError:
            registered = False
        finally:
            os.close(ready_r)
        oom_after = oom_kills(cgroup)
        report = {
            "nanny_id": self.id, "pid": pid, "name": self.name, "started": started, "ended": ended,
            "exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None,
            "peak_rss": peak, "memory_limit": self.memory_limit, "samples": list(self.samples),
            "timeline": self.timeline.points(),
            "killed_by_nanny": killed_by_nanny, "memory_budget": budget, "unresponsive": self.unresponsive,
            "cgroup_oom": (oom_after - oom_before) > 0 if None not in (oom_before, oom_after) else None,
            "cgroup": str(cgroup) if cgroup else None, "stopping": self.stopping,
            "log_tail": list(self.log_tail)[-40:], "registered": registered,
        }
        if executing is not None:                   # another engine's worker: what it was running
            report["executing_keys"] = executing
        running = self.slot.read() if self.slot is not None else None
        if running is not None:                     # ours, mid-task on its loop: that task's start
            report["running"] = running
        self.reports.append(report)
        return report

    @staticmethod
    def _kill_tree(ps: psutil.Process | None) -> None:
        if ps is None:
            return
        try:
            procs = [ps, *ps.children(recursive=True)]
        except psutil.Error:
            procs = [ps]
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass

    async def run(self) -> int:
        startup_failures = 0                        # in a row: workers that never registered
        while True:
            if self.stopping:                       # told to stop between two workers
                return 0
            report = await self.run_once()
            if self.on_report is not None:
                await self.on_report(report)
            why = _describe(report)
            if self.restarting:
                self.restarting = False
                logger.info("worker restarted on the scheduler's request")
                continue
            if report["exit_code"] == EXIT_LIFETIME:
                # The scheduler retired it at the end of its lifetime (drained: nothing lost,
                # nothing charged). dask's --lifetime-restart: a fresh worker, a new lifetime.
                if self.lifetime_restart and not self.stopping:
                    logger.info("worker reached its lifetime; starting a fresh one")
                    continue
                logger.info("worker reached its lifetime; nanny exits")
                return 0
            if self.stopping or report["exit_code"] in (0, 3, EXIT_LOST_SCHEDULER):
                # 0: the scheduler closed the worker; 3: the scheduler cannot be reached; 4: the
                # worker lost it and tried to register again for its whole death_timeout: a fresh
                # worker would only wait as long again.
                logger.info("worker ended (%s); nanny exits", why)
                return report["exit_code"] or 0
            # Deaths of workers that were running are restarted however often they come (a
            # task that keeps killing its worker is the scheduler's to fail); a worker that
            # cannot even start is not going to start next time either.
            startup_failures = 0 if report["registered"] else startup_failures + 1
            if startup_failures >= self.max_startup_failures:
                logger.error("the worker failed %d times in a row before reaching the scheduler "
                             "(last: %s); giving up", startup_failures, why)
                return 1
            logger.warning("worker ended unexpectedly (%s); restarting", why)

    def stop(self, grace: float = 10.0) -> None:
        self.stopping = True
        self._terminate(grace)

    def restart(self) -> None:
        """Stop the worker; run() starts a fresh one (client.restart())."""
        self.restarting = True
        self._terminate()

    def end_unresponsive(self, pid) -> None:
        """The scheduler stopped hearing from our worker: note the state its process is in
        (stopped, blocked in the kernel, running a GIL-holding loop...), then SIGKILL it,
        which works on a stopped process too; run() restarts a fresh one."""
        proc = self.proc
        if proc is None or proc.returncode is not None or proc.pid != pid:
            return                                  # already gone, or a successor: leave it
        try:
            ps = psutil.Process(pid)
            status = ps.status()
        except psutil.Error:
            return
        self.unresponsive = {"status": status}
        msg = f"nanny: the scheduler lost the worker's heartbeat; its process is {status}. Ending it"
        logger.warning(msg)
        self.log_tail.append(msg)
        self._kill_tree(ps)

    def _terminate(self, grace: float = 10.0) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            # Bound to this process: by then self.proc may be its successor.
            asyncio.get_running_loop().call_later(grace, self._force_kill, proc)

    @staticmethod
    def _force_kill(proc) -> None:
        if proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass


class ExecutingPipe:
    """The pipe on which another engine's worker names each task it starts ("+KEY") and ends
    ("-KEY"), a line each: at its death, the tasks it was executing are the ones blamed (issue
    32), each with the time it started (how long it ran goes in the death's attempts). Read as
    it arrives, so the worker never blocks on a full pipe."""

    def __init__(self, executing: dict):
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.read_end, False)
        self.executing = executing
        self.executing.clear()
        self._partial = b""

    def started(self) -> None:
        os.close(self.write_end)
        asyncio.get_running_loop().add_reader(self.read_end, self._read)

    def _read(self) -> None:
        try:
            while True:
                chunk = os.read(self.read_end, 65536)
                if not chunk:
                    asyncio.get_running_loop().remove_reader(self.read_end)
                    return
                *lines, self._partial = (self._partial + chunk).split(b"\n")
                for line in lines:
                    key = line[1:].decode(errors="replace")
                    if line[:1] == b"+":
                        self.executing[key] = round(time.time(), 3)
                    elif line[:1] == b"-":
                        self.executing.pop(key, None)
        except BlockingIOError:
            return
        except OSError:
            asyncio.get_running_loop().remove_reader(self.read_end)

    def finish(self) -> dict[str, float]:
        """What it was executing when it ended (key -> when it started); the pipe closed."""
        self._read()
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.read_end)
        os.close(self.read_end)
        return dict(self.executing)


def _describe(report: dict) -> str:
    if report["signal"]:
        try:
            name = signal.Signals(report["signal"]).name
        except ValueError:
            name = f"signal {report['signal']}"
        return f"killed by {name}"
    return f"exit code {report['exit_code']}"


class SchedulerLink:
    """The nanny's own connection to the scheduler: exit reports go up, restarts come down."""

    def __init__(self, address: str, secret: bytes, nanny: Nanny, security=None, cluster_file: str | None = None):
        self.address, self.secret, self.nanny = address, secret, nanny
        self.tls = security.client_context() if security else None
        self.cluster_file = cluster_file             # re-read on reconnecting: a restarted scheduler's address
        self.comm = None
        self.closing = False
        self._retrying = False

    async def start(self, quiet: bool = False) -> None:
        from ..protocol.comm import connect
        from ..protocol.clusterfile import read_cluster_file
        from ..protocol.versions import get_versions
        if self.cluster_file:
            try:
                self.address = read_cluster_file(self.cluster_file)["address"]
            except (OSError, ValueError, KeyError):
                pass
        try:
            self.comm = await connect(self.address, self.secret, {"role": "nanny", "versions": get_versions()},
                                      tls=self.tls)
            await self.comm.write({"op": Op.REGISTER_NANNY, "nanny_id": self.nanny.id, "pid": os.getpid(),
                                   "name": self.nanny.name})
            self._reader = asyncio.create_task(self._read(self.comm))
        except (OSError, ConnectionError) as exc:
            (logger.info if quiet else logger.warning)("nanny could not reach the scheduler at %s: %s",
                                                      self.address, exc)
            self.comm = None

    async def _read(self, comm) -> None:
        try:
            while True:
                for msg in await comm.read():
                    if msg.get("op") == Op.RESTART:
                        self.nanny.restart()
                    elif msg.get("op") == Op.END_UNRESPONSIVE:
                        self.nanny.end_unresponsive(msg.get("pid"))
                    elif msg.get("op") == Op.PING:         # before an end-unresponsive: are we reachable?
                        asyncio.ensure_future(comm.write({"op": Op.PONG, "nanny_id": self.nanny.id}))
                    elif msg.get("op") == Op.RUN:          # client.run(nanny=True), relayed (running.py)
                        run_in_nanny(self, msg)
        except Exception as exc:  # the connection is gone
            logger.debug("nanny link closed: %s", exc)
        if not self.closing and not self._retrying:
            asyncio.ensure_future(self._rejoin())

    async def _rejoin(self) -> None:
        """The scheduler went away: rejoin the one that comes back (its worker reattaches to it,
        worker/reattach.py), so that its restarts and exit reports reach us again."""
        # Jittered: the nannies of every worker lost the scheduler at once.
        self._retrying, backoff = True, Backoff(0.5, 5.0, jitter=0.5)
        try:
            while not self.closing and (self.comm is None or self.comm.closed):
                await asyncio.sleep(backoff.next())
                await self.start(quiet=True)
        finally:
            self._retrying = False

    async def send_report(self, report: dict) -> None:
        if self.comm is None or self.comm.closed:
            await self.start()
        if self.comm is not None:
            try:
                await self.comm.write({"op": Op.EXIT_REPORT, "report": report})
            except ConnectionError:
                pass

    async def close(self) -> None:
        self.closing = True
        if self.comm is not None:
            self.comm.close()


def run_nanny(address: str, secret: bytes, child_argv: list[str], memory_limit: int = 0,
              terminate_fraction: float = 0.95, name: str | None = None, lifetime_restart: bool = False,
              local_directory: str | None = None, child_env: dict | None = None, security=None,
              owner_pid: int | None = None, cluster_file: str | None = None,
              module: str = "hpc_cluster.worker") -> int:
    async def main() -> int:
        nanny = Nanny(child_argv, memory_limit, terminate_fraction, name, lifetime_restart=lifetime_restart,
                      local_directory=local_directory, child_env=child_env, module=module)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, nanny.stop)

        def orphaned(reason: str) -> bool:
            # SIGTERM, and SIGKILL after 3 s: the worker is gone within lifeline's grace.
            loop.call_soon_threadsafe(nanny.stop, 3.0)
            return True

        watch_owner(owner_pid, orphaned, "nanny")
        link = SchedulerLink(address, secret, nanny, security, cluster_file)
        nanny.on_report = link.send_report
        await link.start()
        try:
            return await nanny.run()
        finally:
            await link.close()

    return asyncio.run(main())
