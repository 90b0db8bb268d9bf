"""Copies of results kept on several workers (client.replicate). Mixed into SchedulerState.

Replicas are pinned: never trimmed while the result is wanted, and restored to the asked
number when a holder dies (remove_worker calls _ensure_replicas).
"""

from __future__ import annotations

from ...protocol.messages import Op
from .records import own

# Plain str copies of the ops sent per key: a literal's cost (protocol/messages.py).
FETCH_REPLICA, FREE_KEYS = Op.FETCH_REPLICA.value, Op.FREE_KEYS.value


class ReplicaMixin:
    def replicate(self, keys, n: int) -> None:
        """Keep `n` copies of each result (pinned: never trimmed), restored after deaths."""
        for key in keys:
            ts = self.tasks.get(key)
            if ts is not None:
                ts.replicas = max(1, int(n))
                self._touch(ts)
                self.replicated.add(key)
                self._ensure_replicas(ts)

    def _restore_replicas(self) -> None:
        """A worker joined: copies lost when no spare worker was left can be made now."""
        for key in list(self.replicated):
            ts = self.tasks.get(key)
            if ts is None or ts.replicas <= 1:
                self.replicated.discard(key)          # forgotten, or no longer replicated
            else:
                self._ensure_replicas(ts)

    def _ensure_replicas(self, ts) -> None:
        if ts.state != "memory" or not ts.who_has:
            return
        missing = ts.replicas - len(ts.who_has) - len(ts.copying)
        if missing <= 0:
            return
        busy = {ws.address for ws in ts.who_has} | ts.copying
        spare = sorted((ws for a, ws in self.workers.items() if a not in busy),
                       key=lambda ws: (len(ws.has_what), ws.address))
        holders = [ws.address for ws in ts.who_has]
        for ws in spare[:missing]:
            own(ts, "copying").add(ws.address)
            self.copying.add(ts)
            self._send(ws.address, {"op": FETCH_REPLICA, "key": ts.key, "holders": holders})

    def add_replica(self, address: str, key: str, nbytes: int) -> None:
        ws, ts = self.workers.get(address), self.tasks.get(key)
        if ts is not None:
            ts.copying.discard(address)
        if ws is None:
            return
        if ts is None or ts.state != "memory":
            self._send(address, {"op": FREE_KEYS, "keys": [key]})
            return
        own(ts, "who_has").add(ws)
        ws.has_what.add(ts)
        self._touch(ts)

    def replica_failed(self, address: str, key: str) -> None:
        ts = self.tasks.get(key)
        if ts is not None:
            ts.copying.discard(address)
