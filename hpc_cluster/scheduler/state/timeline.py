"""Each worker's memory over its whole life, kept for its death record (issue 17). Mixed
into SchedulerState; pure like it (time comes in with the events).

A live worker holds a bounded `MemoryTimeline` fed by its heartbeats (each point the most it
held since the previous one: `peak_rss`, so a spike between two heartbeats is not missed)
and the tasks it started. When it dies, its death record gets a `memory` entry:

    {"worker": name, "samples": [[t, rss_bytes], ...], "memory_limit": int|None,
     "terminate_at": int|None, "batch_limit": int|None, "task_starts": [[t, key], ...],
     "died_at": float}

`samples` are time-sorted, at most MAX_SAMPLES, downsampled keeping maxima; the nanny's
10 Hz samples of the last seconds (and its own whole-life timeline) are merged in when its
exit report arrives, and the batch system's memory request becomes `batch_limit` when the
accounting says it: the record is refined like the verdict. Records of jobs that never
started a worker have no `memory`.
"""

from __future__ import annotations

from ...memseries import CAP, MemoryTimeline, downsample, merge
from .records import MAX_STARTS          # task starts kept per worker, the latest

# What the dashboard and the CLI may use (the timeline class and downsample re-exported).
__all__ = ["CAP", "MAX_SAMPLES", "MAX_STARTS", "MemoryTimeline", "TimelineMixin", "downsample", "journal_death",
           "merge", "summary", "terminate_level"]

MAX_SAMPLES = 1000          # points in a death's memory record
# A scheduler keeps every death; an adaptive cluster retires workers all day. The latest
# KEEP_FULL deaths keep their whole record, older ones a summary, so deaths cost bounded memory
# each and `client.deaths()` stays a small message.
KEEP_FULL = 50
OLD_SAMPLES, OLD_STARTS = 100, 50
# A death is rewritten in the journal at each refinement, fsynced on a shared filesystem:
# the journal keeps a summary (a rebuilt scheduler shows that).
JOURNAL_SAMPLES, JOURNAL_STARTS = 200, 100


def terminate_level(ws) -> int | None:
    """Where the worker's nanny ends it, in bytes, as the nanny computes it (limit x terminate
    fraction, truncated); None without a nanny, a limit, or with the fraction off."""
    if not ws.info.get("nanny") or not ws.memory_limit:
        return None
    fraction = (ws.info.get("memory_fractions") or {}).get("terminate")
    return int(ws.memory_limit * fraction) if fraction else None


def summary(memory: dict, samples: int, starts: int) -> dict:
    """The same record with fewer points: maxima kept, the latest task starts."""
    return dict(memory, samples=downsample(memory.get("samples") or [], samples),
                task_starts=list(memory.get("task_starts") or [])[-starts:] if starts else [])


def journal_death(record: dict) -> dict:
    """A death record as the journal writes it (a summary of its memory)."""
    memory = record.get("memory")
    if not memory:
        return record
    return dict(record, memory=summary(memory, JOURNAL_SAMPLES, JOURNAL_STARTS))


def _positive_int(value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return int(value)


class TimelineMixin:
    def _note_memory(self, ws, memory: dict, now: float | None) -> None:
        """A heartbeat's memory report: the most the worker held since the last one."""
        if now is None:
            return
        rss = max(memory.get("rss") or 0, memory.get("peak_rss") or 0)
        if rss:
            ws.timeline.add(now, rss)

    def _note_start(self, ws, key: str, now: float | None, memory: dict | None) -> None:
        """A task started executing on `ws` (only those: prefetched tasks never ran)."""
        if now is None:
            return
        ws.task_starts.append((now, key))
        if memory and memory.get("rss"):
            ws.timeline.add(now, memory["rss"])

    def _memory_record(self, ws, now: float) -> dict:
        return {"worker": ws.name, "samples": merge(ws.timeline.points(), n=MAX_SAMPLES),
                "memory_limit": ws.memory_limit or None, "terminate_at": terminate_level(ws), "batch_limit": None,
                "task_starts": [[t, k] for t, k in ws.task_starts], "died_at": now}

    def _summarise_old_deaths(self) -> None:
        """The death that just fell out of the latest KEEP_FULL keeps a summary of its memory."""
        i = len(self.deaths) - 1 - KEEP_FULL
        if i >= 0 and self.deaths[i].get("memory"):
            self.deaths[i]["memory"] = summary(self.deaths[i]["memory"], OLD_SAMPLES, OLD_STARTS)
            if self.touched_deaths is not None:
                self.touched_deaths.add(i)

    def death_memory(self, death_id: int) -> dict | None:
        """The memory record of death `death_id` (the schema above), or None (no such death,
        or a job that never started its worker)."""
        if not isinstance(death_id, int) or not 0 <= death_id < len(self.deaths):
            return None
        return self.deaths[death_id].get("memory")

    def refine_death_memory(self, death_id: int, nanny: dict | None = None, batch_limit=None) -> None:
        """Later evidence about a death's memory: the nanny's exit report (its samples, its
        terminate level, the limit it watched) or the job's batch memory request."""
        memory = self.death_memory(death_id)
        if memory is None:
            return
        if nanny:
            memory["samples"] = merge(memory["samples"], nanny.get("samples"), nanny.get("timeline"), n=MAX_SAMPLES)
            budget = _positive_int(nanny.get("memory_budget"))
            if budget is not None:
                memory["terminate_at"] = budget
            if memory["memory_limit"] is None:
                memory["memory_limit"] = _positive_int(nanny.get("memory_limit"))
        limit = _positive_int(batch_limit)
        if limit is not None:
            memory["batch_limit"] = limit
        if self.touched_deaths is not None:
            self.touched_deaths.add(death_id)
