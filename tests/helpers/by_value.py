"""Test functions for the distributed engine's Client. Its scheduler (in the cluster daemon) and
its workers unpickle the task graph, and cannot import tests/ (not on their sys.path); distributed
pickles a function by reference unless it belongs to `__main__`, which it sends by value
(cloudpickle), as it does a script's functions. Our own Client sends any module outside the
installed packages by value by itself (protocol/serialize.py), so tests of our engine need none of this."""

from __future__ import annotations

import types


def by_value(fn):
    """A copy of `fn` that distributed sends by value: the same code and globals, in `__main__`."""
    out = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__module__, out.__qualname__, out.__doc__ = "__main__", fn.__qualname__, fn.__doc__
    return out
