"""Client methods for looking inside the cluster, with dask.distributed 2026.8's signatures and
meaning (issue 31, point 7): who holds and runs what, the task stream, logs, events (and the
print and warn of tasks), metadata, forwarded loggers, rebalance. Mixed into Client, through
its request plumbing (`_request`, `_send`, `_lt`); the scheduler's side is
scheduler/inspection.py. `performance_report` and the `get_task_stream` context manager are in
report.py; differences from dask are in docs/migrating-from-distributed.md, "Looking inside".
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import logging
import sys
import warnings

import msgpack
from dask.typing import no_default      # dask's sentinel, so distributed's get_metadata(default=...) reads the same

from .futures import wait
from ..protocol import context, serialize
from ..protocol.messages import Op

logger = logging.getLogger("hpc_cluster.client")

# dask's topic of a forwarded logger (distributed.client.TOPIC_PREFIX_FORWARDED_LOG_RECORD)
FORWARDED_PREFIX = "forwarded-log-record"
REBALANCE_WAIT = 360.0          # the scheduler gives up on a move after 300 s (inspection.MOVE_TIMEOUT)
ALL_LINES = 10**6               # get_worker_logs(n=None): whatever each worker keeps


def _worker_list(workers) -> list[str] | None:
    """dask's handling of workers=: one address (or name) or an iterable of them; None: all."""
    if workers is None:
        return None
    if isinstance(workers, str):
        return [workers]
    return [str(w) for w in workers]


def _checked_topic(topic) -> str | list[str]:
    if isinstance(topic, str):
        return topic
    if isinstance(topic, (list, tuple, set)) and topic and all(isinstance(t, str) for t in topic):
        return list(topic)
    raise TypeError(f"topic must be a string or a list of strings, not {topic!r}")


def _check_plain(value, what: str) -> None:
    """What the scheduler keeps must be plain msgpack data: it never unpickles."""
    try:
        msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{what} must be msgpack serializable (numbers, strings, bytes, lists, dicts), "
                        f"got {type(value).__name__}: {exc}; keep other objects in results (submit, scatter)"
                        ) from None


def _level(level) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelName(str(level).upper())
    if not isinstance(number, int):
        raise ValueError(f"level={level!r} is not a logging level: give one of DEBUG, INFO, WARNING, ERROR, "
                         "CRITICAL or a number")
    return number


