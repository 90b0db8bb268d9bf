"""The worker's results: in memory while they fit, the least recently used ones in files.

dask's SpillBuffer in spirit (distributed/spill.py), and its thresholds
(distributed/worker_memory.py), by the same names and defaults:

- target (0.6): when the results held in memory (their `sizeof`, "managed" memory) add up to
  more than target x memory limit, the least recently used go to a file each;
- spill (0.7): when the whole process (its RSS) is above spill x limit, results go to disk,
  least recently used first, until the process is back under target x limit (or
  spill x limit when target is off);
- pause (0.8): above it the worker starts no new task until its memory falls again;
- terminate (0.95): the nanny's kill (worker/nanny.py), the last resort.

Each can be False (off). A spilled result comes back into memory when a task reads it and
it fits under the target as it is; when memory is full it is read for the task and stays on
disk (bringing it back would only push another result out: a write per read, where a
reduction over persisted data that does not fit reads each chunk once). A peer or client that asks for it gets the file's bytes as they are (no unpickling, no
unspilling). Values are written as `serialize.dumps_value` makes them, the pickle stream
and each out-of-band buffer (numpy/pandas data) as they are, so an array goes from its own
memory to the file without an extra copy and is read back into a buffer of its own.

Thread-safe: task threads read their inputs through it while the event loop stores results.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import socket
import struct
import tempfile
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from ..protocol import serialize
from ..protocol.clusterfile import private_directory
from ..protocol.frames import Opaque
from .sizeof import sizeof

logger = logging.getLogger("hpc_cluster.worker.memory")

MONITOR_INTERVAL = 0.1          # seconds between the memory monitor's looks (dask's monitor-interval)
SPILL_DIRECTORY = "hpc-cluster-spill"


@dataclass(frozen=True)
class MemoryFractions:
    """dask's distributed.worker.memory.target/spill/pause/terminate; False: off."""

    target: float | bool = 0.6
    spill: float | bool = 0.7
    pause: float | bool = 0.8
    terminate: float | bool = 0.95

    @classmethod
    def read(cls, target=0.6, spill=0.7, pause=0.8, terminate=0.95) -> "MemoryFractions":
        """From the worker's flags, where 0 stands for false."""
        return cls(*(float(x) if x else False for x in (target, spill, pause, terminate)))

    def as_dict(self) -> dict:
        return {"target": self.target, "spill": self.spill, "pause": self.pause, "terminate": self.terminate}


def spill_directory(base: str | None, pid: int) -> str:
    """Where worker `pid` spills: under its local directory (its working directory with
    --local-directory) or the node's temp directory. Known from the host and pid alone, so
    the nanny can remove what a worker it saw die left behind; the host name keeps workers of
    two nodes apart in a local directory that is shared after all."""
    return os.path.join(base or tempfile.gettempdir(), f"{SPILL_DIRECTORY}-{socket.gethostname()}-{pid}")


