"""When the scheduler's process collects cyclic garbage: when it is quiet, not mid-answer.

CPython's full (generation 2) collection walks every tracked object and stops everything
while it does. With 500 workers and 20,000 tasks one took 20-70 ms and found nothing to free
(every record is freed by reference counting when it is forgotten), and it ran several
times a second while a large submission arrived: the slowest answers to clients, 94-157 ms,
were those collections (issue 19, point 3; BENCHMARKS.md "Many workers"). With a million
tasks one takes seconds. dask's scheduler has the same stall (dask/distributed#8958).

So the automatic full collection is off while a scheduler runs; the young generations are
still collected as usual (they are small: a few ms at most). The scheduler collects in full
itself once it has been quiet for QUIET seconds after some activity, and in any case every
EVERY seconds, so garbage cycles cannot pile up under a load that never pauses. A collection
over a second is logged, with its size.
"""

from __future__ import annotations

import gc
import logging
import time

logger = logging.getLogger("hpc_cluster.scheduler")

QUIET = 1.0              # seconds without a message before a full collection
EVERY = 600.0            # seconds between full collections at most, however busy
NEVER = 2**31 - 1        # as the threshold of generation 2: no automatic full collection


class Collector:
    def __init__(self, quiet: float = QUIET, every: float = EVERY):
        self.quiet, self.every = quiet, every
        self._saved: tuple | None = None
        self._busy_at = self._full_at = time.monotonic()
        self._dirty = False               # activity since the last full collection
        self.collections = 0

    def start(self) -> None:
        """Take over full collections (the process's setting, given back by stop())."""
        if self._saved is None:
            self._saved = gc.get_threshold()
            gc.set_threshold(self._saved[0], self._saved[1], NEVER)

    def stop(self) -> None:
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None

    def busy(self) -> None:
        """Something happened (the server calls it with every event it handles)."""
        self._busy_at = time.monotonic()
        self._dirty = True

    def tick(self) -> bool:
        """Called every second or so: collect now if quiet (or overdue). True if it did."""
        now = time.monotonic()
        quiet = self._dirty and now - self._busy_at >= self.quiet
        if self._saved is None or not (quiet or now - self._full_at >= self.every):
            return False
        t0 = time.perf_counter()
        found = gc.collect()
        took = time.perf_counter() - t0
        self._full_at, self._dirty = time.monotonic(), False
        self.collections += 1
        if took > 1.0:
            logger.warning("a full garbage collection took %.1f s (%d objects tracked, %d freed); the "
                           "scheduler answered nothing meanwhile", took, len(gc.get_objects()), found)
        return True
