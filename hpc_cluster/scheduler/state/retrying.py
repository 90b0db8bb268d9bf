"""client.retry(futures): failed tasks run again, as distributed's `Scheduler.stimulus_retry`.
Mixed into SchedulerState (machine.py); pure like it.

A retry goes to the root of each failure: from every key asked for, up through its failed
inputs to the tasks that failed on their own (none of their inputs failed). Those run again,
and with them every task that failed only because of them (a dependency error), whoever holds
it: its clients are told `task-retried` first, then its outcome as for any task. Each runs
with a fresh count of the deaths charged to it (a KilledWorker retried gets its
allowed_failures again); what a retry by cause learned (pool, memory: pools.py) is kept.

Not run again: a task whose submission was refused, or whose input was released before it
was submitted (it has no edge to that input: it would fail the same way). A key in memory is
told to the asking client again, since its future there may have been cancelled only on the
client's side.
"""

from __future__ import annotations

from ...protocol.messages import ErrorKind, Op

# Plain str copies (protocol/messages.py): a literal's cost.
TASK_RETRIED, KEY_IN_MEMORY = Op.TASK_RETRIED.value, Op.KEY_IN_MEMORY.value
DEPENDENCY = ErrorKind.DEPENDENCY.value
NOT_RETRIED = frozenset({ErrorKind.REFUSED.value, ErrorKind.MISSING.value})


def _kind(ts) -> str | None:
    return (ts.error or {}).get("kind")


class RetryMixin:
    def retry(self, cid: str, keys) -> list[str]:
        """Run the failed tasks among `keys` again, with the failures they come from (see the
        module's docstring). Returns the keys that run again."""
        asked, stack, seen = [], [], set()
        for key in keys:
            ts = self.tasks.get(key)
            if ts is None:
                continue
            if ts.state == "memory" and cid in ts.who_wants:
                self._send(cid, {"op": TASK_RETRIED, "key": key})
                self._send(cid, {"op": KEY_IN_MEMORY, "key": key, "nbytes": ts.nbytes})
            elif ts.state == "erred" and ts not in seen:
                seen.add(ts)
                stack.append(ts)
                asked.append(ts)
        roots = []
        while stack:                                  # up, through failed inputs, to the roots
            ts = stack.pop()
            failed = [d for d in ts.dependencies if d.state == "erred"]
            if not failed:
                roots.append(ts)
            for dep in failed:
                if dep not in seen:
                    seen.add(dep)
                    stack.append(dep)
        again = {ts for ts in roots if _kind(ts) not in NOT_RETRIED}
        # An asked task that failed on its own while an input failed too (it ran before that
        # input was lost and failed on recomputing) runs again as well: asked for by name.
        again.update(ts for ts in asked if _kind(ts) not in NOT_RETRIED and _kind(ts) != DEPENDENCY)
        stack = list(again)
        while stack:                                  # down, to what failed because of them
            ts = stack.pop()
            for dts in ts.dependents:
                if dts.state == "erred" and dts not in again and _kind(dts) == DEPENDENCY:
                    again.add(dts)
                    stack.append(dts)
        ordered = sorted(again, key=lambda t: t.priority)
        for ts in ordered:
            self._transition(ts, "released", "retry")
            ts.error, ts.attempts = None, ()
            self._touch(ts)
            self._tell_clients(ts, {"op": TASK_RETRIED, "key": ts.key})
        for ts in ordered:
            self._activate(ts)                        # the wanted ones, and from lineage what they need
        self._schedule()
        return [ts.key for ts in ordered]
