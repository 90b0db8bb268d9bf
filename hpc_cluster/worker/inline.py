"""Tiny tasks run on the worker's event loop instead of a task thread (mixed into Worker).

A task on a thread costs the worker two wake-ups across threads: the loop hands it to the
thread (a futex), the thread hands the outcome back (the loop's self-pipe). On 2 cores those
context switches were half of a worker's CPU per no-op task (throughput.py's map: 152 us of
worker CPU per task on threads, 74 us on the loop; BENCHMARKS.md). So a function whose last
INLINE_AFTER runs each took under INLINE_BELOW runs on the loop, one task at a time, for at
most INLINE_TURN per turn of the loop; then the loop reads its messages and comes back.

Blame is unchanged: before such a task runs, its key is in the memory its nanny reads
after a death (slot.py), and its `task-started` goes to the scheduler with its
`task-finished`, one write for the turn's runs (without a nanny, or with a key too long for
the slot, the start is on the wire before it runs, as a thread's is). A task started for a
thread is handed to its thread before anything runs on the loop. So every task reported
started is really running, and a death in a run on the loop is charged to that run's task.
The scheduler learns of a run's start at its end: for a run that turns out long (a function
that was quick 8 times, then is not), the dashboard and `client.processing()` show it as
started only then, and its function leaves the loop after INLINE_BAN.

A task on the loop must not wait on its own cluster (get_client(), worker_client, secede(),
a Client made in it): the loop it would wait for is the one it blocks. Such a call raises
context.RunOnThread (a BaseException: a task's `except Exception` does not swallow it);
the function never runs on the loop again and the task starts over on a task thread. A run
on the loop that took over INLINE_BAN ends its function's runs there for good; a run over
INLINE_BELOW sends it back to threads until INLINE_AFTER quick runs again.

HPC_CLUSTER_INLINE_TASKS=0 in a worker's environment keeps every task on its threads (code
that needs a thread of its own, or to measure what this saves). HPC_CLUSTER_INLINE_BELOW=S
makes a run under S seconds tiny instead of INLINE_BELOW's 0.2 ms: the tests of the loop's
rules raise it so that their functions qualify on any machine (a run is timed on the wall
clock, so a slower core or a preempted thread can keep a 50 us function above 0.2 ms).
"""

from __future__ import annotations

import asyncio
import os
import time

from ..protocol import context
from ..protocol.messages import Op

TASK_STARTED = Op.TASK_STARTED.value    # a plain str: a literal's cost per task (protocol/messages.py)

INLINE_BELOW_DEFAULT = 0.0002    # s: a run quicker than this is "tiny" (a thread hand-off costs ~40-80 us)
INLINE_AFTER = 8          # consecutive tiny runs of a function before it runs on the loop
INLINE_TURN = 0.002       # s of runs on the loop per turn, then its messages are read
INLINE_BAN = 0.05         # s: a run on the loop this long means the function may block it
_BANNED = -1
_MOST_FUNCTIONS = 4096    # functions tracked; forgotten all at once past it (they re-qualify)


def inline_allowed(environ=os.environ) -> bool:
    return environ.get("HPC_CLUSTER_INLINE_TASKS", "1").strip().lower() not in ("0", "false", "no", "off")


def inline_below(environ=os.environ) -> float:
    """The "tiny" threshold in seconds: HPC_CLUSTER_INLINE_BELOW if it is a positive number."""
    try:
        seconds = float(environ.get("HPC_CLUSTER_INLINE_BELOW", ""))
    except ValueError:
        return INLINE_BELOW_DEFAULT
    return seconds if seconds > 0 else INLINE_BELOW_DEFAULT


INLINE_BELOW = inline_below()     # read once, when the worker imports this


class InlineMixin:
    """Needs: self._quick (dict: function bytes -> consecutive tiny runs, or _BANNED),
    self._inline_allowed (inline_allowed() when the worker started),
    self._execute, self._report, self.executor, self.executing, self.scheduler, self.memory,
    self._slot (slot.py's RunningSlot, or None), self.loop (the worker's event loop, the one running)."""

    def _note_run(self, func: bytes, seconds: float) -> None:
        streak = self._quick.get(func, 0)
        if streak == _BANNED:
            return
        if len(self._quick) >= _MOST_FUNCTIONS and func not in self._quick:
            self._quick.clear()
        self._quick[func] = streak + 1 if seconds < INLINE_BELOW else 0

    def _runs_inline(self, ts) -> bool:
        return self._inline_allowed and self._quick.get(ts.func, 0) >= INLINE_AFTER

    def _run_inline(self, ts) -> None:
        """Start `ts` and run it here, on the loop; report it before anything else starts."""
        ts.state = "executing"
        self.executing.add(ts.key)
        if self.plugins.watching:                # worker/plugins.py: as on a thread (worker.py)
            self.plugins.transition(ts.key, "ready", "executing")
        memory = self.memory.at_task_start()
        self.scheduler.send({"op": TASK_STARTED, "key": ts.key, "memory": memory})
        slot = self._slot
        if slot is None or not slot.set(ts.key, time.time(), memory):
            self.scheduler.flush()       # no nanny to name it after a crash: the start goes first
        # The task sees no running loop, as on a thread: asyncio.run() in it works (95 us,
        # quick enough to be here) instead of "cannot be called from a running event loop".
        asyncio._set_running_loop(None)
        context.set_inline(True)
        try:
            outcome, duration = self._execute(ts)
        finally:
            context.set_inline(False)
            asyncio._set_running_loop(self.loop)
            if slot is not None:
                slot.clear()
        if outcome[0] == "error" and isinstance(outcome[1], context.RunOnThread):
            # It would wait on this loop: started already, it starts over there, and its start
            # must be on the wire before its thread has it (threads.py).
            self._quick[ts.func] = _BANNED
            self.scheduler.flush()
            self.executor.submit(ts)
            return
        if duration > INLINE_BAN:
            self._quick[ts.func] = _BANNED
        else:
            self._note_run(ts.func, duration)
        self._report(ts, outcome, duration)

    def _inline_budget(self) -> float:
        return time.perf_counter() + INLINE_TURN
