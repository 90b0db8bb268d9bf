"""The scheduler's tornado server: wire messages -> state events -> wire messages.

Each connection says in its handshake whether it is a worker or a client. Every batch
read from it is validated, applied to `SchedulerState`, and whatever the state put in
its outbox is sent on the recipients' batched streams. A malformed message drops that
one connection (logged); the scheduler and every other peer carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from typing import Awaitable, Callable

from ..protocol.comm import BatchedSend, Comm, Flusher, Listener
from ..protocol.frames import Limits, ProtocolError
from ..protocol.messages import Cause, Op
from ..protocol.versions import format_table, get_versions, mismatches
from .backlog import BacklogMixin
from .collector import Collector
from .coordination import COORDINATION_OPS, Coordination
from .checks import Refused, check_keys, check_restart_timeout, check_task, compact_payloads
from .evidence import EvidenceCollector
from . import identity
from .inspection import Inspection
from .links import WorkerLinksMixin
from .nanny_runs import NannyRuns
from .state.machine import SchedulerState
from .state.placement import workload
from .state.validate import InvalidState
from .stream import TaskStream
from .workers import heartbeat_interval, paced_interval, worker_table
from .worker_plugins import WorkerPluginRegistry

logger = logging.getLogger("hpc_cluster.scheduler")

# Plain str copies of the ops a client sends (or is answered with) per batch of tasks: a
# literal's cost (an Enum attribute costs ~75 ns; protocol/messages.py).
UPDATE_GRAPH, RELEASE_KEYS, REPLY = Op.UPDATE_GRAPH.value, Op.RELEASE_KEYS.value, Op.REPLY.value

# Tasks placed in one turn of the loop, by all its events together (state.place_limit). A
# 10,000-task submission to 500 workers placed at once held the loop for a second and more
# (BENCHMARKS.md, "Many workers"); so did a turn in which 50 workers each reported a finished
# task and each report refilled its worker's deep queue. 100 placements take 2-5 ms, then
# whatever else arrived is served before the next (200 made 20 ms turns at 500 workers, and an
# answer, two to three turns, over 50 ms).
PLACE_PER_TURN = 100

# Set (1, true, yes, on) in the scheduler's environment: every task's state change is checked
# against the state machine's transition table and kept in its story, and the state's
# invariants are checked after each batch the server applies (docs/configuration.md). Slow.
DEBUG_STATE_ENV = "HPC_CLUSTER_DEBUG_STATE"


def debug_state_from_env(environ=os.environ) -> bool:
    return environ.get(DEBUG_STATE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class Scheduler(BacklogMixin, WorkerLinksMixin):
    def __init__(self, secret: bytes, host: str = "127.0.0.1", port: int = 0,
                 allowed_failures: int = 3, heartbeat_ttl: float = 5.0, prefetch: int = 2,
                 limits: Limits | None = None, versions: str = "warn", walltime_failures: int = 3,
                 walltime_margin: float = 60.0,
                 clock: Callable[[], float] = time.time, security=None, claim_window: float = 120.0,
                 reattach_grace: float = 0.0, journal=None, recovered=None, recovery_window: float = 600.0,
                 debug_state: bool | None = None):
        """`journal` (journal.py's Journal): keep one, flushed every journal.interval.
        `recovered` (journal.load()'s): start from that state instead of an empty one; results
        it held wait `recovery_window` seconds for their workers to come back (recovery.py).
        `debug_state` (None: $HPC_CLUSTER_DEBUG_STATE): check every state change and the
        state's invariants after each batch (state/transitions.py, state/validate.py)."""
        if versions not in ("warn", "strict"):
            raise ValueError(f"versions={versions!r}: use 'warn' or 'strict'")
        self.versions_policy = versions
        self.debug_state = debug_state_from_env() if debug_state is None else bool(debug_state)
        kwargs = dict(allowed_failures=allowed_failures, prefetch=prefetch, walltime_failures=walltime_failures,
                      debug=self.debug_state)
        self.state = (SchedulerState(**kwargs) if recovered is None
                      else SchedulerState.rebuild(recovered, clock(), **kwargs))
        self.state.place_limit = PLACE_PER_TURN
        self._placing = False                              # a _place_more is due on the loop
        self.journal, self.recovery_window = journal, recovery_window
        self._journal_task: asyncio.Task | None = None
        self._recovery_task: asyncio.Task | None = None
        # Reattaching workers and clients (issue 16; scheduler/state/reattach.py): unknown results are
        # kept claim_window s; a restarted scheduler places nothing for reattach_grace s.
        self.state.claim_window = claim_window
        self.reattach_grace = reattach_grace
        self._backlog: dict[str, list] = {}               # client id -> messages held back (backlog.py)
        self.secret, self.host, self.port = secret, host, port
        self.security = security                           # protocol/tls.py's Security: listen on tls://
        self.heartbeat_ttl = heartbeat_ttl
        self.beat_interval = heartbeat_interval(0)          # what workers are told (_pace_heartbeats)
        self.walltime_margin = walltime_margin
        self._retiring: set[str] = set()
        self._drain_intent: dict[str, str] = {}          # worker -> why it drains
        self._kept: set[str] = set()                      # draining workers said to stay for their results
        self.limits = limits or Limits()
        self.clock = clock
        self.started = time.time()                        # scheduler_info()["started"] (identity.py)
        self.listener: Listener | None = None
        self.address: str | None = None
        self.streams: dict[str, BatchedSend] = {}    # worker address / client id -> stream
        self.comms: dict[str, Comm] = {}
        self._client_ids = itertools.count(1)
        self.deaths = EvidenceCollector(self.state, self.clock, self._flush)
        self.nannies: dict[str, BatchedSend] = {}          # nanny id -> stream to it
        self._nanny_pings: dict[str, asyncio.Future] = {}  # nanny id -> its answer to a ping (links.py)
        self.flusher = Flusher()                          # writes to workers, bounded per loop turn
        # Extra client ops added by whoever runs us (deploy's job manager): op -> async fn(msg).
        self.handlers: dict[str, Callable[[dict], Awaitable]] = {}
        self._intents: dict[str, str] = {}                 # worker address -> why we end it
        self._ttl_task: asyncio.Task | None = None
        self.halted: str | None = None                     # why no new job will be submitted (deploy)
        self.expecting_workers: Callable[[], bool] = lambda: False   # jobs still to start theirs
        # What else this process serves, by name (the dashboard's URL, without its token): told
        # to each client as it registers (client.dashboard_link). Filled by whoever starts them.
        self.services: dict[str, str] = {}
        self.stream = TaskStream()                         # recent executions, for the dashboard
        self.worker_plugins = WorkerPluginRegistry()       # handed to every worker that registers
        self.nanny_runs = NannyRuns(self)                  # client.run(nanny=True), relayed to nannies
        # Who wants to hear of workers joining, lost, and nannies' exit reports (deploy's job
        # manager: it polls the batch system less when the workers tell it first): fn(kind, info).
        self.worker_events: list[Callable[[str, dict], None]] = []
        self.closed = asyncio.Event()
        self.collector = Collector()                       # full GCs when quiet (collector.py)
        self.inspection = Inspection(self)                 # events, metadata, logs for clients (inspection.py)
        self.coordination = Coordination(self, recovered)  # locks, queues, variables, datasets (coordination.py)

    async def start(self) -> str:
        info = {"role": "scheduler", "versions": get_versions()}
        self.listener = Listener(self._serve, self.secret, info, self.limits, name="scheduler",
                                 check=self._check_versions,
                                 tls=self.security.server_context() if self.security else None)
        self.address = self.listener.start_listening(self.host, self.port)
        self.collector.start()
        if self.reattach_grace > 0:
            self.state.hold_placement(self.clock() + self.reattach_grace)
        self._ttl_task = asyncio.create_task(self._watch_heartbeats())
        self._drain_task = asyncio.create_task(self._watch_deadlines())
        if self.journal is not None:
            self.journal.start(self.state)           # a new file: a snapshot of the state we start from
            self._journal_task = asyncio.create_task(self.journal.keep())
        if self.state.awaited_workers or self.state.clients:        # rebuilt from a journal
            self._recovery_task = asyncio.create_task(self._end_recovery())
        logger.info("scheduler listening at %s", self.address)
        return self.address

    async def close(self, restarting: bool = False) -> None:
        """Shut down: workers leave and clients cancel their futures at once, since nobody comes
        back. With `restarting` (a scheduler will take over: issue 16) neither is told, so both
        reattach to the next one, as after a crash."""
        for t in (self._ttl_task, getattr(self, "_drain_task", None), self._journal_task, self._recovery_task):
            if t is not None:
                t.cancel()
        if self.journal is not None:
            self.journal.close()                     # the last changes too; the owner removes it if done
        for addr in list(self.state.workers) if not restarting else ():
            self._send_now(addr, {"op": Op.CLOSE, "reason": "the scheduler is shutting down"})
        for cid in list(self.state.clients) if not restarting else ():
            self._send_now(cid, {"op": Op.SCHEDULER_CLOSED, "reason": "the scheduler was shut down"})
        for stream in list(self.streams.values()):
            await stream.drain()
        for comm in list(self.comms.values()):
            comm.close()
        if self.listener:
            self.listener.stop()
        self.collector.stop()
        self.closed.set()

    def _check_versions(self, peer: dict) -> str | None:
        """Handshake hook: warn about (or, when strict, refuse) mismatched packages."""
        rows = mismatches(get_versions(), peer.get("versions") or {})
        if not rows:
            return None
        table = format_table(rows, "scheduler", peer.get("role", "peer"))
        if self.versions_policy == "strict":
            return f"package versions differ from the scheduler's (versions='strict'):\n{table}"
        logger.warning("a %s connected with package versions that differ from the scheduler's:\n%s",
                       peer.get("role", "peer"), table)
        return None

    # -- plumbing --------------------------------------------------------------
    def _flush(self) -> None:
        self.collector.busy()
        if self.debug_state:
            self._validate_state()
        for to, msgs in self.state.take_outbox().items():
            stream = self.streams.get(to)
            if stream is not None:
                stream.extend(msgs)
        if self.state.place_limit < PLACE_PER_TURN and not self._placing:
            with contextlib.suppress(RuntimeError):         # no loop (closing): the next event places
                asyncio.get_running_loop().call_soon(self._place_more)
                self._placing = True

    def _validate_state(self) -> None:
        """Debug mode: what the last batch did left the state consistent, or we say so loudly."""
        try:
            self.state.validate()
        except InvalidState:
            logger.exception("the scheduler's state is inconsistent (%s is set)", DEBUG_STATE_ENV)
            raise

    def _place_more(self) -> None:
        """A new turn: refill the placement budget (PLACE_PER_TURN) and place what the last
        turn left, so a client's question that arrived meanwhile is answered between passes,
        not after all of them."""
        self._placing = False
        self.state.place_limit = PLACE_PER_TURN
        if self.state.more_to_place:
            self.state.place()
        self._flush()

    def _send_now(self, to: str, msg: dict, flush: bool = False) -> None:
        stream = self.streams.get(to)
        if stream is not None:
            stream.send(msg)
            if flush:
                stream.flush()

    async def _serve(self, comm: Comm) -> None:
        role = comm.peer_info.get("role")
        if role == "worker":
            await self._serve_worker(comm)
        elif role == "client":
            await self._serve_client(comm)
        elif role == "nanny":
            await self._serve_nanny(comm)
        else:
            raise ProtocolError(f"unknown role {role!r} in handshake")

    async def _watch_heartbeats(self) -> None:
        interval = max(0.05, self.heartbeat_ttl / 5)
        last = awake_since = self.clock()
        while True:
            await asyncio.sleep(interval)
            now = self.clock()
            if now - last > 2 * interval:
                # We woke late: this process was stopped (SIGSTOP, a suspended laptop, a long
                # GC or a blocked loop), and the heartbeats sent meanwhile wait unread in our
                # sockets. Our stall is not the workers' silence: count it only from now, so
                # everything queued is read before anyone is judged (issue 14, point 1).
                if now - last > interval + 1.0:
                    logger.warning("the scheduler did not run for %.1f s (stopped or blocked); workers get "
                                   "a fresh %.1f s to be heard from before any is judged silent",
                                   now - last - interval, self.silence_ttl())
                awake_since = now
            last = now
            self.collector.tick()
            # A worker last heard before we woke is silent only once we were awake a whole TTL
            # (now - awake_since > ttl); after that, the usual now - last_seen > ttl holds.
            ttl = self.silence_ttl()
            if now - awake_since <= ttl:
                continue
            for addr in self.state.silent_workers(now, ttl):
                try:
                    logger.warning("worker %s silent for more than %.1fs; removing it", addr, ttl)
                    info = self.state.workers[addr].info
                    self._remove_worker(addr, Cause.HEARTBEAT_LOST)
                    self._end_unresponsive(info)
                    comm = self.comms.pop(addr, None)
                    if comm is not None:
                        comm.close()
                except Exception:     # one bad removal must not end silence detection for all
                    logger.exception("removing silent worker %s failed", addr)

    async def _watch_deadlines(self) -> None:
        """Drain workers ahead of their job's walltime, then retire them once nothing is lost."""
        while True:
            await asyncio.sleep(0.5)
            try:
                st = self.state
                st.tick(self.clock())              # unclaimed results, awaited keys, a placement hold
                if self._backlog:
                    self._replay_backlog()
                for addr in st.workers_to_drain(self.clock(), self.walltime_margin):
                    ws = st.workers[addr]
                    lifetime = ws.info.get("lifetime_end") is not None and ws.deadline == ws.info["lifetime_end"]
                    if lifetime:
                        self._drain_intent.setdefault(addr, "lifetime")
                    logger.info("worker %s: %.0f s to the end of its %s; draining", addr,
                                ws.deadline - self.clock(), "lifetime (--lifetime)" if lifetime else "walltime")
                    st.start_drain(addr)
                for addr, ws in list(st.workers.items()):
                    if ws.draining and addr not in self._retiring and st.drain_step(addr):
                        self._retiring.add(addr)
                        self.retire_workers([addr], self._drain_intent.pop(addr, "walltime drain"))
                    elif ws.draining and addr not in self._kept and (n := st.kept_without_peer(addr)):
                        self._kept.add(addr)        # said once per worker
                        logger.info("worker %s stays: it alone holds %d results still wanted and no worker is "
                                    "left to take them; it leaves once they are released or a worker joins "
                                    "to take them (a scale-down never drops results, state/drain.py)", addr, n)
                self._flush()
            except Exception:
                logger.exception("deadline check failed")

    async def _end_recovery(self) -> None:
        """Results rebuilt from the journal wait for their workers this long; then those
        still missing are recomputed from lineage where needed."""
        await asyncio.sleep(self.recovery_window)
        missing = self.state.held_names()
        if missing:
            lost = self.state.holders_missing(missing)
            logger.warning("%d workers did not come back within %.0f s of the restart (%s); %d results they "
                           "held are recomputed where needed", len(missing), self.recovery_window,
                           ", ".join(sorted(missing)[:5]), len(lost))
        # Clients the journal knew that never reattached are gone: what only they wanted is released.
        departed = [cid for cid in self.state.clients if cid not in self.comms and not self.coordination.holds(cid)]
        for cid in departed:
            self.state.remove_client(cid)
        if departed:
            logger.warning("%d clients of the journal did not reattach within %.0f s of the restart; what only "
                           "they wanted is released", len(departed), self.recovery_window)
        self._flush()

    def _end_unresponsive(self, info: dict) -> None:
        """A silent worker still holds its job's slot: its nanny (if any) ends it and reports
        what state the process was in, which also makes the verdict final in a second
        instead of after the ~90 s of asking the batch system about a job that runs on.
        Only if the nanny answers a ping: links.py's _end_if_nanny_answers."""
        nanny_id = info.get("nanny_id") or ""
        if nanny_id in self.nannies and isinstance(info.get("pid"), int):
            asyncio.ensure_future(self._end_if_nanny_answers(nanny_id, info["pid"]))

    def _tell(self, kind: str, info: dict) -> None:
        for listener in self.worker_events:
            try:
                listener(kind, info)
            except Exception:
                logger.exception("a worker-event listener failed on %s", kind)

    def _remove_worker(self, addr: str, connection: str) -> None:
        """A worker is gone: judge on what we know now; later evidence may refine it."""
        ws = self.state.workers.get(addr)
        if ws is not None:
            self._tell("removed", dict(ws.info))
        self.streams.pop(addr, None)
        self._retiring.discard(addr)
        self._kept.discard(addr)
        self._drain_intent.pop(addr, None)
        self.deaths.worker_removed(addr, connection, self._intents.pop(addr, None))
        self.stream.worker_gone(addr, self.clock())
        self.coordination.worker_gone(addr)              # leases its tasks took are released
        self.fail_if_stranded()
        self._pace_heartbeats()
        self._flush()

    def _pace_heartbeats(self) -> None:
        """Tell every worker the heartbeat interval for the cluster's size when it changes
        (heartbeat_interval): 500 workers beating every 0.5 s were 1,000 messages a second. Only
        moves of more than a quarter are told (paced_interval): not every worker at every join."""
        interval = paced_interval(self.beat_interval, len(self.state.workers))
        if interval is not None:
            self.beat_interval = interval
            for stream in self.streams.values():
                stream.send({"op": Op.HEARTBEAT_INTERVAL, "interval": interval})

    def silence_ttl(self) -> float:
        """How long a worker may be silent before it is judged lost: heartbeat_ttl, or three
        of the cluster's heartbeat intervals when the cluster is large enough to need more."""
        return max(self.heartbeat_ttl, 3 * self.beat_interval)

    def halt(self, reason: str | None) -> None:
        """Whoever starts workers (deploy's job manager) stopped submitting jobs until
        someone acts (`reason`), or resumes (None)."""
        self.halted = reason
        if reason:
            logger.error("no more jobs will be submitted: %s", reason)
        for cid in self.state.clients:
            self._send_now(cid, {"op": Op.CLUSTER_HALTED, "reason": reason})
        self.fail_if_stranded()
        self._flush()

    def fail_if_stranded(self) -> None:
        """No worker, none on its way, and no job will be submitted: waiting work would wait
        forever. Fail it, saying why."""
        if not self.halted or self.state.workers or self.expecting_workers():
            return
        keys = [k for k, ts in self.state.tasks.items() if ts.state in ("waiting", "queued", "processing")]
        if keys:
            self.state.cancel(keys, f"no worker is left to run it and none will be started: {self.halted}")
            self._flush()

    # -- clients ---------------------------------------------------------------
    async def _serve_client(self, comm: Comm) -> None:
        cid = f"client-{next(self._client_ids)}"
        while cid in self.streams or cid in self.state.clients:
            cid = f"client-{next(self._client_ids)}"
        self.streams[cid] = BatchedSend(comm)
        self.comms[cid] = comm
        self.state.add_client(cid)
        self._send_now(cid, {"op": Op.REGISTERED, "client": cid, "versions": get_versions(), "halted": self.halted,
                             "services": self.services})
        try:
            async for msgs in comm.batches():
                for msg in msgs:
                    self._client_op(cid, msg)      # or held back (backlog.py)
                self._flush()
        finally:
            self.streams.pop(cid, None)
            self._backlog.pop(cid, None)
            self.comms.pop(cid, None)
            self.coordination.client_gone(cid)           # its leases released, its waiting requests dropped
            self.state.remove_client(cid)
            self._flush()

    def _reply(self, cid: str, msg: dict, result) -> None:
        # Written now, not at the end of the loop's turn: behind 500 workers' writes that turn
        # took a client's question to the next one (what was sent to it before stays ahead).
        self._send_now(cid, {"op": REPLY, "rid": msg.get("rid"), "result": result}, flush=True)

    def _client_message(self, cid: str, msg: dict) -> None:
        op, st = msg["op"], self.state
        try:
            if op == UPDATE_GRAPH:
                tasks = msg.get("tasks", [])
                wanted = check_keys(msg.get("keys", []), "keys")
                try:
                    tasks = [check_task(t) for t in tasks]
                    compact_payloads(tasks)
                except Refused as exc:
                    named = [t["key"] for t in tasks if isinstance(t, dict) and isinstance(t.get("key"), str)]
                    st.refuse_graph(cid, named + wanted, f"{exc}. Nothing of this submission was run")
                    return
                st.update_graph(cid, tasks, wanted)
                self.fail_if_stranded()
            elif op == RELEASE_KEYS:
                st.client_releases(cid, check_keys(msg["keys"], "keys"))
            elif op == Op.WANT_KEYS:                  # a reattached client's futures (issue 16)
                st.client_wants(cid, check_keys(msg["keys"], "keys"), self.clock())
            elif op == Op.CANCEL:
                st.cancel(check_keys(msg["keys"], "keys"), str(msg.get("reason") or "cancelled by the client"))
            elif op == Op.SCATTER:
                who_has = msg["who_has"]
                if not isinstance(who_has, dict):
                    raise ProtocolError("who_has must be a map")
                st.scatter(cid, {k: check_keys(v, "holders") for k, v in who_has.items()}, msg.get("nbytes") or {})
            elif op == Op.WHO_HAS:
                self._reply(cid, msg, st.who_has(check_keys(msg["keys"], "keys")))
            elif op == Op.WORKERS:
                self._reply(cid, msg, self.worker_table())
            elif op == Op.DEATHS:
                self._reply(cid, msg, list(st.deaths))
            elif op == Op.REPLICATE:
                st.replicate(check_keys(msg["keys"], "keys"), int(msg.get("n", 2)))
            elif op == Op.TASK_SPEC:
                ts = st.tasks.get(msg["key"])
                self._reply(cid, msg, None if ts is None or ts.func is None else {
                    "func": ts.func, "args": ts.args, "deps": sorted(d.key for d in ts.dependencies)})
            elif op == Op.WHY:
                ts = st.tasks.get(msg["key"])
                self._reply(cid, msg, None if ts is None else {
                    "state": ts.state, "error": ts.error, "attempts": st._attempts(ts),
                    "pool": ts.pool, "memory": ts.memory, "escalation": ts.escalation,
                    "workers": st.restriction_note(ts)})
            elif op == Op.VERSIONS:
                self._reply(cid, msg, {"scheduler": get_versions(), "workers": {
                    a: ws.info.get("versions") for a, ws in st.workers.items()}})
            elif op == Op.RESTART:
                try:
                    timeout = check_restart_timeout(msg.get("timeout"))
                except Refused as exc:
                    self._reply(cid, msg, {"error": str(exc)})
                    return
                asyncio.create_task(self._restart(cid, msg, timeout))
            elif op in self.handlers:
                asyncio.create_task(self._run_handler(cid, msg))
            elif op in (Op.REGISTER_WORKER_PLUGIN, Op.UNREGISTER_WORKER_PLUGIN, Op.RESTART_WORKERS):
                self._reply(cid, msg, self.worker_plugins.client_op(self, msg))
            elif op == Op.RUN:                             # run(nanny=True): the nanny answers
                self.nanny_runs.relay(cid, msg)
            elif op == Op.COUNTS:
                self._reply(cid, msg, st.counts())
            elif op in COORDINATION_OPS:               # locks, events, variables, queues, datasets (issue 31)
                self.coordination.handle(cid, msg)
            elif op in Inspection.CLIENT_OPS:          # who_has, task stream, events, metadata, ... (issue 31)
                self.inspection.client_op(cid, msg)
            elif op == Op.RETRY:                       # client.retry (state/retrying.py)
                retried = st.retry(cid, check_keys(msg["keys"], "keys"))
                self._flush()                          # its task-retried messages go ahead of the reply
                self._reply(cid, msg, retried)
            elif op in identity.OPS:                   # scheduler_info(), nbytes() (identity.py)
                self._reply(cid, msg, identity.answer(self, op, msg))
            elif op == Op.WORKLOAD:                    # LocalCluster.adapt (deploy/local/adapt.py)
                self._reply(cid, msg, {"workload": workload(st), "workers": self.worker_table()})
            elif op == Op.DRAIN_WORKERS:
                self.drain(check_keys(msg["workers"], "workers"), str(msg.get("intent") or "adapt"))
            elif op == Op.HEARTBEAT:
                pass
            else:
                raise ProtocolError(f"unknown op {op!r} from client")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed {op!r} message from client: {type(exc).__name__}: {exc}") from None

    async def _run_handler(self, cid: str, msg: dict) -> None:
        try:
            result = {"ok": True, "result": await self.handlers[msg["op"]](msg)}
        except Exception as exc:  # the caller gets the message; the scheduler carries on
            logger.warning("%s failed: %s", msg["op"], exc)
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self._reply(cid, msg, result)

    def drain(self, addresses, intent: str) -> None:
        """Retire workers gracefully: no new tasks, unstarted ones handed back, results no one
        else holds copied to peers, then retired with `intent` (scale-down, adapt). Under adapt,
        one that alone holds results still wanted stays until a peer has them or they are
        released (else adapt shrinks, the results are recomputed, it grows back: a loop). An
        explicit scale-down lets it go, as dask-jobqueue's does (`scale(0)` ends every worker;
        lineage recomputes what is asked for again)."""
        for addr in addresses:
            if addr in self.state.workers:
                self._drain_intent[addr] = intent
                self.state.start_drain(addr, keep=intent == "adapt")
        self._flush()

    def retire_workers(self, addresses, intent: str) -> None:
        """Ask workers to leave; their deaths are recorded as `retired` with this intent."""
        for addr in addresses:
            if addr in self.state.workers:
                self._intents[addr] = intent
                self._send_now(addr, {"op": Op.CLOSE, "reason": intent})

    async def _restart(self, cid: str, msg: dict, timeout: float) -> None:
        """client.restart(): forget all work, restart every worker through its nanny."""
        reason = "the cluster was restarted by client.restart(); submit the work again"
        self.state.clear(reason)
        by_nanny, old, without = {}, {}, []
        for addr, ws in self.state.workers.items():
            nid = ws.info.get("nanny_id")
            if nid and nid in self.nannies:
                by_nanny[nid], old[nid] = addr, ws
                self._intents[addr] = "restart"
                self.nannies[nid].send({"op": Op.RESTART})
            else:
                without.append(addr)
                self._send_now(addr, {"op": Op.FREE_ALL})
        self._flush()

        def successors() -> dict:
            # A successor is a new registration from the nanny, not a new address: one on a fixed
            # --worker-port (or given its predecessor's free port) comes back at the same address.
            current = {ws.info.get("nanny_id"): (a, ws) for a, ws in self.state.workers.items()}
            return {nid: current[nid][0] for nid in by_nanny if nid in current and current[nid][1] is not old[nid]}

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(successors()) < len(by_nanny):
            await asyncio.sleep(0.05)
        back = successors()
        self._reply(cid, msg, {"restarted": list(back.values()), "not_restarted": without,
                               "missing": [by_nanny[n] for n in by_nanny if n not in back]})

    def worker_table(self) -> list[dict]:
        return worker_table(self.state)
