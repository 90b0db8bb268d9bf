"""cloudpickle for functions and data. Used by the client and the workers only.

A task travels as two opaque blobs: the pickled function (shared by every task of a
`map`, and cached unpickled on the worker) and the pickled (args, kwargs). References
to other tasks' results inside the arguments, at any depth of lists, tuples, dicts or
objects, are pickled as persistent ids; the worker resolves them to the values, so
"futures nested in args" needs no tree walking of our own.

Results (and scattered data) travel as `dumps_value(obj) -> Opaque`: pickle protocol 5
with the large buffers of numpy arrays and pandas objects left out of the pickle stream
(`Opaque.buffers`), so they go to the socket from the array's own memory and arrive in
memory of their own, on which `loads_value` builds the array: no copy beyond the socket's.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import os
import pickle
import reprlib
import sys
import sysconfig
import threading
import types
from collections import ChainMap, OrderedDict
from typing import Any, Callable

import cloudpickle

from .frames import Opaque

# What we call of cloudpickle beyond its public API: _code_reduce moved into cloudpickle.cloudpickle
# in 3.0 (2.x kept it in cloudpickle_fast). Said at import, not as an AttributeError in the
# middle of the first submit.
CLOUDPICKLE_FLOOR = "3.0"
if not callable(getattr(cloudpickle.cloudpickle, "_code_reduce", None)):
    raise ImportError(f"hpc-cluster needs cloudpickle>={CLOUDPICKLE_FLOOR} (it uses "
                      f"cloudpickle.cloudpickle._code_reduce); this is cloudpickle "
                      f"{getattr(cloudpickle, '__version__', '?')}: pip install 'cloudpickle>={CLOUDPICKLE_FLOOR}'")

# Buffers smaller than this stay in the pickle stream: a frame per small column or index
# would cost more (8 bytes of length, a read) than copying a few KiB.
OUT_OF_BAND_MIN = 65536

class SerializationError(TypeError):
    """A function or argument could not be pickled; the message names which one."""


class KeyRef:
    """A reference to another task's result, resolved on the worker."""

    __slots__ = ("key",)

    def __init__(self, key: str):
        self.key = key

    def __repr__(self) -> str:
        return f"KeyRef({self.key!r})"


# -- nestings deeper than pickle can recurse ------------------------------------------------
# pickle (and cloudpickle) recurse once per level of nesting and fail past the recursion limit
# (~1,000 levels); unpickling does not recurse. So a deep nesting of plain lists, tuples,
# dicts and sets is sent as a flat table of its containers, each holding values and _Slot
# references to others, and rebuilt by `_unflatten` without recursion. Shared and
# self-referencing containers stay shared, as with pickle. Other types are values as they are.
_PLAIN = (list, tuple, dict, set, frozenset)
_MUTABLE = (list, dict, set)


def _too_deep(exc: BaseException) -> bool:
    """Did pickling fail only for recursing too deep? (cloudpickle wraps the RecursionError.)"""
    return isinstance(exc, RecursionError) or isinstance(exc.__cause__, RecursionError)


