"""The task stream: recent task executions per worker thread, for the dashboard (issue 17).

The server notes each task-started / task-finished / task-erred as it reads them and each
worker it loses; nothing else in the scheduler reads this. It is bounded: a deque of the
last `size` executions plus the ones running now, so its cost is a few dict operations per
task and its memory does not grow with the run. Pure: time comes in with the calls.

A worker does not say which of its threads ran a task, so each running task takes the
lowest free "lane" of its worker (0 .. nthreads-1, more while tasks have seceded): what a
task-stream chart needs, without a protocol change. Times are when the scheduler read the
messages, a few hundred microseconds after the worker sent them.
"""

from __future__ import annotations

from collections import deque

# The last executions kept: at ~2,000 tasks/s, the last five seconds; at a few per second,
# far longer than a chart shows.
STREAM_SIZE = 10_000


class TaskStream:
    def __init__(self, size: int = STREAM_SIZE):
        # (worker name, lane, key, start, stop, how it ended: "memory", "erred" or "lost")
        self.done: deque = deque(maxlen=size)
        self.running: dict[str, dict[str, tuple[int, float]]] = {}   # worker address -> key -> (lane, start)
        self.names: dict[str, str] = {}                               # worker address -> name

    def started(self, address: str, name: str, key: str, now: float) -> None:
        mine = self.running.get(address)
        if mine is None:
            mine = self.running[address] = {}
            self.names[address] = name
        if key in mine:
            return
        busy = {lane for lane, _ in mine.values()}
        lane = 0
        while lane in busy:
            lane += 1
        mine[key] = (lane, now)

    def finished(self, address: str, key: str, now: float, outcome: str) -> None:
        mine = self.running.get(address)
        entry = mine.pop(key, None) if mine else None
        if entry is not None:
            self.done.append((self.names.get(address, address), entry[0], key, entry[1], now, outcome))

    def worker_gone(self, address: str, now: float) -> None:
        """Whatever it was running ends here, as "lost" (the death says why)."""
        name = self.names.pop(address, address)
        for key, (lane, start) in (self.running.pop(address, None) or {}).items():
            self.done.append((name, lane, key, start, now, "lost"))

    def recent(self, since: float, limit: int) -> list[tuple]:
        """Executions that ended at or after `since`, newest first, at most `limit`: the deque
        is in order of ending, so this reads only what it returns."""
        out = []
        for entry in reversed(self.done):
            if entry[4] < since or len(out) >= limit:
                break
            out.append(entry)
        return out

    def now_running(self, limit: int) -> list[tuple]:
        """(worker name, lane, key, start) of tasks running now, at most `limit`."""
        out = []
        for address, mine in self.running.items():
            name = self.names.get(address, address)
            for key, (lane, start) in mine.items():
                if len(out) >= limit:
                    return out
                out.append((name, lane, key, start))
        return out
