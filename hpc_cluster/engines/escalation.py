"""Retry by cause on the distributed engine: a task killed for memory moves to a pool with more
memory (and one the walltime cut after half its job, to a pool with longer jobs), as on our
engine, by the same policy: scheduler/state/pools.py chooses the pool and writes the text.

distributed's scheduler knows nothing of pools, and our state holds none of its tasks, so the
bridge (bridge.py) calls two hooks here:

- `verdict(bridge, record, executing)` on a final verdict, before its ledger charges: each
  executing task whose death's cause says where it must go is pinned to that pool's workers and
  left out of the charge, so the death that moved it does not count toward allowed-failures;
  nor do later deaths of a moved task in a pool with less memory than the one it moved to
  (distributed ran it again where it was before the verdict came: it does not wait for one).
  The death record says so (`escalation`), as on our engine.
- `worker_joined(bridge, address)`: a worker of a pool that moved tasks are waiting for joins
  their restrictions.

Pinning uses distributed's own worker restrictions: the addresses of the pool's workers plus a
name that is never a worker's address (`pool_placeholder`), so that with no worker of the pool
up yet the set is not empty (empty means "anywhere") and the task waits in `no-worker` until
one joins; distributed looks at its no-worker tasks right after the plugins' add_worker.
A resource naming the pool would need the workers to start with it: restrictions need nothing
of the job scripts or the workers.

Jobs: the job manager sizes a pool by our state's pool_demand() (deploy/daemon/jobs.py,
demand_jobs). Our state has no distributed tasks, so the escalation adds its moved tasks to
that answer (it wraps pool_demand on this state object, not the class): a job of the bigger
pool is submitted for them, and the pool shrinks once they are done.
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from dataclasses import dataclass, field
from types import SimpleNamespace

from ..protocol.messages import MEMORY_CAUSES, Cause
from ..scheduler.state.placement import worker_pool
from ..scheduler.state.pools import PoolsMixin

logger = logging.getLogger("hpc_cluster.engines")

DONE = ("memory", "erred", "forgotten")
_BY_BRIDGE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def pool_placeholder(pool: str) -> str:
    """In a moved task's worker restrictions: never a worker's address (so never valid)."""
    return f"hpc-cluster-pool://{pool}"


class _NoDurations:
    """distributed's tasks have no duration= of ours: expected from what they ran alone."""

    @staticmethod
    def expected(ts):
        return None


class _Policy(PoolsMixin):
    """pools.py's choice of the next pool (_memory_move, _walltime_move) with our state's pools
    and policy, on a stand-in for a distributed task; the move is kept here, not in a state."""

    def __init__(self, pools: dict, escalate: dict):
        self.pools, self.escalate, self.durations = pools, escalate, _NoDurations()
        self.touched_deaths = None
        self.chosen: tuple | None = None

    def _touch(self, ts) -> None:
        return None

    def _move(self, ts, attempt, target, text, memory=None) -> None:
        self.chosen = (target, text, memory)

    def choose(self, ts, attempt: dict) -> tuple | None:
        """(pool, text, memory needed) where the death's cause sends the task, or None."""
        death, self.chosen = attempt["death"], None
        if death.get("blame") and death.get("cause") in MEMORY_CAUSES and self.escalate.get("memory"):
            self._memory_move(ts, attempt)
        elif death.get("cause") == Cause.WALLTIME and self.escalate.get("walltime"):
            self._walltime_move(ts, attempt)
        return self.chosen


@dataclass
class Moved:
    """A distributed task's moves: where it must run now, and the deaths that sent it there."""

    key: object
    pool: str | None = None
    memory: int = 0                        # what it needs there (pools.py's peak x margin)
    attempts: list = field(default_factory=list)
    resources: dict = field(default_factory=dict)

    def stand_in(self):
        """What pools.py reads of a task (pool, memory, resources, duration, attempts)."""
        return SimpleNamespace(key=self.key, pool=self.pool, memory=self.memory, resources=self.resources,
                               duration=None, attempts=self.attempts, escalation=None)


