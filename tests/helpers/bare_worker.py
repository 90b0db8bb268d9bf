"""A Worker driven directly, without sockets: what it sends the scheduler is recorded."""

from __future__ import annotations

from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.worker.logs import LogBuffer
from hpc_cluster.worker.worker import Worker


class Outbox:
    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)

    def flush(self):
        pass


def bare_worker(monkeypatch, nthreads: int = 1) -> Worker:
    """A worker not connected to anything; shut its executor down when done."""
    monkeypatch.setattr(LogBuffer, "install", classmethod(lambda cls: None))
    w = Worker("tcp://127.0.0.1:1", b"s" * 32, nthreads=nthreads)
    w.address = "tcp://127.0.0.1:2"
    w.scheduler = Outbox()
    return w


PEER = "tcp://127.0.0.1:3"      # the worker said to hold the inputs of compute(..., size=...)


def compute(w, key, deps=(), priority=0, size=None, after=None, batch=False) -> None:
    """Hand the bare worker `w` the scheduler's compute message for `key`. Its inputs `deps` are
    held by PEER, `size` bytes each, when `size` is given, else by nobody yet (a task sent
    ahead, `after` its input). Then the worker runs what is ready, as after each batch of
    messages, unless `batch` (more messages follow in the same read)."""
    msg = {"op": "compute", "key": key, "func": Opaque(b""), "args": Opaque(b""),
           "deps": {d: [PEER] if size is not None else [] for d in deps}, "priority": [priority]}
    if size is not None:
        msg["sizes"] = {d: size for d in deps}
    if after is not None:
        msg["after"] = after
    w._add_task(msg)
    if not batch:
        w._run_ready()


def finish(w, key, value=1, duration=0.1) -> None:
    """The task thread returns `key`'s result to the loop (worker._executed's path)."""
    w._done.append((w.tasks[key], ("ok", value, 28), duration))
    w._drain_done()
