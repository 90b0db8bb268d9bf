"""The worker's recent log lines, kept in memory for client.get_worker_logs()."""

from __future__ import annotations

import collections
import logging


class LogBuffer(logging.Handler):
    """Keeps the worker's recent log lines for client.get_worker_logs()."""

    _instance: "LogBuffer | None" = None

    def __init__(self, size: int = 1000):
        super().__init__(logging.INFO)
        self.lines: collections.deque = collections.deque(maxlen=size)
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:
            pass

    def __iter__(self):
        return iter(self.lines)

    @classmethod
    def install(cls) -> "LogBuffer":
        if cls._instance is None:
            cls._instance = cls()
            root = logging.getLogger()
            root.addHandler(cls._instance)
            if root.level > logging.INFO or root.level == logging.NOTSET:
                root.setLevel(logging.INFO)
        return cls._instance