class LookingMixin:
    # -- who holds and runs what --------------------------------------------------------------
    def _ask(self, msg: dict, timeout: float | None = None):
        return self._lt.run(self._request(msg, timeout), timeout or self.timeout)

    def who_has(self, futures=None, **kwargs) -> dict[str, list[str]]:
        """The workers holding each future's result (all of the scheduler's tasks without futures)."""
        if futures is None:
            return self._ask({"op": Op.ALL_WHO_HAS})
        keys = list(dict.fromkeys(f.key for f in self.futures_of(futures)))
        return self._ask({"op": Op.WHO_HAS, "keys": keys})

    def has_what(self, workers=None, **kwargs) -> dict[str, list[str]]:
        """The keys of the results each worker holds (all workers without `workers`)."""
        return self._ask({"op": Op.HAS_WHAT, "workers": _worker_list(workers)})

    def processing(self, workers=None) -> dict[str, list[str]]:
        """The keys each worker has been given to run (running or queued there)."""
        return self._ask({"op": Op.PROCESSING, "workers": _worker_list(workers)})

    def nthreads(self, workers=None, **kwargs) -> dict[str, int]:
        """The threads of each worker (of those named in `workers`, if given)."""
        return self._ask({"op": Op.NTHREADS, "workers": _worker_list(workers)})

    ncores = nthreads

    # -- the task stream ----------------------------------------------------------------------
    def get_task_stream(self, start=None, stop=None, count=None, plot=False, filename="task-stream.html",
                        bokeh_resources=None):
        """Recent task executions, as dask's records ({"key", "worker", "thread", "startstops",
        "status"}): those that ended between `start` and `stop` (times, or "60s"-style spans
        before now), or `count` of them. With plot=True also a figure (an inline SVG, no
        bokeh: report.TaskStreamFigure); plot="save" writes it to `filename` as one HTML file."""
        records = self._task_stream(start, stop, count)["records"]
        if not plot:
            return records
        from .report import TaskStreamFigure
        figure = TaskStreamFigure(records)
        if plot == "save":
            figure.save(filename)
        return records, figure

    def _task_stream(self, start=None, stop=None, count=None) -> dict:
        def bound(value):
            if isinstance(value, str):
                from dask.utils import parse_timedelta
                return {"ago": parse_timedelta(value)}
            return value
        return self._ask({"op": Op.TASK_STREAM, "start": bound(start), "stop": bound(stop),
                          "count": None if count is None else int(count)})

    # -- logs ---------------------------------------------------------------------------------
    def get_scheduler_logs(self, n=None) -> list[tuple[str, str]]:
        """The scheduler process's latest log lines, newest first, as (level, line)."""
        return [tuple(x) for x in self._ask({"op": Op.SCHEDULER_LOGS, "n": n})]

    def get_worker_logs(self, n=None, workers=None, nanny=False, include_dead: bool | None = None):
        """Each worker's latest log lines (address -> lines, oldest first), of `workers` only
        if given; without `workers`, the last lines of dead workers too (include_dead)."""
        if nanny:
            raise ValueError("get_worker_logs(nanny=True): a nanny's lines are in its worker's log file, with "
                             "the worker's; read them with cluster.get_logs()")
        wanted = _worker_list(workers)
        logs = super().get_worker_logs(n=ALL_LINES if n is None else n,
                                       include_dead=wanted is None if include_dead is None else include_dead)
        if wanted is None:
            return logs
        return {a: lines for a, lines in logs.items() if a in wanted or a.split(" (died")[0] in wanted}

    def profile(self, key=None, start=None, stop=None, workers=None, merge_workers=True, plot=False,
                filename=None, server=False, scheduler=False):
        """Not available: our workers do not sample their threads' stacks (dask's statistical
        profiler). Raises NotImplementedError saying what to use instead."""
        raise NotImplementedError(
            "client.profile(): hpc-cluster's workers do not sample their threads' call stacks, so there is no "
            "statistical profile to collect. Use get_task_stream() or performance_report() for where the time "
            "went per task, or profile one task where it runs, e.g. wrap its function with cProfile and return "
            "or log the stats (docs/migrating-from-distributed.md, 'Looking inside')")

    # -- events -------------------------------------------------------------------------------
    def log_event(self, topic, msg) -> None:
        """Log an event under `topic` (or each of a list of topics); `msg` must be msgpack
        serializable. The scheduler keeps the latest 1000 of each topic."""
        _check_plain(msg, "an event's msg")
        self._send({"op": Op.LOG_EVENT, "topic": _checked_topic(topic), "msg": msg})

    def get_events(self, topic: str | None = None):
        """The events of `topic` as ((time, msg), ...), or of every topic as a dict."""
        if topic is not None and not isinstance(topic, str):
            raise TypeError(f"topic must be a string, not {topic!r}")
        reply = self._ask({"op": Op.GET_EVENTS, "topic": topic})
        if topic is not None:
            return tuple(tuple(e) for e in reply)
        return {t: tuple(tuple(e) for e in events) for t, events in reply.items()}

    @property
    def _topic_handlers(self) -> dict:
        return self.__dict__.setdefault("_event_handlers", {})

    def subscribe_topic(self, topic: str, handler) -> None:
        """Call `handler((time, msg))` (on the client's event loop) for every event of `topic`
        from now on; a coroutine function's result is awaited there."""
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a string, not {topic!r}")
        if not callable(handler):
            raise TypeError("subscribe_topic(topic, handler) needs a callable handler")
        if topic in self._topic_handlers:
            logger.info("handler for %s already set; replacing it", topic)
        self._topic_handlers[topic] = handler
        self._send({"op": Op.SUBSCRIBE_TOPIC, "topic": topic})

    def unsubscribe_topic(self, topic: str) -> None:
        if topic not in self._topic_handlers:
            raise ValueError(f"no event handler known for topic {topic!r}")
        del self._topic_handlers[topic]
        self._send({"op": Op.UNSUBSCRIBE_TOPIC, "topic": topic})

    def _on_event(self, msg: dict) -> None:
        """An event of a topic this client hears (client.py's reader calls this, on the loop)."""
        topic, event = msg.get("topic"), tuple(msg.get("event") or (None, None))
        try:
            if topic == "print" and context.worker() is None:     # in a worker's own client: it printed there
                _print_event(event)
            elif topic == "warn" and context.worker() is None:
                _warn_event(event)
            handler = self._topic_handlers.get(topic)
            if handler is not None:
                result = handler(event)
                if inspect.isawaitable(result):
                    asyncio.ensure_future(result)
        except Exception:       # a user's handler must not end the connection's reader
            logger.exception("handling an event of topic %r failed", topic)

    # -- forwarded loggers ----------------------------------------------------------------------
    def forward_logging(self, logger_name=None, level=logging.NOTSET) -> None:
        """Handle here, on the logger of the same name, what `logger_name` (the root logger if
        None, and those under it) handles on every worker, now and joining later, at `level` or
        above. Records carry the worker's address as `record.worker`."""
        topic = f"{FORWARDED_PREFIX}-forward-logging-{logger_name or '<root>'}"
        self.subscribe_topic(topic, _handle_forwarded_log_record)
        self._send({"op": Op.FORWARD_LOGGING, "name": logger_name, "level": _level(level), "topic": topic})

    def unforward_logging(self, logger_name=None) -> None:
        topic = f"{FORWARDED_PREFIX}-forward-logging-{logger_name or '<root>'}"
        self.unsubscribe_topic(topic)
        self._send({"op": Op.FORWARD_LOGGING, "topic": topic, "stop": True})

    # -- metadata -------------------------------------------------------------------------------
    def set_metadata(self, key, value) -> None:
        """Keep a small plain value in the scheduler; a list key is a path into nested dicts."""
        keys = list(key) if isinstance(key, list) else [key]
        for k in keys:
            if not isinstance(k, (str, int, float, bool)):
                raise TypeError(f"metadata key {k!r}: use strings or numbers (a list of them is a path into "
                                "nested dicts)")
        _check_plain(value, "a metadata value")
        reply = self._ask({"op": Op.SET_METADATA, "keys": keys, "value": value})
        if reply.get("error"):
            raise ValueError(reply["error"])

    def get_metadata(self, keys, default=no_default):
        """The value at `keys` (a key or a path of them); `default`, or KeyError, if there is none."""
        path = list(keys) if isinstance(keys, (list, tuple)) else [keys]
        reply = self._ask({"op": Op.GET_METADATA, "keys": path})
        if reply["found"]:
            return reply["value"]
        if default is not no_default:
            return default
        raise KeyError(keys)

    # -- rebalance ------------------------------------------------------------------------------
    def rebalance(self, futures=None, workers=None, **kwargs) -> None:
        """Move results between workers (of `workers`, if given) so that each holds about as
        many bytes (of the results of `futures` only, if given). Waits for the futures first;
        raises KeyError naming the results that could not be moved."""
        keys = None
        if futures is not None:
            flat = self.futures_of(futures)
            wait(flat)
            keys = list(dict.fromkeys(f.key for f in flat))
        reply = self._ask({"op": Op.REBALANCE, "keys": keys, "workers": _worker_list(workers)}, REBALANCE_WAIT)
        if reply["status"] != "OK":
            raise KeyError(f"Could not rebalance keys: {reply['keys']}")