class _Slot:
    """A reference to container number `i` of a flattened nesting."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def __reduce__(self):
        return _Slot, (self.i,)


class _Flat:
    """Pickles `obj` as (_unflatten, (table,)): a flat table of its plain containers."""

    def __init__(self, obj):
        self.obj = obj

    def __reduce__(self):
        return _unflatten, (_flatten(self.obj),)


def _flatten(root) -> tuple:
    """(kinds, items, build order of the immutable ones) of every plain container in `root`;
    container 0 is the root (or the root itself, if it is no container)."""
    if type(root) not in _PLAIN:
        return ([], [], [], root)
    index: dict[int, int] = {}
    kinds: list[type] = []
    items: list[list] = []
    post: list[int] = []                    # the immutable ones, children first

    def slot(x):
        if type(x) not in _PLAIN:
            return x, False
        i = index.get(id(x))
        if i is not None:
            return _Slot(i), False
        index[id(x)] = i = len(kinds)
        kinds.append(type(x))
        items.append([])
        return _Slot(i), True

    def parts(x):
        return itertools.chain.from_iterable(x.items()) if type(x) is dict else iter(x)

    slot(root)
    open_ = {0}                             # containers entered and not yet left
    stack = [(0, parts(root))]
    while stack:
        i, it = stack[-1]
        for part in it:
            ref, new = slot(part)
            if (isinstance(ref, _Slot) and not new and ref.i in open_ and kinds[i] not in _MUTABLE
                    and kinds[ref.i] not in _MUTABLE):
                # A tuple directly in a tuple that contains it: not buildable in any order.
                raise RecursionError("a tuple holds itself through its own contents")
            items[i].append(ref)
            if new:
                stack.append((ref.i, parts(part)))
                open_.add(ref.i)
                break
        else:
            stack.pop()
            open_.discard(i)
            if kinds[i] not in _MUTABLE:
                post.append(i)
    return (kinds, items, post, None)


def _unflatten(table):
    kinds, items, post, plain = table
    if not kinds:
        return plain
    objs: list = [k() if k in _MUTABLE else None for k in kinds]

    def value(x):
        return objs[x.i] if type(x) is _Slot else x

    for i in post:                          # tuples and frozensets: their parts exist by now
        objs[i] = kinds[i](map(value, items[i]))
    for i, kind in enumerate(kinds):
        if kind is list:
            objs[i].extend(map(value, items[i]))
        elif kind is set:
            objs[i].update(map(value, items[i]))
        elif kind is dict:
            vals = list(map(value, items[i]))
            objs[i].update(zip(vals[0::2], vals[1::2]))
    return objs[0]


def _code_reduce(code):
    """cloudpickle's reduction of a code object sent by value, with its real file name.

    cloudpickle 3.1.3 writes "<dynamic-code>" in place of the file of every function sent by
    value, to make pickles deterministic. The file is what our diagnosis shows of where a task
    crashed ("crashed in string_at ... <- segfault (analysis.py:61)") and what a traceback from
    a task or `recreate_error_locally` names, so it travels as it is."""
    rebuild, args = cloudpickle.cloudpickle._code_reduce(code)
    return rebuild, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_reduce}, *cloudpickle.Pickler.dispatch_table.maps)


def _dumps(obj, buffer_callback=None) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=buffer_callback).dump(obj)
    return out.getvalue()


class _RefPickler(_Pickler):
    def __init__(self, file, refs: set):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.refs = refs

    def persistent_id(self, obj):
        # Client futures expose `_hpc_key`; KeyRef is used for dask graphs.
        key = getattr(obj, "_hpc_key", None) if not isinstance(obj, KeyRef) else obj.key
        if key is not None and isinstance(key, str):
            self.refs.add(key)
            return key
        return None


def dumps(obj: Any) -> bytes:
    return _dumps(obj)


def loads(data, buffers=()) -> Any:
    return pickle.loads(data, buffers=buffers)


class TooLargeToSend(ValueError):
    """Pickling a value would take more memory than `dumps_value` was allowed (`max_inband`)."""

    def __init__(self, written: int, budget: int):
        self.written, self.budget = written, budget
        super().__init__(f"its pickle grew past {budget} bytes")


class _BoundedBuffer(io.BytesIO):
    """A pickle's stream that refuses to grow past `budget` bytes. The pickler hands a large
    object's bytes to write() whole, so the check comes before they are copied."""

    def __init__(self, budget: int):
        super().__init__()
        self.budget = budget

    def write(self, b) -> int:
        n = memoryview(b).nbytes
        if self.tell() + n > self.budget:
            raise TooLargeToSend(self.tell() + n, self.budget)
        return super().write(b)


