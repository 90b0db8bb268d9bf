"""Submissions split into bounded messages (client.map, submit, dask graphs).

A receiver drops a connection whose message has more frames than `Limits.max_frames` (each
task's arguments travel as a frame of their own) or a larger header than `max_header_bytes`:
one message for a map over 100,000 items ended the session, and the user saw only "the
connection to the scheduler was lost". Here a submission becomes several `update-graph`
messages of at most CHUNK_TASKS tasks (and CHUNK_BYTES of payload), which the client writes
as wire messages of their own; a single task that no message could carry is refused at
submission, with the limit named.

The scheduler applies each part as it arrives, and starts the first while the client still
sends the rest. So a part never depends on a later one (tasks go in topological order), and
a task that only a later part needs must not be forgotten in between (a task nobody wants
and nothing depends on is dropped at once): the client wants such a task until the last part
is sent, then releases it (`carried`).

Pure (specs in, messages out), but for `gc_paused`, which the client holds while it builds a
large submission.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import heapq
import threading

from ..protocol.frames import Limits, MessageTooLargeError, nbytes
from ..protocol.messages import Op
from ..units import format_memory

# Tasks per message. The frame limit alone would allow ~50,000 (2 frames a task, 100,000 a
# receiver takes), but the scheduler applies a message in one go: 10,000 tasks held its loop
# for 150-400 ms with 500 workers, and no client got an answer meanwhile (issue 19, point 3).
# A part of 1,000 tasks still took 10 ms of a turn (read, decoded, applied); the scheduler now
# takes parts until 5 ms are spent (Comm.batches), which 250 lets it stop near.
CHUNK_TASKS = 250
CHUNK_BYTES = 256 * 2**20       # payload per message: bounds what one write holds, not a task's size
CHUNK_HEADER = 32 * 2**20       # msgpack header per message (the receiver takes 256 MiB)
_SPEC_OVERHEAD = 160            # header bytes of a task beside its key and deps (msgpack, generous)


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection while a submission's specs and futures are built.

    Each spec and future is a new container object: CPython's collector ran ~9,000 times and
    cost 3.1 of a 1,000,000-task map's 12.4 us per task in the client (collecting nothing:
    all of it is live). Paused from the first of concurrent builders (threads) to the last,
    then enabled again as it was; reference counting frees memory meanwhile as always."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def header_bytes(spec: dict) -> int:
    """An upper estimate of what a task spec takes in a message's msgpack header."""
    # Twice per task of a submission: no generator for the (usually empty) deps and resources.
    size = _SPEC_OVERHEAD + len(spec["key"])
    deps, resources = spec.get("deps"), spec.get("resources")
    if deps:
        size += sum(map(len, deps)) + 8 * len(deps)
    if resources:
        size += sum(map(len, resources)) + 16 * len(resources)
    return size


def _opaque_bytes(payload) -> int:
    return nbytes(payload.data) + (sum(map(nbytes, payload.buffers)) if payload.buffers else 0)


def payload_bytes(spec: dict) -> int:
    return _opaque_bytes(spec["func"]) + _opaque_bytes(spec["args"])


def check_fits(spec: dict, limits: Limits) -> None:
    """Refuse, before anything is sent, a task no message to the scheduler could carry."""
    size, head = payload_bytes(spec), header_bytes(spec)
    if size + head > limits.max_message_bytes:
        raise MessageTooLargeError(
            f"task {spec['key']!r} carries {format_memory(size)} of function and arguments, more than a "
            f"message to the scheduler may hold (max_message_bytes = {format_memory(limits.max_message_bytes)}). "
            "Do not pass large data as an argument: scatter it first (client.scatter(data)) and pass the "
            "future, or load it inside the task; or raise max_message_bytes (docs/configuration.md)")
    if head > limits.max_header_bytes // 2:
        raise MessageTooLargeError(
            f"task {spec['key']!r} has a key and {len(spec.get('deps') or ())} dependencies taking about "
            f"{format_memory(head)} of a message header, more than half of what the scheduler reads "
            f"(max_header_bytes = {format_memory(limits.max_header_bytes)}); give it fewer inputs "
            "(combine them in a tree of smaller tasks)")


