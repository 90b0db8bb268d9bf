"""Worker pools: placement by need, demand per pool, retry by cause. Mixed into SchedulerState.

One cluster may run several kinds of job (the cluster classes' `pools=`), each pool's
workers with their own memory, walltime, threads and resources. The deploy half says what
they are (`set_pools`), and a worker names its pool when it registers (`info["pool"]`).
Without `set_pools` none of this applies: the scheduler places and retries as it always did.

- Needs: a task's memory= (reserved per running task within the worker's memory_limit,
  like resources), pool=, resources= and expected duration. It runs only where they fit;
  one that fits no pool fails at once, naming the largest pool and the keyword to change,
  rather than wait for a worker that no job will ever bring.
- `pool_demand()` tells the job manager how many threads each pool should have for work
  that only that pool can run: a job of the big pool is submitted for the task that needs it.
- Retry by cause: a *final* verdict that charges a task for memory means it would die again
  where it died, so it moves to the smallest pool with memory >= its observed peak x margin,
  and is not charged while a bigger pool exists. A task the walltime cut after half its job
  or more moves to a pool with longer jobs. Innocent deaths retry where they were.
  escalation_only pools take only moved tasks and tasks that name them.
"""

from __future__ import annotations

import math

from ...units import format_memory
from ...protocol.messages import MEMORY_CAUSES, Cause, ErrorKind
from ..diagnosis import ask_for, fmt_seconds
from .placement import FIT_FACTOR, FIT_SLACK, expected_duration, has_time, seconds_for, worker_pool

INF = float("inf")
ESCALATE = {"memory": True, "walltime": True, "margin": 1.5}
# A task the walltime cut after r seconds was still running: it needs more than r, and we
# guess up to twice that (as the margin guesses for memory). A task cut within the first
# half of its job may just have started late in it: it retries in its pool.
WALLTIME_GROWTH = 2.0


def pool_spec(spec: dict) -> dict:
    """A pool as the deploy half describes it (the contract in the issue), gaps filled."""
    return {"memory": int(spec.get("memory") or 0),
            "walltime": float(spec["walltime"]) if spec.get("walltime") else None,
            "nthreads": max(1, int(spec.get("nthreads") or 1)),
            "processes": max(1, int(spec.get("processes") or 1)),
            "resources": dict(spec.get("resources") or {}),
            "max_jobs": None if spec.get("max_jobs") is None else int(spec["max_jobs"]),
            "escalation_only": bool(spec.get("escalation_only"))}


def _memory_of(pool: dict) -> float:
    return pool["memory"] or INF                       # 0: no limit


def _walltime_of(pool: dict) -> float:
    return pool["walltime"] or INF


def _fits_time(seconds: float | None, walltime: float | None) -> bool:
    return seconds is None or not walltime or seconds * FIT_FACTOR + FIT_SLACK <= walltime


def misfit(ts, name: str, pool: dict, expected: float | None, memory: int | None = None,
           any_pool: bool = False) -> str | None:
    """The keyword that keeps pool `name`'s workers from ever holding the task, or None.
    `any_pool`: whatever pool it names or is barred from (where a move could take it)."""
    if not any_pool and ((ts.pool or name) != name or (not ts.pool and pool["escalation_only"])):
        return "pool"
    need = ts.memory if memory is None else memory
    if need and pool["memory"] and need > pool["memory"]:
        return "memory"
    if any(pool["resources"].get(r, 0) < n for r, n in (ts.resources or {}).items()):
        return "resources"
    if not _fits_time(expected, pool["walltime"]):
        return "walltime"
    return None




def decimal_size(n) -> str:
    """Pool sizes as users write them: '64 GB', '1.5 GB', '300 MB'."""
    if not n:
        return "no memory limit"
    return format_memory(n, decimal=True, significant=3)


def _used_of(peak, limit) -> str:
    """'3.9 of 4.0 GiB', '290 of 300 MiB': the peak the way the verdict's evidence reads."""
    name, digits = ("GiB", 1) if (limit or peak or 0) >= 2**30 else ("MiB", 0)
    if not limit:
        return format_memory(peak, name, digits)
    return f"{format_memory(peak, name, digits).split()[0]} of {format_memory(limit, name, digits)}"   # one unit


