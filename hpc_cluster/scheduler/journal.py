"""The scheduler's journal: what a restarted scheduler needs to resume (issue 16, point 1).

An append-only file next to the cluster file (0600, in its private directory) of the state
changes that matter for recovery: task specs as submitted (the opaque payloads as stored),
which results exist and on which workers (by worker *name*: a worker that comes back has a
new address), erred tasks with their errors, deaths with their verdicts, what each client
wants, forgotten tasks, and an opaque "jobs" record the deploy half writes.

Format. `MAGIC`, then frames: u32 length | u32 crc32 | msgpack list of records. One frame
is one flush (every `interval`, 0.2 s), so a frame is a consistent point of the state; a
frame cut short by a crash (or with a wrong checksum) ends the journal there and is
ignored. Records, each a list whose first item says what it is:

    ["H", {"version", "cluster", "created"}]            first of every file
    ["B", id, data]                                      a function's payload many tasks share
    ["S", key, func, args, deps, priority, duration, resources, extra]
                                                         a task as (re)defined (its pool and
                                                         memory, which a move changes, are in "T");
                                                         func is [data, [buffers]], or a "B" id;
                                                         extra: None, or its workers= and
                                                         allow_other_workers
    ["T", key, code, holders|error, wanted, nbytes, retries, attempts, pool, memory,
     escalated, escalation, replicas]                    where the task stands
    ["F", key]                                           forgotten
    ["D", death record]                                  a death (later ones replace it, by id)
    ["J", anything]                                      the deploy half's jobs (latest wins)
    ["C", kind, name, payload]                           a coordination object (variable, dataset,
                                                         queue, event, semaphore: coordination.py),
                                                         its payload None once it is gone

code is "p" (to compute, if anyone needs it), "m" (in memory on the named workers) or "e"
(erred, with the error record).

The pure state machine does no I/O: it only notes which keys and deaths changed
(`state.touched`, `state.touched_deaths`, see state.py's `_touch`). At each flush the
server's loop turns those into records (`Journal.collect`), and a writer thread appends and
fsyncs them, so a slow shared filesystem never stalls the scheduler. When the file grows
past `COMPACT_RATIO` x the live state, the writer thread rewrites it as a snapshot (the
live records only) and renames it into place atomically.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from ..protocol.frames import Opaque
from .state.records import priority_pair
from .state.recovery import opaque_in
from .state.timeline import journal_death

logger = logging.getLogger("hpc_cluster.journal")

MAGIC = b"HPCJOURNAL1\n"
VERSION = 1
_FRAME = struct.Struct("<II")          # length, crc32 of the payload
COMPACT_RATIO = 2.0                    # rewrite once the file is this many times the live state
COMPACT_MIN_BYTES = 1 << 20            # ... and at least this big (a small file costs nothing)
MAX_FRAME = 1 << 31                    # a length above this is garbage, not a frame


# -- the format: pure ----------------------------------------------------------------------
_EXT_OPAQUE = 1        # an Opaque inside a record (an error's pickled exception): [data, [buffers]]


def _default(obj):
    if isinstance(obj, Opaque):
        return msgpack.ExtType(_EXT_OPAQUE, msgpack.packb(opaque_out(obj), use_bin_type=True))
    raise TypeError(f"cannot journal a {type(obj).__name__}")


def _ext_hook(code: int, data: bytes):
    if code == _EXT_OPAQUE:
        return opaque_in(msgpack.unpackb(data, raw=False))
    return msgpack.ExtType(code, data)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, default=_default)


def unpack(data):
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def encode_frame(records: list) -> bytes:
    payload = pack(records)
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def read_frames(data: bytes) -> tuple[list[list], int, bool]:
    """The records of the whole frames in `data` (after MAGIC), the bytes they span, and
    whether a torn or corrupt tail was found (and ignored) after them."""
    if not data.startswith(MAGIC):
        raise ValueError("not a journal (bad magic)")
    pos, out, view = len(MAGIC), [], memoryview(data)
    while pos < len(data):
        if pos + _FRAME.size > len(data):
            return out, pos, True
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if length > MAX_FRAME or end > len(data) or zlib.crc32(view[pos + _FRAME.size:end]) != crc:
            return out, pos, True
        try:
            out.extend(unpack(view[pos + _FRAME.size:end]))
        except Exception:                                  # a checksum collision on garbage
            return out, pos, True
        pos = end
    return out, pos, False


def opaque_out(value) -> list | None:
    """An Opaque as plain msgpack: [data, [buffers]] (the bytes as stored, never unpickled)."""
    if value is None:
        return None
    # msgpack packs any buffer (bytes, a memoryview of a received frame) as bin: no copy here.
    return [value.data, list(value.buffers)]


@dataclass
class Recovered:
    """What a journal says: the latest spec and status of each live task, the deaths by id,
    the jobs record. `torn`: a cut or corrupt tail was ignored."""

    cluster: str | None = None
    created: float | None = None
    specs: dict = field(default_factory=dict)       # key -> "S" record, its func resolved
    blobs: dict = field(default_factory=dict)       # "B" id -> payload
    spec_blob: dict = field(default_factory=dict)   # key -> the "B" id its func came from
    status: dict = field(default_factory=dict)      # key -> "T" record
    deaths: dict = field(default_factory=dict)      # id -> death record
    jobs: object = None
    coordination: dict = field(default_factory=dict)   # packed [kind, name] -> its latest "C" record
    torn: bool = False
    valid_bytes: int = 0

    def apply(self, rec: list) -> None:
        kind = rec[0]
        if kind == "S":
            if isinstance(rec[2], int):
                self.spec_blob[rec[1]] = rec[2]
                rec = [*rec[:2], [self.blobs[rec[2]], []], *rec[3:]]
            else:
                self.spec_blob.pop(rec[1], None)
            self.specs[rec[1]] = rec
        elif kind == "B":
            self.blobs[rec[1]] = rec[2]
        elif kind == "T":
            self.status[rec[1]] = rec
        elif kind == "F":
            self.specs.pop(rec[1], None)
            self.status.pop(rec[1], None)
            self.spec_blob.pop(rec[1], None)
        elif kind == "D":
            self.deaths[rec[1]["id"]] = rec[1]
        elif kind == "J":
            self.jobs = rec[1]
        elif kind == "C":
            if rec[3] is None:
                self.coordination.pop(pack(rec[1:3]), None)
            else:
                self.coordination[pack(rec[1:3])] = rec
        elif kind == "H":
            self.cluster, self.created = rec[1].get("cluster"), rec[1].get("created")

    def records(self) -> list[list]:
        """The live records, as a snapshot (compaction) writes them."""
        out = [["H", {"version": VERSION, "cluster": self.cluster, "created": self.created}]]
        written = set()
        for key, spec in self.specs.items():
            blob = self.spec_blob.get(key)
            if blob is not None:                  # shared payloads stay shared
                if blob not in written:
                    written.add(blob)
                    out.append(["B", blob, self.blobs[blob]])
                spec = [*spec[:2], blob, *spec[3:]]
            out.append(spec)
            if key in self.status:
                out.append(self.status[key])
        out.extend(["D", d] for _, d in sorted(self.deaths.items()))
        if self.jobs is not None:
            out.append(["J", self.jobs])
        out.extend(self.coordination.values())
        return out

    def tasks(self) -> dict[str, dict]:
        """key -> the task as it stands, in readable form (tests, rebuild)."""
        out = {}
        for key, s in self.specs.items():
            t = self.status.get(key) or ["T", key, "p", None, [], 0, 0, [], None, 0, False, None, 1]
            out[key] = {"func": opaque_in(s[2]), "args": opaque_in(s[3]), "deps": list(s[4]),
                        "priority": tuple(s[5]), "duration": s[6], "resources": s[7], "extra": s[8],
                        "state": t[2], "holders": t[3] if t[2] == "m" else [], "error": t[3] if t[2] == "e" else None,
                        "wanted": list(t[4]), "nbytes": t[5], "retries": t[6], "attempts": [list(a) for a in t[7]],
                        "pool": t[8], "memory": t[9], "escalated": t[10], "escalation": t[11], "replicas": t[12]}
        return out


def load(path) -> Recovered:
    """Read a journal; a torn or corrupt tail is ignored (`torn` says so)."""
    data = Path(path).read_bytes()
    records, valid, torn = read_frames(data)
    rec = Recovered(torn=torn, valid_bytes=valid)
    for r in records:
        rec.apply(r)
    return rec


def resume_from(path, cluster: str | None = None) -> Recovered | None:
    """What a journal left by a scheduler that died holds, or None: no journal, not a journal
    (logged), or another cluster's."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        rec = load(path)
    except (OSError, ValueError) as exc:
        logger.warning("cannot resume from %s (%s); starting empty", path, exc)
        return None
    if cluster is not None and rec.cluster != cluster:
        logger.warning("the journal %s is cluster %r's, not %r's; starting empty", path, rec.cluster, cluster)
        return None
    logger.info("resuming from the journal %s: %d tasks, %d results held by workers, %d deaths%s", path,
                len(rec.specs), sum(1 for t in rec.status.values() if t[2] == "m"), len(rec.deaths),
                " (a torn last write was ignored)" if rec.torn else "")
    return rec


