"""The worker's memory policy (dask's target/spill/pause fractions, distributed/worker_memory.py):
when results go to disk, when the worker pauses, what it reports to the scheduler and the
diagnosis, which results it may send without passing its limit; and glibc's malloc tuned so
freed memory goes back to the OS. The results themselves are worker/store.py's SpillStore.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

from ..protocol import serialize
from ..protocol.frames import nbytes as buffer_bytes
from ..units import format_memory
from .store import MemoryFractions, SpillStore, spill_directory

logger = logging.getLogger("hpc_cluster.worker.memory")


ALWAYS_SENDABLE = 4 * 2**20     # bytes of pickle a worker sends whatever its memory
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class MemoryManager:
    """A worker's memory policy: its store, its limit and fractions, and whether it is paused.

    The worker's monitor calls `sample` every MONITOR_INTERVAL, `pause_changed` and
    `spill_level`; what it reports to the scheduler is `report` (and `at_task_start` with
    every task it starts: the scheduler's diagnosis compares those with the memory at a death
    to tell what a running task allocated from what the worker held)."""

    def __init__(self, limit: int = 0, fractions: MemoryFractions | None = None,
                 local_directory: str | None = None, pid: int | None = None):
        import psutil
        self.limit = int(limit or 0)
        self.fractions = fractions or MemoryFractions()
        f = self.fractions
        spilling = bool(self.limit) and bool(f.target or f.spill)
        directory = spill_directory(local_directory, pid or os.getpid()) if spilling else None
        # target off but spill on: only the process-memory rule spills (dask: target = maxsize)
        target = int(self.limit * f.target) if self.limit and f.target else None
        self.store = SpillStore(directory, target)
        # Files are written by one thread of their own, so neither the event loop (messages,
        # the next task's start) nor the task threads wait for the disk.
        self._spiller = ThreadPoolExecutor(1, thread_name_prefix="hpc-spill") if directory else None
        self._spilling: asyncio.Future | None = None
        self._spill_again = False
        self._then = None
        self.paused = False
        self._process = psutil.Process(pid or os.getpid())
        # The resident set read from /proc/<pid>/statm kept open: one pread, 3 us, where
        # psutil's memory_info() opens, stats, seeks, reads and closes it, 11 us, with every
        # task a worker starts (issue 19: CPU per task). psutil where there is no /proc.
        try:
            self._statm = os.open(f"/proc/{pid or os.getpid()}/statm", os.O_RDONLY)
        except OSError:
            self._statm = None
        self.rss = self.read_rss()
        self.peak = self.rss                  # the most seen since the last report
        self._quiet_until = 0.0               # no second "nothing to spill" warning before then

    def read_rss(self) -> int:
        try:
            if self._statm is not None:
                return int(os.pread(self._statm, 256, 0).split()[1]) * PAGE_SIZE
            return self._process.memory_info().rss
        except Exception:             # psutil.Error, OSError (the process is gone); never let the monitor die of it
            return 0

    def sample(self) -> int:
        self.rss = self.read_rss()
        self.peak = max(self.peak, self.rss)
        return self.rss

    def payloads(self, keys: list) -> tuple[dict, list, dict]:
        """Results for a peer or a client, as they travel (data), those not here (missing), and
        those that cannot travel (errors); spilled ones straight from their files.

        A result that cannot travel is an error for that key (`errors`: key -> why and what to
        do), said once, never a dropped connection: the asker would ask again for ever. That
        is one that does not pickle, and one whose pickle would take the worker past the memory
        its nanny ends it at (a 1 GiB `bytes`: its copy killed the worker, the result was
        recomputed, and the next gather killed it again)."""
        data, missing, errors = {}, [], {}
        room = self.headroom()
        # A copy this small never decides the worker's fate: refused while a running task held
        # the worker at its limit, a finished task's int became an error for good (on SLURM).
        budget = None if room is None else max(room[0], ALWAYS_SENDABLE)
        for k in keys:
            try:
                data[k] = payload = self.store.payload(k, budget)
            except KeyError:
                missing.append(k)
                continue
            except serialize.TooLargeToSend as exc:
                errors[k] = (f"the result of {k!r} is too large to send from its worker: pickling it takes more "
                             f"than the {format_memory(exc.budget)} the worker has left before its memory limit "
                             f"({format_memory(room[1])}), so it was not sent (the worker holds it, unharmed). "
                             "Return it in smaller pieces (e.g. chunks of an array, gathered or used one by one), "
                             "or as a numpy array or bytearray (sent without a copy), or give the workers more "
                             "memory (memory_limit)")
                continue
            except Exception as exc:  # whatever the value's own pickling raises
                errors[k] = (f"the result of {k!r} cannot be sent from its worker: it does not pickle "
                             f"({type(exc).__name__}: {exc}). Return a value that pickles (plain data, arrays, "
                             "frames), or use it only in tasks that run on the worker that holds it")
                logger.warning("cannot send %r: %s: %s", k, type(exc).__name__, exc)
                continue
            if budget is not None:
                budget = max(0, budget - buffer_bytes(payload.data))
        return data, missing, errors

    def _level(self, fraction) -> int | None:
        return int(self.limit * fraction) if self.limit and fraction else None

    def headroom(self) -> tuple[int, int] | None:
        """(bytes the process may still take, the level it may reach) before the nanny ends
        it (the terminate fraction, else the limit); None without a limit."""
        level = self._level(self.fractions.terminate) or self.limit
        if not level:
            return None
        return max(0, level - self.read_rss()), level

    def pause_changed(self, rss: int) -> bool:
        """Pause above the pause fraction, resume at or below it; True when that flips."""
        level = self._level(self.fractions.pause)
        paused = level is not None and rss > level
        if paused == self.paused:
            return False
        self.paused = paused
        return True

    def spill_level(self, rss: int) -> int | None:
        """Spill down to this many bytes of process memory now, or None: the process is over
        the spill fraction (dask's hysteresis: spill from `spill` down to `target`)."""
        start = self._level(self.fractions.spill)
        if start is None or self.store.directory is None or rss <= start:
            return None
        return self._level(self.fractions.target) or start

    def spill_soon(self, then=None) -> None:
        """Bring the results in memory under the target, in the spill thread (the worker calls
        this, from its event loop, after storing a result). One pass at a time; a call during
        a pass asks for another. `then` is called on the event loop when no pass is left."""
        if then is not None:
            self._then = then
        if self._spiller is None or self.store.target is None:
            return
        if self._spilling is not None:
            self._spill_again = True
            return
        if not self.store.over_target():
            return                          # the common case: no thread to wake for nothing
        self._spilling = asyncio.get_running_loop().run_in_executor(self._spiller, self.store.spill_to_target)
        self._spilling.add_done_callback(self._spilled)

    def _spilled(self, fut) -> None:
        self._spilling = None
        if not fut.cancelled() and fut.exception() is not None:
            logger.error("spilling failed: %s", fut.exception())
        if self._spill_again:
            self._spill_again = False
            self.spill_soon()
        # No pass left (another may have been needed, or not: under the target none starts):
        # the worker may start the tasks it held back while the writes lagged.
        if self._spilling is None and self._then is not None:
            self._then()

    def behind(self) -> bool:
        """Is the spill thread behind? Results in memory are over the spill fraction of the
        limit while it writes: the worker starts no task until it has caught up, as a worker
        that wrote them itself could not have (without this, tasks made 10 MB results faster
        than they were written and reached the nanny's terminate fraction)."""
        level = self._level(self.fractions.spill) or self.store.target
        return self._spilling is not None and level is not None and self.store.memory_bytes > level

    def close(self) -> None:
        """Wait for a write under way, then remove every spill file (the worker is ending)."""
        if self._statm is not None:
            statm, self._statm = self._statm, None
            os.close(statm)
        if self._spiller is not None:
            self._spiller.shutdown(wait=True, cancel_futures=True)
        self.store.close()

    async def spill_down(self, rss: int) -> int:
        """Over the spill fraction: spill results, least recently used first, until the
        process is under the target (dask's hysteresis); the process's memory after."""
        level = self.spill_level(rss)
        spilled, count, trimmed = 0, 0, False
        loop = asyncio.get_running_loop()
        while level is not None and rss > level:
            weight = await loop.run_in_executor(self._spiller, self.store.evict)
            if weight < 0 and not trimmed:
                # Freed results may still sit in the heap: hand them back and look again.
                trim_malloc()
                trimmed, rss = True, self.sample()
                continue
            if weight < 0:
                # Nothing left to spill and still over: the memory is not results.
                now = time.monotonic()
                if now > self._quiet_until:
                    self._quiet_until = now + 300
                    logger.warning("memory is high but no result is left to spill (%s; %s of results in "
                                   "memory): unmanaged memory, taken by running tasks, libraries, or not "
                                   "given back to the OS", self.describe(rss), _mib(self.store.memory_bytes))
                break
            spilled, count = spilled + weight, count + 1
            rss = self.sample()
        if count and not trimmed and rss > level:
            trim_malloc()
            rss = self.sample()
        if count:
            logger.debug("spilled %d results (%s) to disk; memory now %s", count, _mib(spilled), self.describe(rss))
        return rss

    def report(self) -> dict:
        """What the heartbeat carries: the process's memory now and at most since the last
        report, results in memory and on disk, whether paused."""
        rss = self.sample()
        out = {"rss": rss, "peak_rss": self.peak, "paused": self.paused, **self.store.metrics()}
        self.peak = rss
        return out

    def at_task_start(self) -> dict:
        """Memory as a task starts: the baseline against which its growth is measured."""
        return {"rss": self.sample(), "managed": self.store.memory_bytes}

    def describe(self, rss: int) -> str:
        return f"{_mib(rss)} of {_mib(self.limit)} ({rss / self.limit:.0%})" if self.limit else _mib(rss)


# -- giving freed memory back to the OS (glibc) ---------------------------------------------
# glibc keeps freed memory for reuse: after a 25 MB array is freed, its dynamic threshold
# moves so later arrays up to 32 MiB come from the heap, and a heap rarely shrinks. A worker
# that spilled every result could then stay over its pause fraction for ever with nothing
# left to spill (two such workers deadlock a computation). dask sets MALLOC_TRIM_THRESHOLD_
# in its nanny's environment for the same reason; mallopt does it from inside the process,
# so a --no-nanny worker gets it too. A value the user set in the environment wins.
TRIM_THRESHOLD = 65536
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


@functools.lru_cache(maxsize=1)      # find_library runs `ldconfig -p`: once per process, not per call
def _libc():
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def tune_malloc() -> bool:
    """Make freed memory go back to the OS promptly; False where that is not glibc's to do."""
    libc = _libc()
    if libc is None:
        return False
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        libc.mallopt(_M_MMAP_THRESHOLD, 1 << 20)   # fixed: large results always in their own mmaps
    return True


def trim_malloc() -> None:
    """Give the heap's free memory back to the OS now (after spilling freed results)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _mib(n: int) -> str:
    return format_memory(n, "MiB", 0)