def remove_spill_directory(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


# -- the files: u64 count | u64 length per part | the parts (pickle stream, buffers) -----------
_U64 = struct.Struct("<Q")


def write_parts(path: str, payload: Opaque) -> int:
    parts = (payload.data, *payload.buffers)
    head = _U64.pack(len(parts)) + b"".join(_U64.pack(memoryview(p).nbytes) for p in parts)
    with open(path, "wb") as f:
        f.write(head)
        for part in parts:              # large buffers go to the kernel from their own memory
            f.write(part)
    return len(head) + sum(memoryview(p).nbytes for p in parts)


def read_parts(path: str) -> Opaque:
    with open(path, "rb", buffering=0) as f:
        count = _U64.unpack(_read_exactly(f, 8))[0]
        lengths = [_U64.unpack(_read_exactly(f, 8))[0] for _ in range(count)]
        parts = [_read_exactly(f, n) for n in lengths]
    return Opaque(bytes(parts[0]), parts[1:])


def _read_exactly(f, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise OSError(f"spill file {f.name} is truncated")
        got += k
    return buf


_MISSING = object()


class SpillStore:
    """Results by key: `fast` in memory (least recently used first), `slow` in files.

    `target` is the managed memory (bytes) above which results are spilled on insert (None:
    only when asked, by `evict`); `directory` None turns spilling off (a plain dict)."""

    def __init__(self, directory: str | None = None, target: int | None = None):
        self.directory = directory
        self.target = target or None
        self.fast: OrderedDict[str, object] = OrderedDict()
        self.weight: dict[str, int] = {}              # sizeof of every result, in memory or not
        self.slow: dict[str, tuple[str, int]] = {}     # key -> (file, bytes on disk)
        self.memory_bytes = 0                          # managed memory: sizeof of `fast`
        self.spilled_bytes = 0                         # sizeof of `slow` (what it takes in memory)
        self.disk_bytes = 0                            # the files' sizes
        self.spills = 0                                # results written to disk, ever
        self.unspills = 0                              # results read back into memory, ever
        # A spilled value that something still holds (a running task's input) is that same
        # object when read again, not a second copy (dask's zict.Cache over a WeakValueMapping).
        self._alive: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._unpicklable: set[str] = set()
        self._writing: dict[str, int] = {}              # key -> weight: being written to a file now
        self._names = itertools.count()
        self._lock = threading.RLock()
        self._made_directory = False

    # -- the mapping ---------------------------------------------------------------------
    def __contains__(self, key) -> bool:
        return key in self.fast or key in self.slow

    def __len__(self) -> int:
        return len(self.fast) + len(self.slow)

    def __iter__(self):
        with self._lock:
            return iter([*self.fast, *self.slow])

    def keys(self):
        return list(self)

    def __setitem__(self, key: str, value) -> None:
        self.put(key, value)

    def __getitem__(self, key: str):
        return self.get(key)

    def __delitem__(self, key: str) -> None:
        if not self.discard(key):
            raise KeyError(key)

    def pop(self, key: str, default=None):
        """Forget `key`; returns `default` (not the value: reading it back from disk to
        return it would cost for nothing)."""
        self.discard(key)
        return default

    def put(self, key: str, value, nbytes: int | None = None, spill: bool = True) -> int:
        """Store a result; returns its size. May spill older ones (or this one, if it alone
        is larger than the target); with spill=False older ones stay in memory until
        `spill_to_target()`, so the caller can first report the result and start the next task."""
        weight = sizeof(value) if nbytes is None else int(nbytes)
        if self.directory is not None and self.target is not None and weight > self.target:
            entry = self._write_file(key, value)       # too large to keep: straight to disk, as dask
            if entry is not None:
                with self._lock:
                    self.discard(key)
                    self.weight[key] = weight
                    self._record_spilled(key, entry, value)
                return weight
        with self._lock:
            self.discard(key)
            self.weight[key] = weight
            self.fast[key] = value
            self.memory_bytes += weight
        if spill:
            self._evict_to(self.target)
        return weight

    def spill_to_target(self) -> None:
        """Spill least recently used results until those in memory are under the target."""
        self._evict_to(self.target)

    def get(self, key: str):
        """The value, read back into memory if it was spilled (for a task's input)."""
        with self._lock:
            if key in self.fast:
                self.fast.move_to_end(key)
                return self.fast[key]
            entry = self.slow.get(key)
            if entry is None:
                raise KeyError(key)
            value = self._alive.get(key)
        if value is None:
            # Read outside the lock: the event loop may store results meanwhile. A file
            # removed under us (released) was still open or is gone: KeyError either way.
            try:
                value = serialize.loads_value(read_parts(entry[0]))
            except FileNotFoundError:
                raise KeyError(key) from None
        with self._lock:
            if self.slow.get(key) is entry:
                self._unspill(key, value, entry)
        return value

    def payload(self, key: str, max_inband: int | None = None) -> Opaque:
        """The value as `dumps_value` makes it, for a peer or a client: a spilled one is sent
        from its file as it is (neither unpickled nor brought back into memory). `max_inband`:
        the memory its pickle (or file) may take here, else serialize.TooLargeToSend."""
        # A result may be None itself (a task that only writes a file): _MISSING marks "not in
        # memory" (taking None for it sent such results to the file branch, which failed).
        with self._lock:
            if key in self.fast:
                self.fast.move_to_end(key)
                value = self.fast[key]
            else:
                entry = self.slow.get(key)
                if entry is None:
                    raise KeyError(key)
                value = self._alive.get(key, _MISSING)
                if value is _MISSING:
                    path, size = entry
        if value is not _MISSING:
            return serialize.dumps_value(value, max_inband)
        if max_inband is not None and size > max_inband:
            raise serialize.TooLargeToSend(size, max_inband)
        try:
            return read_parts(path)
        except FileNotFoundError:
            raise KeyError(key) from None

    def is_spilled(self, key: str) -> bool:
        return key in self.slow

    def discard(self, key: str) -> bool:
        with self._lock:
            self._unpicklable.discard(key)
            if key in self.fast:
                del self.fast[key]
                self.memory_bytes -= self.weight.pop(key)
                return True
            entry = self.slow.pop(key, None)
            if entry is None:
                return False
            self._forget_file(key, entry)
            del self.weight[key]
            return True

    # -- spilling ------------------------------------------------------------------------
    def evict(self) -> int:
        """Spill the least recently used result that can be spilled; its size, or -1 when
        nothing could be (spilling off, nothing in memory, disk full, unpicklable).

        The file is written outside the lock: task threads read their inputs and the event
        loop stores results meanwhile (a 32 MiB write takes tens of milliseconds). A result
        read, replaced or dropped while it was being written stays as it is now, and the
        file goes."""
        if self.directory is None:
            return -1
        while True:
            with self._lock:
                key = next((k for k in self.fast if k not in self._unpicklable and k not in self._writing), None)
                if key is None:
                    return -1
                value, weight = self.fast[key], self.weight[key]
                self._writing[key] = weight
            try:
                entry = self._write_file(key, value)
            finally:
                with self._lock:
                    del self._writing[key]
            if entry is None:
                if key in self._unpicklable:
                    continue                   # keep it in memory; try the next one
                return -1                      # the disk refused: the next one would fare no better
            with self._lock:
                if self.fast.get(key) is value:
                    del self.fast[key]
                    self.memory_bytes -= weight
                    self._record_spilled(key, entry, value)
                    return weight
            with contextlib.suppress(OSError):
                os.remove(entry[0])            # gone or replaced meanwhile: nothing was spilled

    def close(self) -> None:
        """Remove every file (the worker is ending)."""
        with self._lock:
            for key, entry in list(self.slow.items()):
                self._forget_file(key, entry)
            self.slow.clear()
            if self.directory is not None and self._made_directory:
                remove_spill_directory(self.directory)

    def metrics(self) -> dict:
        return {"managed": self.memory_bytes, "spilled": self.spilled_bytes, "spilled_disk": self.disk_bytes,
                "spilled_count": len(self.slow)}

    # -- internals ---------------------------------------------------------------------------
    def over_target(self) -> bool:
        """Are the results in memory, less those being written now, over the target?"""
        return self.target is not None and self.memory_bytes - sum(self._writing.values()) > self.target

    def _evict_to(self, limit: int | None) -> None:
        """Spill until the results in memory, less those being written now, are under `limit`."""
        if limit is None or self.directory is None:
            return
        while self.memory_bytes - sum(self._writing.values()) > limit and self.fast:
            if self.evict() < 0:
                return

    def _write_file(self, key: str, value) -> tuple[str, int] | None:
        """Write `value` to a new file, without the lock; (path, bytes) or None if it cannot
        be written (an unpicklable one is remembered, and stays in memory)."""
        try:
            payload = serialize.dumps_value(value)
        except Exception as exc:
            with self._lock:
                self._unpicklable.add(key)
            logger.error("cannot spill %r to disk (keeping it in memory): it does not pickle: %s: %s",
                         key, type(exc).__name__, exc)
            return None
        with self._lock:
            if not self._made_directory:
                # The owner's alone: a node's /tmp is shared by every user whose jobs run there,
                # and these files are the user's results (one left by a worker on a node that
                # died stays there until something cleans /tmp).
                private_directory(self.directory, fix=True)
                self._made_directory = True
            path = os.path.join(self.directory, str(next(self._names)))
        try:
            return path, write_parts(path, payload)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(path)
            logger.error("spilling to %s failed (keeping results in memory): %s", self.directory, exc)
            return None

    def _record_spilled(self, key: str, entry: tuple[str, int], value) -> None:
        """Under the lock: `key` (its weight recorded, not in `fast`) now lives in file `entry`."""
        self.slow[key] = entry
        self.spilled_bytes += self.weight[key]
        self.disk_bytes += entry[1]
        self.spills += 1
        try:
            self._alive[key] = value
        except TypeError:            # ints, tuples, dicts... cannot be weakly referenced
            pass

    def _unspill(self, key: str, value, entry) -> bool:
        """A task read a spilled value: keep it in memory again, dropping its file, when it
        fits under the target with what is there; otherwise it stays on disk (alive while the
        task holds it). True when it came back."""
        weight = self.weight.get(key, 0)
        if self.target is not None and self.memory_bytes + weight > self.target:
            try:
                self._alive[key] = value
            except TypeError:
                pass
            return False
        del self.slow[key]
        self._forget_file(key, entry)
        self.fast[key] = value
        self.memory_bytes += weight
        self.unspills += 1
        return True

    def _forget_file(self, key: str, entry) -> None:
        """The file of a result no longer in `slow` (its weight still recorded)."""
        path, size = entry
        self.spilled_bytes -= self.weight[key]
        self.disk_bytes -= size
        self._alive.pop(key, None)
        with contextlib.suppress(OSError):
            os.remove(path)
