"""The task a worker runs on its event loop, in memory its nanny can read after a death.

A task run on the loop (inline.py) used to put its `task-started` on the wire before it ran,
so that a crash would be charged to it: one write per task, and over TLS one record per task
each way (~2.5 per task in a map), most of what TLS cost (BENCHMARKS.md, "The cost of TLS").
Instead, the worker writes the task's key here before running it and clears it after, and
its start goes to the scheduler with its end, one write for a whole turn of the loop. Should
the worker die in the run (a SIGSEGV, an OOM kill), its nanny reads the key here and its
exit report names it (`running`); the scheduler charges the death to that task as if its
start had arrived (scheduler/evidence.py). No system call: a shared mapping of a memfd the
nanny made and handed to the worker (--running-fd).

What a death takes with it: a nanny that dies with its worker (a job's walltime, a cancel, a
node lost) reports nothing, so a task started on the loop less than a turn (at most ~2 ms of
runs, INLINE_TURN) before such a death is not charged with it: those causes blame no task.
Without a slot (no nanny, a system without memfd) the worker writes each start first, as before.

Layout: a header (key length, start time, the process's RSS and the results' bytes as the
task started) then the key. The length is written last and cleared first, so a worker killed
halfway through writing leaves either the previous state or nothing: the nanny reads only
after the worker is gone.
"""

from __future__ import annotations

import mmap
import os
import struct

_HEADER = struct.Struct("<IdQQ")     # key length (0: none running), started (epoch s), rss, managed
_LENGTH = struct.Struct("<I")
_KEY_AT = 32
SIZE = 65536                         # longest key kept: SIZE - _KEY_AT bytes (longer: written first)


class RunningSlot:
    def __init__(self, fd: int, owner: bool):
        self.fd = fd
        self._map = mmap.mmap(fd, SIZE)
        self._owner = owner
        if not owner:                    # the worker: the mapping stays, the descriptor goes
            os.close(fd)                 # (so the worker's own subprocesses never inherit it)
            self.fd = -1

    @classmethod
    def create(cls) -> "RunningSlot | None":
        """The nanny's: None where memfd is missing (its worker then reports each start first)."""
        try:
            fd = os.memfd_create("hpc-cluster-running", os.MFD_CLOEXEC)
            os.ftruncate(fd, SIZE)
        except (AttributeError, OSError):
            return None
        return cls(fd, owner=True)

    @classmethod
    def attach(cls, fd: int | None) -> "RunningSlot | None":
        """The worker's, from --running-fd; None if there is none or it cannot be mapped."""
        if fd is None:
            return None
        try:
            return cls(fd, owner=False)
        except (OSError, ValueError):
            return None

    def set(self, key: str, started: float, memory: dict | None) -> bool:
        """Name the task about to run; False if its key cannot be kept (too long, or not a
        string): the caller then reports its start first."""
        if not isinstance(key, str):
            return False
        data = key.encode("utf-8", "surrogatepass")
        if len(data) > SIZE - _KEY_AT:
            return False
        m = memory or {}
        self._map[_KEY_AT:_KEY_AT + len(data)] = data
        _HEADER.pack_into(self._map, 0, 0, started, int(m.get("rss") or 0), int(m.get("managed") or 0))
        _LENGTH.pack_into(self._map, 0, len(data))
        return True

    def clear(self) -> None:
        _LENGTH.pack_into(self._map, 0, 0)

    def read(self) -> dict | None:
        """What the worker was running on its loop as it ended, or None."""
        length, started, rss, managed = _HEADER.unpack_from(self._map, 0)
        if not 0 < length <= SIZE - _KEY_AT:
            return None
        key = bytes(self._map[_KEY_AT:_KEY_AT + length]).decode("utf-8", "surrogatepass")
        return {"key": key, "started": started, "memory": {"rss": rss or None, "managed": managed}}

    def close(self) -> None:
        self._map.close()
        if self._owner and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
