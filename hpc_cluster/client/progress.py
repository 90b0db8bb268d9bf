"""`progress(futures)`: block until futures are done, showing how far along they are.

On a terminal it redraws one line in place (carriage return):

    [#####               ] 512/1000 done, 3 erred, 12.3 s

Anywhere else (a batch job's log, a pipe, CI) a redrawn line would be a mess of `\\r`, so
it writes plain lines instead: at most one per 10 % of the work or per 5 s, whichever
comes first, and always a final line.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Iterable

from .futures import Future, flatten_futures

BAR_WIDTH = 20
PLAIN_EVERY_FRACTION = 0.10
PLAIN_EVERY_SECONDS = 5.0


def _is_tty(file) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


def format_line(done: int, erred: int, total: int, elapsed: float, bar: bool) -> str:
    """One progress line; pure, so its look is tested without a terminal."""
    text = f"{done}/{total} done"
    if erred:
        text += f", {erred} erred"
    text += f", {elapsed:.1f} s"
    if not bar:
        return text
    filled = BAR_WIDTH if total == 0 else int(BAR_WIDTH * done / total)
    return f"[{'#' * filled}{' ' * (BAR_WIDTH - filled)}] {text}"


def progress(futures: Future | Iterable | dict, *, interval: float = 0.1, file: IO[str] | None = None):
    """Wait for every future, showing progress on `file` (stderr by default); return `futures`.

    A future counts as done when it finished, erred or was cancelled; erred and cancelled
    ones are counted as "erred". Their errors are not raised here: `result()` or
    `gather()` raise them, as usual.
    """
    file = sys.stderr if file is None else file
    flat: list[Future] = []
    flatten_futures(futures, flat)
    total = len(flat)
    tty = _is_tty(file)
    start = time.monotonic()
    pending = list(flat)
    done = erred = 0
    last_plain_time, last_plain_done = start, -1
    last_len = 0
    while True:
        still = []
        for f in pending:
            if f.done():
                done += 1
                if f.status != "finished":
                    erred += 1
            else:
                still.append(f)
        pending = still
        now = time.monotonic()
        finished = not pending
        line = format_line(done, erred, total, now - start, bar=tty)
        if tty:
            # Pad over the previous line: it may have been longer (e.g. before "erred" shrank it).
            file.write("\r" + line + " " * max(0, last_len - len(line)))
            last_len = len(line)
            if finished:
                file.write("\n")
            file.flush()
        else:
            step = max(1, int(total * PLAIN_EVERY_FRACTION))
            # A line every 5 s even with no change: a stuck run should still look alive.
            due = (last_plain_done < 0 or done - last_plain_done >= step
                   or now - last_plain_time >= PLAIN_EVERY_SECONDS)
            if finished or due:
                file.write(line + "\n")
                file.flush()
                last_plain_time, last_plain_done = now, done
        if finished:
            return futures
        # Sleep on the last pending future (tasks mostly finish in order): one wake-up per
        # interval while work goes on, and an immediate one when the last of it is done.
        pending[-1].client.wait_keys([pending[-1].key], interval)
