"""Checks of what peers send the scheduler (server.py): each turns a wire value into what the
state machine takes, or raises ProtocolError (the connection is dropped, logged) or Refused
(the sender is told why; nothing changes). Kept apart so the server reads as the flow of
messages, and so that what is accepted is in one place.
"""

from __future__ import annotations

from ..protocol.frames import Opaque, ProtocolError, nbytes

# Payloads up to this size are copied out of the message they came in (compact_payloads).
COPY_BELOW = 4096

# msgpack packs integers in [-2**63, 2**64); a priority is sent to workers negated, so a
# larger one made the whole outgoing batch to a worker unpackable (issue 14, point 7).
INT64 = 2**63 - 1


class Refused(ValueError):
    """A well-formed request we will not carry out; the sender is told why, nothing else changes."""


def check_keys(value, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise ProtocolError(f"{what} must be a list of strings")
    return value


def check_task(spec) -> dict:
    if not isinstance(spec, dict) or not isinstance(spec.get("key"), str):
        raise ProtocolError("each task needs a string 'key'")
    if not isinstance(spec.get("func"), Opaque) or not isinstance(spec.get("args"), Opaque):
        raise ProtocolError(f"task {spec['key']!r} needs opaque 'func' and 'args' payloads")
    check_keys(spec.get("deps", []), "deps")
    for name in ("priority", "retries"):
        if not isinstance(spec.get(name, 0), int):
            raise ProtocolError(f"task {spec['key']!r}: {name} must be an integer")
        if not -INT64 <= spec.get(name, 0) <= INT64:
            raise Refused(f"task {spec['key']!r}: {name}={spec[name]} is out of range; give an integer "
                          f"between -(2**63 - 1) and 2**63 - 1")
    if spec.get("duration") is not None and check_number(spec["duration"]) is None:
        raise ProtocolError(f"task {spec['key']!r}: duration must be a number of seconds")
    memory = spec.get("memory")
    if memory is not None and (not isinstance(memory, int) or isinstance(memory, bool) or not 0 <= memory <= INT64):
        raise ProtocolError(f"task {spec['key']!r}: memory must be a number of bytes")
    if spec.get("pool") is not None and not isinstance(spec["pool"], str):
        raise ProtocolError(f"task {spec['key']!r}: pool must be a pool's name")
    if "workers" in spec:
        check_workers(spec)
    res = spec.get("resources") or {}
    if not isinstance(res, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                            for k, v in res.items()):
        raise ProtocolError(f"task {spec['key']!r}: resources must map names to numbers")
    return spec


def check_workers(spec: dict) -> None:
    """workers= as the client sends it (client/graph.py's task_where): a sorted list of distinct
    names, with allow_other_workers a bool; the state machine interns it by that list."""
    names, loose = spec["workers"], spec.get("allow_other_workers", False)
    if (not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names)
            or not isinstance(loose, bool)):
        raise ProtocolError(f"task {spec['key']!r}: workers must be a non-empty list of worker addresses, "
                            "names or hosts, and allow_other_workers a bool")
    if any(a >= b for a, b in zip(names, names[1:])):
        spec["workers"] = sorted(set(names))      # another client's order: one Where all the same


def compact_payloads(tasks: list[dict]) -> None:
    """Small payloads as bytes of their own, one per distinct payload, not views of the message.

    A view (memoryview, 184 B) of each task's args kept the whole message's buffer alive, and
    each task had an Opaque of its own for the function they all share (a map sends it once):
    with a 20-byte args pickle, a waiting task cost 230 B more than its bytes (issue 19). A
    large payload stays a view: copying it would double it while the message lives."""
    copies: dict[int, Opaque] = {}
    for spec in tasks:
        for name in ("func", "args"):
            payload = spec[name]
            if payload.buffers or nbytes(payload.data) > COPY_BELOW:
                continue
            copy = copies.get(id(payload.data))
            if copy is None:
                copy = copies[id(payload.data)] = Opaque(bytes(payload.data))
            spec[name] = copy


def check_held(value) -> dict[str, int]:
    """A reattaching worker's results: key -> nbytes."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in value.items()):
        raise ProtocolError("held must map keys to byte counts")
    return {k: check_count(v, "nbytes") for k, v in value.items()}


def check_number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value >= 0 else None


def check_count(value, what: str) -> int:
    """A byte count from a worker: it is passed on to clients, so it must fit msgpack."""
    try:
        value = int(value or 0)
    except OverflowError:                   # inf
        raise ProtocolError(f"{what} {value} is not a byte count") from None
    if not 0 <= value <= INT64:
        raise ProtocolError(f"{what} {value} is not a byte count")
    return value


def check_restart_timeout(value) -> float:
    """client.restart(timeout=): checked before anything is cleared (a bad one used to clear
    everyone's work, then fail, and never reply)."""
    if value is None:
        return 60.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        raise Refused(f"restart timeout={value!r}: give a number of seconds above 0 and at most one day "
                      "(86400); nothing was restarted")
    return float(value)


MEMORY_FIELDS = ("rss", "peak_rss", "managed", "spilled", "spilled_disk", "spilled_count")


def check_memory(value) -> dict | None:
    """A worker's memory report (heartbeat, task-started): byte counts and `paused`; None if absent."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError("memory must be a map")
    out = {k: int(v) for k, v in value.items()
           if k in MEMORY_FIELDS and isinstance(v, (int, float)) and 0 <= v <= INT64}
    if "paused" in value:
        out["paused"] = bool(value["paused"])
    return out


def check_fractions(value) -> dict | None:
    """The worker's memory fractions (target, spill, pause, terminate): numbers, or False for off."""
    if not isinstance(value, dict):
        return None
    return {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v else False)
            for k, v in value.items() if k in ("target", "spill", "pause", "terminate")}


def worker_deadline(info: dict) -> float | None:
    """When the worker must be gone: the earlier of its job's end (job start + walltime, as the
    job script recorded) and its lifetime's (`lifetime_end`: --lifetime, drawn by the worker).
    Both are drained for alike: the lifetime is an earlier walltime that no one enforces by a kill."""
    start, walltime = check_number(info.get("job_start")), check_number(info.get("job_walltime"))
    ends = [check_number(info.get("lifetime_end"))]
    if start is not None and walltime is not None:
        ends.append(start + walltime)
    return min((end for end in ends if end is not None), default=None)
