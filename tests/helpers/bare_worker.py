"""A Worker driven directly, without sockets: what it sends the scheduler is recorded."""

from __future__ import annotations

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
