"""Tasks sent ahead: the next link of a chain waits on the worker running its input.

A chain step used to cost a round trip through the scheduler: the worker reported the input
finished, the scheduler placed the next task, the worker received it. Issue 19 asked for a
chain step of 300 us; that round trip alone was most of the 500 us it took.

So when a task's only missing input is processing on worker W, and everything else it needs
is already on W, the scheduler sends its `compute` to W at once, marked `"after": input`.
W holds it (unstarted, unfetched) until that input finishes *there*, then treats it as a
compute that just arrived: it starts it in the same turn of its loop that reports the input.

Both sides apply one rule, so they agree without asking each other:

    the input finishes on W while W holds the task  =>  the task is assigned to W

The scheduler records "W holds it" as `ts.ahead_on = W` (the task stays *waiting*: nothing is
charged to it if W dies, it takes no slot, and `processing => inputs in memory` still holds).
Whenever it stops wanting W to hold it (the input went elsewhere, the task failed or is no
longer wanted) it sends `free-keys` for it and clears `ahead_on`; W drops a held task only on
that message. When the input finishes on W, the scheduler promotes the task to processing on
W without sending anything (`_promote`), unless W may not take tasks now (draining, paused,
placement held): then it frees the held copy and places the task as usual. A copy W started
meanwhile is then cancelled like any task given up on (worker.py `_free`).

Only chains are sent ahead: an input with one dependent. A fan-out's dependents are placed as
usual, spread over the workers.
"""

from __future__ import annotations

from ...protocol.messages import Op
from .placement import expected_duration, fits_worker, has_time
from .prefetch import queued_cost_us

FREE_KEYS = Op.FREE_KEYS.value          # a plain str: a literal's cost per task (protocol/messages.py)


# Links of a chain held ahead on one worker. One is enough while the scheduler answers a
# finished link before the worker ends the next; a few more keep the worker going when the
# scheduler falls behind (no-op tasks: the worker is then faster than the scheduler).
AHEAD_DEPTH = 4


class AheadMixin:
    """Part of SchedulerState (state.py)."""

    def _send_ahead(self, ts, dep, depth: int | None = None) -> None:
        """`ts` waits only on `dep`, which was just placed or sent ahead (or is processing, or
        held): hold it where `dep` will run, and the links after it, up to AHEAD_DEPTH."""
        while True:
            ws = dep.processing_on or dep.ahead_on
            if depth is None:
                depth = self._depth_of(dep) + 1
            if (ws is None or depth > AHEAD_DEPTH or self.workers.get(ws.address) is not ws
                    or ts.state != "waiting" or ts.waiting_on != {dep}
                    or len(dep.dependents) != 1 or ts.attempts or ts.resources or ts.memory
                    or ts.where is not None and ws not in ts.where.matching
                    or not fits_worker(ts, ws, self.pools or None)):
                return
            if ts.ahead_on is not ws:       # (held there already: the input came back to it)
                for other in ts.dependencies:
                    if other is not dep and ws not in other.who_has:
                        return              # it would fetch: placement decides where, as usual
                self._clear_ahead(ts)
                ts.ahead_on = ws
                self._send(ws.address, {**self._compute_msg(ts, ws), "after": dep.key})
            if len(ts.dependents) != 1:
                return
            dep, depth = ts, depth + 1
            ts = next(iter(ts.dependents))

    @staticmethod
    def _depth_of(ts) -> int:
        """0 for a task processing; for one held ahead, how many held links lead to it."""
        depth = 0
        while ts.processing_on is None and ts.ahead_on is not None and depth <= AHEAD_DEPTH:
            depth += 1
            ts = next(iter(ts.waiting_on))
        return depth

    def _forget_holds(self, ws, running) -> None:
        """`ws` is gone: what it held behind its running tasks is held nowhere now."""
        for ts in running:
            while len(ts.dependents) == 1:
                ts = next(iter(ts.dependents))
                if ts.ahead_on is not ws:
                    break
                ts.ahead_on = None

    def _clear_ahead(self, ts) -> None:
        """Stop having a worker hold `ts` (it frees its copy; the message keeps both in step)."""
        ws = ts.ahead_on
        if ws is None:
            return
        ts.ahead_on = None
        if self.workers.get(ws.address) is ws:
            self._send(ws.address, {"op": FREE_KEYS, "keys": [ts.key]})

    def _promote(self, ts, ws) -> bool:
        """`ts` became ready as its input finished on `ws`: if `ws` held it, it runs there now.
        False: it is placed as usual (and any copy held elsewhere is freed)."""
        if ts.ahead_on is not ws:
            self._clear_ahead(ts)
            return False
        expected = expected_duration(ts, self.durations)
        if (self.workers.get(ws.address) is not ws or ws.draining or ws.paused
                or self.placement_held_until is not None or not has_time(expected, ws, self.now)
                or any(ws not in d.who_has for d in ts.dependencies)):
            self._clear_ahead(ts)
            return False
        ts.ahead_on = None
        cost = queued_cost_us(expected, self.prefetch_seconds)
        self._assign(ts, ws, cost, send=False)          # the worker starts it on its own
        return True
