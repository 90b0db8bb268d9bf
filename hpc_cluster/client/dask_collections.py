"""The Client as dask's scheduler: `get`, `compute`, `persist`, `futures_of`, the default client.

A new Client becomes dask's default scheduler, as distributed's does: `x.compute()`,
`dask.compute`, `dask.persist`, xarray's `.compute()`/`.load()`/`.persist()` then run on
the workers, and dask builds shuffles that move data through the workers ('tasks'), never
through a local disk that other nodes cannot see. Closing it (or leaving `as_current()`)
gives back whatever was the default before. An explicit `scheduler="threads"` still runs
on threads.

Mixed into Client (client/client.py), like client/tools.py: it uses the client's submission path.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import warnings
import weakref

from .futures import Future, flatten_futures
from .graph import graph_tasks, placement_keywords, wire_key
from ..protocol.frames import Opaque
from .submission import gc_paused

# Keywords of dask's compute()/get() that only mean something to dask's local schedulers.
_LOCAL_ONLY = frozenset({"num_workers", "pool", "chunksize", "raise_task_exception", "get_id", "rerun_exceptions_locally"})
# Keywords handed to every scheduler that none reads, dropped without a word: xarray's to_netcdf
# gives dask.array.store flush=True, which passes it to the compute (issue 31, point 8).
_NOBODYS = frozenset({"flush"})
_SCHEDULER_CONFIG = ("scheduler", "dataframe.shuffle.method", "array.rechunk.threshold")
# dask plans a rechunk whose task graph would grow past `threshold` x (blocks in + blocks
# out) in several steps, every step copying all the data again. distributed's Client makes
# dask run exactly those with its P2P extension, a one-step exchange. Ours lets them be one
# step of tasks up to 16 x that many tasks (dask's default is 4): a 1.5 GB rows -> columns
# rechunk in 11 blocks then takes 165 tasks instead of 210, each value is copied twice
# instead of four times, and it ran in half the time with 0.1-0.3 GiB less peak memory per
# worker (benchmarks/collections.py, b). Past 16 x, dask's plan in steps keeps the graph small.
RECHUNK_THRESHOLD = 16
_DASK_RECHUNK_THRESHOLD = 4                 # dask's own default; a value the user set stands

logger = logging.getLogger("hpc_cluster.client")


class _DefaultScheduler:
    """What dask's `scheduler` setting holds while a Client is the default. dask calls it as
    a get function, and (dask.persist) asks its `__self__` for the client, whose `persist`
    keeps results on the workers. Looking the client up at each call keeps no strong
    reference from dask's global config to a client."""

    def __call__(self, dsk, keys, **kwargs):
        try:
            client = current_client()
        except ValueError:
            # Every default client is gone without close() (garbage collected): give dask its
            # own settings back and run this one as dask would have without us.
            from dask.threaded import get
            _apply()
            warnings.warn("the hpc_cluster Client that was dask's default scheduler is gone; computing "
                          "with dask's local threads", UserWarning, stacklevel=2)
            return get(dsk, keys, **kwargs)
        if client.asynchronous:               # dask's own words (dask/base.py's _ensure_not_async)
            raise RuntimeError("Attempting to use an asynchronous Client in a synchronous context of "
                               "`dask.compute`: use `await client.compute(x)` (client/asynchronous.py)")
        return client.get(dsk, keys, **kwargs)

    @property
    def __self__(self):
        try:
            return current_client()
        except ValueError:
            return None

    def __eq__(self, other) -> bool:
        # dask.base.get_scheduler() gives this object while a Client is the default; with
        # distributed it gives the current client's `get`, and code compares the two.
        if other is self:
            return True
        client = self.__self__
        return client is not None and other == client.get

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "<hpc_cluster default client>"


_lock = threading.RLock()
_defaults: list[weakref.ref] = []          # clients made default, the current one last
# The client of this thread or task, as distributed's (Client.current(allow_global=False)): that of
# the innermost as_current() block, or of a `with client:` block of a client made default.
_inside: contextvars.ContextVar = contextvars.ContextVar("hpc_cluster_as_current", default=None)
_blocks = 0                                 # as_current() blocks open, in any thread: dask's settings are ours
_before: dict | None = None                 # dask's settings before the first one
_SCHEDULER = _DefaultScheduler()


