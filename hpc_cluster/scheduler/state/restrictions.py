"""Tasks restricted to named workers: `submit(..., workers=[...], allow_other_workers=...)`,
dask.annotate(workers=...). Mixed into SchedulerState; pure like it.

A restriction is a set of names, each a worker's address ("tcp://10.0.0.5:40321", or without
its protocol: "10.0.0.5:40321", as a tls:// cluster's workers are named too), its name
("worker-3", "mycluster-17"), or a host ("10.0.0.5", or "node017" as the worker's
socket.gethostname() says): a worker is one of them if any of those is in the set. distributed
reads `workers=` the same way (addresses, hostnames, and names through its aliases); the
client canonicalises what the user wrote (client/graph.py's task_where) and the scheduler
only compares strings.

- strict (the default): the task runs only on such a worker. If no live worker is one, it
  waits (queued) until one joins, as distributed's task waits in "no-worker" (its
  no-workers-timeout is off by default); client.why() says what it waits for.
- loose (allow_other_workers=True): such a worker is preferred; when none of them has a free
  slot the task may run on any other worker, as distributed's work stealing moves such a
  task to an idle worker.

Thousands of tasks of one map share one `Where` (interned per state), and it keeps the live
workers that match, updated as workers join and leave: placement looks only at those, never
at every worker, and tests membership in a set.
"""

from __future__ import annotations

import weakref

# What why() lists of the live workers (a cluster may have hundreds).
SHOWN = 5


class Where:
    """One restriction, shared by every task that has it: the names, loose or not, and the
    live workers that are one of them (kept by the state machine, never stale)."""

    __slots__ = ("names", "loose", "matching", "__weakref__")

    def __init__(self, names: frozenset, loose: bool):
        self.names, self.loose = names, loose
        self.matching: set = set()

    def admits(self, ws) -> bool:
        names, hostport = self.names, ws.address.split("://", 1)[-1]
        return (ws.address in names or hostport in names or ws.name in names or host_of(hostport) in names
                or ws.info.get("host") in names)

    def __repr__(self) -> str:
        return f"<Where {sorted(self.names)}{' loose' if self.loose else ''} {len(self.matching)} live>"


def host_of(address: str) -> str:
    """'tcp://10.0.0.5:40321' -> '10.0.0.5'; 'tls://[::1]:5' -> '::1'."""
    hostport = address.split("://", 1)[-1]
    host = hostport.rsplit(":", 1)[0] if ":" in hostport else hostport
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def allowed_on(ts, ws) -> bool:
    """May `ts` run on `ws` now? (A loose restriction allows any worker: where it prefers is
    placement's choice, free.py.)"""
    where = ts.where
    return where is None or where.loose or ws in where.matching


class RestrictionsMixin:
    def _init_restrictions(self) -> None:
        # (names, loose) -> Where, while some task holds it
        self._wheres: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def _where_of(self, names, loose) -> Where:
        """The state's one Where for these names (a list from the wire)."""
        key = (tuple(names), bool(loose))
        where = self._wheres.get(key)
        if where is None:
            where = Where(frozenset(names), bool(loose))
            where.matching = {ws for ws in self.workers.values() if where.admits(ws)}
            self._wheres[key] = where
        return where

    def _where_joined(self, ws) -> None:
        for where in list(self._wheres.values()):
            if where.admits(ws):
                where.matching.add(ws)

    def _where_left(self, ws) -> None:
        for where in list(self._wheres.values()):
            where.matching.discard(ws)

    def restriction_note(self, ts) -> str | None:
        """What client.why() says of a task's workers=: where it may run and, if it waits,
        for what. None for a task without one."""
        where = ts.where
        if where is None:
            return None
        names = ", ".join(map(repr, sorted(where.names)))
        if where.loose:
            return (f"it prefers workers=[{names}] (allow_other_workers=True: it runs elsewhere when none "
                    f"of them has a free slot; {len(where.matching)} of them live)")
        if ts.state != "queued":
            return f"it may run only on workers=[{names}] ({len(where.matching)} of them live)"
        if not where.matching:
            live = sorted(ws.name if ws.name != ws.address else ws.address for ws in self.workers.values())
            shown = ", ".join(live[:SHOWN]) + (f" and {len(live) - SHOWN} more" if len(live) > SHOWN else "")
            return (f"it waits: it may run only on workers=[{names}], and no live worker is one of them "
                    f"(by address, name or host; live: {shown or 'none'}). It starts when one joins; "
                    "to run it elsewhere, submit it with allow_other_workers=True or without workers=")
        return (f"it waits for a free slot on workers=[{names}], the only ones it may run on "
                f"({len(where.matching)} live)")
