"""Leaving before the walltime: the pure part of a worker's graceful drain.

A worker whose job will be killed at `deadline` starts draining `margin` seconds before:
it gets no new tasks; tasks queued on it go back to the scheduler; running tasks that
will finish in time finish, the others are handed back (not charged: nothing was their
fault); results no other worker holds are copied to peers; then it is retired. So no
task is lost or run twice because of walltime. Mixed into SchedulerState.

A drain we chose (scale-down, adapt: `keep=True`) differs in one rule, distributed's: a
worker that alone holds results still wanted stays until a peer has them or they are
released, even with no peer to copy them to (every worker draining at once, adapt's target
falling to 0). Leaving then had the held futures recomputed, which grew the cluster back,
which shrank it again: a loop (issue 34). Its walltime still ends it: once the walltime's
margin comes, it drains as for walltime and leaves (lineage recomputes what it held).
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
        return [a for a, ws in self.workers.items() if (not ws.draining or ws.drain_keeps)
                and ws.deadline is not None and now >= ws.deadline - drain_margin(ws, walltime_margin)]

    def start_drain(self, address: str, keep: bool = False) -> None:
        """Drain a worker; `keep`: a scale-down's, which keeps what only it holds (the docstring above)."""
        ws = self.workers.get(address)
        if ws is None:
            return
        if ws.draining:
            ws.drain_keeps = ws.drain_keeps and keep      # a walltime drain ends the keeping
            return
        ws.draining, ws.drain_keeps = True, keep
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

    @staticmethod
    def _kept_elsewhere(ts, ws) -> bool:
        """Does a holder other than `ws` keep `ts`? For a scale-down's drain, only one that
        stays: not draining, or keeping too and after `ws` by address (of two draining holders
        of one copy each, one leaves and the other stays; each saying 'the other has it', both
        left). A walltime drain leaves if anyone else holds it, as before."""
        if not ws.drain_keeps:
            return len(ts.who_has) > 1
        return any(h is not ws and (not h.draining or (h.drain_keeps and h.address > ws.address))
                   for h in ts.who_has)

    def kept_without_peer(self, address: str) -> int:
        """Results a scale-down keeps `address` for with no worker left to take them (0: none)."""
        ws = self.workers.get(address)
        if ws is None or not ws.drain_keeps or any(not w.draining for w in self.workers.values()):
            return 0
        return sum(1 for ts in ws.has_what if (ts.who_wants or ts.waiters) and not self._kept_elsewhere(ts, ws))

    def drain_step(self, address: str) -> bool:
        """Advance a drain; True when the worker can leave without losing anything."""
        ws = self.workers.get(address)
        if ws is None:
            return False
        if ws.processing:
            return False
        unique = [ts for ts in ws.has_what if (ts.who_wants or ts.waiters) and not self._kept_elsewhere(ts, ws)]
        if not unique:
            return True                       # nothing to save
        todo = [(i, ts) for i, ts in enumerate(unique) if not ts.copying]
        if not todo:
            # Its copies are on their way: no need to sort every worker again; it leaves at
            # once, as before, if no worker is left to save its results to (lineage will),
            # unless a scale-down keeps it until they land.
            return not ws.drain_keeps and not any(not w.draining for w in self.workers.values())
        # Sorted when copies are to be started, not at every step (every 0.5 s) while they
        # travel: when a whole job array drains at its walltime, each of 500 workers sorted
        # all 500 at each step.
        targets = sorted((w for w in self.workers.values() if not w.draining),
                         key=lambda w: (len(w.has_what), w.address))
        if not targets:
            # Nowhere to save it: a scale-down keeps it (a worker that joins gets the copies,
            # or they are released); at walltime it leaves and lineage recomputes them.
            return not ws.drain_keeps
        for i, ts in todo:
            target = targets[i % len(targets)]
            own(ts, "copying").add(target.address)
            self.copying.add(ts)
            self._send(target.address, {"op": FETCH_REPLICA, "key": ts.key,
                                        "holders": [ws.address]})
        return False
