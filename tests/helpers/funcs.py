"""The task functions the integration and batch tests submit. Workers are other processes that
cannot import tests/ (not on their sys.path): these travel by value, as a user's own module does
(protocol/serialize.py's local_modules_by_value sends any module outside the installed packages
by value), which tests/unit/test_helpers_package.py checks on a real cluster."""

from __future__ import annotations

import ctypes
import time


def inc(x):
    return x + 1


def slow_inc(x, delay=0.2):
    time.sleep(delay)
    return x + 1


def add(a, b):
    return a + b


def add_all(*xs):
    return sum(xs)


def total(items):
    return sum(items)


def square(x):
    return x * x


def slow_square(x, seconds=2.0):
    time.sleep(seconds)
    return x * x


def double(x):
    return 2 * x


def slow(x, delay=1.0):
    time.sleep(delay)
    return x


def sleep_then(value, seconds):
    time.sleep(seconds)
    return value


def segfault(x=None):
    """Kill the worker's process with SIGSEGV (a crash the nanny and the batch system report)."""
    ctypes.string_at(0)


def grow(limit_bytes, chunk=8 << 20, pause=0.02):
    """Take memory a few MiB at a time (so samplers see it rise) up to `limit_bytes`, in the
    worker's own process; the bytes taken."""
    held = []
    while len(held) * chunk < limit_bytes:
        held.append(b"x" * chunk)
        time.sleep(pause)
    return len(held) * chunk


def hog(nbytes, hold=5.0):
    """Hold `nbytes` of touched memory (real RSS) for `hold` seconds, long enough that the nanny
    or the batch system sees it; the bytes held."""
    block = bytearray(nbytes)
    for i in range(0, nbytes, 4096):
        block[i] = 1
    time.sleep(hold)
    return len(block)


def kwargs_of(*args, **kwargs):
    """The keyword arguments the task was called with: none of submit's or map's own may be among them."""
    return kwargs


def pid_of(*args):
    """The worker process that ran the task (scheduler_info()'s rows name each worker's pid)."""
    import os
    return os.getpid()
