"""client.rebalance(): results moved from the workers holding the most bytes to those holding
the fewest (dask's "roughly balance memory burden"). Mixed into SchedulerState; pure like it.

A move is a copy, then a drop: the target fetches the result from the source as for a replica
(replicas.py's `copying`, the worker's fetch-replica), and only once the target holds it does
the source let its copy go, so a result is never without a holder on the way. The server
drives the moves (scheduler/inspection.py) and asks `end_move` how each one went.
"""

from __future__ import annotations

from ...protocol.messages import Op
from .records import own

FETCH_REPLICA, FREE_KEYS = Op.FETCH_REPLICA.value, Op.FREE_KEYS.value


def _loads(workers) -> dict:
    """Bytes of results each worker holds (all of them: its memory burden, not only the keys
    asked about)."""
    return {ws.address: sum(ts.nbytes for ts in ws.has_what) for ws in workers}


class RebalanceMixin:
    def plan_rebalance(self, keys=None, workers=None) -> list[tuple[str, str, str]]:
        """(key, source, target) moves that even out the bytes the chosen workers hold
        (`workers`: addresses, None: all; `keys`: the results that may move, None: all).

        Greedy: the heaviest worker gives its largest movable result to the lightest while
        that narrows the gap between them (twice its size fits in the gap), so nothing is
        moved back and forth and one huge result stays where it is."""
        chosen = [ws for a, ws in self.workers.items() if workers is None or a in workers]
        receivers = [ws for ws in chosen if not ws.draining]
        if len(chosen) < 2 or not receivers:
            return []
        wanted = None if keys is None else set(keys)
        load = _loads(chosen)
        moves, moved = [], set()
        for sender in sorted(chosen, key=lambda ws: -load[ws.address]):
            movable = sorted((ts for ts in sender.has_what
                              if ts.state == "memory" and ts.nbytes > 0 and not ts.copying
                              and (wanted is None or ts.key in wanted)),
                             key=lambda ts: -ts.nbytes)
            for ts in movable:
                if ts.key in moved:
                    continue
                target = min((ws for ws in receivers if ws is not sender and ws not in ts.who_has),
                             key=lambda ws: load[ws.address], default=None)
                if target is None:
                    continue
                if 2 * ts.nbytes > load[sender.address] - load[target.address]:
                    continue                 # smaller ones may still fit: the list is largest first
                moves.append((ts.key, sender.address, target.address))
                moved.add(ts.key)
                load[sender.address] -= ts.nbytes
                load[target.address] += ts.nbytes
        return moves

    def start_moves(self, moves) -> None:
        """Each target fetches its result from the source (the source keeps it for now)."""
        for key, source, target in moves:
            ts = self.tasks.get(key)
            if ts is None or ts.state != "memory" or target not in self.workers:
                continue
            own(ts, "copying").add(target)
            self.copying.add(ts)
            self._send(target, {"op": FETCH_REPLICA, "key": key, "holders": [source]})

    def end_move(self, key: str, source: str, target: str) -> str:
        """'pending' while the copy travels; 'done' once the target holds the result (the
        source is then told to drop its copy) or the result is no longer needed; 'failed' if
        the copy will not arrive (the target left, or could not fetch it)."""
        ts = self.tasks.get(key)
        if ts is None or ts.state != "memory":
            return "done"                       # released or recomputing meanwhile: nothing to move
        if target in ts.copying:
            return "pending"
        tws, sws = self.workers.get(target), self.workers.get(source)
        if tws is None or tws not in ts.who_has:
            return "failed"
        # Pinned copies (replicate) keep their number: the target's copy stands in for the source's.
        if sws is not None and sws in ts.who_has and len(ts.who_has) > 1:
            ts.who_has.discard(sws)
            sws.has_what.discard(ts)
            self._touch(ts)
            self._send(source, {"op": FREE_KEYS, "keys": [key]})
        return "done"
