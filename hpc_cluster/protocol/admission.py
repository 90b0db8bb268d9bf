"""Connections before they authenticate: how many may wait, for how long, and what is logged.

A peer that connects and never proves the secret holds a file descriptor until its handshake
times out. A flood of them used to fill the common 1024-descriptor limit in seconds: accept()
then failed with EMFILE on every turn of the event loop (96% CPU, one traceback per attempt,
15 MB of log in 12 s) and a real client waited 8 s. Here:

- the soft RLIMIT_NOFILE is raised to the hard limit at process start (`raise_open_file_limit`);
- at most `max_pending` handshakes wait at once, and `max_per_host` from one address; a new
  connection over either cap that has not sent its first bytes yet waits in a lobby as a bare
  socket (no stream, no task: it costs little more than the accept) and goes on once its
  bytes are there, or is closed after PRESSURE_TIMEOUT. One that has spoken (a real peer
  sends its first bytes right after connecting) goes on, closing the oldest waiting one that
  has not spoken, or, only when every waiting one has, the oldest of those;
- under pressure (more than half the cap waiting) a new handshake gets PRESSURE_TIMEOUT
  instead of the usual 10 s;
- a connection whose peer hung up before speaking is closed as it is accepted (a flood's
  end leaves thousands in the accept queue, which is 2048 long: see comm.ACCEPT_BACKLOG);
- EMFILE/ENFILE on accept closes the oldest silent handshakes and stops accepting for
  ACCEPT_PAUSE, never a busy loop;
- drops are logged in full a few times per cause and interval, then as one summary line per
  interval.
"""

from __future__ import annotations

import collections
import errno
import logging
import socket
import time
from typing import Callable

from tornado.ioloop import IOLoop

logger = logging.getLogger("hpc_cluster.comm")

PRESSURE_TIMEOUT = 1.0      # seconds a handshake may take while many wait (else HANDSHAKE_TIMEOUT)
ACCEPT_PAUSE = 0.05         # seconds without accept() after running out of descriptors
ACCEPT_BURST = 128          # connections accepted per readiness event, at most (tornado's)
SUMMARY_INTERVAL = 10.0     # seconds between summary lines
LOBBY_SWEEP = 0.02          # seconds between looks at the lobby's sockets
FULL_LINES = 10             # drops logged in full per cause and interval, then only counted
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def open_file_limit() -> int:
    try:
        import resource
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 1024


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit (many batch systems and
    distributions start jobs with a soft 1024 under a far higher hard limit); the new soft."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < target:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            except (OSError, ValueError):       # e.g. above fs.nr_open: keep what we have
                pass
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 0


