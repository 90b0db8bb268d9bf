"""A scheduler state rebuilt from its journal (issue 16, point 2), and the results it waits for.

`rebuild(recovered, now)` makes a fresh `SchedulerState` from what `journal.load()` read:
every live task with its spec, dependencies, retries left, deaths it ran in and who wants
it; erred tasks with their errors; the deaths with their verdicts. No worker is known yet,
so a result the journal saw on workers is *held*: state "held", `held_by` naming the workers
(by name: a worker that comes back has a new address). Tasks that need it wait for it.

Then, as workers come back or do not (the reattach half decides when):

- `confirm_held(address, keys)`: a worker that registered again holds these results: they
  are in memory on it, their dependents go ahead;
- `holders_missing(names)`: these workers will not come back: a result only they held is
  lost, and recomputed from lineage if anyone still needs it (scattered data, with no
  lineage, fails with `lost-data`, as when its worker dies).

Mixed into SchedulerState (pure, like it).
"""

from __future__ import annotations

import itertools

from ...protocol.frames import Opaque
from ...protocol.messages import Op
from .records import add_edge, own, priority_from_pair, SEQ_SPAN, shared, TaskState

KEY_IN_MEMORY = Op.KEY_IN_MEMORY.value   # a plain str: a literal's cost per key (protocol/messages.py)

def opaque_in(value) -> Opaque | None:
    """A payload as journal.py stores it ([data, [buffers]]), as the state holds it."""
    return None if value is None else Opaque(value[0], value[1])


RESTART_NOTE = "the scheduler restarted before this verdict was final"


class RecoveryMixin:
    # Names of the workers the rebuilt state waits for (a cheap test at each registration);
    # set by rebuild_into, emptied as they come back or are given up on.
    awaited_workers: frozenset | set = frozenset()

    def held_names(self) -> set[str]:
        """The workers (names) whose return some results still wait for."""
        return {name for ts in self.tasks.values() if ts.state == "held" for name in ts.held_by}

    def confirm_held(self, address: str, keys) -> tuple[list[str], list[str]]:
        """Worker `address` (registered again) says it holds `keys`. Returns (accepted,
        dropped): the results we know and want, now in memory on it; the rest, which the
        worker should free."""
        ws = self.workers.get(address)
        accepted, dropped = [], []
        for key in keys:
            ts = self.tasks.get(key)
            if ws is None or ts is None or ts.state not in ("held", "memory"):
                dropped.append(key)
                continue
            accepted.append(key)
            own(ts, "who_has").add(ws)
            ws.has_what.add(ts)
            self._touch(ts)
            if ts.state == "held":
                self._transition(ts, "memory", "holder-confirmed")
                ts.held_by = set()
                self._tell_clients(ts, {"op": KEY_IN_MEMORY, "key": key, "nbytes": ts.nbytes})
                for dts in ts.dependents:
                    if dts.state == "waiting" and ts in dts.waiting_on:
                        dts.waiting_on.discard(ts)
                        if not dts.waiting_on:
                            self._queue(dts)
        self._schedule()
        return accepted, dropped

    def holders_missing(self, names) -> list[str]:
        """Workers `names` are not coming back: results only they held are lost and, where
        still needed, recomputed from lineage. Returns the keys lost."""
        names = set(names)
        self.awaited_workers = set(self.awaited_workers) - names
        lost = []
        for ts in list(self.tasks.values()):
            if ts.state != "held" or not ts.held_by & names:
                continue
            ts.held_by -= names
            self._touch(ts)
            if not ts.held_by:
                lost.append(ts.key)
        for key in lost:
            ts = self.tasks.get(key)
            if ts is not None and ts.state == "held":
                self._data_lost(ts)
        for key in lost:                      # needed by nobody any more: forgotten
            ts = self.tasks.get(key)
            if ts is not None:
                self._maybe_release(ts)
        self._schedule()
        return lost


def rebuild_into(st, recovered, now: float):
    """Fill `st`, a fresh SchedulerState, with what the journal recovered (see the module's
    docstring; `SchedulerState.rebuild` is the usual way in). Open verdicts are made final as
    they stand (their evidence collection died with the old scheduler), so no task waits for
    one forever."""
    if st.tasks or st.workers or st.deaths:
        raise ValueError("rebuild_into needs a fresh SchedulerState")
    st.set_time(now)
    deaths = [recovered.deaths[i] for i in sorted(recovered.deaths)]
    for i, d in enumerate(deaths):
        d = dict(d, id=i)
        if d.get("final_at") is None:
            d["final_at"] = now
            d["text"] = f"{d.get('text') or ''} ({RESTART_NOTE})".strip()
        deaths[i] = d
    st.deaths = deaths
    by_id = {d["id"]: d for d in deaths}
    top = 0
    for key, spec in recovered.specs.items():
        ts = st.tasks[key] = TaskState(key)
        ts.func, ts.args = opaque_in(spec[2]), opaque_in(spec[3])
        ts.priority = priority_from_pair(spec[5])
        top = max(top, ts.priority % SEQ_SPAN)
        ts.duration, ts.resources = spec[6], spec[7] or None
        if spec[8] and spec[8].get("workers"):        # workers= (restrictions.py); older journals: None
            ts.where = st._where_of(spec[8]["workers"], spec[8].get("allow_other_workers"))
        status = recovered.status.get(key)
        if status is not None:
            _, _, code, detail, wanted, nbytes, retries, attempts, pool, memory, escalated, escalation, replicas = status
            ts.nbytes, ts.retries, ts.pool, ts.memory = nbytes, retries, pool, memory
            ts.escalated, ts.escalation, ts.replicas = escalated, escalation, replicas
            ts.who_wants = shared(wanted)
            st.clients.update(wanted)
            ts.attempts = [{"death": by_id[a[0]], "ran_for": a[1], "pool": a[2], "moved": a[3],
                            "considered": a[4], "escalation": a[5], "needed": a[6]}
                           for a in attempts if a[0] in by_id]
            for a in ts.attempts:                   # the flags were False when not set: leave them out
                for flag in ("moved", "considered", "escalation", "needed"):
                    if not a[flag]:
                        del a[flag]
            if code == "m":
                st._transition(ts, "held", "rebuilt")
                ts.held_by = set(detail)
                st.awaited_workers = set(st.awaited_workers) | ts.held_by
            elif code == "e":
                st._transition(ts, "erred", "rebuilt")
                ts.error = detail
            if ts.replicas > 1:
                st.replicated.add(key)
    st._seq = itertools.count(top + 1)          # new tasks come after the recovered ones
    for key, spec in recovered.specs.items():
        ts = st.tasks[key]
        for dkey in spec[4]:
            dep = st.tasks.get(dkey)
            if dep is not None:
                own(ts, "dependencies").add(dep)
                add_edge(dep, "dependents", ts)
    # What was to be computed goes again, waiting for held inputs; what nobody needs goes.
    for ts in sorted(st.tasks.values(), key=lambda t: t.priority):
        if ts.state == "released" and ts.who_wants:
            st._activate(ts)
    for ts in list(st.tasks.values()):
        if ts.state in ("released", "held", "erred") and st.tasks.get(ts.key) is ts:
            st._maybe_release(ts)
    st._schedule()
    st.take_outbox()                            # nobody is connected to be told anything yet
    return st
