"""Reattaching works through the seam the Client offers (reattach.Reattachable), not through its
private attributes (issue 30, point 1): checked on reattach.py's source, and the seam's two
sides run here without sockets, reattach.py's against a recording fake, the Client's own."""

from __future__ import annotations

import ast
import asyncio
import collections
import inspect
import threading
from pathlib import Path

from hpc_cluster.client import reattach
from hpc_cluster.client.client import Client
from hpc_cluster.client.futures import FutureStates
from hpc_cluster.client.reattach import Reattachable, SpecKeeper
from hpc_cluster.protocol.frames import Limits, Opaque

REATTACH = Path(reattach.__file__)


def private_uses(source: str) -> list[str]:
    """`x._name` (x not self) and getattr/setattr/hasattr(x, "_name") in the source, by line."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
            out.append(f"{node.lineno}: .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_")):
            out.append(f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return out


def client_uses(source: str) -> set[str]:
    """The attributes used of a name `client` (reattach.py's parameter for the Client)."""
    return {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "client"}


def seam() -> set[str]:
    members = {name for name in vars(Reattachable) if not name.startswith("_")}
    return members | set(Reattachable.__annotations__)


def test_reattach_touches_no_private_attribute_of_the_client():
    assert private_uses(REATTACH.read_text()) == []


def test_the_private_check_catches_what_reattach_did():
    for text in ("def f(client):\n    client._lost('x')\n",
                 "def f(c):\n    c._stream.send(1)\n",
                 "def f(client):\n    with client._lock:\n        pass\n",
                 "def f(client):\n    return getattr(client, '_refs')\n"):
        assert private_uses(text), text
    assert private_uses("class A:\n    def f(self):\n        self._x = 1\n") == []


def test_reattach_uses_of_the_client_only_the_seam():
    used = client_uses(REATTACH.read_text())
    assert used and used <= seam(), sorted(used - seam())


def test_the_client_offers_the_whole_seam():
    init = inspect.getsource(Client.__init__)
    for name in seam():
        assert hasattr(Client, name) or f"self.{name} =" in init or f"self.{name}," in init, name


class FakeComm:
    def __init__(self, welcome):
        self.welcome, self.closed = welcome, False

    async def read(self):
        return [self.welcome]

    def close(self):
        self.closed = True


class FakeClient:
    """Reattachable, recording the calls in order."""

    def __init__(self, refs=None, failed=(), specs=(), queue=(), limits=None, comms=()):
        self.status, self.reconnect, self.cluster = "reconnecting", 5.0, None
        self.scheduler_address, self.cluster_file = "tcp://old:1", None
        self.limits = limits or Limits()
        self.refs, self.failed, self.specs, self.queue = dict(refs or {}), set(failed), list(specs), list(queue)
        self.comms, self.calls, self.sent, self.requeued = list(comms), [], [], None

    async def open_connection(self, address):
        self.calls.append(("open", address))
        if not self.comms:
            raise ConnectionRefusedError("nobody there")
        return self.comms.pop(0)

    def adopt_connection(self, address, comm, welcome):
        self.calls.append(("adopt", address, welcome["client"]))

    def holdings(self):
        self.calls.append(("holdings",))
        return self.refs, self.failed, self.specs, self.queue

    def requeue(self, items):
        self.calls.append(("requeue",))
        self.requeued = items

    def send_now(self, msgs):
        self.calls.append(("send",))
        self.sent.extend(msgs)

    def run_again(self):
        self.calls.append(("run",))
        self.status = "running"

    def give_up(self, text):
        self.calls.append(("give up", text))
        self.status = "disconnected"


FUNC = Opaque(b"f")


def task_spec(key, deps=()):
    return {"key": key, "func": FUNC, "args": Opaque(b"a"), "deps": list(deps)}


def test_resume_tells_what_is_held_then_the_unfinished_work_then_the_queue():
    c = FakeClient(refs={"done": 1, "bad": 1, "todo": 2}, failed={"bad"},
                   specs=[task_spec("todo", ["done"])],
                   queue=[{"op": "update-graph", "tasks": [task_spec("todo")]}, "gone", {"op": "cancel", "keys": ["x"]}])
    assert reattach.resume(c) == (2, 1)
    assert c.sent == [{"op": "want-keys", "keys": ["done"]},       # not the failed one, not the spec'd one
                      {"op": "update-graph", "tasks": [task_spec("todo", ["done"])], "keys": ["todo"]}]
    # The queued submission is among the specs: it does not go twice; the rest keeps its order.
    assert c.requeued == ["gone", {"op": "cancel", "keys": ["x"]}]


def test_resume_splits_within_the_new_schedulers_limits_and_carries_inputs():
    # max_frames 5: two tasks a part. "a" is an input of a later part, held by no future.
    specs = [task_spec("a"), task_spec("b"), task_spec("c", ["a"])]
    c = FakeClient(refs={"b": 1, "c": 1}, specs=specs, limits=Limits(max_frames=5))
    reattach.resume(c)
    parts = [m for m in c.sent if m["op"] == "update-graph"]
    assert [[t["key"] for t in m["tasks"]] for m in parts] == [["a", "b"], ["c"]]
    assert c.requeued == ["a"]                    # released once the last part went


def test_reattach_adopts_resumes_then_runs_again():
    c = FakeClient(refs={"k": 1}, comms=[FakeComm({"client": "client-2"})])
    assert asyncio.run(reattach.reattach(c)) is True
    assert c.calls == [("open", "tcp://old:1"), ("adopt", "tcp://old:1", "client-2"), ("holdings",),
                       ("requeue",), ("send",), ("run",)]


def test_a_window_that_ends_cancels_the_pending_futures_saying_why():
    c = FakeClient()
    c.reconnect = 0.3
    asyncio.run(reattach.reattach_or_give_up(c))
    assert c.calls[0] == ("open", "tcp://old:1")
    assert c.calls[-1][0] == "give up" and "within 0.3 s (Client(reconnect=))" in c.calls[-1][1]


def bare_client(refs, states, specs, queue) -> Client:
    """A Client's seam state without a connection (what __init__ sets up for it)."""
    client = object.__new__(Client)
    client._lock = threading.RLock()
    client._refs = collections.Counter(refs)
    client._states = FutureStates(client._lock)
    for key, status in states.items():
        client._states.state(key).status = status
    client._specs = SpecKeeper()
    client._specs.add(specs, [s["key"] for s in specs])
    client._outq = list(queue)
    return client


def test_the_clients_holdings_take_the_queue_and_requeue_puts_items_before_later_ones():
    client = bare_client({"ok": 1, "err": 1, "off": 1, "todo": 1},
                         {"ok": "finished", "err": "error", "off": "cancelled", "todo": "pending"},
                         [task_spec("todo")], ["r1", {"op": "cancel"}])
    refs, failed, specs, queue = client.holdings()
    assert refs == {"ok": 1, "err": 1, "off": 1, "todo": 1} and failed == {"err", "off"}
    assert [s["key"] for s in specs] == ["todo"] and queue == ["r1", {"op": "cancel"}]
    assert client._outq == []
    client._outq.append("later")                  # queued by a user's thread meanwhile
    client.requeue(["first", "second"])
    assert client._outq == ["first", "second", "later"]
