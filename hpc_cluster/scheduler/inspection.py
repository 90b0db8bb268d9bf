"""What clients ask to look inside the cluster (issue 31, point 7), answered by the scheduler:
who holds and runs what, the task stream, its own recent log lines, events by topic (a task's
print and warn among them), metadata, forwarded loggers, and rebalance.

Everything kept here is bounded: events are the latest EVENTS_PER_TOPIC of at most MAX_TOPICS
topics, one event is at most MAX_EVENT_BYTES as kept, metadata at most MAX_METADATA_BYTES, log
lines the latest LOG_LINES. The task stream is server.py's TaskStream (stream.py), not a copy.
Event messages and metadata values are plain msgpack data or bytes the scheduler passes on
unread (a warning's pickle): it never unpickles them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import msgpack

from ..protocol.frames import ProtocolError
from ..protocol.messages import Op
from .checks import Refused, check_keys

logger = logging.getLogger("hpc_cluster.scheduler")

EVENTS_PER_TOPIC = 1000          # dask's distributed.admin.low-level-log-length
MAX_TOPICS = 1000                # past it the topic heard from longest ago goes
MAX_EVENT_BYTES = 256 * 1024     # a larger event is delivered but kept as a note saying so
MAX_METADATA_BYTES = 64 * 2**20
LOG_LINES = 10_000               # dask's distributed.admin.log-length
# Heard by every client without subscribing, as in dask (hpc_cluster.print and .warn in tasks).
BROADCAST_TOPICS = frozenset({"print", "warn"})
MOVE_POLL = 0.05                 # how often a rebalance looks at its copies in flight
MOVE_TIMEOUT = 300.0

_NO_DEFAULT = object()


class LogLines(logging.Handler):
    """The scheduler process's latest log lines, for client.get_scheduler_logs(); one per
    process (several Schedulers in one process, as in tests, share it)."""

    _instance: "LogLines | None" = None

    def __init__(self, size: int = LOG_LINES):
        super().__init__(logging.INFO)
        self.lines: collections.deque = collections.deque(maxlen=size)
        self.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append((record.levelname, self.format(record)))
        except Exception:          # a record that does not format must not break the logging call
            pass

    @classmethod
    def install(cls) -> "LogLines":
        if cls._instance is None:
            cls._instance = cls()
            logging.getLogger().addHandler(cls._instance)
        return cls._instance


def packed_size(value) -> int:
    """Bytes of `value` as msgpack (an opaque payload counted as nothing: it has its own limit)."""
    return len(msgpack.packb(value, use_bin_type=True, default=lambda o: b""))


def _topics(value) -> list[str]:
    topics = [value] if isinstance(value, str) else value
    if not isinstance(topics, list) or not topics or not all(isinstance(t, str) for t in topics):
        raise ProtocolError("topic must be a string or a list of strings")
    return topics


def _when(value, now: float) -> float | None:
    """A task-stream bound: a time, or {"ago": seconds} before the scheduler's now."""
    if isinstance(value, dict):
        return now - float(value["ago"])
    return None if value is None else float(value)


def _first_ending_at(records: list, when: float) -> int:
    """Index of the first record (in order of ending) that ended at or after `when`."""
    lo, hi = 0, len(records)
    while lo < hi:
        mid = (lo + hi) // 2
        if records[mid][4] < when:
            lo = mid + 1
        else:
            hi = mid
    return lo


def select(records: list, start: float | None, stop: float | None, count: int | None) -> list:
    """dask's task-stream selection (TaskStreamPlugin.collect): records ending in [start, stop),
    or `count` of them from a bound (the latest `count` with neither)."""
    first = None if start is None else _first_ending_at(records, start)
    last = None if stop is None else _first_ending_at(records, stop)
    if count is not None:
        if first is None and last is None:
            last = len(records)
            first = last - count
        elif first is None:
            first = last - count
        elif last is None:
            last = first + count
    first = max(0, first or 0)
    last = len(records) if last is None else min(last, len(records))
    return records[first:last]


