"""dask-style graphs -> our tasks, for `Client.get` (so `dask.compute(x, scheduler=client.get)` works).

Graphs are normalised with dask's own converter (dask is needed only if you pass dask
graphs). Each node is pickled with references to its inputs; the worker resolves them
and calls the node with its inputs' values.
"""

from __future__ import annotations

from .protocol import serialize


def wire_key(key) -> str:
    """Our keys are strings; dask's may be tuples like ('x-abc', 0, 1)."""
    return key if isinstance(key, str) else repr(key)


def run_graph_node(node, inputs: dict):
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


def graph_tasks(dsk: dict, func_blob_of) -> tuple[dict, dict, bytes]:
    """Return ({key: (args_blob, dep wire keys)}, {key: wire key}, pickled runner function)."""
    try:
        from dask._task_spec import convert_legacy_graph
    except ImportError:  # pragma: no cover - dask is a test/optional dependency
        raise ImportError("Client.get runs dask graphs and needs dask installed: pip install dask") from None
    if hasattr(dsk, "__dask_graph__"):         # dask >= 2025 hands over an expression
        dsk = dsk.__dask_graph__()
    graph = convert_legacy_graph(dict(dsk))
    wire = {k: wire_key(k) for k in graph}
    tasks = {}
    for key in _dask_order(graph):
        node = graph[key]
        deps = [d for d in node.dependencies if d in graph]
        refs = {d: serialize.KeyRef(wire[d]) for d in deps}
        blob, _ = serialize.dumps_args((node, refs), {})
        tasks[key] = (blob, sorted(wire[d] for d in deps))
    return tasks, wire, func_blob_of(run_graph_node)