def current_client(default: bool = True):
    """The Client dask computes on now: this thread's (or task's) `as_current()` or `with
    client:` one, else the newest one made default and not closed. Raises ValueError when
    there is none."""
    client = as_current_client()
    if client is not None:
        return client
    with _lock:
        while _defaults:
            client = _defaults[-1]()
            if client is not None and client.status not in ("closed", "closing"):
                return client
            _defaults.pop()
    raise ValueError("no hpc_cluster Client: create one, e.g. client = Client(cluster)")


def as_current_client():
    """The client of the innermost `as_current()` block around this call, or None."""
    ref = _inside.get()
    client = ref() if ref is not None else None
    return client if client is not None and client.status not in ("closed", "closing") else None


def _apply() -> None:
    """Point dask's settings at the current default client, or back to what they were."""
    import dask
    global _before
    with _lock:
        live = [r for r in _defaults if r() is not None and r().status not in ("closed", "closing")]
        _defaults[:] = live
        if live or _blocks:
            if _before is None:
                _before = {k: dask.config.get(k, None) for k in _SCHEDULER_CONFIG}
            settings = {"scheduler": _SCHEDULER, "dataframe.shuffle.method": "tasks"}
            if dask.config.get("array.rechunk.threshold", None) in (None, _DASK_RECHUNK_THRESHOLD, RECHUNK_THRESHOLD):
                settings["array.rechunk.threshold"] = RECHUNK_THRESHOLD
            dask.config.set(settings)
        elif _before is not None:
            for key, value in _before.items():
                if value is None:
                    _unset(dask.config.config, key.split("."))
                else:
                    dask.config.set({key: value})
            _before = None


def _unset(config: dict, path: list[str]) -> None:
    node = config
    for part in path[:-1]:
        node = node.get(part)
        if not isinstance(node, dict):
            return
    node.pop(path[-1], None)


def futures_of(obj) -> list[Future]:
    """The Futures inside a collection (a persisted one: its graph holds them), a list, a
    dict, a Future, at any depth, each once, in order."""
    found: list[Future] = []
    flatten_futures(obj, found)
    return list({f.key: f for f in found}.values())