class Inspection:
    """The scheduler's part of looking inside: `sched` is server.py's Scheduler."""

    # The client ops answered here (server.py dispatches them in one branch).
    CLIENT_OPS = frozenset({Op.HAS_WHAT, Op.PROCESSING, Op.NTHREADS, Op.ALL_WHO_HAS, Op.TASK_STREAM,
                            Op.SCHEDULER_LOGS, Op.GET_EVENTS, Op.SET_METADATA, Op.GET_METADATA, Op.REBALANCE,
                            Op.SUBSCRIBE_TOPIC, Op.UNSUBSCRIBE_TOPIC, Op.LOG_EVENT, Op.FORWARD_LOGGING})

    def __init__(self, sched):
        self.sched = sched
        self.logs = LogLines.install()
        self.events: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self.subscribers: dict[str, set[str]] = {}          # topic -> client ids
        self.metadata: dict = {}
        self._metadata_bytes = 0
        self.forwarded: dict[str, dict] = {}                # topic -> {"name", "level", "topic"}
        sched.worker_events.append(self._worker_joined)

    # -- dispatch ---------------------------------------------------------------------------
    def client_op(self, cid: str, msg: dict) -> None:
        op, st, sched = msg["op"], self.sched.state, self.sched
        if op == Op.LOG_EVENT:
            self.publish(msg["topic"], msg.get("msg"))
        elif op == Op.SUBSCRIBE_TOPIC:
            for topic in _topics(msg["topic"]):
                self.subscribers.setdefault(topic, set()).add(cid)
        elif op == Op.UNSUBSCRIBE_TOPIC:
            for topic in _topics(msg["topic"]):
                self.subscribers.get(topic, set()).discard(cid)
        elif op == Op.FORWARD_LOGGING:
            self.forward_logging(msg)
        elif op == Op.REBALANCE:
            keys = msg.get("keys")             # checked here: a bad one drops the sender, not the move loop
            keys = None if keys is None else set(check_keys(keys, "keys"))
            workers = None if msg.get("workers") is None else [a for a, _ in self._workers(msg["workers"])]
            asyncio.create_task(self._rebalance(cid, msg, st.plan_rebalance(keys, workers)))
        else:
            sched._reply(cid, msg, self._answer(op, msg, st))

    def _answer(self, op: str, msg: dict, st):
        if op == Op.HAS_WHAT:
            return {a: sorted(ts.key for ts in ws.has_what) if ws else []
                    for a, ws in self._workers(msg.get("workers"), known_only=False)}
        if op == Op.PROCESSING:
            return {a: sorted(ts.key for ts in ws.processing) if ws else []
                    for a, ws in self._workers(msg.get("workers"), known_only=False)}
        if op == Op.NTHREADS:
            return {a: ws.nthreads for a, ws in self._workers(msg.get("workers"))}
        if op == Op.ALL_WHO_HAS:
            return {k: [ws.address for ws in ts.who_has] for k, ts in st.tasks.items()}
        if op == Op.TASK_STREAM:
            return self.task_stream(msg)
        if op == Op.SCHEDULER_LOGS:
            n = msg.get("n")
            lines = list(reversed(self.logs.lines))            # newest first, as dask's
            return lines if n is None else lines[:max(0, int(n))]
        if op == Op.GET_EVENTS:
            return self.get_events(msg.get("topic"))
        if op == Op.SET_METADATA:
            try:
                self.set_metadata(msg["keys"], msg.get("value"))
            except Refused as exc:
                return {"error": str(exc)}
            return {"ok": True}
        if op == Op.GET_METADATA:
            value = self.get_metadata(msg["keys"])
            return {"found": value is not _NO_DEFAULT, "value": None if value is _NO_DEFAULT else value}
        raise ProtocolError(f"unknown op {op!r} from client")

    def _workers(self, asked, known_only: bool = True):
        """(address, WorkerState or None) for the workers asked (addresses, 'host:port', or
        names), or all."""
        workers = self.sched.state.workers
        if asked is None:
            return list(workers.items())
        names = {ws.name: a for a, ws in workers.items()}
        out = []
        for w in check_keys(asked, "workers"):
            address = w if w in workers else names.get(w) or next(
                (f"{s}://{w}" for s in ("tcp", "tls") if f"{s}://{w}" in workers), w)
            if address in workers or not known_only:
                out.append((address, workers.get(address)))
        return out

    # -- the task stream ----------------------------------------------------------------------
    def task_stream(self, msg: dict) -> dict:
        """Executions that ended between `start` and `stop` (or `count` of them), as dask's
        records, and the scheduler's clock now (get_task_stream's context manager starts
        there, so the client's clock never matters)."""
        sched = self.sched
        now = sched.clock()
        count = msg.get("count")
        records = select(list(sched.stream.done), _when(msg.get("start"), now), _when(msg.get("stop"), now),
                         None if count is None else int(count))
        addresses = {d.get("name"): d.get("worker") for d in sched.state.deaths}
        addresses.update((ws.name, a) for a, ws in sched.state.workers.items())
        return {"now": now, "records": [
            {"key": key, "worker": addresses.get(name, name), "worker_name": name, "thread": lane,
             "startstops": [{"action": "compute", "start": start, "stop": stop}],
             "status": "OK" if outcome == "memory" else "error" if outcome == "erred" else outcome}
            for name, lane, key, start, stop, outcome in records]}

    # -- events -------------------------------------------------------------------------------
    def publish(self, topic, event_msg) -> None:
        """Keep an event under each of its topics and tell the clients that hear them."""
        now = self.sched.clock()
        kept = event_msg
        size = packed_size(event_msg)
        if size > MAX_EVENT_BYTES:
            kept = {"dropped": f"an event of {size} bytes, over the {MAX_EVENT_BYTES} the scheduler keeps of "
                               "one event; it was delivered to subscribers when it came. Keep large data "
                               "in results (scatter, futures) rather than events"}
        for t in _topics(topic):
            log = self.events.get(t)
            if log is None:
                if len(self.events) >= MAX_TOPICS:
                    self.events.popitem(last=False)
                log = self.events[t] = collections.deque(maxlen=EVENTS_PER_TOPIC)
            else:
                self.events.move_to_end(t)
            log.append((now, kept))
            self._deliver(t, now, event_msg)

    def _deliver(self, topic: str, now: float, event_msg) -> None:
        streams = self.sched.streams
        if topic in BROADCAST_TOPICS:
            hearers = [c for c in self.sched.state.clients if c in streams]
        else:
            subs = self.subscribers.get(topic)
            if not subs:
                return
            subs.intersection_update(streams)           # clients gone since they subscribed
            hearers = list(subs)
        for cid in hearers:
            self.sched._send_now(cid, {"op": Op.EVENT, "topic": topic, "event": [now, event_msg]})

    def get_events(self, topic: str | None):
        if topic is None:
            return {t: list(log) for t, log in self.events.items()}
        if not isinstance(topic, str):
            raise ProtocolError("topic must be a string")
        return list(self.events.get(topic, ()))

    def worker_event(self, msg: dict) -> None:
        """A task's log_event (its print, warn, or a forwarded log record), from its worker."""
        self.publish(msg["topic"], msg.get("msg"))

    # -- metadata -----------------------------------------------------------------------------
    def set_metadata(self, keys, value) -> None:
        """dask's Scheduler.set_metadata: a key path into nested dicts, made on the way (a
        value that is not a dict on the path is replaced by one)."""
        if not isinstance(keys, list) or not keys or not all(isinstance(k, (str, int, float, bool)) for k in keys):
            raise ProtocolError("metadata keys must be a non-empty list of strings or numbers")
        size = packed_size(value)
        node = self.metadata
        for key in keys[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        last = keys[-1]
        old = node.get(last)
        grown = self._metadata_bytes + size - (packed_size(old) if old is not None else 0)
        if grown > MAX_METADATA_BYTES:
            raise Refused(f"the scheduler keeps at most {MAX_METADATA_BYTES} bytes of metadata and this value "
                          f"({size} bytes) would take it past that; metadata is for small administrative "
                          "values: keep data in results (scatter, futures)")
        node[last] = value
        self._metadata_bytes = max(0, grown)

    def get_metadata(self, keys):
        node = self.metadata
        for key in keys:
            try:
                node = node[key]
            except (KeyError, IndexError, TypeError):      # not there, or not a container there
                return _NO_DEFAULT
        return node

    # -- forwarded loggers --------------------------------------------------------------------
    def forward_logging(self, msg: dict) -> None:
        """Start (or with `stop`, end) forwarding a logger from every worker's tasks as events
        of `topic`; workers that join later are told at once (_worker_joined)."""
        topic = msg["topic"]
        if not isinstance(topic, str) or not isinstance(msg.get("level", 0), int):
            raise ProtocolError("forward-logging needs a topic and an integer level")
        if msg.get("stop"):
            self.forwarded.pop(topic, None)
        else:
            name = msg.get("name")
            self.forwarded[topic] = {"name": name if isinstance(name, str) else None,
                                     "level": msg.get("level", 0), "topic": topic}
        for address in self.sched.state.workers:
            self._tell_forwarded(address)

    def _tell_forwarded(self, address: str) -> None:
        self.sched._send_now(address, {"op": Op.FORWARD_LOGGING, "loggers": list(self.forwarded.values())})

    def _worker_joined(self, kind: str, info: dict) -> None:
        # The server tells of joins with the worker's info (not its address): the worker just
        # added is the one whose info is equal (pid and host make it unique).
        if kind != "joined" or not self.forwarded:
            return
        for address, ws in self.sched.state.workers.items():
            if ws.info == info:
                self._tell_forwarded(address)

    # -- rebalance ----------------------------------------------------------------------------
    async def _rebalance(self, cid: str, msg: dict, moves: list) -> None:
        """Make the moves state/rebalance.py planned; reply when each is done or failed."""
        sched, st = self.sched, self.sched.state
        failed, deadline = [], time.monotonic() + MOVE_TIMEOUT
        try:
            st.start_moves(moves)
            sched._flush()
            while moves:
                await asyncio.sleep(MOVE_POLL)
                pending = []
                for move in moves:
                    outcome = st.end_move(*move)
                    if outcome == "pending" and time.monotonic() < deadline:
                        pending.append(move)
                    elif outcome != "done":
                        failed.append(move[0])
                moves = pending
                sched._flush()
        except Exception:          # the client is answered whatever happened; the scheduler goes on
            logger.exception("rebalance failed")
            failed = list(dict.fromkeys(failed + [m[0] for m in moves]))
        if failed:
            logger.warning("rebalance: %d results could not be moved (e.g. %r)", len(failed), failed[0])
        sched._reply(cid, msg, {"status": "partial-fail", "keys": failed} if failed else {"status": "OK"})