# -- what the state says, as records ---------------------------------------------------------
def spec_record(ts, func=None) -> list:
    """`func`: the "B" id its function was written under, if it was (else the payload)."""
    return ["S", ts.key, opaque_out(ts.func) if func is None else func, opaque_out(ts.args), sorted(d.key for d in ts.dependencies),
            priority_pair(ts.priority), ts.duration, ts.resources,
            None if ts.where is None else {"workers": sorted(ts.where.names), "allow_other_workers": ts.where.loose}]


def _sorted(items) -> list:
    return sorted(items) if len(items) > 1 else list(items)      # (the common case, cheaply)


def status_record(ts) -> list:
    """Called for every touched task at every flush: kept cheap (the throughput benchmark)."""
    state = ts.state
    if state == "memory":
        code, detail = "m", _sorted({ws.name for ws in ts.who_has})
    elif state == "held":                      # still unconfirmed: it stays memory in the journal
        code, detail = "m", _sorted(ts.held_by)
    elif state == "erred":
        code, detail = "e", ts.error
    else:
        code, detail = "p", None
    attempts = [[a["death"]["id"], a.get("ran_for"), a.get("pool"), bool(a.get("moved")), bool(a.get("considered")),
                 a.get("escalation"), a.get("needed")] for a in ts.attempts] if ts.attempts else []
    return ["T", ts.key, code, detail, _sorted(ts.who_wants), ts.nbytes, ts.retries, attempts, ts.pool, ts.memory,
            ts.escalated, ts.escalation, ts.replicas]