class HandshakeGate:
    """The waiting handshakes of one listener, oldest first, and the log of dropped ones."""

    def __init__(self, name: str, first_bytes: int, max_pending: int | None = None,
                 max_per_host: int | None = None):
        self.name = name
        self.first_bytes = first_bytes  # what a real peer sends with its connect (our magic)
        fds = open_file_limit()
        # A quarter of the descriptors for strangers at most: the rest stay for real peers.
        self.max_pending = max_pending or max(16, min(512, fds // 4))
        self.max_per_host = max_per_host or max(8, self.max_pending // 2)
        self._fresh: dict = {}          # comm -> host: not yet sent a valid first message
        self._started: dict = {}        # comm -> host: past it, waiting for the proof
        self._by_host: dict[str, tuple[dict, dict]] = {}
        self._counts: collections.Counter = collections.Counter()   # drops by cause, this interval
        self._full_lines: collections.Counter = collections.Counter()   # logged in full, by cause
        self._summary_due = False
        self._out_of_fds = 0
        self._lobby: collections.deque = collections.deque()    # (socket, address, since)
        self._callback: Callable | None = None

    # -- waiting handshakes ---------------------------------------------------------
    def admit(self, comm, host: str) -> float | None:
        """Count a new connection in, closing the oldest waiting one if a cap is reached.
        Returns the shorter timeout to use under pressure, or None for the usual one."""
        fresh, started = self._by_host.setdefault(host, ({}, {}))
        if len(fresh) + len(started) >= self.max_per_host:
            self._evict(fresh, started)
        if len(self._fresh) + len(self._started) >= self.max_pending:
            self._evict(self._fresh, self._started)
        pressure = len(self._fresh) + len(self._started) >= self.max_pending // 2
        self._fresh[comm] = host
        fresh[comm] = None
        if self._spoken(comm.stream.socket):     # a peek, before the stream reads them
            self.progressed(comm)
        return PRESSURE_TIMEOUT if pressure else None

    def progressed(self, comm) -> None:
        """The peer has spoken (its first bytes came): closed last when room is needed."""
        host = self._fresh.pop(comm, None)
        if host is not None:
            self._started[comm] = host
            fresh, started = self._by_host[host]
            fresh.pop(comm, None)
            started[comm] = None

    def done(self, comm) -> None:
        host = self._fresh.pop(comm, None) or self._started.pop(comm, None)
        if host is None:
            return
        fresh, started = self._by_host[host]
        fresh.pop(comm, None)
        started.pop(comm, None)
        if not fresh and not started:
            del self._by_host[host]

    @property
    def pending(self) -> int:
        return len(self._fresh) + len(self._started)

    def _evict(self, fresh: dict, started: dict) -> None:
        victim = None
        for _ in range(min(len(fresh), 32)):
            oldest = next(iter(fresh))
            # Its bytes may already be in the stream's buffer, read but not yet handled
            # (tornado keeps no public count of them).
            if not self._spoken(oldest.stream.socket) and not getattr(oldest.stream, "_read_buffer_size", 0):
                victim = oldest
                break
            self.progressed(oldest)     # spoke, though not read yet: spared this time
        if victim is None:
            victim = next(iter(started), None)
        if victim is not None:
            victim.evicted = True
            self.done(victim)
            victim.close()

    def _evict_silent(self, n: int) -> None:
        for _ in range(n):
            if not self._fresh:
                return
            self._evict(self._fresh, {})

    def _full(self, host: str) -> bool:
        fresh, started = self._by_host.get(host) or ((), ())
        return len(fresh) + len(started) >= self.max_per_host or self.pending >= self.max_pending

    def _spoken(self, sock) -> bool:
        """The peer's first bytes wait in the socket (a peek: nothing is read)."""
        peeked = self._peek(sock)
        return peeked is not None and len(peeked) >= self.first_bytes

    def _peek(self, sock) -> bytes | None:
        """What waits in the socket, unread: b"" when the peer hung up, None when nothing yet."""
        # The plain socket's recv, also under TLS (an SSLSocket refuses flags): then the bytes
        # peeked at are the peer's TLS hello, which is speaking all the same.
        try:
            if sock is None:
                return None
            return socket.socket.recv(sock, self.first_bytes, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (OSError, ValueError):
            return None

    # -- accepting ----------------------------------------------------------------------
    def accept_handler(self, sock: socket.socket, callback: Callable) -> Callable[[], None]:
        """tornado's add_accept_handler, but running out of descriptors is survived quietly:
        the oldest silent handshakes are closed and accepting pauses for ACCEPT_PAUSE."""
        loop = IOLoop.current()
        state = {"removed": False, "watching": True}
        self._callback = callback

        def on_readable(fd, events) -> None:
            for _ in range(ACCEPT_BURST):
                if state["removed"]:
                    return
                try:
                    connection, address = sock.accept()
                except BlockingIOError:
                    return
                except ConnectionAbortedError:
                    continue
                except OSError as exc:
                    if exc.errno not in _OUT_OF_FDS:
                        raise
                    self._out_of_fds += 1
                    self._note()
                    self._evict_silent(16)
                    self._empty_lobby()
                    loop.remove_handler(sock)
                    state["watching"] = False
                    loop.call_later(ACCEPT_PAUSE, resume)
                    return
                peeked = self._peek(connection)
                if peeked == b"":
                    # Hung up before it spoke (what a flood leaves in the accept queue when it
                    # ends): closed at once, so the queue drains in one pass and a real client
                    # behind them is served without waiting.
                    connection.close()
                    self.dropped(f"tcp://{address[0]}:{address[1]}", "hung up before speaking",
                                 "closed its end before sending anything")
                    continue
                if self._full(address[0]) and (peeked is None or len(peeked) < self.first_bytes):
                    self._to_lobby(connection, address)
                    continue
                callback(connection, address)

        def resume() -> None:
            if not state["removed"] and not state["watching"]:
                state["watching"] = True
                loop.add_handler(sock, on_readable, IOLoop.READ)

        def remove() -> None:
            state["removed"] = True
            while self._lobby:
                self._lobby.popleft()[0].close()
            if state["watching"]:
                state["watching"] = False
                loop.remove_handler(sock)

        loop.add_handler(sock, on_readable, IOLoop.READ)
        return remove

    def _to_lobby(self, connection: socket.socket, address) -> None:
        while len(self._lobby) >= self.max_pending:
            old, addr, _ = self._lobby.popleft()
            if self._spoken(old):           # spoke since it came: it goes on, not out
                self._callback(old, addr)
                continue
            old.close()
            self.dropped(f"tcp://{addr[0]}:{addr[1]}", "closed silent to make room", "said nothing, room needed")
        if not self._lobby:
            IOLoop.current().call_later(LOBBY_SWEEP, self._sweep)
        self._lobby.append((connection, address, time.monotonic()))

    def _empty_lobby(self) -> None:
        """Out of descriptors: the lobby's silent sockets go first."""
        for connection, address, since in [self._lobby.popleft() for _ in range(len(self._lobby))]:
            if self._spoken(connection):
                self._callback(connection, address)
            else:
                connection.close()
                self.dropped(f"tcp://{address[0]}:{address[1]}", "closed silent: out of descriptors",
                             "said nothing, and the process ran out of file descriptors")

    def _sweep(self) -> None:
        now, waiting = time.monotonic(), collections.deque()
        while self._lobby:
            connection, address, since = self._lobby.popleft()
            if self._spoken(connection):
                self._callback(connection, address)
            elif now - since > PRESSURE_TIMEOUT or connection.fileno() < 0:
                connection.close()
                self.dropped(f"tcp://{address[0]}:{address[1]}", f"said nothing within {PRESSURE_TIMEOUT:g} s",
                             f"sent nothing within {PRESSURE_TIMEOUT:g} s while many waited")
            else:
                waiting.append((connection, address, since))
        self._lobby = waiting
        if waiting:
            IOLoop.current().call_later(LOBBY_SWEEP, self._sweep)

    # -- the log ---------------------------------------------------------------------------
    def dropped(self, peer: str, cause: str, detail: str) -> None:
        """A connection dropped before it authenticated: in full a few times per interval
        (a user with the wrong secret must see why), then counted for the summary line."""
        self._counts[cause] += 1
        if self._full_lines[cause] < FULL_LINES:
            self._full_lines[cause] += 1
            logger.warning("%s: dropped connection from %s during handshake: %s", self.name, peer, detail)
        self._note()

    def _note(self) -> None:
        if not self._summary_due:
            self._summary_due = True
            IOLoop.current().call_later(SUMMARY_INTERVAL, self._summary)

    def _summary(self) -> None:
        counts, self._counts = self._counts, collections.Counter()
        out_of_fds, self._out_of_fds = self._out_of_fds, 0
        logged, self._full_lines = sum(self._full_lines.values()), collections.Counter()
        self._summary_due = False
        if sum(counts.values()) <= logged and not out_of_fds:
            return
        causes = ", ".join(f"{n} {cause}" for cause, n in counts.most_common())
        line = (f"{self.name}: in the last {SUMMARY_INTERVAL:.0f} s, {sum(counts.values())} connections dropped "
                f"before authenticating ({causes}); {self.pending} waiting now (at most {self.max_pending}, "
                f"{self.max_per_host} per address)")
        if out_of_fds:
            line += (f"; accept() ran out of file descriptors {out_of_fds} times (open-file limit "
                     f"{open_file_limit()}): raise `ulimit -n`, or find who opens connections without the secret")
        logger.warning(line)
