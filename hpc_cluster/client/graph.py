"""dask graphs -> our tasks, for the Client as dask's scheduler (`get`, `compute`, `persist`).

dask hands over an expression, a HighLevelGraph or a plain dict; dask's own converter turns
it into its task spec (Task, Alias, DataNode), which is what a worker runs: each node is
pickled with references to its inputs, the worker resolves them and calls the node with its
inputs' values. A node may depend on a key that is not in the graph: a Future (persisted
data, scattered data, a future placed in a `delayed` call), which the scheduler then waits
for like any other input. Annotations (retries, priority, resources, workers and
allow_other_workers) reach the tasks they name (and memory=, pool=, duration=, the task's
needs); what we cannot honour is refused, never dropped.
"""

from __future__ import annotations

import copy
import functools
import warnings

from ..protocol import serialize

# dask's annotations that mean something to a scheduler, and ours: a task's needs.
HONOURED = ("retries", "priority", "resources", "memory", "pool", "duration", "workers", "allow_other_workers")
# Task keys of dask's "disk" shuffle: partd files in a worker's local temporary directory,
# which a worker on another node cannot see. Run on a cluster they lose rows silently.
DISK_SHUFFLE_PREFIXES = ("zpartd", "diskshuffle", "partd")
# The node every P2P exchange of dask's (shuffle, merge, rechunk) waits on: distributed's
# extension of its own workers, which ours are not. Run here, its tasks fail mid-way with
# "P2P ... failed during transfer phase", which says nothing of why.
P2P_BARRIER = "P2PBarrierTask"


class UnsupportedGraph(ValueError):
    """A graph asks for something this cluster cannot do; the message names it."""


def task_needs(duration=None, memory=None, pool=None) -> dict:
    """A task's needs as the wire carries them: duration in seconds ('5m'), memory in bytes
    ('20GB'), pool by name. Checked here, so a bad value is refused where the user wrote it."""
    from ..units import parse_memory, parse_walltime
    out: dict = {}
    if duration is not None:
        out["duration"] = float(parse_walltime(duration, "duration"))
    if memory is not None:
        out["memory"] = parse_memory(memory, "memory")
    if pool is not None:
        if not isinstance(pool, str) or not pool:
            raise TypeError(f"pool={pool!r}: give a pool's name, e.g. pool='bigmem' (the cluster's pools=)")
        out["pool"] = pool
    return out


def task_where(workers=None, allow_other_workers=None) -> dict:
    """workers= as the wire carries it: {"workers": sorted distinct names, "allow_other_workers":
    bool}, or {} for none. Read as distributed reads it: one or several worker addresses
    ("tcp://10.0.0.5:40321", "10.0.0.5:40321", ("10.0.0.5", 40321)), worker names ("worker-3",
    or a number as dask's LocalCluster names them) or hosts ("10.0.0.5", "node017"); a host:port
    is resolved here, as distributed's scheduler resolves it (scheduler/state/restrictions.py
    compares strings only)."""
    if allow_other_workers not in (True, False, None):
        raise TypeError(f"allow_other_workers={allow_other_workers!r}: give True or False")
    if workers is None or isinstance(workers, (list, tuple, set, frozenset)) and not workers:
        return {}
    if isinstance(workers, (str, int)) and not isinstance(workers, bool):
        workers = [workers]
    elif isinstance(workers, tuple) and len(workers) == 2 and isinstance(workers[1], int):
        workers = [workers]                       # one ("host", port)
    elif not isinstance(workers, (list, tuple, set, frozenset)):
        raise TypeError(f"workers={workers!r}: give a worker's address, name or host, or a list of them "
                        "(client.scheduler_info()['workers'] lists the addresses and names)")
    names = sorted({_worker_name(w) for w in workers})
    return {"workers": names, "allow_other_workers": bool(allow_other_workers)}


def _worker_name(w) -> str:
    if isinstance(w, tuple) and len(w) == 2 and isinstance(w[0], str) and isinstance(w[1], int):
        return _resolved(f"{w[0]}:{w[1]}")
    if isinstance(w, int) and not isinstance(w, bool):
        return str(w)                             # a worker named 0, 1, ... (dask's LocalCluster)
    if not isinstance(w, str) or not w.strip():
        raise TypeError(f"workers= entry {w!r}: give a worker's address ('tcp://10.0.0.5:40321'), "
                        "its name or its host, as strings")
    return _resolved(w.strip().rstrip("/"))


