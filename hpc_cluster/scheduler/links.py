"""The scheduler's side of its workers' and nannies' connections (part of server.py's Scheduler).

A worker registers first (refused, with the reason, if its address is not its own), then
every batch it sends is applied to the state in one event: task started / finished / erred,
inputs missing, tasks handed back, replicas, heartbeats with its memory. A nanny registers
and sends its worker's exit report, which refines that death's verdict (evidence.py).
A malformed message is a ProtocolError: that one connection is dropped, logged.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from ..protocol.comm import BatchedSend, Comm
from ..protocol.frames import ProtocolError
from ..protocol.messages import Op
from .checks import (check_count, check_fractions, check_held, check_keys, check_memory, check_number,
                     worker_deadline)
from .workers import heartbeat_interval

logger = logging.getLogger("hpc_cluster.scheduler")

# Plain str copies of the ops _worker_message compares each message with: a literal's cost (an
# Enum attribute costs ~75 ns, and a member misses str's fast compare; protocol/messages.py).
(TASK_FINISHED, TASK_STARTED, TASK_ERRED, MISSING_DATA, HANDED_BACK, TASK_SECEDED, TASK_REJOINED, ABANDONED_DONE,
 ADD_REPLICA, REPLICA_FAILED, HEARTBEAT, GOODBYE) = (
    Op.TASK_FINISHED.value, Op.TASK_STARTED.value, Op.TASK_ERRED.value, Op.MISSING_DATA.value, Op.HANDED_BACK.value,
    Op.TASK_SECEDED.value, Op.TASK_REJOINED.value, Op.ABANDONED_DONE.value, Op.ADD_REPLICA.value,
    Op.REPLICA_FAILED.value, Op.HEARTBEAT.value, Op.GOODBYE.value)


class WorkerLinksMixin:
    async def _serve_worker(self, comm: Comm) -> None:
        first = (await comm.read())[0]
        if first.get("op") != Op.REGISTER_WORKER or not isinstance(first.get("address"), str):
            raise ProtocolError("a worker must register first")
        addr = first["address"]
        nthreads = first.get("nthreads", 1)
        if not isinstance(nthreads, int) or not 1 <= nthreads <= 2**20:
            raise ProtocolError("nthreads must be a positive integer")
        held, running = check_held(first.get("held") or {}), check_keys(first.get("running") or [], "running")
        refusal = self._registration_refusal(addr) or self._ended_job_refusal(addr)
        if refusal:
            logger.warning("refused a worker registering as %s: %s", addr, refusal)
            await comm.write({"op": Op.REFUSED, "error": refusal})
            comm.close()
            return
        # Reply before any task can be queued for it, so "registered" travels alone.
        await comm.write({"op": Op.REGISTERED, "address": addr,
                          "heartbeat_interval": heartbeat_interval(len(self.state.workers) + 1),
                          "plugins": self.worker_plugins.entries()})     # set up before its first task
        self.streams[addr] = BatchedSend(comm, self.flusher)
        self.comms[addr] = comm
        info = {"pid": first.get("pid"), "host": first.get("host"), "versions": comm.peer_info.get("versions"),
                "nanny": first.get("nanny"), "job_id": first.get("job_id"), "nanny_id": first.get("nanny_id"),
                "job_walltime": check_number(first.get("job_walltime")),
                "job_start": check_number(first.get("job_start")),
                "lifetime": check_number(first.get("lifetime")),
                "lifetime_end": check_number(first.get("lifetime_end")),
                "memory_fractions": check_fractions(first.get("memory_fractions")),
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
             info=info, deadline=worker_deadline(info))
        self.deaths.reattached(addr)          # a worker removed as silent, back: its death says so
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
                    if self._worker_message(addr, msg, now) == GOODBYE:
                        connection = GOODBYE
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

    def _ended_job_refusal(self, addr: str) -> str | None:
        """A lost worker coming back from a job the batch system says ended (a node declared
        failed whose link returns with its processes still running) is a leftover: it would
        take tasks until the batch system's cleanup kills it, and die a second time."""
        ended = self.deaths.ended_workers.get(addr)
        if ended is None:
            return None
        return (f"{ended} as far as the batch system is concerned: this worker is what is left of it and "
                "may not rejoin (a replacement job is submitted as needed)")

    def _worker_message(self, addr: str, msg: dict, now: float):
        op, st = msg["op"], self.state
        try:
            if op == TASK_FINISHED:
                st.task_finished(addr, msg["key"], check_count(msg.get("nbytes"), "nbytes"),
                                 check_number(msg.get("duration")))
                self.stream.finished(addr, msg["key"], now, "memory")
            elif op == TASK_STARTED:
                st.task_started(addr, msg["key"], now, check_memory(msg.get("memory")))
                ws = st.workers.get(addr)
                if ws is not None and isinstance(msg["key"], str):
                    self.stream.started(addr, ws.name, msg["key"], now)
            elif op == TASK_ERRED:
                st.task_erred(addr, msg["key"], {"exception": msg.get("exception"),
                                                  "traceback": msg.get("traceback"),
                                                  "text": str(msg.get("text", ""))})
                self.stream.finished(addr, msg["key"], now, "erred")
            elif op == MISSING_DATA:
                st.missing_data(addr, msg["key"], msg["dep"], check_keys(msg.get("holders", []), "holders"))
            elif op == HANDED_BACK:
                st.handed_back(addr, check_keys(msg["keys"], "keys"))
            elif op in (TASK_SECEDED, TASK_REJOINED):
                st.task_seceded(addr, str(msg["key"]), op == TASK_SECEDED)
            elif op == ABANDONED_DONE:
                st.abandoned_done(addr, msg["key"])
            elif op == ADD_REPLICA:
                st.add_replica(addr, msg["key"], check_count(msg.get("nbytes"), "nbytes"))
            elif op == REPLICA_FAILED:
                st.replica_failed(addr, msg["key"])
            elif op == HEARTBEAT:
                if msg.get("memory") is not None:
                    st.worker_memory(addr, check_memory(msg["memory"]), now)
            elif op == GOODBYE:
                return GOODBYE
            elif op == Op.LOG_EVENT:                     # a task's print, warn, log record (inspection.py)
                self.inspection.worker_event(msg)
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
                    nanny_id = msg.get("nanny_id") if msg["op"] == Op.REGISTER_NANNY else nanny_id
        finally:
            if nanny_id and self.nannies.get(nanny_id) is not None and self.nannies[nanny_id].comm is comm:
                del self.nannies[nanny_id]
                self.deaths.nanny_gone(nanny_id)
                self.nanny_runs.nanny_gone(nanny_id)
                self._flush()

    def _nanny_message(self, comm: Comm, msg: dict) -> None:
        op = msg["op"]
        if op == Op.REGISTER_NANNY:
            if not isinstance(msg.get("nanny_id"), str):
                raise ProtocolError("register-nanny needs a string nanny_id")
            self.nannies[msg["nanny_id"]] = BatchedSend(comm)
        elif op == Op.EXIT_REPORT and isinstance(msg.get("report"), dict):
            self.deaths.exit_report(msg["report"])
            self._tell("exit-report", msg["report"])
        elif op == Op.RUN_RESULT:                          # client.run(nanny=True)'s answer (nanny_runs.py)
            self.nanny_runs.answered(msg)
        elif op == Op.PONG:
            answered = self._nanny_pings.pop(msg.get("nanny_id"), None)
            if answered is not None and not answered.done():
                answered.set_result(True)
        else:
            raise ProtocolError(f"unknown op {op!r} from nanny")

    async def _end_if_nanny_answers(self, nanny_id: str, pid: int) -> None:
        """End a silent worker through its nanny, if the nanny answers a ping within the silence
        TTL. One that does not is behind the same silence (its node down or cut off): the worker
        process is not the problem, and an order read when the network comes back would kill a
        worker that is reattaching with its results; the death says the nanny was silent too."""
        stream = self.nannies.get(nanny_id)
        if stream is None:
            return
        answered = asyncio.get_running_loop().create_future()
        self._nanny_pings[nanny_id] = answered
        stream.send({"op": Op.PING})
        try:
            await asyncio.wait_for(answered, self.silence_ttl())
        except asyncio.TimeoutError:
            logger.warning("the nanny of silent worker pid %s did not answer either: its node or the network to it", pid)
            self.deaths.nanny_unanswered(nanny_id)
            return
        finally:
            self._nanny_pings.pop(nanny_id, None)
        stream = self.nannies.get(nanny_id)
        if stream is not None:
            stream.send({"op": Op.END_UNRESPONSIVE, "pid": pid})
