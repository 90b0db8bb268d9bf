"""What each /api endpoint answers: plain dicts built from the scheduler's state (docs/dashboard.md
has the schema of each). Read-only: nothing here changes the state.

Each is built on the scheduler's event loop while a request waits, so each is bounded: lists
are capped (the page shows no more), and the one pass over every task (the progress per key
prefix) is made at most once a second whoever asks, and less often when it is slow, so that it
takes at most 2% of the scheduler's time however many tasks there are (`Views.tasks`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from operator import attrgetter

from ..scheduler.state.placement import worker_pool

MAX_WORKERS = 1000          # rows of the workers page
MAX_PREFIXES = 60           # progress bars
MAX_STREAM = 1000           # task-stream bars (recent executions): as dask's, "the most recent thousand tasks"
MAX_RUNNING = 1000          # task-stream bars still open
STREAM_WINDOW = 60.0        # seconds of task stream shown
MAX_DEATHS = 100            # newest first
MAX_JOBS = 500
MAX_SAMPLES = 2000          # points of a memory timeline sent (peaks kept when thinned)
TASKS_CACHE = 1.0           # seconds the per-prefix counts are reused, at least
COUNT_SHARE = 0.02          # ... and at most this share of the scheduler's time goes to them

# Task states -> the progress bar's columns (dask's: waiting, processing, memory, erred,
# released). "queued" waits for a thread; "held" is a result a worker keeps that a restarted
# scheduler waits to hear about again (scheduler/state/recovery.py).
COLUMN = {"waiting": "waiting", "queued": "waiting", "processing": "processing", "memory": "memory",
          "held": "memory", "erred": "erred", "released": "released"}
COLUMNS = ("waiting", "processing", "memory", "erred", "released")
_STATE = attrgetter("state")


def key_prefix(key: str) -> str:
    """The name part of a task key, as dask's key_split: 'inc-9f1c2d3e...' -> 'inc',
    "('sum-aggregate-ab12cd34ef', 0)" -> 'sum-aggregate'. Words stop at the first that holds
    anything but letters (a token, an index) or is an 8+ character hex word."""
    if key.startswith("("):                   # a dask key's repr: ('name-token', 0, 1)
        key = key[1:].split(",", 1)[0].strip("'\" ")
    words = key.split("-")
    out = [words[0]]
    for w in words[1:]:
        if not w.isalpha() or (len(w) >= 8 and all(c in "0123456789abcdef" for c in w)):
            break
        out.append(w)
    return "-".join(out) or key


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fraction_of(limit: int, fractions: dict | None, name: str) -> int | None:
    f = (fractions or {}).get(name)
    return int(limit * f) if limit and isinstance(f, float) and f else None


def workers(state, now: float) -> dict:
    """One row per connected worker: memory (process RSS, results held in memory, spilled),
    tasks, threads, job, node, pool, time left before its walltime, draining."""
    rows = []
    for ws in list(state.workers.values())[:MAX_WORKERS]:
        mem, info = ws.memory, ws.info
        fractions = info.get("memory_fractions")
        rows.append({
            "name": ws.name, "address": ws.address, "nthreads": ws.nthreads,
            "executing": len(ws.executing), "processing": len(ws.processing), "stored": len(ws.has_what),
            "memory_limit": ws.memory_limit or None,
            "pause_at": _fraction_of(ws.memory_limit, fractions, "pause"),
            "terminate_at": _fraction_of(ws.memory_limit, fractions, "terminate"),
            "rss": mem.get("rss"), "managed": mem.get("managed"), "spilled": mem.get("spilled"),
            "spilled_disk": mem.get("spilled_disk"), "memory_age": None if ws.memory_at is None else now - ws.memory_at,
            "job_id": info.get("job_id"), "node": info.get("host"), "pool": worker_pool(ws),
            "time_left": None if ws.deadline is None else ws.deadline - now,
            "status": "draining" if ws.draining else "paused" if ws.paused else "running",
            "joined": ws.joined, "last_seen": now - ws.last_seen,
        })
    return {"now": now, "total": len(state.workers), "workers": rows}


class Views:
    """The endpoints' answers for one scheduler. `jobs` (the daemon's): a callable returning
    the job manager's table (deploy/daemon/pools.py PoolManager.table()); None for a LocalCluster."""

    def __init__(self, scheduler, jobs=None, clock=time.time):
        self.scheduler, self.jobs_table, self.clock = scheduler, jobs, clock
        self._prefixes: tuple[float, dict] | None = None
        self._reuse = TASKS_CACHE                     # seconds the last counts stay good
        self._prefix_of: dict[str, str] = {}          # key -> key_prefix(key), for the tasks alive
        # Tasks seen by an earlier count and forgotten since (their results gathered and let
        # go), per prefix: the bar of a finished map still shows it done, as dask's does.
        self._gone: Counter = Counter()

    @property
    def state(self):
        return self.scheduler.state

    def workers(self) -> dict:
        return workers(self.state, self.clock())

    # -- tasks ---------------------------------------------------------------------------
    def _count_prefixes(self, now: float) -> dict:
        if self._prefixes is not None and 0 <= now - self._prefixes[0] < self._reuse:
            return self._prefixes[1]
        started = time.perf_counter()
        tasks, known = self.state.tasks, self._prefix_of
        # The prefix map follows the tasks by set differences (C speed); only new keys are split.
        gone = known.keys() - tasks.keys()
        if gone:
            self._gone.update(map(known.pop, gone))
            if len(self._gone) > 4 * MAX_PREFIXES:        # keys without a common name: bounded
                self._gone = Counter(dict(self._gone.most_common(2 * MAX_PREFIXES)))
        for key in tasks.keys() - known.keys():
            known[key] = key_prefix(key)
        # One pass over every task, counted by (prefix, state) in C: the cost per task is what
        # decides this page's cost with 100,000 tasks (docs/dashboard.md, BENCHMARKS.md).
        pairs = Counter(zip(map(known.__getitem__, tasks), map(_STATE, tasks.values())))
        counts: dict[str, dict[str, int]] = {}
        for prefix, n in self._gone.items():
            counts[prefix] = dict.fromkeys(COLUMNS, 0)
            counts[prefix]["released"] = n
        for (prefix, state), n in pairs.items():
            row = counts.get(prefix)
            if row is None:
                row = counts[prefix] = dict.fromkeys(COLUMNS, 0)
            row[COLUMN.get(state, "released")] += n
        rows = sorted(({"prefix": p, **c, "total": sum(c.values())} for p, c in counts.items()),
                      key=lambda r: (-r["total"], r["prefix"]))
        out = {"prefixes": rows[:MAX_PREFIXES], "prefixes_total": len(rows), "tasks_total": len(tasks),
               "counted_at": now}
        self._prefixes = (now, out)
        # 50 ms for 100,000 tasks: reused for 2.5 s, so a page asking every 2.5 s costs 2% at most.
        self._reuse = max(TASKS_CACHE, (time.perf_counter() - started) / COUNT_SHARE)
        return out

    def tasks(self) -> dict:
        now = self.clock()
        stream = self.scheduler.stream
        since = now - STREAM_WINDOW
        done = stream.recent(since, MAX_STREAM)
        running = stream.now_running(MAX_RUNNING)
        lanes: dict[str, int] = {}
        for ws in self.state.workers.values():
            lanes[ws.name] = ws.nthreads
        for entry in (*done, *running):
            lanes[entry[0]] = max(lanes.get(entry[0], 0), entry[1] + 1)
        counts = self._count_prefixes(now)
        known = self._prefix_of                       # most keys shown were counted a moment ago

        def prefix(key: str) -> str:
            return known.get(key) or key_prefix(key)
        return {"now": now, **counts,
                "stream": {"since": since, "window": STREAM_WINDOW, "lanes": lanes,
                           "done": [{"worker": w, "lane": lane, "key": k, "prefix": prefix(k), "start": a,
                                     "stop": b, "outcome": o} for w, lane, k, a, b, o in done],
                           "running": [{"worker": w, "lane": lane, "key": k, "prefix": prefix(k), "start": a}
                                       for w, lane, k, a in running]}}

    # -- jobs ------------------------------------------------------------------------------
    def jobs(self) -> dict:
        now = self.clock()
        if self.jobs_table is None:
            return {"now": now, "batch": False, "jobs": [], "pools": {}, "target": None, "halted": None,
                    "errors": []}
        table = self.jobs_table()
        keep = ("job_id", "index", "pool", "state", "raw_state", "reason", "node", "worker_names", "submitted",
                "started", "ended", "time_left", "memory", "memory_used", "spilled", "paused", "retiring")
        rows = [{k: r.get(k) for k in keep} for r in table.get("jobs", [])]
        rows.sort(key=lambda r: (r["state"] not in ("pending", "running"), -(r["submitted"] or 0)))
        return {"now": now, "batch": True, "jobs": rows[:MAX_JOBS], "jobs_total": len(rows),
                "target": table.get("target"), "halted": table.get("halted"),
                "errors": table.get("errors") or [], "adaptive": table.get("adaptive"),
                "pools": {name: {k: p.get(k) for k in ("target", "max_jobs", "cores", "memory", "processes",
                                                        "walltime", "queue", "adaptive", "halted")}
                          for name, p in (table.get("pools") or {}).items()}}

    # -- deaths ------------------------------------------------------------------------------
    def _memory_of(self, record: dict) -> dict | None:
        """The memory timeline of a death: the state's (death_memory, from the timeline work)
        or the record's own "memory"; None when there is none."""
        find = getattr(self.state, "death_memory", None)
        memory = find(record.get("id")) if callable(find) else None
        return memory if isinstance(memory, dict) else (
            record.get("memory") if isinstance(record.get("memory"), dict) else None)

    def deaths(self) -> dict:
        all_deaths = self.state.deaths
        rows = []
        for d in reversed(all_deaths[-MAX_DEATHS:]):
            memory = self._memory_of(d)
            samples = memory.get("samples") if memory else None
            rows.append({
                "id": d.get("id"), "time": d.get("time"), "worker": d.get("worker"), "name": d.get("name"),
                "cause": d.get("cause"), "blame": bool(d.get("blame")), "final": d.get("final_at") is not None,
                "text": d.get("text") or "", "evidence": list(d.get("evidence") or []),
                "advice": d.get("advice") or "", "executing": list(d.get("executing") or []),
                "job_id": d.get("job_id"), "pool": d.get("pool"), "memory_limit": d.get("memory_limit"),
                "peak_memory": d.get("peak_memory"), "escalation": d.get("escalation"),
                "log_tail": list(d.get("log_tail") or [])[-8:],
                "memory_samples": len(samples) if isinstance(samples, list) else 0,
            })
        return {"now": self.clock(), "total": len(all_deaths), "deaths": rows}

    def death_memory(self, death_id: int) -> dict | None:
        """The memory timeline of death `death_id` for its chart, or None if there is no such
        death. Over MAX_SAMPLES samples are thinned, keeping each stretch's highest."""
        record = next((d for d in reversed(self.state.deaths) if d.get("id") == death_id), None)
        if record is None:
            return None
        memory = self._memory_of(record)
        out = {"id": death_id, "worker": record.get("name") or record.get("worker"), "cause": record.get("cause"),
               "memory": None}
        if memory is None:
            return out
        samples = [s for s in memory.get("samples") or [] if isinstance(s, (list, tuple)) and len(s) == 2
                   and _number(s[0]) is not None and _number(s[1]) is not None]
        if len(samples) > MAX_SAMPLES:
            step = math.ceil(len(samples) / MAX_SAMPLES)
            samples = [max(samples[i:i + step], key=lambda s: s[1]) for i in range(0, len(samples), step)]
        starts = [s for s in memory.get("task_starts") or [] if isinstance(s, (list, tuple)) and len(s) == 2]
        out["memory"] = {"worker": memory.get("worker"), "samples": [[float(t), int(v)] for t, v in samples],
                         "memory_limit": memory.get("memory_limit"), "terminate_at": memory.get("terminate_at"),
                         "batch_limit": memory.get("batch_limit"), "died_at": _number(memory.get("died_at")),
                         "task_starts": [[float(t), str(k)] for t, k in starts[-200:] if _number(t) is not None]}
        return out
