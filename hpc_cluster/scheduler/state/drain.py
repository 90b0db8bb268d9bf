"""Leaving before the walltime: the pure part of a worker's graceful drain.

A worker whose job will be killed at `deadline` starts draining `margin` seconds before:
it gets no new tasks; tasks queued on it go back to the scheduler; running tasks that
will finish in time finish, the others are handed back (not charged: nothing was their
fault); results no other worker holds are copied to peers; then it is retired. So no
task is lost or run twice because of walltime. Mixed into SchedulerState.
"""

from __future__ import annotations

from ...protocol.messages import Op
from .placement import expected_duration
from .records import own

# Plain str copies of the ops sent per key: a literal's cost (protocol/messages.py).
FETCH_REPLICA, HAND_BACK = Op.FETCH_REPLICA.value, Op.HAND_BACK.value


def drain_margin(ws, walltime_margin: float) -> float:
    """Seconds before the deadline to start draining: the configured margin, but never more
    than a fifth of the job's walltime or of the worker's lifetime (a 1-minute job, or a
    worker with --lifetime 60s, must not drain from its start)."""
    spans = [t for t in (ws.info.get("job_walltime"), ws.info.get("lifetime")) if t]
    return min([walltime_margin] + [0.2 * t for t in spans])


class DrainMixin:
    def workers_to_drain(self, now: float, walltime_margin: float) -> list[str]:
        self.set_time(now)
        return [a for a, ws in self.workers.items() if not ws.draining and ws.deadline is not None
                and now >= ws.deadline - drain_margin(ws, walltime_margin)]

    def start_drain(self, address: str) -> None:
        ws = self.workers.get(address)
        if ws is None or ws.draining:
            return
        ws.draining = True
        self._update_free(ws)
        unstarted = []
        for ts in sorted(ws.processing, key=lambda t: t.priority):
            if not ts.executing:
                # It may have started a moment ago ("task-started" in flight): the worker
                # decides, and hands back only what it has not started (handed_back).
                unstarted.append(ts.key)
            elif not self._finishes_in_time(ts, ws):
                self._abandon(ts)             # would die at walltime: run it elsewhere, uncharged
                self._transition(ts, "released", "drain")
                self._activate(ts)
        if unstarted:
            self._send(address, {"op": HAND_BACK, "keys": unstarted})
        self._schedule()

    def handed_back(self, address: str, keys) -> None:
        """The worker gave these back unstarted: they go to other workers."""
        ws = self.workers.get(address)
        for key in keys:
            ts = self.tasks.get(key)
            if ws is not None and ts is not None and ts.processing_on is ws and not ts.executing:
                self._unassign(ts)
                self._transition(ts, "released", "handed-back")
                self._activate(ts)
        self._schedule()

    def _finishes_in_time(self, ts, ws) -> bool:
        expected = expected_duration(ts, self.durations)
        if expected is None or ts.started_at is None:
            return True                       # unknown: let it try, it was started with time left
        return ts.started_at + expected <= ws.deadline

    def drain_step(self, address: str) -> bool:
        """Advance a drain; True when the worker can leave without losing anything."""
        ws = self.workers.get(address)
        if ws is None:
            return False
        if ws.processing:
            return False
        unique = [ts for ts in ws.has_what if ts.who_has == {ws} and (ts.who_wants or ts.waiters)]
        if not unique:
            return True                       # nothing to save
        todo = [(i, ts) for i, ts in enumerate(unique) if not ts.copying]
        if not todo:
            # Its copies are on their way: no need to sort every worker again; it leaves at
            # once, as before, if no worker is left to save its results to (lineage will).
            return not any(not w.draining for w in self.workers.values())
        # Sorted when copies are to be started, not at every step (every 0.5 s) while they
        # travel: when a whole job array drains at its walltime, each of 500 workers sorted
        # all 500 at each step.
        targets = sorted((w for w in self.workers.values() if not w.draining),
                         key=lambda w: (len(w.has_what), w.address))
        if not targets:
            return True                       # nowhere to save it (lineage will)
        for i, ts in todo:
            target = targets[i % len(targets)]
            own(ts, "copying").add(target.address)
            self.copying.add(ts)
            self._send(target.address, {"op": FETCH_REPLICA, "key": ts.key,
                                        "holders": [ws.address]})
        return False
