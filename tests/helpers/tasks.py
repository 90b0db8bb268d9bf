"""Builders for the state machine's tests: a task as a client's update-graph lists it, and
readers of what SchedulerState.take_outbox() returns ({peer address: [message, ...]})."""

from __future__ import annotations

from hpc_cluster.protocol.frames import Opaque

F, A = Opaque(b"f"), Opaque(b"a")      # a function and arguments the scheduler never opens


def task(key, deps=(), **fields) -> dict:
    """One task of an update-graph: `key`, the inputs `deps`, priority 0, and any other field
    given (priority, retries, resources, duration, memory, pool, func, args...). A field given
    as None is left out, as a client leaves it out: the scheduler's default applies."""
    spec = {"key": key, "func": F, "args": A, "deps": list(deps), "priority": 0}
    spec.update((name, value) for name, value in fields.items() if value is not None)
    return spec


def sent(out, to, op="compute") -> list[dict]:
    """The messages of `op` in the outbox `out` for the peer `to`."""
    return [m for m in out.get(to, []) if m["op"] == op]


def computes(out, worker) -> list[str]:
    """The tasks placed on `worker` (not those sent ahead: they wait there for an input)."""
    return [m["key"] for m in sent(out, worker) if "after" not in m]