class Escalation:
    def __init__(self, bridge):
        self.bridge = bridge
        self.tasks: dict = {}              # key -> Moved: every task with a death on record here
        state = bridge.ours.state
        ours = getattr(state, "pool_demand", None)
        if callable(ours):
            # The job manager asks the state; the moved tasks are ours to add (module docstring).
            def pool_demand() -> dict:
                out = dict(ours() or {})
                for name, threads in self.demand().items():
                    out[name] = self._capped(name, out.get(name, 0) + threads)
                return out
            state.pool_demand = pool_demand

    # -- what the state knows of pools -------------------------------------------------------
    @property
    def pools(self) -> dict:
        return getattr(self.bridge.ours.state, "pools", None) or {}

    def _moves_possible(self) -> bool:
        escalate = getattr(self.bridge.ours.state, "escalate", None) or {}
        return len(self.pools) > 1 and bool(escalate.get("memory") or escalate.get("walltime"))

    def _capped(self, name: str, threads: int) -> int:
        pool = self.pools.get(name) or {}
        if pool.get("max_jobs") is None:
            return threads
        return min(threads, pool["max_jobs"] * pool["processes"] * pool["nthreads"])

    # -- the hooks -----------------------------------------------------------------------------
    def verdict(self, record: dict, executing: dict) -> dict:
        """The tasks of `executing` (key -> seconds it ran) the ledger is to charge for this final
        verdict: those it moved, or that had moved already to a bigger pool, are left out."""
        if not executing or not self._moves_possible():
            return executing
        state = self.bridge.ours.state
        policy = _Policy(self.pools, state.escalate)
        charge = {}
        for key, ran in executing.items():
            moved = self.tasks.get(key)
            if moved is None:
                moved = self.tasks[key] = Moved(key, resources=self._resources_of(key))
            if self._moved_past(moved, record):
                self._note(record, key, f"not charged: already moved to {moved.pool} (it ran again in "
                                        f"{record.get('pool')} before the verdict that moved it)")
                continue
            attempt = {"death": record, "ran_for": ran, "pool": record.get("pool")}
            moved.attempts.append(attempt)
            chosen = policy.choose(moved.stand_in(), attempt)
            if chosen is None:
                charge[key] = ran
                continue
            target, text, memory = chosen
            moved.pool = target
            if memory:
                moved.memory = max(moved.memory, memory)
            attempt["moved"], attempt["escalation"] = True, text
            self._note(record, key, text)
            self._pin(key, target)
        return charge

    def worker_joined(self, address: str) -> None:
        """A worker joined: tasks moved to its pool may run on it."""
        ws = self.bridge.ours.state.workers.get(address)
        ds = self.bridge.ds
        if ws is None or ds is None or not self.tasks:
            return
        pool = worker_pool(ws)
        for key, moved in list(self.tasks.items()):
            ts = ds.tasks.get(key)
            if ts is None or ts.state in DONE:
                del self.tasks[key]
            elif moved.pool == pool and ts.worker_restrictions:
                ts.worker_restrictions.add(address)

    def demand(self) -> dict[str, int]:
        """Threads each pool needs for the moved tasks not done yet (pools.py's count per task)."""
        ds, pools = self.bridge.ds, self.pools
        threads: dict[str, float] = {}
        for key, moved in list(self.tasks.items()):
            ts = ds.tasks.get(key) if ds is not None else None
            if ts is None or ts.state in DONE:
                del self.tasks[key]
                continue
            if moved.pool in pools and ts.state != "released":
                per = PoolsMixin._threads_per_task(SimpleNamespace(memory=moved.memory, resources=moved.resources),
                                                   pools[moved.pool])
                threads[moved.pool] = threads.get(moved.pool, 0.0) + per
        return {name: math.ceil(n - 1e-9) for name, n in threads.items()}

    # -- distributed's side ----------------------------------------------------------------------
    def _resources_of(self, key) -> dict:
        ts = self.bridge.ds.tasks.get(key) if self.bridge.ds is not None else None
        return dict(getattr(ts, "resource_restrictions", None) or {})

    def _moved_past(self, moved: Moved, record: dict) -> bool:
        """Did this death come in a pool with less memory than the one the task moved to?"""
        if moved.pool is None or record.get("cause") not in MEMORY_CAUSES:
            return False
        here, there = self.pools.get(record.get("pool") or "default"), self.pools.get(moved.pool)
        if here is None or there is None:
            return False
        return bool(here["memory"]) and (not there["memory"] or here["memory"] < there["memory"])

    def _pin(self, key, pool: str) -> None:
        """Only workers of `pool` may run the task from now on; if it is queued or running
        elsewhere (distributed started it again before the verdict), it starts over there."""
        ds = self.bridge.ds
        ts = ds.tasks.get(key) if ds is not None else None
        if ts is None or ts.state in DONE:
            return
        workers = {a for a, ws in self.bridge.ours.state.workers.items()
                   if worker_pool(ws) == pool and not ws.draining and a in ds.workers}
        ts.worker_restrictions = {pool_placeholder(pool), *workers}
        ts.host_restrictions = set()
        ts.loose_restrictions = False
        if ts.state in ("processing", "queued", "no-worker"):
            ds.transitions({key: "released"}, f"hpc-cluster-escalation-{time.time()}")
        logger.info("task %r moved to pool %s (%d worker(s) of it up)", key, pool, len(workers))

    def _note(self, record: dict, key, text: str) -> None:
        """The death record says why a task it was executing was not charged (as pools.py's _move)."""
        said = text if len(record.get("executing") or ()) <= 1 else f"{key!r}: {text}"
        record["escalation"] = f"{record['escalation']}; {said}" if record.get("escalation") else said
        touched = getattr(self.bridge.ours.state, "touched_deaths", None)
        if touched is not None:
            touched.add(record["id"])


def for_bridge(bridge) -> Escalation:
    esc = _BY_BRIDGE.get(bridge)
    if esc is None:
        esc = _BY_BRIDGE[bridge] = Escalation(bridge)
    return esc


def verdict(bridge, record: dict, executing: dict) -> dict:
    """bridge.on_verdict's hook, before the ledger charges: what it is to charge."""
    return for_bridge(bridge).verdict(record, executing)


def worker_joined(bridge, address: str) -> None:
    """bridge.add_worker's hook, once the worker is mirrored in our state."""
    for_bridge(bridge).worker_joined(address)
