"""What coordination (coordination.py) and published datasets (datasets.py) share: values sent
through the scheduler, and asking the scheduler with an answer that may wait.

A value travels as opaque bytes (pickled here, never unpickled by the scheduler) with the keys of
the futures inside it, pickled as references (protocol/serialize.py's persistent ids, as a task's
arguments are), so the scheduler keeps those results alive while it holds the value. Whoever
gets the value gets futures of its own client to them, and then says so (`coordination-taken`):
only then does the scheduler tell it their state, which a client drops for a key it holds no
future to yet.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .exceptions import TimeoutError
from .futures import Future
from .timeouts import parse_timeout  # noqa: F401  (coordination.py reads it from here)
from ..protocol import context, serialize
from ..protocol.frames import Opaque
from ..protocol.messages import Op

# asyncio.wait_for needs a number: a wait with no timeout of its own ends with the scheduler's
# answer or the connection (its reply then fails with ConnectionError), not with this.
FOREVER = 10.0 ** 9

_RAISED = {"ValueError": ValueError, "KeyError": KeyError, "RuntimeError": RuntimeError,
           "TimeoutError": TimeoutError}


def pack(value, what: str) -> dict:
    """`value` as the scheduler keeps it: {'data': pickled bytes, 'keys': futures inside}."""
    try:
        blob, keys = serialize.dumps_args((value,), {})
    except serialize.SerializationError as exc:
        raise serialize.SerializationError(f"{what} could not be pickled: {exc.__cause__ or exc}. Share "
                                           "picklable values (or futures to the results)") from exc
    return {"data": Opaque(blob), "keys": sorted(keys)}


def unpack(client, wire: dict) -> Any:
    """A value the scheduler sent, its futures this client's; the scheduler is told they are held."""
    data = wire["data"]
    (value,), _ = serialize.loads_args(data.data if isinstance(data, Opaque) else data,
                                       lambda key: Future(key, client))
    if wire.get("keys"):
        client._send({"op": Op.COORDINATION_TAKEN, "keys": list(wire["keys"])})
    return value


def answer(result: dict):
    """The scheduler's answer, or what it refused raised as the exception it names."""
    if "error" in result:
        raise _RAISED.get(result.get("type"), RuntimeError)(result["error"])
    return result.get("ok")


def timed_out(result: dict) -> bool:
    return bool(result.get("timeout"))


async def _ask(client, msg: dict, limit: float):
    while True:
        try:
            return await client._request(msg, limit)
        except ConnectionError:
            # The scheduler went away while we asked or waited: asked again once the client has
            # reattached (a lease id or request id makes that safe); not if it gave up.
            if client.status != "reconnecting":
                raise


def ask(client, msg: dict, waits: bool = False, then=answer):
    """`then` (the scheduler's raw answer to `msg`): what the caller returns. An asynchronous
    client gets a future of it. A request that `waits` (its timeout in msg) may be parked there.

    A task that waits keeps its thread slot, as with distributed: giving it up meanwhile (as a
    gather does) deadlocked xarray's writes, whose tasks take an in-process lock before the file's
    Lock: the task granted the file's Lock waited to rejoin for the slot of a task waiting for
    the in-process lock it held."""
    if context.task() is not None and context.worker() is not None:
        msg["worker"] = context.worker().address          # leases of a worker that dies are released
    timeout = msg.get("timeout")
    limit = client.timeout if not waits else FOREVER if timeout is None else timeout + client.timeout
    if getattr(client, "asynchronous", False):          # from async code: started now, awaited there
        async def asked():
            on_loop = asyncio.run_coroutine_threadsafe(_ask(client, msg, limit), client._loop)
            return then(await asyncio.wrap_future(on_loop))
        return asyncio.ensure_future(asked())
    return then(client._lt.run(_ask(client, msg, limit), None))


def send(client, msg: dict) -> None:
    """A message no one waits for, in order with everything else the client sends."""
    client._send(msg)
