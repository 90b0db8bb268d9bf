"""Timeouts as distributed takes them: seconds, or a string dask's parse_timedelta reads ("1s",
"500ms", "2 minutes"), or a timedelta; None waits for as long as it takes.

One reading for every wait of the client (Future.result/exception, wait, as_completed, gather,
wait_for_workers, scatter, replicate, the coordination primitives), so that a string works
wherever a number does, and a wrong value is refused with advice before anything waits.
"""

from __future__ import annotations

import datetime
import numbers


def parse_timeout(timeout, what: str) -> float | None:
    """Seconds from a number, a string ('200ms', '5s') or a timedelta, as dask reads them; None:
    no limit. `what` names the call in the error (a future passed as the timeout, as in
    `wait(x, y)`, is told apart: wait takes a list)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (numbers.Real, str, datetime.timedelta)):
        raise TypeError(f"{what}: timeout={timeout!r} is not a time: give seconds, a string such as '200ms' or "
                        "'5s', or None. Passing futures one by one puts the second in the timeout's place: "
                        "give them as a list, wait([x, y, z]), not wait(x, y, z)")
    from dask.utils import parse_timedelta
    try:
        seconds = parse_timedelta(timeout, default="s")
    except (ValueError, TypeError, KeyError):
        seconds = None
    if seconds is None or seconds < 0:
        raise ValueError(f"{what}: timeout={timeout!r} is not a time: give seconds >= 0, a string such as "
                         "'200ms' or '5s', or None to wait for as long as it takes")
    return float(seconds)
