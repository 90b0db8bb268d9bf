"""Cheap estimates of a result's size in memory, reported to the scheduler for placement."""

from __future__ import annotations

import sys


def sizeof(obj, _depth: int = 0) -> int:
    try:
        nbytes = getattr(obj, "nbytes", None)       # numpy, pandas, memoryview
    except Exception:                               # a property that refuses: a dask DataFrame's raises
        nbytes = None                               # NotImplementedError (it dropped a scatter's connection)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(obj, (bytes, bytearray, str)):
        return len(obj)
    if isinstance(obj, (list, tuple, set, frozenset)) and _depth < 2:
        items = list(obj)
        if len(items) > 64:                          # sample large containers
            step = len(items) // 64
            sample = items[::step][:64]
            return sys.getsizeof(obj) + sum(sizeof(i, _depth + 1) for i in sample) * len(items) // len(sample)
        return sys.getsizeof(obj) + sum(sizeof(i, _depth + 1) for i in items)
    if isinstance(obj, dict) and _depth < 2:
        return sys.getsizeof(obj) + sum(sizeof(k, _depth + 1) + sizeof(v, _depth + 1)
                                        for k, v in list(obj.items())[:64])
    try:
        return sys.getsizeof(obj)
    except TypeError:
        return 64