class CollectionsMixin:
    asynchronous = False            # dask checks this before it uses a client as its scheduler
    _made_default = False           # set_as_default: `with client:` makes it this thread's current one
    _entered = None                 # the token of that, for __exit__

    # -- being dask's scheduler ---------------------------------------------------------
    def _make_default(self) -> None:
        self._made_default = True
        with _lock:
            _defaults.append(weakref.ref(self))
            _apply()

    def _stop_being_default(self) -> None:
        with _lock:
            _defaults[:] = [r for r in _defaults if r() is not None and r() is not self]
            _apply()

    @contextlib.contextmanager
    def as_current(self):
        """Make this client dask's scheduler, and Client.current(), inside the block: for this
        thread (or asyncio task) only, as distributed's; another may be the default elsewhere."""
        global _blocks
        with _lock:
            _blocks += 1
            _apply()
        token = _inside.set(weakref.ref(self))
        try:
            yield self
        finally:
            _inside.reset(token)
            with _lock:
                _blocks -= 1
                _apply()

    def __enter__(self):
        """`with Client(...) as client:` makes it this thread's current client inside the block,
        when it was made default (set_as_default), as distributed's does."""
        if self._made_default:
            self._entered = _inside.set(weakref.ref(self))
        return self

    def __exit__(self, *exc):
        token, self._entered = self._entered, None
        if token is not None:
            try:
                _inside.reset(token)
            except ValueError:            # entered in another thread: that thread's setting stays there
                warnings.warn("It is deprecated to enter and exit the Client context manager from different threads",
                              DeprecationWarning, stacklevel=2)
        self.close()

    # -- graphs ---------------------------------------------------------------------------
    def _graph_to_futures(self, dsk, keys: list, annotations: dict) -> dict:
        """Submit a dask graph; {dask key: Future} for `keys`."""
        with gc_paused():
            return self._graph_submitted(dsk, keys, annotations)

    def _graph_submitted(self, dsk, keys: list, annotations: dict) -> dict:
        specs, wire = graph_tasks(dsk, self._func_blob, annotations)
        in_graph = {s["key"] for s in specs}
        for spec in specs:
            for dep in spec["deps"]:
                if dep not in in_graph and dep not in self._states:
                    raise ValueError(f"the graph refers to future {dep!r}, which this client does not "
                                     "hold (released, or another client's): keep a reference to the "
                                     "future (or the persisted collection) while graphs use it")
        futures = {k: Future(wire.get(k) or wire_key(k), self) for k in keys}
        for spec in specs:
            spec["func"], spec["args"] = Opaque(spec["func"]), Opaque(spec["args"])
        self._submit(specs, [f.key for f in futures.values()])
        return futures

    @staticmethod
    def _annotations(retries=None, priority=0, resources=None, workers=None, allow_other_workers=None,
                     memory=None, pool=None, duration=None) -> dict:
        """The annotations of one call: dask.annotate(...) around it, then its keywords."""
        import dask
        out = dict(dask.get_annotations())
        for name, value in (("retries", retries), ("priority", priority), ("resources", resources),
                            ("workers", workers), ("allow_other_workers", allow_other_workers),
                            ("memory", memory), ("pool", pool), ("duration", duration)):
            if value:
                out[name] = value
        return out

    @staticmethod
    def _our_pool(pool, kwargs: dict):
        """pool='bigmem' is a pool of ours; dask's local schedulers take a thread pool object
        by the same keyword, which means nothing here (said as for their other keywords)."""
        if pool is not None and not isinstance(pool, str):
            kwargs["pool"] = pool
            return None
        return pool

    @staticmethod
    def _check_kwargs(kwargs: dict, what: str) -> None:
        kwargs = {k: v for k, v in kwargs.items() if k not in _NOBODYS}
        unknown = sorted(set(kwargs) - _LOCAL_ONLY)
        if unknown and what == "get":
            # dask hands every keyword of x.compute(...) / dask.compute(...) to whichever
            # scheduler is in use, so get() ignores the ones it does not know, as dask's own
            # schedulers and distributed's do (a warning would make dask code that passes
            # another scheduler's keyword fail where warnings are errors). Said in the log.
            logger.warning("compute(): ignored keyword arguments %s (the cluster takes retries=, priority=, "
                           "resources=, workers=, allow_other_workers=, memory=, pool=, duration=)", unknown)
            kwargs = {k: v for k, v in kwargs.items() if k in _LOCAL_ONLY}
        elif unknown:
            raise TypeError(f"{what}() got unexpected keyword arguments {unknown}: the cluster takes retries=, "
                            "priority=, resources=, workers=, allow_other_workers=, memory=, pool=, duration= (and "
                            "dask.annotate(...) around the call)")
        if kwargs:
            warnings.warn(f"{sorted(kwargs)} only mean something to dask's local schedulers; ignored on the "
                          "cluster", UserWarning, stacklevel=3)

    def get(self, dsk, keys, *, sync: bool = True, retries: int | None = None, priority: int = 0,
            resources: dict | None = None, workers=None, allow_other_workers=None, memory=None, pool=None,
            duration=None, fifo_timeout="60s", actors=None, asynchronous=None, direct=None, **kwargs):
        """Run a dask graph on the cluster (dask's scheduler interface): the values of `keys`,
        in their (nested list) shape, or with sync=False the Futures. When a task fails, its
        error is raised at once and the call's futures are released, as distributed's: the
        scheduler forgets the rest of the call's work (what another future holds stays).
        `asynchronous` and `direct` are gather's (distributed's keywords, taken)."""
        placement_keywords(fifo_timeout, None, False, actors)
        pool = self._our_pool(pool, kwargs)
        self._check_kwargs(kwargs, "get")
        wanted: list = []
        _collect_keys(keys, wanted)
        futures = self._graph_to_futures(dsk, list(dict.fromkeys(wanted)),
                                         self._annotations(retries, priority, resources, workers, allow_other_workers,
                                                           memory, pool, duration))
        if not sync:
            return _rebuild_keys(keys, futures)
        try:
            values = self.gather(list(futures.values()))
        finally:
            for f in futures.values():
                f.release()
        return _rebuild_keys(keys, dict(zip(futures, values)))

    def compute(self, collections, sync: bool = False, optimize_graph: bool = True, workers=None,
                allow_other_workers=None, resources: dict | None = None, retries: int | None = 0, priority: int = 0,
                fifo_timeout="60s", actors=None, traverse: bool = True, memory=None, pool=None, duration=None,
                batch_size: int | None = None, **kwargs):
        """Start computing dask collections (one, or a list); their results as Futures (the
        final values with sync=True). Things that are not collections pass through.
        memory=, pool=, duration= are every task's needs (as submit's; dask.annotate for some);
        workers= and allow_other_workers= as submit's. fifo_timeout= and batch_size= are checked
        and change no result (docs/migrating-from-distributed.md); actors= is refused."""
        placement_keywords(fifo_timeout, batch_size, False, actors)
        import dask
        from dask._expr import FinalizeCompute
        from dask.base import collections_to_expr
        from dask.core import flatten
        pool = self._our_pool(pool, kwargs)
        self._check_kwargs(kwargs, "compute")
        singleton = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if singleton else list(collections)
        if traverse:
            items = [dask.delayed(a) if isinstance(a, (list, set, tuple, dict)) and not dask.is_dask_collection(a)
                     else a for a in items]
        variables = [a for a in items if dask.is_dask_collection(a)]
        by_key: dict = {}
        names: list = []
        if variables:
            expr = FinalizeCompute(collections_to_expr(variables, optimize_graph)).optimize()
            names = list(flatten(expr.__dask_keys__()))
            by_key = self._graph_to_futures(expr, names, self._annotations(retries, priority, resources, workers,
                                                                           allow_other_workers, memory, pool, duration))
        results, i = [], 0
        for a in items:
            if dask.is_dask_collection(a):
                results.append(by_key[names[i]])
                i += 1
            else:
                results.append(a)
        if sync:
            results = self.gather(results)
        return results[0] if singleton else results

    def persist(self, collections, optimize_graph: bool = True, workers=None, allow_other_workers=None,
                resources: dict | None = None, retries: int | None = None, priority: int = 0, fifo_timeout="60s",
                actors=None, memory=None, pool=None, duration=None, batch_size: int | None = None, **kwargs):
        """Start computing dask collections and return them, each backed by Futures: the data
        stays on the workers, and graphs built on them start from it. Keywords as compute's."""
        placement_keywords(fifo_timeout, batch_size, False, actors)
        import dask
        from dask.base import collections_to_expr
        from dask.core import flatten
        pool = self._our_pool(pool, kwargs)
        self._check_kwargs(kwargs, "persist")
        singleton = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if singleton else list(collections)
        not_collections = [type(a).__name__ for a in items if not dask.is_dask_collection(a)]
        if not_collections:
            raise TypeError(f"persist() takes dask collections, not {', '.join(not_collections)}")
        expr = collections_to_expr(items, optimize_graph).optimize()
        keys = expr.__dask_keys__()
        futures = self._graph_to_futures(expr, list(flatten(keys)),
                                         self._annotations(retries, priority, resources, workers, allow_other_workers,
                                                           memory, pool, duration))
        out = [rebuild({k: futures[k] for k in flatten(ks)}, *args)
               for (rebuild, args), ks in zip((a.__dask_postpersist__() for a in items), keys)]
        return out[0] if singleton else out

    def futures_of(self, obj) -> list[Future]:
        return futures_of(obj)

    def normalize_collection(self, collection):
        """A copy of `collection` whose tasks this client holds the results of already (a
        persisted collection's, say) read those results instead of computing them again, as
        distributed's; the collection itself when it holds none of them."""
        from dask.core import flatten
        from dask.optimization import cull
        graph = dict(collection.__dask_graph__())
        with self._lock:                  # held now, so not released before the Futures below hold them
            held = [k for k in graph if self._refs.get(wire_key(k), 0) > 0]
            if not held:
                return collection
            for k in held:
                graph[k] = Future(wire_key(k), self)
        graph, _ = cull(graph, list(flatten(collection.__dask_keys__())))
        rebuild, args = collection.__dask_postpersist__()
        return rebuild(graph, *args)


def _collect_keys(keys, out: list) -> None:
    if isinstance(keys, list):
        for k in keys:
            _collect_keys(k, out)
    else:
        out.append(keys)


def _rebuild_keys(keys, values: dict):
    if isinstance(keys, list):
        return [_rebuild_keys(k, values) for k in keys]
    return values[keys]


__all__ = ["CollectionsMixin", "current_client", "futures_of"]