@functools.lru_cache(maxsize=256)
def _resolved(name: str) -> str:
    """'localhost:40321' -> '127.0.0.1:40321' (workers register by IP address); a name or a host
    without a port stays as written (resolving every worker name would ask DNS for each)."""
    import socket
    proto, _, hostport = name.rpartition("://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host or host.startswith("["):
        return name
    try:
        host = socket.gethostbyname(host)
    except OSError:
        pass                                      # kept as written: it may still match a worker's
    return f"{proto}://{host}:{port}" if proto else f"{host}:{port}"


def placement_keywords(fifo_timeout=None, batch_size=None, actor=False, actors=False) -> int | None:
    """Check distributed's other placement keywords; the batch size to cut a map into (None: ours).

    actor=/actors=: refused, we run no actors. fifo_timeout: checked as distributed parses it;
    our scheduler runs submissions in the order they arrive (distributed's fifo_timeout=0), so
    it changes no result (docs/migrating-from-distributed.md). batch_size: a map is sent in
    parts of at most that many tasks (each part is at most 250 anyway)."""
    if actor or actors:
        raise NotImplementedError(
            f"{'actor' if actor else 'actors'}={actor or actors!r}: hpc-cluster does not run actors (a stateful "
            "object kept on one worker and called through a proxy). Keep the state in task results and pass "
            "the futures on, or keep it in a file or database the tasks share")
    if fifo_timeout is not None and fifo_timeout not in ("100 ms", "60s"):      # distributed's defaults
        _fifo_seconds(fifo_timeout)
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise TypeError(f"batch_size={batch_size!r}: give a whole number of tasks (>= 1) per batch, or None")
    return batch_size


def _fifo_seconds(value) -> float:
    from dask.utils import parse_timedelta
    try:
        seconds = parse_timedelta(value)
    except (KeyError, ValueError, TypeError, AttributeError):
        seconds = None
    if seconds is None or seconds < 0:
        raise ValueError(f"fifo_timeout={value!r}: give a time such as '100 ms', '60s' or a number of seconds")
    return seconds


def wire_key(key) -> str:
    """Our keys are strings; dask's may be tuples like ('x-abc', 0, 1)."""
    return key if isinstance(key, str) else repr(key)


def run_graph_node(node, inputs: dict):
    return node(inputs)


# A node's function up to this size (pickled) travels apart from the node (GraphCall).
PULL_BELOW = 4096


class GraphCall:
    """A graph node's function, sent as the task's function instead of inside every node.

    A 1,000,000-task graph of `inc` from the user's script carried `inc` by value (450 B) in
    each node's pickle, and the scheduler held a million copies (issue 19: 1,871 B per
    waiting task). Pulled out, the nodes that share a function share one payload: the
    message carries it once, the scheduler keeps it once, a worker unpickles it once."""

    __slots__ = ("func",)

    def __init__(self, func):
        self.func = func

    def __reduce__(self):
        return GraphCall, (self.func,)

    def __call__(self, node, inputs: dict):
        node.func = self.func           # the node was unpickled for this run alone
        return node(inputs)


def _dask_order(graph: dict) -> list:
    """The keys in dask.order's order. Our priority is submission order, so this runs the
    graph the way dask would: depth-first, releasing intermediates early, which keeps both
    memory and what a worker's death can destroy small."""
    try:
        from dask.order import order
        rank = order(graph)
        return sorted(graph, key=lambda k: getattr(rank[k], "priority", rank[k]))
    except Exception:  # an ordering is an optimisation; never fail a computation over it
        return list(graph)


def materialize(dsk) -> tuple[dict, dict]:
    """(dask task spec graph, {annotation: {key: value}}) of what dask hands a scheduler."""
    from dask._task_spec import convert_legacy_graph
    annotations: dict = {}
    if hasattr(dsk, "__dask_graph__"):           # an expression (dask >= 2025)
        try:
            annotations = dict(dsk.__dask_annotations__() or {})
        except Exception:                        # annotations are extra; the graph is what counts
            annotations = {}
        dsk = dsk.__dask_graph__()
    if hasattr(dsk, "layers"):                   # a HighLevelGraph: annotations are per layer
        for layer in dsk.layers.values():
            for name, value in (getattr(layer, "annotations", None) or {}).items():
                per_key = annotations.setdefault(name, {})
                for key in layer.keys():
                    per_key.setdefault(key, value(key) if callable(value) else value)
    return convert_legacy_graph(dict(dsk)), annotations


def check_graph(graph: dict) -> None:
    from dask.utils import key_split
    disk = sorted({key_split(k) for k in graph} & set(DISK_SHUFFLE_PREFIXES))
    if disk:
        raise UnsupportedGraph(
            f"this graph shuffles through files on a local disk (dask's 'disk' shuffle method: tasks "
            f"{', '.join(repr(d) for d in disk)}), which loses data on workers that share no "
            "filesystem. Build it with shuffle_method='tasks' (set_index, merge, groupby, shuffle; "
            "shuffle='tasks' for a bag's groupby), or leave the method out while the Client is dask's "
            "default scheduler (Client(...) makes it so; dask.config.set({'dataframe.shuffle.method': "
            "'tasks'}) otherwise)")
    p2p = sorted({key_split(k) for k, node in graph.items() if type(node).__name__ == P2P_BARRIER})
    if p2p:
        raise UnsupportedGraph(
            f"this graph uses dask's 'p2p' shuffle (tasks {', '.join(repr(p) for p in p2p)}), which runs only "
            "on distributed's workers, an extension of theirs that ours do not have. Build it with "
            "shuffle_method='tasks' (set_index, merge, groupby, shuffle; array.rechunk.method 'tasks' for "
            "a rechunk), or leave the method out while the Client is dask's default scheduler; or run "
            "the cluster with engine='distributed' and distributed's Client (docs/choosing-an-engine.md)")


def task_annotations(key, per_key: dict, overall: dict) -> dict:
    """The annotations of one task: per-key (from the graph) over those of the whole call."""
    out = dict(overall)
    for name, values in per_key.items():
        if isinstance(values, dict) and key in values:
            out[name] = values[key]
    return out


def check_annotations(overall: dict, per_key: dict) -> None:
    """Say which annotations have no meaning here (workers= and allow_other_workers= do)."""
    names = set(overall) | {n for n, v in per_key.items() if v}
    ignored = sorted(names - set(HONOURED) - {"fifo_timeout"})
    if ignored:
        warnings.warn(f"dask annotations {ignored} have no meaning to hpc-cluster's scheduler and are "
                      f"ignored (honoured: {', '.join(HONOURED)})", UserWarning, stacklevel=4)


def graph_tasks(dsk, func_blob_of, overall: dict | None = None) -> tuple[list[dict], dict]:
    """Task specs for our scheduler, in dask.order's order, and {dask key: wire key}.

    `overall`: annotations for every task (keywords of compute/get, dask.annotate around
    the call); the graph's own per-key annotations win over them.
    """
    graph, per_key = materialize(dsk)
    check_graph(graph)
    overall = dict(overall or {})
    check_annotations(overall, per_key)
    wire = {k: wire_key(k) for k in graph}
    needs_of = functools.lru_cache(maxsize=64)(task_needs)      # parsed once per distinct value
    where_of = _WhereCache()
    pull = _FunctionPuller(func_blob_of)
    specs = []
    for key in _dask_order(graph):
        node = graph[key]
        # Inputs outside the graph (futures: persisted or scattered data) are keys too.
        refs = {d: serialize.KeyRef(wire.get(d) or wire_key(d)) for d in node.dependencies}
        func_blob, node = pull(node)
        blob, deps = serialize.dumps_args((node, refs), {})
        ann = task_annotations(key, per_key, overall)
        specs.append({"key": wire[key], "func": func_blob, "args": blob, "deps": sorted(deps),
                      "priority": int(ann.get("priority") or 0), "retries": int(ann.get("retries") or 0),
                      "resources": dict(ann.get("resources") or {}),
                      **needs_of(ann.get("duration"), ann.get("memory"), ann.get("pool")),
                      **where_of(ann.get("workers"), ann.get("allow_other_workers"))})
    return specs, wire


class _WhereCache:
    """task_where once per distinct workers= value of a graph (a list is no lru_cache key): the
    values are the annotations' own objects, alive for the whole call, so their ids stay theirs."""

    def __init__(self):
        self._seen: dict = {}

    def __call__(self, workers, loose) -> dict:
        if not workers:
            return {}                             # allow_other_workers without workers: nothing (as distributed)
        entry = self._seen.get((id(workers), loose))
        if entry is None:
            entry = self._seen[(id(workers), loose)] = (workers, task_where(workers, loose))
        return entry[1]


class _FunctionPuller:
    """(function payload, node to pickle) per node: a dask Task's function as a GraphCall,
    pickled once per distinct function of the submission, and a copy of the node without it.
    Other nodes (data, aliases, subclasses of Task), and functions that pickle larger than
    PULL_BELOW, stay whole under run_graph_node."""

    def __init__(self, func_blob_of):
        from dask._task_spec import Task
        self._task_type, self._blob_of = Task, func_blob_of
        self._whole = func_blob_of(run_graph_node)
        self._calls: dict[int, tuple] = {}      # id(function) -> (function, its payload or None)

    def __call__(self, node) -> tuple[bytes, object]:
        if type(node) is not self._task_type or not callable(node.func):
            return self._whole, node
        func = node.func
        entry = self._calls.get(id(func))
        if entry is None:                       # the function is held, so its id stays its own
            blob = self._blob_of(GraphCall(func))
            entry = self._calls[id(func)] = (func, blob if len(blob) <= PULL_BELOW else None)
        if entry[1] is None:
            return self._whole, node
        bare = copy.copy(node)                  # the user's graph is left as it was
        bare.func = None
        return entry[1], bare