def release_messages(keys: list[str]) -> list[dict]:
    """release-keys messages of at most CHUNK_TASKS keys, each sent as a wire message of its
    own: the scheduler takes a large release a part per turn of its loop (Comm.batches), where
    20,000 keys in one message held every other client's answer for 15 ms at a time."""
    return [{"op": Op.RELEASE_KEYS, "keys": keys[i:i + CHUNK_TASKS]} for i in range(0, len(keys), CHUNK_TASKS)]


def split_submission(specs: list[dict], wanted: list[str], limits: Limits | None = None,
                     chunk_tasks: int | None = None) -> tuple[list[dict], list[str]]:
    """The `update-graph` messages for one submission, and the keys to release after them.

    One message when it fits (what the scheduler saw before); else parts in topological order,
    each wanting its own `wanted` keys plus the `carried` ones later parts depend on."""
    limits = limits or Limits()
    max_tasks = max(1, min(chunk_tasks or CHUNK_TASKS, (limits.max_frames - 1) // 2))
    max_header = min(CHUNK_HEADER, limits.max_header_bytes // 2)
    max_bytes = min(CHUNK_BYTES, limits.max_message_bytes // 2)
    # More tasks than a part holds need parts whatever their sizes: no trial cut (a 1,000,000
    # task map measured every task twice).
    if len(specs) <= max_tasks and len(_chunks(specs, max_tasks, max_header, max_bytes)) <= 1:
        return [{"op": Op.UPDATE_GRAPH, "tasks": specs, "keys": list(wanted)}], []
    specs = _topological(specs)
    chunks = _chunks(specs, max_tasks, max_header, max_bytes)
    part_of: dict[str, int] = {}
    for i, chunk in enumerate(chunks):
        for spec in chunk:
            part_of.setdefault(spec["key"], i)
    wanted_set = set(wanted)
    carried: dict[str, None] = {}
    for i, chunk in enumerate(chunks):
        for spec in chunk:
            for d in spec.get("deps") or ():
                if part_of.get(d, i) < i and d not in wanted_set:
                    carried[d] = None
    keys_of: list[list[str]] = [[] for _ in chunks]
    for key in wanted:              # with the part that holds the task (the last if none does)
        keys_of[part_of.get(key, len(chunks) - 1)].append(key)
    for key in carried:
        keys_of[part_of[key]].append(key)
    msgs = [{"op": Op.UPDATE_GRAPH, "tasks": chunk, "keys": keys} for chunk, keys in zip(chunks, keys_of)]
    return msgs, list(carried)


def _chunks(specs: list[dict], max_tasks: int, max_header: int, max_bytes: int) -> list[list[dict]]:
    chunks: list[list[dict]] = []
    current: list[dict] = []
    head = size = 0
    seen_funcs: set[int] = set()        # a function shared by a part's tasks travels once
    for spec in specs:
        h = header_bytes(spec)
        fid = id(spec["func"].data)
        s = _opaque_bytes(spec["args"]) + (0 if fid in seen_funcs else nbytes(spec["func"].data))
        if current and (len(current) >= max_tasks or head + h > max_header or size + s > max_bytes):
            chunks.append(current)
            current, head, size, seen_funcs = [], 0, 0, set()
            s = payload_bytes(spec)
        current.append(spec)
        seen_funcs.add(fid)
        head += h
        size += s
    if current:
        chunks.append(current)
    return chunks


def _topological(specs: list[dict]) -> list[dict]:
    """`specs` with every task after its inputs in the submission, else in their order
    (dask.order's already is; a hand-made graph may not be). Iterative: graphs are deep."""
    pos = {}
    for i, spec in enumerate(specs):
        pos.setdefault(spec["key"], i)
    if all(pos.get(d, -1) < i for i, spec in enumerate(specs) for d in spec.get("deps") or ()):
        return specs
    waiting = [0] * len(specs)
    dependents: dict[int, list[int]] = collections.defaultdict(list)
    for i, spec in enumerate(specs):
        for d in set(spec.get("deps") or ()):
            j = pos.get(d)
            if j is not None and j != i:
                waiting[i] += 1
                dependents[j].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(specs[i])
        for j in dependents.pop(i, ()):
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(out) < len(specs):       # a cycle: leave the rest in order; the scheduler refuses it
        done = {id(s) for s in out}
        out.extend(s for s in specs if id(s) not in done)
    return out
