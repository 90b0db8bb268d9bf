"""Where a task may run and where it should: pure functions over scheduler state.

A task goes to a worker with a free slot that (1) has the resources it asks for and
(2) still has time for it (expected run x1.1 + 1 s) before the worker's job hits its walltime, judged from the
duration the user gave (`submit(..., duration=)`) or the one learned from earlier tasks
of the same function. Among those, the worker already holding most of its input bytes wins.
"""

from __future__ import annotations

import re

# A task is started only if its expected run, with 10 % and 1 s to spare, ends before the deadline.
FIT_FACTOR = 1.1
FIT_SLACK = 1.0

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


def has_time(expected: float | None, ws, now: float) -> bool:
    """Would a task expected to take `expected` seconds finish before this worker's deadline?"""
    if ws.deadline is None or expected is None:
        return True                       # no deadline, or nothing learned yet: run it and learn
    return now + expected * FIT_FACTOR + FIT_SLACK <= ws.deadline


def pick_worker(ts, free, expected: float | None, now: float):
    """The best worker for `ts` among `free` ones, or None if none fits (it waits)."""
    best, best_score = None, None
    for ws in free:
        if ws.draining or (ts.resources and not has_resources(ts, ws)) or not has_time(expected, ws, now):
            continue
        local = 0
        for dep in ts.dependencies:
            if ws in dep.who_has:
                local += dep.nbytes or 1
        score = (local, -len(ws.processing) / ws.nthreads)
        if best_score is None or score > best_score:
            best, best_score = ws, score
    return best


def workload(state, unknown: float = 1.0) -> float:
    """Expected seconds of work not yet done (queued, waiting, processing): adapt() sizes by it."""
    total = 0.0
    for ts in state.tasks.values():
        if ts.state in ("waiting", "queued", "processing"):
            expected = expected_duration(ts, state.durations)
            total += unknown if expected is None else expected
    return total
