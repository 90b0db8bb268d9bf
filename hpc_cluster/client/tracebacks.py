"""A task's traceback as a traceback object, rebuilt from the text its worker sent.

distributed's workers pickle the traceback itself (with tblib); ours send the formatted text
(worker.py), which every client can read without that package. `Future.traceback()` and
`Future.exception().__traceback__` are traceback objects all the same: each remote frame
becomes a real frame with the remote file, line and function name, so `traceback.format_tb`,
`traceback.print_exception` and debuggers' post-mortem views list the task's own frames. The
worker's frames that called the task's function are left out, as distributed leaves out its own.
"""

from __future__ import annotations

import re
import types

_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^  File "(?P<file>.+)", line (?P<line>\d+), in (?P<name>.+)$')
# A frame of ours (the worker calling the task's function), however the remote installed us.
_OURS = re.compile(r"[\\/]hpc_cluster[\\/]worker[\\/]")


class _Unwind(Exception):
    """Raised at the remote line by the stand-in frame: its traceback entry is the one we keep."""


def remote_frames(text: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of each frame of the exception's own traceback in `text` (the last
    traceback block: a chained exception's text holds one per exception), outermost first."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line == _HEADER]
    if not starts:
        return []
    frames = []
    for line in lines[starts[-1] + 1:]:
        m = _FRAME.match(line)
        if m:
            frames.append((m["file"], int(m["line"]), m["name"]))
    while frames and _OURS.search(frames[0][0]):
        frames.pop(0)
    return frames


def _stand_in(filename: str, lineno: int, name: str):
    """A frame that says `filename`, `lineno`, `name`: code compiled under that file name,
    raising on that line, renamed to that function."""
    code = compile("\n" * (lineno - 1) + "raise _Unwind()", filename, "exec").replace(co_name=name)
    try:
        exec(code, {"_Unwind": _Unwind, "__file__": filename, "__name__": "__remote__"})
    except _Unwind as exc:
        return exc.__traceback__.tb_next.tb_frame
    raise AssertionError("the stand-in frame did not raise")         # pragma: no cover


def rebuild_traceback(text: str | None) -> types.TracebackType | None:
    """The traceback object of the frames in `text` (a worker's formatted traceback); None when
    it names none."""
    tb = None
    for filename, lineno, name in reversed(remote_frames(text or "")):
        lineno = max(1, lineno)
        # No instruction (tb_lasti -1): the line is all it says. The stand-in's own columns
        # would put carets under the wrong part of the real line.
        tb = types.TracebackType(tb, _stand_in(filename, lineno, name), -1, lineno)
    return tb



def shorten(exc: BaseException) -> bool:
    """Give a task's exception (one that carries its worker's traceback text, exceptions.py's
    error_from_record) the task's frames as its traceback; True if it did. Raised again by the
    public call (Future.result, Client.gather: `raise exc`), it then shows the caller's frame,
    that call, and the task's own frames, as distributed's does, not the client's frames in
    between. Any other exception is left as it is (re-raise it with a bare `raise`): its frames
    are where it happened."""
    tb = rebuild_traceback(getattr(exc, "remote_traceback", None))
    if tb is None:
        return False
    exc.with_traceback(tb)
    return True
