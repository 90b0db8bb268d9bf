"""A worker's memory over its life as a small text chart, for `hpc-cluster why WORKER`.

Pure: a death record's `memory` entry (scheduler/state/timeline.py's schema) in, lines of plain
ASCII out, so it reads the same over ssh, in a log file and in a test. The y axis is bytes
from 0 to the highest of the samples and the limits; the x axis is the worker's life up to
its death, which is marked at the right end.

    memory of worker-0: peak 366 MiB 0s before its death; limit 381 MiB; nanny ends it at 362 MiB
       381MiB |----------------------------------------------------------*X = limit 381 MiB; - nanny ...
              |                                                 *  * * *
              |                                             * **
              |                                     ** *  *
              |                               *  * *
              |                         *** *
              |                  * * *
              |             * **
              |  * *  * * *
         0MiB |*
              +------------------------------------------------------------
                      ^                                                     ^ task starts (1)
               2s before its death                                    death

(a LocalCluster worker with memory_limit="400MB" running a task that takes 16 MiB every
0.1 s: the nanny's 10 Hz samples show the climb; the limit and the nanny's 95 % share a row.)
"""

from __future__ import annotations

from ..memseries import downsample
from ..units import format_memory
from .views import dur

GiB, MiB = 2**30, 2**20
LABEL = 9                    # width of the y axis labels
# A line per limit that is known, in drawing order: a later one on the same row is the one
# drawn (the nanny's level over the limit it is a fraction of); the legend names them all.
LINES = (("memory_limit", "=", "limit"), ("batch_limit", "~", "batch limit"),
         ("terminate_at", "-", "nanny ends it at"))


def _unit(top: float) -> tuple[int, str]:
    return (GiB, "GiB") if top >= GiB else (MiB, "MiB")


def _fmt(value: float, unit: tuple[int, str]) -> str:
    name = unit[1]
    return format_memory(value or 0, name, 2 if name == "GiB" and value else 0)      # 0 is '0 MiB'


def memory_chart(memory: dict, width: int = 60, height: int = 10) -> str:
    """The chart of one death's `memory` record: `width` columns x `height` rows of plot."""
    if width < 10 or height < 3:
        raise ValueError(f"a memory chart needs width >= 10 and height >= 3, not {width} x {height}")
    samples = [p for p in memory.get("samples") or [] if isinstance(p, (list, tuple)) and len(p) == 2]
    who = memory.get("worker") or "?"
    if not samples:
        return f"memory of {who}: no samples (the worker died before it reported its memory)"
    samples = downsample(sorted(samples), 4 * width)     # a column's maximum is all that is drawn
    t0 = samples[0][0]
    died = memory.get("died_at")
    t1 = max(samples[-1][0], died if isinstance(died, (int, float)) else samples[-1][0])
    span = (t1 - t0) or 1.0
    lines = [(memory.get(k), ch, what) for k, ch, what in LINES if memory.get(k)]
    peak_t, peak = max(samples, key=lambda p: p[1])
    top = max([peak] + [v for v, _, _ in lines]) or 1
    unit = _unit(top)

    def row(value: float) -> int:
        return height - 1 - min(height - 1, int(value / top * (height - 1) + 0.5))

    def col(t: float) -> int:
        return min(width - 1, max(0, int((t - t0) / span * (width - 1) + 0.5)))

    grid = [[" "] * width for _ in range(height)]
    legend: dict[int, list[str]] = {}
    for value, ch, what in lines:
        grid[row(value)] = [ch] * width
        legend.setdefault(row(value), []).append(f"{ch} {what} {_fmt(value, unit)}")
    tops: dict[int, int] = {}
    for t, v in samples:
        c = col(t)
        tops[c] = max(tops.get(c, 0), v)
    for c, v in tops.items():
        grid[row(v)][c] = "*"
    last = samples[-1][1]
    grid[row(last)][width - 1] = "X"
    legend.setdefault(row(last), []).append(f"X died at {_fmt(last, unit)}")

    labels = {0: _fmt(top, unit), height - 1: _fmt(0, unit)}
    for value, _, _ in lines:
        labels.setdefault(row(value), _fmt(value, unit))
    limits = "; ".join(f"{what} {_fmt(v, unit)}" for v, _, what in lines) or "no memory limit known"
    out = [f"memory of {who}: peak {_fmt(peak, unit)} {dur(t1 - peak_t)} before its death; {limits}"]
    for r in range(height):
        text = f"{labels.get(r, '').replace(' ', ''):>{LABEL}} |{''.join(grid[r])}"
        if r in legend:
            text += " " + "; ".join(legend[r])
        out.append(text)
    out.append(" " * LABEL + " +" + "-" * width)
    starts = [s for s in memory.get("task_starts") or [] if isinstance(s, (list, tuple)) and len(s) == 2
              and isinstance(s[0], (int, float)) and t0 <= s[0] <= t1]
    marks = [" "] * width
    for t, _ in starts:
        marks[col(t)] = "^"
    out.append(" " * (LABEL + 2) + "".join(marks) + (f" ^ task starts ({len(starts)})" if starts else
                                                      " (no task started in this span)"))
    left = f"{dur(t1 - t0)} before its death"
    out.append(" " * (LABEL + 2) + left + "death".rjust(width - len(left)))
    return "\n".join(line.rstrip() for line in out)
