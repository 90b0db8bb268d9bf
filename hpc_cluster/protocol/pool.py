"""Request/response to peers over reused connections: a worker's fetches from the workers that
hold its inputs, a client's gathers from the workers."""

from __future__ import annotations

import ssl
import time

from .comm import Comm, connect
from .frames import Limits

POOL_IDLE_SECONDS = 30.0        # a pooled connection unused this long is closed


class ConnectionPool:
    """Request/response to peers over reused connections (one request per connection at a time).

    A burst of concurrent requests to one peer opens a connection each (a tree reduction's
    first level: 35 to a peer); those left unused for `idle_seconds` are closed when the pool
    is next used or swept, so that what a past burst opened does not hold its descriptors and
    buffers (up to ~80 KB each under TLS, tls.py keep_buffers) for the cluster's life."""

    def __init__(self, secret: bytes, info: dict, limits: Limits | None = None, tls: ssl.SSLContext | None = None,
                 idle_seconds: float = POOL_IDLE_SECONDS):
        self.secret, self.info, self.limits, self.tls = secret, info, limits, tls
        self.idle_seconds = idle_seconds
        self._idle: dict[str, list[tuple[Comm, float]]] = {}     # address: (connection, when it was last used)
        self._next_sweep = time.monotonic() + idle_seconds

    async def request(self, address: str, msg: dict) -> dict:
        idle = self._idle.get(address)
        comm = idle.pop()[0] if idle else await connect(address, self.secret, self.info, self.limits, tls=self.tls)
        try:
            await comm.write(msg)
            reply = (await comm.read())[0]
        except BaseException:
            comm.close()            # a half-done exchange leaves the stream unusable
            raise
        self._idle.setdefault(address, []).append((comm, time.monotonic()))   # (a sweep may have replaced the list)
        self.tidy()
        return reply

    def tidy(self) -> None:
        """Sweep if one is due (every idle_seconds / 2): cheap enough for every request and heartbeat."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self.sweep(now)

    def sweep(self, now: float | None = None) -> int:
        """Close the connections unused for idle_seconds (and drop those the peer closed); how
        many were closed."""
        now = time.monotonic() if now is None else now
        self._next_sweep = now + self.idle_seconds / 2
        closed = 0
        for address, idle in list(self._idle.items()):
            kept = []
            for c, t in idle:
                if now - t >= self.idle_seconds:
                    c.close()
                    closed += 1
                elif not c.closed:
                    kept.append((c, t))
            if kept:
                self._idle[address] = kept
            else:
                del self._idle[address]
        return closed

    def close(self) -> None:
        for comms in self._idle.values():
            for c, _ in comms:
                c.close()
        self._idle.clear()
