"""The one backoff every retry loop uses: waits that grow by a factor up to a cap, jittered.

Jitter matters where many processes lose the same peer at once: after a scheduler restart,
hundreds of workers (worker/reattach.py), their nannies and the clients (client/reattach.py)
try again, and without it they come back in step, every round a burst of handshakes at
the new scheduler. Each wait is drawn in [(1 - jitter) x d, d] of the undrawn delay d, so a
wait is never longer than the loop's cap and the first one stays short.

A leaf: no imports of ours, no clock (the loop sleeps; this only says how long). The random
draw is injectable for tests.
"""

from __future__ import annotations

import random
from typing import Callable, Iterator


class Backoff:
    """Delays first, first x factor, ... up to cap; each drawn in [(1 - jitter) x d, d].

        backoff = Backoff(0.1, 2.0, jitter=0.5)
        while not connected():
            time.sleep(backoff.next())
        backoff.reset()                 # after a success: short waits again

    jitter=0 gives the plain schedule (polls of one process: nobody to fall in step with).
    """

    __slots__ = ("first", "cap", "factor", "jitter", "rng", "count", "_delay")

    def __init__(self, first: float, cap: float, factor: float = 2.0, jitter: float = 0.0,
                 rng: Callable[[], float] = random.random):
        if not 0 < first <= cap:
            raise ValueError(f"Backoff(first={first!r}, cap={cap!r}): need 0 < first <= cap")
        if factor < 1:
            raise ValueError(f"Backoff(factor={factor!r}): a backoff does not shrink; need factor >= 1")
        if not 0 <= jitter <= 1:
            raise ValueError(f"Backoff(jitter={jitter!r}): need a fraction, 0 <= jitter <= 1")
        self.first, self.cap, self.factor, self.jitter, self.rng = first, cap, factor, jitter, rng
        self.count = 0                  # waits drawn since the last reset (a failure streak's length)
        self._delay = first

    def peek(self) -> float:
        """The next wait before its jitter: the longest next() can return now."""
        return self._delay

    def next(self) -> float:
        """The wait before the next try; the one after it grows."""
        delay = self._delay
        self._delay = min(delay * self.factor, self.cap)
        self.count += 1
        if self.jitter:
            delay *= 1.0 - self.jitter * (1.0 - self.rng())     # rng() in [0, 1): (1 - jitter) x d .. d
        return delay

    def reset(self) -> int:
        """Back to the first delay (the peer answered); returns how many waits the streak drew."""
        streak, self.count, self._delay = self.count, 0, self.first
        return streak

    def __iter__(self) -> Iterator[float]:
        while True:
            yield self.next()
