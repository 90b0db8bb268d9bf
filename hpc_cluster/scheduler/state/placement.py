"""Where a task may run and where it should: pure functions over scheduler state.

A task goes to a worker with a free slot that (0) is of the pool it must run on, with its
memory= free (pools.py), and one of its workers= if it names some (restrictions.py; a loose
one prefers them), (1) has the resources it asks for and (2) still has time for it (expected run x1.1 + 1 s) before the worker's job hits its walltime, judged from the
duration the user gave (`submit(..., duration=)`) or the one learned from earlier tasks
of the same function. (Paused workers, over their memory's pause fraction, have no free
slot: the state machine leaves them out.) Among those, in order:

1. the worker already holding most of the task's input bytes: moving a result costs a
   copy in a second worker's memory as well as the transfer;
2. a worker with memory to spare: below its spill fraction rather than above it (there it
   is writing results to disk to make room);
3. the least busy (tasks per thread);
4. the one with the most memory left (of its limit);
5. the lowest address, so the same events place tasks the same way.
"""

from __future__ import annotations

import math

import re

# A task is started only if its expected run, with 10 % and 1 s to spare, ends before the deadline.
FIT_FACTOR = 1.1
FIT_SLACK = 1.0

# A job's first minutes go to starting its worker (the queue's prologue, module loads, Python's
# imports, registering), and batch systems count walltime in whole minutes (SLURM rounds up):
# advice that left no room for these named a walltime still too short for the task (issue 34).
STARTUP_ALLOWANCE = 120


def seconds_for(expected: float) -> int:
    """The walltime a job needs to start a task expected to take this long: a whole number of
    minutes covering the task with its margin and the worker's start."""
    need = expected * FIT_FACTOR + FIT_SLACK + STARTUP_ALLOWANCE
    return 60 * math.ceil(round(need / 60, 6))

_TOKEN = re.compile(r"-[0-9a-f]{8,}$")
_TUPLE_KEY = re.compile(r"""^\(['"]([^'"]+)['"],""")      # a dask key such as "('sum-3a9c...', 0, 1)"


def key_prefix(key: str) -> str:
    """'inc-3a9c0d1e...' -> 'inc', "('sum-3a9c...', 0, 1)" -> 'sum': tasks of one function
    share a learned duration."""
    if not isinstance(key, str):
        return str(key)
    m = _TUPLE_KEY.match(key)
    return _TOKEN.sub("", m.group(1) if m else key)


class TaskDurations:
    """Learned run times per function: an exponentially weighted average per key prefix."""

    def __init__(self, alpha: float = 0.5):
        self.alpha = alpha
        self.by_prefix: dict[str, float] = {}

    def learn(self, key: str, seconds: float) -> None:
        if seconds is None or seconds < 0:
            return
        p = key_prefix(key)
        old = self.by_prefix.get(p)
        self.by_prefix[p] = seconds if old is None else self.alpha * seconds + (1 - self.alpha) * old

    def expected(self, ts) -> float | None:
        if ts.duration is not None:
            return ts.duration
        return self.by_prefix.get(key_prefix(ts.key))


def expected_duration(ts, durations: TaskDurations) -> float | None:
    """What placement assumes a task will take: what the user said or tasks like it took,
    and never less than it already ran before a worker's death cut it off (a task the
    walltime killed after 40 s needs more than 40 s on its next worker)."""
    expected = durations.expected(ts)
    ran = ran_at_least(ts)
    return ran if ran and (expected is None or ran > expected) else expected


def ran_at_least(ts) -> float:
    """The longest the task ran before a death cut it off (0 if it never did)."""
    return max((a["ran_for"] or 0 for a in ts.attempts), default=0)


def has_resources(ts, ws) -> bool:
    for r, n in (ts.resources or {}).items():
        if ws.resources.get(r, 0) - ws.used_resources.get(r, 0) < n:
            return False
    return True


def worker_pool(ws) -> str:
    return ws.info.get("pool") or "default"


def fits_worker(ts, ws, pools: dict | None) -> bool:
    """Its pool (a task that names none may not use an escalation_only pool's workers), and
    its memory= within what the worker's memory_limit has not reserved for others yet."""
    pool = worker_pool(ws)
    if ts.pool is not None:
        if pool != ts.pool:
            return False
    elif pools and (pools.get(pool) or {}).get("escalation_only"):
        return False
    return not ts.memory or not ws.memory_limit or ws.used_memory + ts.memory <= ws.memory_limit


def has_time(expected: float | None, ws, now: float) -> bool:
    """Would a task expected to take `expected` seconds finish before this worker's deadline?"""
    if ws.deadline is None or expected is None:
        return True                       # no deadline, or nothing learned yet: run it and learn
    return now + expected * FIT_FACTOR + FIT_SLACK <= ws.deadline


# Where a worker that did not say otherwise starts spilling (dask's distributed.worker.memory.spill).
SPILL_FRACTION = 0.7


def memory_room(ws) -> tuple[bool, float]:
    """(below the fraction of its limit where it spills, the fraction of its limit still
    free), from the worker's last memory report; a worker without a limit or a report has room."""
    rss = ws.memory.get("rss")
    if not ws.memory_limit or rss is None:
        return True, 1.0
    used = rss / ws.memory_limit
    spill = (ws.info.get("memory_fractions") or {}).get("spill") or SPILL_FRACTION
    return used <= spill, 1.0 - used


