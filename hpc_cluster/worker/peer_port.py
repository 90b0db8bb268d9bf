"""The worker's own port: what peers and clients ask of it (Worker._serve_peer hands each
connection here). Results out (get-data, read from disk in a thread when spilled), results in
(put-data: a client's scatter), a ping, its log tail, and the plugin and run requests
(worker/plugins.py). A message of any other op ends the connection with a ProtocolError."""

from __future__ import annotations

from ..protocol import serialize
from ..protocol.comm import Comm
from ..protocol.frames import Opaque, ProtocolError
from ..protocol.messages import Op

# Plain str copies of the ops read per transfer (protocol/messages.py: a literal's cost).
GET_DATA, DATA = Op.GET_DATA.value, Op.DATA.value


async def serve_peer(worker, comm: Comm) -> None:
    while True:
        for msg in await comm.read():
            op = msg["op"]
            if op == GET_DATA:
                keys = msg.get("keys")
                if not isinstance(keys, list):
                    raise ProtocolError("get-data needs a list of keys")
                if any(worker.data.is_spilled(k) for k in keys):
                    # Read from disk in a thread: the event loop keeps serving meanwhile.
                    data, missing, errors = await worker.loop.run_in_executor(None, worker._payloads, keys)
                else:
                    data, missing, errors = worker._payloads(keys)
                await comm.write({"op": DATA, "data": data, "missing": missing, "errors": errors})
            elif op == Op.PUT_DATA:
                items = msg.get("data")
                if not isinstance(items, dict) or not all(isinstance(v, Opaque) for v in items.values()):
                    raise ProtocolError("put-data needs a map of keys to payloads")
                for k, blob in items.items():
                    worker.nbytes[k] = worker.data.put(k, serialize.loads_value(blob), spill=False)
                worker.memory.spill_soon()
                await comm.write({"op": Op.OK, "nbytes": {k: worker.nbytes[k] for k in items}})
            elif op == Op.PING:
                await comm.write({"op": Op.PONG, "address": worker.address})
            elif op == Op.GET_LOGS:
                n = msg.get("n", 200)
                lines = list(worker.logs)[-int(n):] if isinstance(n, int) and n > 0 else []
                await comm.write({"op": Op.LOGS, "lines": lines})
            elif op in (Op.RUN, Op.SETUP_PLUGIN, Op.TEARDOWN_PLUGIN):
                await comm.write(await worker.plugins.answer(msg))
            else:
                raise ProtocolError(f"unknown op {op!r} on the worker's port")