def snapshot(state, cluster: str | None = None, created: float | None = None, jobs=None) -> Recovered:
    """The whole recoverable state as a journal would hold it (compaction's equal, and the
    check that the journal missed nothing: tests compare the two)."""
    rec = Recovered(cluster=cluster, created=created, jobs=jobs)
    for ts in state.tasks.values():
        rec.specs[ts.key] = spec_record(ts)
        rec.status[ts.key] = status_record(ts)
    for d in state.deaths:
        rec.deaths[d["id"]] = journal_death(d)
    return rec


class Recorder:
    """Turns what the state noted as changed into records: a spec when a task is (re)defined,
    its status whenever it was touched, "F" when it is gone (pure: no I/O; `Journal` owns the
    file)."""

    def __init__(self, state):
        self.state = state
        state.touched, state.touched_deaths = set(), set()
        self._spec_of: dict[str, tuple] = {}          # key -> the priority its spec was written with
        # Functions shared by many tasks (a map's) are written once, as "B" records: payload ->
        # [id, live specs using it]; key -> the payload its spec uses. Ids are never reused.
        self._blobs: dict[bytes, list] = {}
        self._blob_of: dict[str, bytes] = {}
        self._next_blob = 0
        self.sizes: dict[str, int] = {}               # key -> bytes of its live records
        self.death_sizes: dict[int, int] = {}
        self._deaths_seen = 0
        self._jobs = None

    def _unref(self, key: str) -> None:
        data = self._blob_of.pop(key, None)
        if data is not None:
            entry = self._blobs[data]
            entry[1] -= 1
            if not entry[1]:
                del self._blobs[data]            # a later use writes it again, under a new id

    def live_bytes(self) -> int:
        return sum(self.sizes.values()) + sum(self.death_sizes.values())

    def collect(self, jobs=None) -> list[list]:
        st = self.state
        touched, st.touched = st.touched, set()
        out = []
        for key in touched:
            ts = st.tasks.get(key)
            if ts is None:
                if self._spec_of.pop(key, None) is not None:
                    self.sizes.pop(key, None)
                    self._unref(key)
                    out.append(["F", key])
                continue
            if self._spec_of.get(key) != ts.priority:
                # The priority carries a sequence number unique to each definition: a new one
                # means the task was (re)defined, payloads and all.
                self._spec_of[key] = ts.priority
                self._unref(key)
                blob = None
                size = (ts.args.nbytes if ts.args is not None else 0) + 40 + 8 * len(ts.dependencies)
                func = ts.func
                if func is not None and not func.buffers and len(func.data) >= 64:
                    data = bytes(func.data)
                    entry = self._blobs.get(data)
                    if entry is None:
                        entry = self._blobs[data] = [self._next_blob, 0]
                        self._next_blob += 1
                        out.append(["B", entry[0], data])
                        size += len(data)        # (counted with the first spec using it)
                    entry[1] += 1
                    self._blob_of[key] = data
                    blob = entry[0]
                elif func is not None:
                    size += func.nbytes
                out.append(spec_record(ts, blob))
                self.sizes[key] = size + 64
            # A touched key's status is written as it is: keys are touched where what the journal
            # holds of them changes, and keeping each key's last record to compare with cost
            # memory (and the garbage collector's time) for every live task.
            out.append(status_record(ts))
        touched_deaths, st.touched_deaths = st.touched_deaths, set()
        touched_deaths.update(range(self._deaths_seen, len(st.deaths)))
        self._deaths_seen = len(st.deaths)
        for i in sorted(touched_deaths):
            if 0 <= i < len(st.deaths):
                d = journal_death(st.deaths[i])          # its memory as a summary: bounded
                out.append(["D", d])
                memory = d.get("memory") or {}
                self.death_sizes[i] = (256 + 64 * len(d.get("evidence") or ()) + 20 * len(memory.get("samples") or ())
                                       + 40 * len(memory.get("task_starts") or ()))
        if jobs is not None and jobs != self._jobs:
            self._jobs = jobs
            out.append(["J", jobs])
        return out


