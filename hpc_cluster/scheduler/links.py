"""The scheduler's side of its workers' and nannies' connections (part of server.py's Scheduler).

A worker registers first (refused, with the reason, if its address is not its own), then
every batch it sends is applied to the state in one event: task started / finished / erred,
inputs missing, tasks handed back, replicas, heartbeats with its memory. A nanny registers
and sends its worker's exit report, which refines that death's verdict (evidence.py).
A malformed message is a ProtocolError: that one connection is dropped, logged.
"""

from __future__ import annotations

import functools
import logging

from ..protocol.comm import BatchedSend, Comm
from ..protocol.frames import ProtocolError
from .checks import _count, _deadline, _fractions, _held, _keys, _memory, _number
from .workers import heartbeat_interval

logger = logging.getLogger("hpc_cluster.scheduler")


class WorkerLinksMixin:
    async def _serve_worker(self, comm: Comm) -> None:
        first = (await comm.read())[0]
        if first.get("op") != "register-worker" or not isinstance(first.get("address"), str):
            raise ProtocolError("a worker must register first")
        addr = first["address"]
        nthreads = first.get("nthreads", 1)
        if not isinstance(nthreads, int) or not 1 <= nthreads <= 2**20:
            raise ProtocolError("nthreads must be a positive integer")
        held, running = _held(first.get("held") or {}), _keys(first.get("running") or [], "running")
        refusal = self._registration_refusal(addr)
        if refusal:
            logger.warning("refused a worker registering as %s: %s", addr, refusal)
            await comm.write({"op": "refused", "error": refusal})
            comm.close()
            return
        # Reply before any task can be queued for it, so "registered" travels alone.
        await comm.write({"op": "registered", "address": addr,
                          "heartbeat_interval": heartbeat_interval(len(self.state.workers) + 1)})
        self.streams[addr] = BatchedSend(comm, self.flusher)
        self.comms[addr] = comm
        info = {"pid": first.get("pid"), "host": first.get("host"), "versions": comm.peer_info.get("versions"),
                "nanny": first.get("nanny"), "job_id": first.get("job_id"), "nanny_id": first.get("nanny_id"),
                "job_walltime": _number(first.get("job_walltime")), "job_start": _number(first.get("job_start")),
                "lifetime": _number(first.get("lifetime")), "lifetime_end": _number(first.get("lifetime_end")),
                "memory_fractions": _fractions(first.get("memory_fractions")),
                "pool": first.get("pool") if isinstance(first.get("pool"), str) else None,
                "spill_directory": first.get("spill_directory") if isinstance(first.get("spill_directory"), str)
                else None}
        name = str(first.get("name") or addr)
        # A worker that comes back with what it kept (scheduler/state/reattach.py) joins in one event;
        # results a journal's rebuilt state holds for it by name are confirmed or lost there.
        join = functools.partial(self.state.add_reattached_worker, held=held, running=running) \
            if held or running or name in self.state.awaited_workers else self.state.add_worker
        join(addr, nthreads, self.clock(), memory_limit=first.get("memory_limit") or 0,
             name=name, resources=first.get("resources") or {},
             info=info, deadline=_deadline(info))
        self._flush()
        if self._backlog:
            self._replay_backlog()            # its results may be inputs a client's submission waits for
        logger.info("worker %s registered (%d threads)", addr, nthreads)
        self._pace_heartbeats()
        self._tell("joined", info)
        connection = "closed"
        try:
            async for msgs in comm.batches():
                now = self.clock()
                self.state.heartbeat(addr, now)
                for msg in msgs:
                    if self._worker_message(addr, msg, now) == "goodbye":
                        connection = "goodbye"
                self._flush()
        finally:
            if self.comms.get(addr) is comm:
                del self.comms[addr]
                self._remove_worker(addr, connection)

    def _registration_refusal(self, addr: str) -> str | None:
        """Why a worker may not register at `addr`, or None. Taking a live worker's address
        used to evict the real worker for good, and a client's id to steal its stream (the
        client hung): each peer's address is its own."""
        if not addr.startswith(("tcp://", "tls://")):
            return (f"{addr!r} is not a worker address: register the tcp://host:port (tls://host:port "
                    "with security=) the worker listens on")
        if addr in self.streams or addr in self.state.clients:
            live = self.comms.get(addr)
            if live is None or not live.closed:
                return (f"{addr} is the address of a worker that is connected and alive; each worker "
                        "needs its own address (a free --worker-port, or leave it out)")
        return None

    def _worker_message(self, addr: str, msg: dict, now: float):
        op, st = msg["op"], self.state
        try:
            if op == "task-finished":
                st.task_finished(addr, msg["key"], _count(msg.get("nbytes"), "nbytes"), _number(msg.get("duration")))
                self.stream.finished(addr, msg["key"], now, "memory")
            elif op == "task-started":
                st.task_started(addr, msg["key"], now, _memory(msg.get("memory")))
                ws = st.workers.get(addr)
                if ws is not None and isinstance(msg["key"], str):
                    self.stream.started(addr, ws.name, msg["key"], now)
            elif op == "task-erred":
                st.task_erred(addr, msg["key"], {"exception": msg.get("exception"),
                                                  "traceback": msg.get("traceback"),
                                                  "text": str(msg.get("text", ""))})
                self.stream.finished(addr, msg["key"], now, "erred")
            elif op == "missing-data":
                st.missing_data(addr, msg["key"], msg["dep"], _keys(msg.get("holders", []), "holders"))
            elif op == "handed-back":
                st.handed_back(addr, _keys(msg["keys"], "keys"))
            elif op in ("task-seceded", "task-rejoined"):
                st.task_seceded(addr, str(msg["key"]), op == "task-seceded")
            elif op == "abandoned-done":
                st.abandoned_done(addr, msg["key"])
            elif op == "add-replica":
                st.add_replica(addr, msg["key"], _count(msg.get("nbytes"), "nbytes"))
            elif op == "replica-failed":
                st.replica_failed(addr, msg["key"])
            elif op == "heartbeat":
                if msg.get("memory") is not None:
                    st.worker_memory(addr, _memory(msg["memory"]), now)
            elif op == "goodbye":
                return "goodbye"
            else:
                raise ProtocolError(f"unknown op {op!r} from worker")
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed {op!r} message from worker: {type(exc).__name__}: {exc}") from None
        return None

    # -- nannies ---------------------------------------------------------------
    async def _serve_nanny(self, comm: Comm) -> None:
        nanny_id = None
        try:
            while True:
                for msg in await comm.read():
                    self._nanny_message(comm, msg)
                    nanny_id = msg.get("nanny_id") if msg["op"] == "register-nanny" else nanny_id
        finally:
            if nanny_id and self.nannies.get(nanny_id) is not None and self.nannies[nanny_id].comm is comm:
                del self.nannies[nanny_id]
                self.deaths.nanny_gone(nanny_id)
                self._flush()

    def _nanny_message(self, comm: Comm, msg: dict) -> None:
        op = msg["op"]
        if op == "register-nanny":
            if not isinstance(msg.get("nanny_id"), str):
                raise ProtocolError("register-nanny needs a string nanny_id")
            self.nannies[msg["nanny_id"]] = BatchedSend(comm)
        elif op == "exit-report" and isinstance(msg.get("report"), dict):
            self.deaths.exit_report(msg["report"])
            self._tell("exit-report", msg["report"])
        else:
            raise ProtocolError(f"unknown op {op!r} from nanny")