# Root tasks (no inputs) wait at the scheduler until a worker has a slot for them, as with
# dask's root-task queuing: prefetching them would make results faster than their
# dependents can consume them (a 20000^2 array's chunks piled up on the workers). Tasks this
# short are still prefetched: for them the round trip is the cost.
SHORT_ROOT = 0.005
# A worker's slots for root tasks: its threads times this, rounded up. dask's default
# (distributed.scheduler.worker-saturation) is 1.1, which gives a 1-thread worker two; on
# benchmarks/collections.py that was no faster for us (a: 3.8 vs 3.4 s, b: 4.1 vs 3.8 s,
# e: 4.2 vs 4.0 s, 2 workers x 1 thread, one run each) and held more memory (a: 0.28 vs
# 0.25 GiB), so one slot per thread: a worker reports a result before it spills (worker.py),
# so the next root arrives one round trip after the last ended.
ROOT_SATURATION = 1.0


def is_queued_root(ts, expected: float | None) -> bool:
    return not ts.dependencies and (expected is None or expected >= SHORT_ROOT)


def has_root_slot(ws) -> bool:
    return len(ws.processing) - len(ws.seceded) < max(math.ceil(ws.nthreads * ROOT_SATURATION), 1)


def pick_worker(ts, free, expected: float | None, now: float, queue_root: bool = False,
                pools: dict | None = None):
    """The best worker for `ts` among `free` ones, or None if none fits (it waits).
    `queue_root`: only a worker with a root slot open will do (is_queued_root). A task with
    workers= (restrictions.py) goes to one of those; a loose one, if none of them fits, to any."""
    where = ts.where
    if where is not None:
        best = best_worker(ts, [ws for ws in free if ws in where.matching], expected, now, queue_root, pools)
        if best is not None or not where.loose:
            return best
    return best_worker(ts, free, expected, now, queue_root, pools)


def best_worker(ts, free, expected: float | None, now: float, queue_root: bool = False,
                pools: dict | None = None):
    """pick_worker's choice among `free`, its workers= aside."""
    best, best_score = None, None
    needs = ts.pool is not None or ts.memory or pools
    for ws in free:
        if ws.draining or (ts.resources and not has_resources(ts, ws)) or not has_time(expected, ws, now):
            continue
        if needs and not fits_worker(ts, ws, pools):
            continue
        if queue_root and not has_root_slot(ws):
            continue
        local = 0
        for dep in ts.dependencies:
            if ws in dep.who_has:
                local += dep.nbytes or 1
        roomy, left = memory_room(ws)
        score = (local, roomy, -len(ws.processing) / ws.nthreads, left)
        # Ties go to the lowest address, not to the set's order (which follows memory
        # addresses): the same events must place tasks the same way (tests/unit/scheduler/test_state_fuzz.py).
        if best_score is None or score > best_score or score == best_score and ws.address < best.address:
            best, best_score = ws, score
    return best


# Moving a result costs its bytes over the network and a second copy in memory; waiting for
# the worker that has them costs its queue. dask weighs the same two (its default bandwidth
# estimate is 100 MB/s); below a megabyte moving is always cheaper than thinking about it.
BANDWIDTH = 100e6
LOCALITY_MIN_BYTES = 2**20


def wait_for_holder(ts, chosen, durations, now: float, pools: dict | None = None) -> bool:
    """True when `ts` should wait for the busy worker holding most of its input bytes rather
    than run on `chosen` (free) after copying them: the copy would take longer than the
    holder's queue ahead of it. A paused or draining holder is not waited for.

    Tasks in that queue whose durations are not known yet count as nothing: with no
    evidence that the holder is slow, the task stays with its data, as in dask (whose
    scheduler places a task only among the holders of its inputs, and moves it later only
    once durations are known). Counting them as dask's 0.5 s default instead sent the
    slices of a rechunk to the other worker, each copying the whole 143 MB block it cut a
    13 MB piece from (1.85 GB copied for a 1.5 GB array)."""
    held: dict = {}
    for dep in ts.dependencies:
        for w in dep.who_has:
            held[w] = held.get(w, 0) + (dep.nbytes or 0)
    if not held:
        return False
    holder = max(held, key=lambda w: (held[w], w.address))       # ties: the same one every time
    missing = held[holder] - held.get(chosen, 0)
    if holder is chosen or missing < LOCALITY_MIN_BYTES or holder.paused or holder.draining:
        return False
    if ts.where is not None and holder not in ts.where.matching:
        return False                      # not one of its workers= (or not the ones it prefers)
    if ts.resources and not has_resources(ts, holder):
        return False
    if (ts.pool is not None or ts.memory or pools) and not fits_worker(ts, holder, pools):
        return False
    if not has_time(expected_duration(ts, durations), holder, now):
        return False
    queued, running = 0.0, []
    for other in holder.processing:
        expected = expected_duration(other, durations) or 0.0
        if other.executing:
            running.append(max(0.0, expected - (now - (other.started_at or now))))
        else:
            queued += expected
    # Its threads are busy until the first running task ends (if all are busy), then the queue.
    first_slot = min(running) if len(running) >= holder.nthreads else 0.0
    return first_slot + queued / holder.nthreads < missing / BANDWIDTH


def workload(state, pool: str | None = None, unknown: float = 1.0) -> float:
    """Expected seconds of work not yet done (queued, waiting, processing): adapt() sizes by it.
    With `pool`, only the work that goes to that pool (state.task_pool)."""
    total = 0.0
    for ts in state.tasks.values():
        if ts.state in ("waiting", "queued", "processing"):
            expected = expected_duration(ts, state.durations)
            if pool is not None and state.task_pool(ts, expected) != pool:
                continue
            total += unknown if expected is None else expected
    return total