def dumps_value(obj: Any, max_inband: int | None = None) -> Opaque:
    """Pickle a value for the wire with its large buffers out of band (not copied).

    `max_inband`: the most the pickle stream (the copy; out-of-band buffers are not copied)
    may take; more raises TooLargeToSend before it is taken (a worker near its memory limit)."""
    buffers: list[memoryview] = []

    def keep_out_of_band(buf: pickle.PickleBuffer) -> bool:
        try:
            raw = buf.raw()             # the exporter's own memory, as flat bytes
        except BufferError:             # neither C- nor Fortran-contiguous: pickle copies it
            return True
        if raw.nbytes < OUT_OF_BAND_MIN:
            return True                 # true: keep it in the stream
        buffers.append(raw)
        return False

    def pickle_into(target):
        if max_inband is None:
            return _dumps(target, keep_out_of_band)
        out = _BoundedBuffer(max_inband)
        _Pickler(out, protocol=5, buffer_callback=keep_out_of_band).dump(target)
        return out.getvalue()

    try:
        header = pickle_into(obj)
    except (RecursionError, pickle.PicklingError) as exc:
        if not _too_deep(exc):
            raise
        buffers.clear()
        header = pickle_into(_Flat(obj))
    return Opaque(header, buffers)


def loads_value(payload: Opaque) -> Any:
    """The value of `dumps_value`, built on the received buffers (no copy)."""
    return pickle.loads(payload.data, buffers=payload.buffers)


_INSTALLED = tuple(os.path.realpath(p) + os.sep for p in {
    sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} if p)
_lock = threading.Lock()
_scanned: set[str] = set()
_local: list = []               # the user's own modules seen so far
_users = 0                      # pickles under way that need them by value
_ours: list = []                # the modules registered for those pickles (unregistered after)


def _is_local(name: str, module) -> bool:
    """A module from the user's own files rather than an installed package."""
    path = getattr(module, "__file__", None)
    if path is None or name == "__main__" or name.split(".")[0] == "hpc_cluster":
        return False
    return not os.path.realpath(path).startswith(_INSTALLED)


def _scan() -> None:
    """Note the user's modules imported since the last call (cheap when nothing is new)."""
    if len(_scanned) >= len(sys.modules):
        return
    for name, module in list(sys.modules.items()):
        if name not in _scanned:
            _scanned.add(name)
            if module is not None and _is_local(name, module):
                _local.append(module)


@contextlib.contextmanager
def local_modules_by_value():
    """While our client pickles a task or data, functions and classes of the user's own
    modules travel by value.

    Workers on other nodes, or started from another directory, cannot import a script's
    helper module (or a test file), so we treat them like code defined in __main__. The
    registration is cloudpickle's, which is process-wide, so it lasts only while one of our
    pickles is under way: left in place, it changed how everything else in the process
    pickles (dask's own process pool sent the user's classes by value, and partd's plain
    pickle of such an object then failed). A module the user registered stays registered.
    """
    global _users
    with _lock:
        _scan()
        if _users == 0:
            registered = getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", set())
            for module in _local:
                if module.__name__ not in registered and module.__name__ in sys.modules:
                    cloudpickle.register_pickle_by_value(module)
                    _ours.append(module)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                for module in _ours:
                    with contextlib.suppress(ValueError):
                        cloudpickle.unregister_pickle_by_value(module)
                _ours.clear()


def dumps_function(func: Callable) -> bytes:
    try:
        with local_modules_by_value():
            return dumps(func)
    except Exception as exc:
        name = getattr(func, "__qualname__", None) or repr(func)
        raise SerializationError(f"could not pickle the function {name!r}: {type(exc).__name__}: {exc}. "
                                 "Define it at module level or avoid capturing unpicklable objects "
                                 "(locks, open files, sockets) in its closure.") from exc


