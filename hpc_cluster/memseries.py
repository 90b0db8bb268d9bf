"""A process's memory over its whole life in bounded space: (time, rss bytes) points.

A pure leaf (no clock, no I/O) that any layer may use: the scheduler keeps one per worker
from its heartbeats (scheduler/state/timeline.py), the nanny one of its 10 Hz samples, and the CLI
and the dashboard downsample what they show with `downsample`.

Downsampling keeps the *largest* value of the points it merges, at that point's time: a
memory death is explained by its spike, and an average would shave the spike off.
"""

from __future__ import annotations

import math
from array import array

CAP = 720            # points a MemoryTimeline keeps (a 24-hour worker at 1 Hz: 2 minutes a point)
MERGE_LIMIT = 100_000   # points merge() reads of one series (the latest): a report's size is not ours


class MemoryTimeline:
    """Every point of a life at a resolution that halves whenever `cap` points are held.

    After k halvings a stored point stands for 2**k raw points (its `stride`), and new raw
    points are gathered into one such bucket before they are stored, so the resolution stays
    even over the whole life instead of the old half being merged again and again. Times
    and values live in two arrays (16 bytes a point), not in tuples: a scheduler holds one
    timeline per live worker.
    """

    __slots__ = ("cap", "stride", "_t", "_v", "_pending", "_count")

    def __init__(self, cap: int = CAP):
        if cap < 2:
            raise ValueError(f"cap={cap}: a timeline needs room for at least 2 points")
        self.cap = cap - cap % 2                 # even: halving merges whole pairs
        self.stride = 1
        self._t, self._v = array("d"), array("q")
        self._pending: tuple[float, int] | None = None     # the max of the bucket being gathered
        self._count = 0                                     # raw points in that bucket

    def add(self, t: float, rss: int) -> None:
        rss = int(rss)
        if self._pending is None or rss > self._pending[1]:
            self._pending = (float(t), rss)
        self._count += 1
        if self._count < self.stride:
            return
        self._t.append(self._pending[0])
        self._v.append(self._pending[1])
        self._pending, self._count = None, 0
        if len(self._v) >= self.cap:
            self._halve()

    def _halve(self) -> None:
        t, v = self._t, self._v
        nt, nv = array("d"), array("q")
        for i in range(0, len(v) - 1, 2):
            j = i if v[i] >= v[i + 1] else i + 1
            nt.append(t[j])
            nv.append(v[j])
        if len(v) % 2:
            nt.append(t[-1])
            nv.append(v[-1])
        self._t, self._v = nt, nv
        self.stride *= 2

    def points(self) -> list[list]:
        """[[t, rss], ...] in time order, the bucket still being gathered included (JSON-safe)."""
        out = [[t, v] for t, v in zip(self._t, self._v)]
        if self._pending is not None:
            out.append([self._pending[0], self._pending[1]])
        return out

    def __len__(self) -> int:
        return len(self._v) + (self._pending is not None)


def downsample(points, n: int) -> list[list]:
    """At most `n` points of time-sorted `points` ([t, value] pairs): consecutive points are
    grouped evenly and each group gives its largest value, at its own time. Fewer than `n`
    points come back as they are (as lists)."""
    if n < 1:
        raise ValueError(f"n={n}: downsample to at least 1 point")
    pts = [[p[0], p[1]] for p in points]
    if len(pts) <= n:
        return pts
    out = []
    for g in range(n):
        group = pts[g * len(pts) // n:(g + 1) * len(pts) // n]
        out.append(max(group, key=lambda p: p[1]))
    return out


def merge(*series, n: int | None = None) -> list[list]:
    """Several [t, value] series as one, time-sorted, exact repeats dropped; at most `n` points
    (max-preserving) when `n` is given. Points that are not a number pair are skipped: a
    report from another process is read, not trusted."""
    seen = set()
    for s in series:
        if not isinstance(s, (list, tuple)):
            continue
        for p in s[-MERGE_LIMIT:]:
            try:
                t, v = float(p[0]), int(p[1])
            except (TypeError, ValueError, IndexError, KeyError, OverflowError):
                continue
            if math.isfinite(t) and v >= 0:
                seen.add((t, v))
    pts = [[t, v] for t, v in sorted(seen)]
    return downsample(pts, n) if n is not None else pts
