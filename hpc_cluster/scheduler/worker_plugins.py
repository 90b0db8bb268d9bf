"""The worker plugins a cluster keeps for the workers to come (issue 31, point 4).

A client registers a plugin here as opaque pickled bytes, never unpickled in this process
(DESIGN.md, principle 2); every worker that registers afterwards is handed them all, in order,
with its `registered` answer (links.py), and sets them up before it reads a task. The client
sets the plugin up on the workers that are here already itself, over their own ports: the
answer names them, and since this loop answers one message at a time a worker is either named
or handed the plugin at registration, never both and never neither.

Kept in memory only: a restarted scheduler starts without plugins (workers that reattach keep
theirs; new workers get none until they are registered again).
"""

from __future__ import annotations

import logging

from ..protocol.frames import Opaque, ProtocolError
from ..protocol.messages import Op

logger = logging.getLogger("hpc_cluster.scheduler")


class WorkerPluginRegistry:
    def __init__(self):
        self.plugins: dict[str, Opaque] = {}          # name -> its pickle, in registration order

    def entries(self) -> list[dict]:
        """What a registering worker sets up, in order."""
        return [{"name": name, "plugin": blob} for name, blob in self.plugins.items()]

    def register(self, name: str, blob: Opaque, idempotent: bool) -> bool:
        """Keep it (replacing one of that name, unless `idempotent`); was it added?"""
        if idempotent and name in self.plugins:
            return False
        self.plugins.pop(name, None)                  # a replacement goes to the end: set up after the rest
        # Copied out of the message: a view would keep the whole received buffer alive.
        self.plugins[name] = Opaque(bytes(blob.data), [bytes(b) for b in blob.buffers])
        logger.info("worker plugin %r registered (%d bytes)", name, blob.nbytes)
        return True

    def client_op(self, server, msg: dict) -> dict:
        """A client's register / unregister / restart-workers message: the answer to reply."""
        op, workers = msg["op"], list(server.state.workers)
        if op == Op.RESTART_WORKERS:
            return restart_workers(server, _names(msg.get("workers"), "workers"))
        name = msg.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"{op} needs a plugin name")
        if op == Op.UNREGISTER_WORKER_PLUGIN:
            known = self.plugins.pop(name, None) is not None
            return {"known": known, "workers": workers if known else [], "registered": list(self.plugins)}
        blob = msg.get("plugin")
        if not isinstance(blob, Opaque) or not isinstance(msg.get("idempotent", False), bool):
            raise ProtocolError("register-worker-plugin needs the plugin's payload and idempotent true or false")
        added = self.register(name, blob, msg.get("idempotent", False))
        return {"added": added, "workers": workers if added else []}


def restart_workers(server, addresses: list[str]) -> dict:
    """Restart these workers through their nannies (a plugin's restart_workers): each leaves as
    'retired' (asked to leave: nothing it ran is charged), its results are recomputed where
    needed, and the fresh process sets the plugins up as it registers."""
    restarted, without_nanny = [], []
    for addr in addresses:
        ws = server.state.workers.get(addr)
        if ws is None:
            continue                                   # gone meanwhile: its successor starts fresh anyway
        stream = server.nannies.get(ws.info.get("nanny_id") or "")
        if stream is None:
            without_nanny.append(addr)
            continue
        server._intents[addr] = "restart"
        stream.send({"op": Op.RESTART})
        restarted.append(addr)
    return {"restarted": restarted, "without_nanny": without_nanny}


def _names(value, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError(f"{what} must be a list of addresses")
    return value
