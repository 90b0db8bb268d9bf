"""The client's event loop: one, in a daemon thread, shared by every Client of the process.

The user's thread hands it coroutines (`run`) and blocks on their result; a blocking call
made from that loop's own thread would wait for itself, so it is refused with the reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from .exceptions import TimeoutError


class LoopThread:
    """One event loop in a daemon thread, shared by every Client of the process."""

    _lock = threading.Lock()
    _instance: "LoopThread | None" = None

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="hpc-cluster-client", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> "LoopThread":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def run(self, coro, timeout: float | None = None):
        if threading.current_thread() is self.thread:
            raise RuntimeError("blocking client call made from the client's own event loop "
                               "(e.g. inside a done-callback); call it from another thread")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"no answer within {timeout} s") from None
