"""scheduler/worker_plugins.py: the plugins kept for workers to come, as opaque bytes."""

from __future__ import annotations

from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.scheduler.worker_plugins import WorkerPluginRegistry


def test_plugins_are_kept_in_order_a_replacement_goes_last_and_idempotent_ones_stay():
    reg = WorkerPluginRegistry()
    received = bytearray(b"xxAAAAyy")
    assert reg.register("a", Opaque(memoryview(received)[2:6]), idempotent=False)
    assert reg.register("b", Opaque(b"B"), idempotent=False)
    received[2:6] = b"...."                       # the message's buffer, reused: the kept copy is its own
    assert [(e["name"], bytes(e["plugin"].data)) for e in reg.entries()] == [("a", b"AAAA"), ("b", b"B")]
    assert not reg.register("a", Opaque(b"A2"), idempotent=True)
    assert reg.register("a", Opaque(b"A3"), idempotent=False)
    assert [(e["name"], bytes(e["plugin"].data)) for e in reg.entries()] == [("b", b"B"), ("a", b"A3")]
