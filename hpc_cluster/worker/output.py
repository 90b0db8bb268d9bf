"""The worker's stdout and stderr, which are its job's log files: a write that fails there
(a full or vanished log filesystem) says so.

A task that only printed used to fail with a bare `OSError: [Errno 28] No space left on
device`, nothing saying the full disk was the worker's log directory (issue 34). The streams
are wrapped once, at start: the same stream objects, whose failed writes name the file.
"""

from __future__ import annotations

import os
import sys


def _where(stream) -> str:
    try:
        path = os.readlink(f"/proc/self/fd/{stream.fileno()}")
    except (OSError, ValueError, AttributeError):
        return ""
    return f" ({path})" if path.startswith("/") else ""


def explained(exc: OSError, name: str, stream) -> OSError:
    """`exc` again, saying which of the worker's outputs failed and what to do."""
    return OSError(exc.errno, f"{exc.strerror or exc}: writing the worker's {name}{_where(stream)}, its job's log "
                              "in log_directory. Free space there, or set log_directory to another "
                              "filesystem (print less from tasks, or log to a file of your own)")


class GuardedStream:
    """A text stream whose write and flush errors are `explained`; everything else is the
    stream's own."""

    def __init__(self, stream, name: str):
        self._stream, self._name = stream, name

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise explained(exc, self._name, self._stream) from None

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as exc:
            raise explained(exc, self._name, self._stream) from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_std_streams() -> None:
    if not isinstance(sys.stdout, GuardedStream) and sys.stdout is not None:
        sys.stdout = GuardedStream(sys.stdout, "stdout")
    if not isinstance(sys.stderr, GuardedStream) and sys.stderr is not None:
        sys.stderr = GuardedStream(sys.stderr, "stderr")


def flush_quietly() -> None:
    """At exit: a log that cannot take the last lines must not change the exit code."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
