"""client.run(..., nanny=True): the function goes to the worker's nanny through us (issue 31).

A nanny listens on no port of its own; it keeps one connection to the scheduler (its exit
reports go up it, restarts come down). So the client's `run` for a nanny comes here, naming
the worker; we pass the message on to that worker's nanny and its `run-result` back to the
client as the answer to its request. Function, arguments and result stay opaque bytes: this
process only forwards them (DESIGN.md, principle 2). A nanny that goes away with runs
unanswered answers them with an error, so no caller waits for ever.
"""

from __future__ import annotations

import itertools

from ..protocol.messages import Op

ERROR = "error"          # an answer's status, as the worker's (worker/running.py)


class NannyRuns:
    def __init__(self, server):
        self.server = server
        self._ids = itertools.count(1)
        self.pending: dict[int, tuple[str, object, str]] = {}      # relay id -> (client, its rid, nanny id)

    def relay(self, cid: str, msg: dict) -> None:
        addr = msg.get("worker")
        ws = self.server.state.workers.get(addr) if isinstance(addr, str) else None
        nid = ws.info.get("nanny_id") if ws is not None else None
        stream = self.server.nannies.get(nid or "")
        if stream is None:
            why = (f"{addr} is not a worker of this cluster (any more)" if ws is None else
                   f"worker {addr} runs without a nanny (started with nanny=False), so there is no nanny to run "
                   "the function in; run it in the worker (nanny=False)")
            self.server._reply(cid, msg, _error(why))
            return
        relay = next(self._ids)
        self.pending[relay] = (cid, msg.get("rid"), nid)
        stream.send({"op": Op.RUN, "relay": relay, "worker": addr, "function": msg["function"],
                     "args": msg["args"], "kwargs": msg["kwargs"], "wait": bool(msg.get("wait", True))})

    def answered(self, msg: dict) -> None:
        entry = self.pending.pop(msg.get("relay"), None)
        if entry is None:
            return                                     # its client is gone, or a stray answer
        cid, rid, _ = entry
        answer = {k: v for k, v in msg.items() if k not in ("op", "relay")}
        self.server._reply(cid, {"rid": rid}, answer)

    def nanny_gone(self, nid: str) -> None:
        for relay, (cid, rid, owner) in list(self.pending.items()):
            if owner == nid:
                del self.pending[relay]
                self.server._reply(cid, {"rid": rid}, _error("the worker's nanny went away before it answered"))


def _error(text: str) -> dict:
    """An answer without a pickled exception (this process pickles nothing): the client makes
    a RuntimeError of the text."""
    return {"op": Op.RUN_RESULT, "status": ERROR, "text": text, "exception": None, "traceback": None}