def _handle_forwarded_log_record(event) -> None:
    record = logging.makeLogRecord(event[1])
    logging.getLogger(record.name).handle(record)


def _print_event(event) -> None:
    msg = event[1]
    if not isinstance(msg, dict):           # someone logged a "print" event by hand
        builtins.print(msg)
        return
    file = {1: sys.stdout, 2: sys.stderr}.get(msg.get("file"))
    builtins.print(*(msg.get("args") or ()), sep=msg.get("sep"), end=msg.get("end"), file=file,
                   flush=bool(msg.get("flush")))


def _warn_event(event) -> None:
    msg = event[1]
    if not isinstance(msg, dict) or "message" not in msg:
        warnings.warn(str(msg))
        return
    category = serialize.loads(msg["category"]) if msg.get("category") else None
    warnings.warn(serialize.loads(msg["message"]), category=category)


def print(*args, sep: str | None = " ", end: str | None = "\n", file=None, flush: bool = False) -> None:
    """distributed.print: the built-in print, and inside a task also on the stdout (or stderr)
    of every client of the cluster, and as an event of topic "print"."""
    ctx = context.worker()
    if ctx is not None and ctx.log_event is not None:
        msg = {"args": [str(a) for a in args], "sep": sep, "end": end, "flush": flush}
        if file is sys.stdout:
            msg["file"] = 1
        elif file is sys.stderr:
            msg["file"] = 2
        elif file is not None:
            raise TypeError(f"printing to a client from a task goes to sys.stdout or sys.stderr only, not {file!r}")
        ctx.log_event("print", msg)
    builtins.print(*args, sep=sep, end=end, file=file, flush=flush)


def warn(message, category=UserWarning, stacklevel: int = 1, source=None) -> None:
    """distributed.warn: warnings.warn, and inside a task also a warning in every client of the
    cluster (under their own filters), and an event of topic "warn"."""
    ctx = context.worker()
    if ctx is not None and ctx.log_event is not None:
        # Pickled here and unpickled by the clients: the scheduler passes the bytes on unread.
        ctx.log_event("warn", {"message": serialize.dumps(message), "category": serialize.dumps(category)})
    warnings.warn(message, category, stacklevel + 1, source)