def _at_limit(peak, limit) -> str:
    """The kernel ended it at its cgroup limit, above the last peak the nanny sampled (a fast
    allocation falls between two samples): 'its 286 MiB limit (101 MiB sampled)'."""
    name, digits = ("GiB", 1) if limit >= 2**30 else ("MiB", 0)
    return f"its {format_memory(limit, name, digits)} limit ({format_memory(peak, name, digits)} sampled)"


def _new_name(pools: dict, name: str) -> str:
    i = 2
    out = name
    while out in pools:
        out, i = f"{name}{i}", i + 1
    return out


class PoolsMixin:
    # -- what the deploy half tells us, and asks ----------------------------------------
    def set_pools(self, pools: dict, escalate: dict | None = None) -> None:
        """The cluster's pools ({name: {memory, walltime, nthreads, processes, resources,
        max_jobs, escalation_only}}) and the policy for moves ({memory, walltime, margin})."""
        escalate = dict(ESCALATE, **(escalate or {}))
        if not float(escalate["margin"]) >= 1.0:
            raise ValueError(f"escalate margin={escalate['margin']!r}: a task's next pool holds its observed peak "
                             "times the margin, so it must be at least 1 (default 1.5)")
        self.pools = {str(name): pool_spec(spec or {}) for name, spec in (pools or {}).items()}
        self.escalate = dict(escalate, margin=float(escalate["margin"]))
        self._unchecked.extend(ts for ts in self.tasks.values() if ts.state == "queued")
        self._schedule()

    def pool_demand(self) -> dict[str, int]:
        """Threads each pool should have for the work only it can run (queued and running):
        tasks whose needs fit no live, non-draining worker of another pool, counted for the
        smallest pool that fits them (or the pool they must run on), at most max_jobs' worth."""
        if not self.pools:
            return {}
        live = [ws for ws in self.workers.values() if not ws.draining]
        wanted = dict.fromkeys(self.pools, 0.0)
        by_needs: dict = {}               # tasks alike in needs go to the same pool: decide once
        for ts in self.tasks.values():
            if ts.state not in ("queued", "processing") or ts.state == "queued" and self._awaiting_verdict(ts):
                continue                  # not ready, or its next pool is not decided yet
            if ts.where is not None and not ts.where.loose:
                continue                  # workers= names its workers: a new job's would not do (restrictions.py)
            expected = expected_duration(ts, self.durations)
            needs = (ts.pool, ts.memory, tuple(sorted((ts.resources or {}).items())), expected)
            if needs not in by_needs:
                by_needs[needs] = self._demand_pool(ts, expected, live)
            name = by_needs[needs]
            if name is not None:
                wanted[name] += self._threads_per_task(ts, self.pools[name])
        out = {}
        for name, pool in self.pools.items():
            threads = math.ceil(wanted[name] - 1e-9)
            if pool["max_jobs"] is not None:
                threads = min(threads, pool["max_jobs"] * pool["processes"] * pool["nthreads"])
            out[name] = threads
        return out

    def task_pool(self, ts, expected: float | None = None) -> str | None:
        """The pool a task's work goes to (placement.workload per pool): the one it runs on,
        the one it must run on, else the smallest that fits it."""
        if ts.processing_on is not None:
            return worker_pool(ts.processing_on)
        if ts.pool is not None or not self.pools:
            return ts.pool or "default"
        return self._smallest_fit(ts, expected)

    # -- placement ------------------------------------------------------------------------
    def _smallest_fit(self, ts, expected) -> str | None:
        fitting = [n for n, p in self.pools.items() if misfit(ts, n, p, expected) is None]
        return min(fitting, key=self._size) if fitting else None

    def _size(self, name: str) -> tuple:
        """Smaller pools first: memory, then walltime; the cluster's own pool wins ties."""
        pool = self.pools[name]
        return (_memory_of(pool), _walltime_of(pool), name != "default", name)

    def _demand_pool(self, ts, expected, live) -> str | None:
        if ts.pool is not None:
            return ts.pool if ts.pool in self.pools else None
        name = self._smallest_fit(ts, expected)
        if name is None or any(worker_pool(ws) != name and self._could_hold(ts, ws, expected) for ws in live):
            return None
        return name

    def _could_hold(self, ts, ws, expected) -> bool:
        """Could this worker run the task once it is free (its totals, not what is free now)?"""
        if (self.pools.get(worker_pool(ws)) or {}).get("escalation_only"):
            return False
        if ts.memory and ws.memory_limit and ts.memory > ws.memory_limit:
            return False
        if any(ws.resources.get(r, 0) < n for r, n in (ts.resources or {}).items()):
            return False
        return has_time(expected, ws, self.now)

    @staticmethod
    def _threads_per_task(ts, pool: dict) -> float:
        """A task holds one thread, or more when its memory or resources leave room for
        fewer tasks than threads on a worker (2 tasks of 30 GB on a 64 GB, 8-thread worker)."""
        per_worker = pool["nthreads"]
        if ts.memory and pool["memory"]:
            per_worker = min(per_worker, pool["memory"] // ts.memory)
        for r, n in (ts.resources or {}).items():
            if n > 0:
                per_worker = min(per_worker, int(pool["resources"].get(r, 0) // n))
        return pool["nthreads"] / max(1, per_worker)

    def _check_placeable(self) -> None:
        """Fail at once the tasks queued since the last look that no pool can hold."""
        todo, self._unchecked = self._unchecked, []
        for ts in todo:
            if ts.state == "queued" and self.tasks.get(ts.key) is ts and not self._awaiting_verdict(ts):
                error = self._unplaceable(ts, expected_duration(ts, self.durations))
                if error is not None:
                    self._err(ts, error)

    def _unplaceable(self, ts, expected) -> dict | None:
        """The error of a task that no worker can ever run, or None (it may wait). With pools,
        a task longer than any job of the pools it may use moves to one with longer jobs."""
        if not self.pools:
            return self._too_long_error(ts, expected) if self._fits_nowhere(ts, expected) else None
        why = {n: misfit(ts, n, p, expected) for n, p in self.pools.items()}
        if None in why.values():
            return None
        if self.escalate["walltime"] and "walltime" in why.values():
            longer = [n for n, p in self.pools.items() if misfit(ts, n, p, expected, any_pool=True) is None]
            if longer:
                target = min(longer, key=lambda n: (_walltime_of(self.pools[n]), self._size(n)))
                shorter = next(n for n, w in why.items() if w == "walltime")
                self._move(ts, None, target, f"moved to {target} ({fmt_seconds(self.pools[target]['walltime'])} "
                           f"walltime): expected to run {expected:.0f} s, too long for the jobs of {shorter} "
                           f"({fmt_seconds(self.pools[shorter]['walltime'])})")
                return None
        return self._no_pool_error(ts, expected, why)

    def _no_pool_error(self, ts, expected, why: dict) -> dict:
        pools, key = self.pools, ts.key
        usable = [n for n, w in why.items() if w != "pool"]
        if ts.pool is not None and ts.pool not in pools:
            return {"kind": ErrorKind.NO_POOL, "need": "pool", "needed": ts.pool, "largest_pool": None,
                    "text": f"task {key!r} names pool={ts.pool!r}, which this cluster does not have (its pools: "
                            f"{', '.join(map(repr, pools))}): name one of those, or add it: "
                            f"pools={{{ts.pool!r}: {{'memory': ..., 'walltime': ...}}}}"}
        if not usable:                    # it may use none: only escalation_only pools fit
            only = ", ".join(repr(n) for n in pools if pools[n]["escalation_only"])
            return {"kind": ErrorKind.NO_POOL, "need": "pool", "needed": None, "largest_pool": None,
                    "text": f"task {key!r} fits only pools kept for retries ({only}: escalation_only): name "
                            f"one with pool=, or lower its needs (memory=, resources=, duration=)"}
        reasons = {why[n] for n in usable}
        if "memory" in reasons:
            largest = max(usable, key=lambda n: (_memory_of(pools[n]), n))
            ask = ask_for(ts.memory)
            return {"kind": ErrorKind.NO_POOL, "need": "memory", "needed": ts.memory, "largest_pool": largest,
                    "text": f"task {key!r} needs memory={decimal_size(ts.memory)}, but the largest pool it may "
                            f"use, {largest!r}, has {decimal_size(pools[largest]['memory'])} per worker process: "
                            f"lower memory=, or add a pool with memory >= {ask}: "
                            f"pools={{{_new_name(pools, 'huge')!r}: {{'memory': {ask!r}}}}}"}
        if "resources" in reasons:
            shown = "; ".join(f"{n}: {pools[n]['resources'] or 'none'}" for n in usable)
            res = " ".join(f"{r}={n:g}" for r, n in sorted((ts.resources or {}).items()))
            return {"kind": ErrorKind.NO_POOL, "need": "resources", "needed": dict(ts.resources or {}), "largest_pool": None,
                    "text": f"task {key!r} asks for resources={ts.resources}, which no pool's workers have "
                            f"({shown}): lower resources=, or add a pool with them: "
                            f"pools={{{_new_name(pools, 'extra')!r}: {{'resources': {res!r}}}}}"}
        longest = max(usable, key=lambda n: (_walltime_of(pools[n]), n))
        walltime = pools[longest]["walltime"]
        ask = fmt_seconds(seconds_for(expected))
        return {"kind": ErrorKind.TOO_LONG, "walltime": walltime, "expected": expected, "largest_pool": longest,
                "text": f"task {key!r} cannot fit in any pool's jobs: it is expected to run {expected:.0f} s, and "
                        f"the longest walltime of the pools it may use is {walltime:.0f} s (pool {longest!r}; a "
                        f"task is started only "
                        f"with {FIT_FACTOR:.1f} x its expected time + {FIT_SLACK:.0f} s left): correct duration=, "
                        f"split the task, or add a pool with walltime >= {ask}: "
                        f"pools={{{_new_name(pools, 'long')!r}: {{'walltime': {ask!r}}}}}"}

    # -- retry by cause -------------------------------------------------------------------------
    def _moves_possible(self) -> bool:
        return len(self.pools) > 1 and bool(self.escalate["memory"] or self.escalate["walltime"])

    def _consider_moves(self, ts) -> None:
        """Each death's final verdict, once: move the task if its cause says where it must go."""
        if not self.pools:
            return
        for attempt in ts.attempts:
            death = attempt["death"]
            if attempt.get("considered") or death.get("final_at") is None:
                continue
            attempt["considered"] = True
            self._touch(ts)
            if death["blame"] and death["cause"] in MEMORY_CAUSES and self.escalate["memory"]:
                self._memory_move(ts, attempt)
            elif death["cause"] == Cause.WALLTIME and self.escalate["walltime"]:
                self._walltime_move(ts, attempt)

    def _memory_move(self, ts, attempt: dict) -> None:
        death, pools = attempt["death"], self.pools
        limit = death.get("memory_limit") or (pools.get(attempt.get("pool")) or {}).get("memory") or 0
        peak = death.get("peak_memory") or 0
        # The kernel ends a process when its cgroup is full: a peak sampled before a fast
        # allocation undercounts, the limit does not.
        basis = max(peak, limit if death["cause"] == Cause.MEMORY_BATCH else 0) or limit
        if not basis:
            return                         # nothing known of its memory: charged as before
        sampled_low = death["cause"] == Cause.MEMORY_BATCH and 0 < peak < 0.9 * limit
        need = max(ts.memory, math.ceil(basis * self.escalate["margin"]))
        attempt["needed"] = need
        expected = expected_duration(ts, self.durations)
        bigger = [n for n, p in pools.items() if _memory_of(p) > (limit or basis)
                  and misfit(ts, n, p, expected, memory=0, any_pool=True) is None]
        if not bigger:
            return                         # no bigger pool: charged as before
        holding = [n for n in bigger if _memory_of(pools[n]) >= need]
        # None holds peak x margin: the biggest, with what it has (the peak is a floor, not a need).
        target = min(holding, key=self._size) if holding else max(bigger, key=self._size)
        size = pools[target]["memory"]
        text = (f"attempt {len(ts.attempts) + 1} on {target} ({decimal_size(size)}) after {death['cause']} "
                f"at {_at_limit(peak, limit) if sampled_low else _used_of(peak or basis, limit)}"
                + ("" if holding else f" (the largest pool; {self.escalate['margin']:g} x its peak would be "
                                      f"{decimal_size(need)})"))
        self._move(ts, attempt, target, text, memory=min(need, size) if size else need)

    def _walltime_move(self, ts, attempt: dict) -> None:
        death, pools = attempt["death"], self.pools
        walltime = death.get("walltime") or (pools.get(attempt.get("pool")) or {}).get("walltime")
        ran = attempt.get("ran_for") or 0
        if not walltime or not ran:
            return
        need = max(expected_duration(ts, self.durations) or 0, ran * WALLTIME_GROWTH)
        attempt["needed"] = need
        if _fits_time(need, walltime):
            return                         # cut early in its job: a fresh job of its pool may do
        longer = [n for n, p in pools.items() if _walltime_of(p) > walltime
                  and misfit(ts, n, p, None, any_pool=True) is None]
        if not longer:
            return                         # counted against walltime_failures, as before
        holding = [n for n in longer if _fits_time(need, pools[n]["walltime"])]
        order = (lambda n: (_walltime_of(pools[n]), self._size(n)))
        target = min(holding, key=order) if holding else max(longer, key=order)
        self._move(ts, attempt, target,
                   f"attempt {len(ts.attempts) + 1} on {target} ({fmt_seconds(pools[target]['walltime'])} "
                   f"walltime) after walltime at {fmt_seconds(ran)} of {fmt_seconds(walltime)}")

    def _move(self, ts, attempt: dict | None, target: str, text: str, memory: int | None = None) -> None:
        """Pin the task to `target`; the attempt that caused it no longer counts against it."""
        if memory is not None and memory != ts.memory:
            if ts.processing_on is not None:              # keep its worker's reservation right
                ts.processing_on.used_memory += memory - ts.memory
            ts.memory = memory
        ts.pool, ts.escalated, ts.escalation = target, True, text
        self._touch(ts)
        if attempt is not None:
            if self.touched_deaths is not None:
                self.touched_deaths.add(attempt["death"]["id"])
            attempt["moved"], attempt["escalation"] = True, text
            death = attempt["death"]
            said = text if len(death.get("executing") or ()) <= 1 else f"{ts.key!r}: {text}"
            death["escalation"] = f"{death['escalation']}; {said}" if death.get("escalation") else said

    def _pool_advice(self, ts, kind: str) -> dict | None:
        """For a task that failed with no bigger (or longer) pool to go to: what it needed, the
        largest pool, and the pool to add."""
        if not self.pools:
            return None
        needed = max((a.get("needed") or 0 for a in ts.attempts), default=0)
        if kind == "memory":
            needed = needed or ts.memory
            largest = max(self.pools, key=lambda n: (_memory_of(self.pools[n]), n))
            ask = ask_for(needed) if needed else None
            text = (f"the largest pool, {largest!r}, has {decimal_size(self.pools[largest]['memory'])} per worker"
                    + (f" and the task needs about {decimal_size(needed)} ({self.escalate['margin']:g} x its peak): "
                       f"add a pool with memory >= {ask}: pools={{{_new_name(self.pools, 'huge')!r}: "
                       f"{{'memory': {ask!r}}}}}" if ask else ""))
        else:
            largest = max(self.pools, key=lambda n: (_walltime_of(self.pools[n]), n))
            ask = fmt_seconds(seconds_for(needed)) if needed else None
            text = (f"the longest walltime, pool {largest!r}'s, is {fmt_seconds(self.pools[largest]['walltime'])}"
                    + (f", and the task needs about {fmt_seconds(needed)}: add a pool with walltime >= {ask}: "
                       f"pools={{{_new_name(self.pools, 'long')!r}: {{'walltime': {ask!r}}}}}" if ask else ""))
        return {"needed": needed or None, "largest_pool": largest, "text": text}