# -- the file ----------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_snapshot(path, records: list[list], chunk: int = 2000) -> None:
    """Write `records` as a new journal at `path`, atomically (temp file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.compact")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, MAGIC)
        for i in range(0, len(records), chunk):
            _write_all(fd, encode_frame(records[i:i + chunk]))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Journal:
    """The journal file of one scheduler. Start it with the state to follow (`start`: a new
    file holding a snapshot of that state), then `flush()` every `interval` from the event
    loop (Scheduler does), `close()` at the end; `remove()` after a clean shutdown."""

    def __init__(self, path, cluster: str | None = None, interval: float = 0.2,
                 compact_ratio: float = COMPACT_RATIO, compact_min_bytes: int = COMPACT_MIN_BYTES):
        self.path = Path(path)
        self.cluster, self.interval = cluster, interval
        self.compact_ratio, self.compact_min_bytes = compact_ratio, compact_min_bytes
        self.recorder: Recorder | None = None
        self.jobs = None                          # set by the deploy half (or a function): written at the next flush
        # Records kept beside the state's, from the scheduler's coordination (coordination.py):
        # extra(everything) -> what changed since the last call, or all of it for a new file.
        self.extra = None
        self.file_bytes = 0
        self.compactions = 0
        self.error: str | None = None             # the writer's last failure (logged once)
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._idle = threading.Event()
        self._idle.set()

    def start(self, state) -> None:
        """Follow `state` from now on: the file starts as a snapshot of it (a resumed state
        included), so what an earlier journal held and a torn tail are not appended to."""
        self.recorder = Recorder(state)
        self.created = time.time()
        records = [["H", {"version": VERSION, "cluster": self.cluster, "created": self.created}]]
        state.touched.update(state.tasks)                # everything, through the recorder's bookkeeping
        records += self.recorder.collect(self.current_jobs())
        if self.extra is not None:
            records += self.extra(True)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_snapshot(self.path, records)
        self.file_bytes = self.path.stat().st_size
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._thread = threading.Thread(target=self._write_forever, name="journal-writer", daemon=True)
        self._thread.start()

    def flush(self) -> int:
        """Turn what changed since the last flush into one frame for the writer thread.
        Returns the records queued (0: nothing changed)."""
        if self.recorder is None:
            return 0
        records = self.recorder.collect(self.current_jobs())
        if self.extra is not None:
            records += self.extra(False)
        if not records:
            return 0
        try:
            frame = encode_frame(records)
        except (TypeError, ValueError, OverflowError):
            # One record msgpack cannot hold (a value of a type it does not know) must not
            # cost the others: they go, it is logged.
            good = []
            for rec in records:
                try:
                    pack(rec)
                    good.append(rec)
                except (TypeError, ValueError, OverflowError) as exc:
                    logger.error("cannot journal %s record for %r: %s", rec[0], rec[1] if len(rec) > 1 else None, exc)
            frame = encode_frame(good)
        self.file_bytes += len(frame)
        self._idle.clear()
        self._queue.put(("write", frame))
        live = self.recorder.live_bytes()
        if self.file_bytes > self.compact_min_bytes and self.file_bytes > self.compact_ratio * live:
            self._queue.put(("compact", None))
            self.file_bytes = live             # about what the snapshot will be
        return len(records)

    def current_jobs(self):
        """`jobs` as the deploy half set it: a value, or a function giving it (read at every
        flush, so a job is in the journal within one interval of its submission)."""
        if callable(self.jobs):
            try:
                return self.jobs()
            except Exception:
                logger.exception("reading the jobs for the journal failed")
                return None
        return self.jobs

    async def keep(self) -> None:
        """Every `interval`, on the scheduler's loop: what changed goes to the writer thread,
        batched, never a write per event, never a wait for the disk on the loop."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.flush()
            except Exception:
                logger.exception("journal flush failed")

    def wait_written(self, timeout: float = 10.0) -> bool:
        """Block until every queued frame is on disk (tests; close)."""
        self._queue.put(("mark", None))
        return self._idle.wait(timeout)

    def close(self) -> None:
        if self._thread is None:
            return
        self.flush()
        self._queue.put(("stop", None))
        self._thread.join(30)
        self._thread = None

    def remove(self) -> None:
        """A clean shutdown: nothing to resume, so the journal goes."""
        self.close()
        self.path.unlink(missing_ok=True)

    # -- the writer thread ---------------------------------------------------------------
    def _write_forever(self) -> None:
        while True:
            items = [self._queue.get()]
            while True:                        # everything queued meanwhile: one write, one fsync
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            frames = [data for op, data in items if op == "write"]
            try:
                if frames:
                    _write_all(self._fd, b"".join(frames))
                    os.fsync(self._fd)
                if any(op == "compact" for op, _ in items):
                    self._compact()
            except OSError as exc:
                if self.error is None:
                    logger.error("writing the journal %s failed: %s; the scheduler carries on without "
                                 "a complete journal", self.path, exc)
                self.error = str(exc)
            if any(op == "stop" for op, _ in items):
                os.close(self._fd)
                self._fd = None
                self._idle.set()
                return
            if self._queue.empty():
                self._idle.set()

    def _compact(self) -> None:
        """Rewrite the file as its live records. Runs in the writer thread, so no frame is
        appended meanwhile; the loop goes on queueing."""
        t0 = time.monotonic()
        before = os.fstat(self._fd).st_size
        rec = load(self.path)
        write_snapshot(self.path, rec.records())
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.compactions += 1
        logger.info("journal compacted: %d -> %d bytes in %.3f s", before, os.fstat(self._fd).st_size,
                    time.monotonic() - t0)