def dumps_args(args: tuple, kwargs: dict) -> tuple[bytes, set[str]]:
    """Pickle (args, kwargs); return the blob and the keys of the task results it refers to."""
    refs: set[str] = set()
    buf = io.BytesIO()
    try:
        with local_modules_by_value():
            try:
                _RefPickler(buf, refs).dump((args, kwargs))
            except (RecursionError, pickle.PicklingError) as exc:
                if not _too_deep(exc):
                    raise
                # Nested deeper than pickle recurses (a chain of futures in lists, 3,000 deep).
                refs.clear()
                buf = io.BytesIO()
                _RefPickler(buf, refs).dump(_Flat((args, kwargs)))
    except Exception as exc:
        with local_modules_by_value():
            why = _which_argument(args, kwargs, exc)
        raise SerializationError(why) from exc
    return buf.getvalue(), refs


class ArgsPickler:
    """dumps_args for many tasks in a row (a map's), used inside one local_modules_by_value().

    One pickler for all, its memo cleared between tasks: entering the by-value registration
    and building a cloudpickle Pickler per task were 4.5 of a map's 5.8 us per task's
    arguments (issue 19: a 1,000,000-task map took 23 s to submit, dask's 13). A task whose
    arguments fail, or nest too deep, goes the way of dumps_args (its error names them)."""

    def __init__(self):
        self._buf = io.BytesIO()
        self._refs: set[str] = set()
        self._pickler = _RefPickler(self._buf, self._refs)

    def dumps(self, args: tuple, kwargs: dict) -> tuple[bytes, set[str]]:
        buf, refs, pickler = self._buf, self._refs, self._pickler
        buf.seek(0)
        buf.truncate()
        refs.clear()
        pickler.clear_memo()
        # cloudpickle shares one subset of a module's globals among the functions of a pickle;
        # each task's pickle is read alone, so each starts afresh.
        getattr(pickler, "globals_ref", {}).clear()
        try:
            pickler.dump((args, kwargs))
        except Exception:
            self._pickler = _RefPickler(self._buf, self._refs)      # the failed one's state is unknown
            return dumps_args(args, kwargs)
        return buf.getvalue(), set(refs)


def _which_argument(args: tuple, kwargs: dict, exc: Exception) -> str:
    """Find the first argument that fails to pickle, so the error can name it."""
    for label, value in [*((f"argument {i}", a) for i, a in enumerate(args)),
                         *((f"keyword argument {k!r}", v) for k, v in kwargs.items())]:
        try:
            _RefPickler(io.BytesIO(), set()).dump(value)
        except Exception as inner:
            return (f"could not pickle {label} ({type(value).__name__}: {reprlib.repr(value):.60}): "
                    f"{type(inner).__name__}: {inner}")
    return f"could not pickle the arguments: {type(exc).__name__}: {exc}"


def tokenize(func_blob: bytes, args_blob: bytes | Opaque, start=None) -> str:
    """A key from pickled bytes (or an Opaque of `dumps_value`: its buffers are hashed where
    they lie, not joined into one copy). `start`: token_start(func_blob), for many tasks of
    one function (the function hashed once)."""
    h = (start or token_start(func_blob)).copy()
    for part in (args_blob.data, *args_blob.buffers) if isinstance(args_blob, Opaque) else (args_blob,):
        h.update(part)
    return h.hexdigest()


def token_start(func_blob: bytes):
    h = hashlib.blake2b(func_blob, digest_size=12)
    h.update(b"\0")
    return h


class _RefUnpickler(pickle.Unpickler):
    def __init__(self, file, resolve: Callable[[str], Any]):
        super().__init__(file)
        self.resolve = resolve

    def persistent_load(self, pid):
        return self.resolve(pid)


def loads_args(blob, resolve: Callable[[str], Any]) -> tuple[tuple, dict]:
    return _RefUnpickler(io.BytesIO(blob), resolve).load()


class FunctionCache:
    """Unpickled functions by their pickled bytes: a map of 20,000 tasks unpickles once."""

    def __init__(self, size: int = 256):
        self.size = size
        self._cache: OrderedDict[bytes, Callable] = OrderedDict()

    def get(self, blob) -> Callable:
        key = bytes(blob)
        func = self._cache.get(key)
        if func is None:
            func = loads(key)
            self._cache[key] = func
            if len(self._cache) > self.size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return func
