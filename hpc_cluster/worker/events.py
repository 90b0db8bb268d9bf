"""Events from a worker's tasks to the scheduler (issue 31, point 7): hpc_cluster.print and .warn
inside a task, log_event, and log records of the loggers a client forwards (forward_logging).

The worker puts `event_sender(worker)` in its WorkerContext (protocol/context.py), where the
client layer's print/warn find it without importing the worker. An event goes on the worker's
own stream to the scheduler, so it arrives before the task's result: a client sees what a task
printed before its future is done, as with dask.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from ..protocol.messages import Op

_PLAIN = (str, int, float, bool, type(None))
_sending = threading.local()          # a forwarded record whose sending logs must not loop


def event_sender(worker) -> Callable[[object, object], None]:
    """log_event(topic, msg) for any thread of the worker: `topic` a string or a list of
    them, `msg` plain msgpack data. Made on the worker's loop thread."""
    loop_thread = threading.get_ident()

    def send(payload: dict) -> None:
        if worker.scheduler is not None and not worker.closed.is_set():
            worker.scheduler.send(payload)

    def log_event(topic, msg) -> None:
        payload = {"op": Op.LOG_EVENT, "topic": topic, "msg": msg}
        # On the loop's thread (a task run inline, worker/inline.py) at once: a call_soon would
        # put the event after the task's result, which the loop sends before it turns again.
        # Known by the thread, not by asyncio's running loop: an inline task runs with none set.
        if threading.get_ident() == loop_thread:
            send(payload)
        else:
            worker.loop.call_soon_threadsafe(send, payload)
    return log_event


def record_event(record: logging.LogRecord, address: str) -> dict:
    """A log record as msgpack can carry it and logging.makeLogRecord can rebuild it: the
    message formatted here (its args may not travel), the traceback as text."""
    attrs = {k: (v if isinstance(v, _PLAIN) else str(v)) for k, v in record.__dict__.items()
             if k not in ("args", "exc_info", "msg")}
    attrs["msg"], attrs["args"] = record.getMessage(), None
    if record.exc_info and not record.exc_text:
        attrs["exc_text"] = logging.Formatter().formatException(record.exc_info)
    attrs["worker"] = address
    return attrs


class ForwardingHandler(logging.Handler):
    """Sends what its logger handles on this worker to the scheduler as events of `topic`."""

    def __init__(self, topic: str, level: int, log_event, address: str):
        super().__init__(level)
        self.topic, self.log_event, self.address = topic, log_event, address

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(_sending, "busy", False):
            return
        _sending.busy = True
        try:
            self.log_event(self.topic, record_event(record, self.address))
        except Exception:
            self.handleError(record)
        finally:
            _sending.busy = False


_installed: dict[str, tuple[logging.Logger, ForwardingHandler]] = {}      # topic -> where it is


def forward_loggers(worker, loggers: list) -> None:
    """The scheduler's table of forwarded loggers ({"name", "level", "topic"}), whole: handlers
    for new topics are added, those no longer in it removed."""
    wanted = {entry["topic"]: entry for entry in loggers if isinstance(entry, dict) and "topic" in entry}
    for topic in list(_installed):
        if topic not in wanted:
            log, handler = _installed.pop(topic)
            log.removeHandler(handler)
    sender = event_sender(worker)
    for topic, entry in wanted.items():
        if topic in _installed:
            continue
        log = logging.getLogger(entry.get("name"))
        handler = ForwardingHandler(topic, int(entry.get("level") or 0), sender, worker.address)
        log.addHandler(handler)
        _installed[topic] = (log, handler)
