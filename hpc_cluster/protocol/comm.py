"""Authenticated connections over tornado IOStreams, and batched sends.

Every connection starts with a magic string and a mutual HMAC challenge/response on the
per-cluster secret; package versions are exchanged only after both sides have proven
the secret. Until then a peer may send at most one tiny frame (HANDSHAKE_LIMITS), so an
unauthenticated peer can neither make us allocate nor make us decode anything large.
Each side also announces the limits it reads with, so a sender splits frames to fit the
receiver and refuses, with advice, a message the receiver would drop the connection for.

Large messages move without copies: frames are written from the payloads' own memory
(a numpy array's buffer; frames under 1 MiB are joined into writes of about 1 MiB) and
read into memory of their own per part (reader.py), both in pieces of CHUNK bytes so
that moving a gigabyte never holds the event loop for long.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import logging
import os
import socket
import ssl
import time
from typing import Awaitable, Callable

from tornado.iostream import IOStream, StreamClosedError
from tornado.tcpclient import TCPClient
from tornado.tcpserver import TCPServer

from .admission import HandshakeGate
from .frames import HANDSHAKE_LIMITS, Limits, MessageTooLargeError, ProtocolError, byte_view, dumps, loads, nbytes
from .messages import Op
from .reader import CHUNK, FrameReader
from .tls import fast_tls

logger = logging.getLogger("hpc_cluster.comm")

# Protocol name + wire version; garbage fails here at once. Version 2: out-of-band buffers
# (msgpack extension 2), split frames (bit 63 of a length) and limits in the handshake.
MAGIC = b"HPCC\x00\x02\r\n"
HANDSHAKE_TIMEOUT = 10.0
ACCEPT_BACKLOG = 2048            # connections the kernel queues before we accept them
FAIR_AFTER = 0.005              # Comm.batches: a batch handled this long lets the loop serve others
_JOIN_BELOW = 8 * 2**20         # a message smaller than this is joined and written in one call
_PIECE = 2**20                  # a larger one's frames below this are joined into writes of about
                                # this size (one syscall and one await each); larger frames are
                                # written from their own memory, in pieces of at most CHUNK bytes


class AuthenticationError(ConnectionError):
    """The peer could not prove the cluster secret (or we could not)."""


class HandshakeClosed(AuthenticationError):
    """The listener closed the connection before its half of the handshake: a peer that is not
    ours, or ours too busy to take one more handshake now (hundreds of workers starting at
    once: protocol/admission.py closes the ones it cannot wait for). Worth a retry, where a
    refused proof is not."""


class CommClosedError(ConnectionError):
    pass


def parse_address(address: str) -> tuple[str, int]:
    """'tcp://host:port', 'tls://host:port' or 'host:port' -> (host, port)."""
    text = address.split("://", 1)[1] if "://" in address else address
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {address!r} is not of the form tcp://host:port")
    return host.strip("[]"), int(port)


def port_of(address: str | None) -> int:
    """The port of an address, or 0 (any port) when there is none to read."""
    try:
        return parse_address(str(address))[1]
    except ValueError:
        return 0


def _proof(secret: bytes, side: bytes, c_nonce: bytes, s_nonce: bytes) -> bytes:
    return hmac.new(secret, side + b"|" + c_nonce + b"|" + s_nonce, hashlib.sha256).digest()


class Comm:
    """One authenticated connection; reads and writes batches of message dicts."""

    def __init__(self, stream: IOStream, peer: str, limits: Limits | None = None):
        self.stream = stream
        self.peer = peer
        self.limits = limits or Limits()
        self.peer_info: dict = {}           # role, versions ... from the handshake
        self.peer_limits: Limits | None = None  # what the peer reads with (None: an older peer)
        self._backlog: collections.deque | None = None  # messages queued behind a large write
        self._reader = FrameReader(stream)
        self._writer: asyncio.Task | None = None
        self._close_callbacks: list[Callable[[], None]] = []
        stream.set_close_callback(self._on_close)

    # -- reading ----------------------------------------------------------------
    async def read(self, limits: Limits | None = None) -> list[dict]:
        """Read one batch: a list of dicts, each with a string 'op'."""
        try:
            frames = await self._reader.read_frames(limits or self.limits)
        except StreamClosedError:
            raise CommClosedError(f"connection to {self.peer} closed") from None
        msgs = loads(frames)
        if isinstance(msgs, dict):
            msgs = [msgs]
        # An empty list is no message: every reader may take the first one (the fuzzer's []
        # in the handshake raised IndexError, logged as an unexpected error with a traceback).
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and isinstance(m.get("op"), str)
                                                             for m in msgs):
            raise ProtocolError("a message must be a map with a string 'op' (or a non-empty list of them)")
        return msgs

    async def batches(self, fair_after: float = FAIR_AFTER):
        """Read batches for ever (async for). After one its reader spent `fair_after` seconds
        on, one turn of the event loop for everyone else before the next: awaiting data that
        is already buffered does not suspend, so a client's submission in 20 parts was read
        and applied in one go, 430 ms in which no other peer was answered (issue 19). The time
        is summed over the batches since the last such turn: quick batches, each under
        `fair_after`, went back to back for as long as any were buffered (a submission in
        parts of 250 tasks: 123 ms in one go at 500 workers). Reading and decoding a buffered
        batch counts too (a third of a submission's time); a read that waited for the peer
        starts the sum again, the loop having turned meanwhile. The turn comes before a batch
        that would take the sum past `fair_after` if it took as long as the last one: a
        submission's parts of 3-7 ms each went two to a turn, 11.6 ms in which a client's
        question waited (500 workers)."""
        spent = 0.0
        reader = self._reader
        while True:
            reader.waited = False
            start = time.perf_counter()
            msgs = await self.read()
            if reader.waited:
                spent, start = 0.0, time.perf_counter()
            yield msgs
            last = time.perf_counter() - start
            spent += last
            if spent + last > fair_after:
                spent = 0.0
                await asyncio.sleep(0)

    # -- writing ----------------------------------------------------------------
    def write_nowait(self, msgs) -> Awaitable | None:
        """Queue a batch on the stream; returns the write future (errors are swallowed).

        Raises MessageTooLargeError, before writing anything, for a message the peer would
        refuse (over the limits it announced)."""
        if self.stream.closed():
            return None
        try:
            frames = dumps(msgs, (self.peer_limits or self.limits).max_frame_bytes, self.peer_limits)
        except MessageTooLargeError as exc:
            raise MessageTooLargeError(f"cannot send to {self.peer}: {exc}") from None
        try:
            if self._backlog is None and sum(nbytes(f) for f in frames) < _JOIN_BELOW:
                fut = self.stream.write(b"".join(frames))
            else:
                fut = self._enqueue(frames)
        except StreamClosedError:
            return None
        fut.add_done_callback(_swallow)
        return fut

    def _enqueue(self, frames: list) -> asyncio.Future:
        """Write a large message in pieces; later messages wait behind it (in order)."""
        fut = asyncio.get_running_loop().create_future()
        if self._backlog is None:
            self._backlog = collections.deque()
            self._writer = asyncio.ensure_future(self._write_backlog(self._backlog))
        self._backlog.append((frames, fut))
        return fut

    async def _write_backlog(self, backlog: collections.deque) -> None:
        try:
            while backlog:
                frames, fut = backlog[0]
                try:
                    await self._write_pieces(frames)
                except BaseException as exc:
                    # Closed, or anything else that leaves a message half-written: the stream
                    # is unusable, so close it and fail every queued write (as closed).
                    self.stream.close()
                    for _, f in backlog:
                        if not f.done():
                            f.set_exception(StreamClosedError(real_error=exc))
                    backlog.clear()
                    if not isinstance(exc, StreamClosedError):
                        raise
                    return
                backlog.popleft()
                if not fut.done():
                    fut.set_result(None)
        finally:
            self._backlog = self._writer = None

    async def _write_pieces(self, frames: list) -> None:
        # Two pieces in flight: the kernel always has the next one while we wait for this one.
        pending = None
        for piece in _pieces(frames):
            fut = self.stream.write(piece)
            if pending is not None:
                await pending
            pending = fut
        if pending is not None:
            await pending

    async def write(self, msgs) -> None:
        if self.stream.closed():
            raise CommClosedError(f"connection to {self.peer} closed")
        fut = self.write_nowait(msgs)
        if fut is not None:
            try:
                await fut
            except StreamClosedError:
                raise CommClosedError(f"connection to {self.peer} closed") from None

    # -- lifecycle --------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.stream.closed()

    def on_close(self, callback: Callable[[], None]) -> None:
        self._close_callbacks.append(callback)

    def _on_close(self) -> None:
        for cb in self._close_callbacks:
            try:
                cb()
            except Exception:
                logger.exception("close callback failed for %s", self.peer)

    def close(self) -> None:
        self.stream.close()

    def __repr__(self) -> str:
        return f"<Comm {self.peer} {self.peer_info.get('role', '?')}>"


def _pieces(frames: list):
    """The writes for one message: frames below _PIECE joined into writes of about _PIECE
    bytes (a copy of at most 2 MiB at a time), larger ones as slices of their own memory (no
    copy), at most CHUNK bytes each."""
    small: list = []
    size = 0
    for f in frames:
        n = nbytes(f)
        if n < _PIECE:
            small.append(f)
            size += n
            if size >= _PIECE:
                yield b"".join(small)
                small, size = [], 0
            continue
        if small:
            yield b"".join(small)
            small, size = [], 0
        view = byte_view(f)
        for start in range(0, n, CHUNK):
            yield view[start:start + CHUNK]
    if small:
        yield b"".join(small)


def _announced(value) -> Limits | None:
    """The limits a peer announced in its handshake (None if absent or not understood)."""
    if not isinstance(value, dict):
        return None
    fields = {}
    for name in ("max_frames", "max_frame_bytes", "max_message_bytes", "max_header_bytes"):
        v = value.get(name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return None
        fields[name] = v
    return Limits(**fields)


def _announce(limits: Limits) -> dict:
    return {"max_frames": limits.max_frames, "max_frame_bytes": limits.max_frame_bytes,
            "max_message_bytes": limits.max_message_bytes, "max_header_bytes": limits.max_header_bytes}


def _swallow(fut) -> None:
    if not fut.cancelled():
        fut.exception()


def _nodelay(stream: IOStream) -> None:
    try:
        stream.set_nodelay(True)
    except (OSError, AttributeError):
        pass


# -- TLS (protocol/tls.py makes the contexts): the scheme of an address says whether it is spoken
def scheme(address: str) -> str:
    return address.split("://", 1)[0].lower() if "://" in address else "tcp"


def _check_tls(address: str, tls: ssl.SSLContext | None) -> None:
    if scheme(address) == "tls" and tls is None:
        raise ConnectionError(f"{address} speaks TLS: pass the cluster's security= (Client(cluster) does), "
                              "or a cluster file, which names its certificates")
    if scheme(address) != "tls" and tls is not None:
        raise ConnectionError(f"{address} is not a TLS address but security= asks for encryption; connect to "
                              "the cluster's tls:// address, or drop security= for a cluster without TLS")


async def connect(address: str, secret: bytes, info: dict, limits: Limits | None = None,
                  timeout: float = 10.0, tls: ssl.SSLContext | None = None) -> Comm:
    """Open a connection and run the handshake as the connecting side (inside TLS for a
    tls:// address, with `tls` the client context)."""
    host, port = parse_address(address)
    _check_tls(address, tls)
    try:
        stream = await asyncio.wait_for(TCPClient().connect(host, port, ssl_options=tls, max_buffer_size=2**62),
                                        timeout)
    except ssl.SSLError as exc:
        raise AuthenticationError(f"TLS handshake with {address} failed ({exc}); is it a cluster with the "
                                  "same certificate authority as your security=?") from None
    except (OSError, StreamClosedError, asyncio.TimeoutError) as exc:
        raise ConnectionError(f"could not connect to {address}: {exc or type(exc).__name__}") from None
    _nodelay(stream)
    fast_tls(stream)
    comm = Comm(stream, f"{scheme(address) if tls else 'tcp'}://{host}:{port}", limits)
    try:
        await asyncio.wait_for(_handshake_connector(comm, secret, info), HANDSHAKE_TIMEOUT)
    except BaseException:
        comm.close()
        raise
    return comm


async def _handshake_connector(comm: Comm, secret: bytes, info: dict) -> None:
    c_nonce = os.urandom(32)
    comm.stream.write(MAGIC)
    await comm.write({"op": Op.AUTH, "nonce": c_nonce})
    try:
        reply = (await comm.read(HANDSHAKE_LIMITS))[0]
    except (CommClosedError, ProtocolError) as exc:
        # Nothing of the secret has been checked yet (the peer answers our nonce first), so a
        # wrong secret is not why: a peer that is ending (a worker dying of memory, the usual
        # case in a death's log tail), a scheduler taking many workers at once, or not our
        # protocol (another version, or a TLS listener spoken to in clear).
        raise HandshakeClosed(f"{comm.peer} closed the connection during the handshake ({exc}): it may be "
                                  "ending or too busy to answer; if it keeps doing so, is it an hpc-cluster "
                                  "scheduler or worker of this version? (A cluster with security= listens "
                                  "on a tls:// address)") from None
    s_nonce, proof = reply.get("nonce"), reply.get("proof")
    if not isinstance(s_nonce, bytes) or not isinstance(proof, bytes) or not hmac.compare_digest(
            proof, _proof(secret, b"listener", c_nonce, s_nonce)):
        raise AuthenticationError(f"{comm.peer} did not prove the cluster secret; check that you use "
                                  "the cluster file (or secret) of the cluster you meant")
    await comm.write({"op": Op.AUTH_PROOF, "proof": _proof(secret, b"connector", c_nonce, s_nonce),
                      "info": info, "limits": _announce(comm.limits)})
    try:
        welcome = (await comm.read(HANDSHAKE_LIMITS))[0]
    except CommClosedError:
        raise AuthenticationError(f"{comm.peer} refused our proof of the cluster secret; the secret "
                                  "you passed is not this cluster's") from None
    if welcome.get("op") == Op.REFUSED:
        raise AuthenticationError(f"{comm.peer} refused the connection: {welcome.get('reason')}")
    comm.peer_info = welcome.get("info") or {}
    comm.peer_limits = _announced(welcome.get("limits"))


async def _handshake_listener(comm: Comm, secret: bytes, info: dict,
                              check: Callable[[dict], str | None] | None,
                              started: Callable[[Comm], None] = lambda comm: None) -> None:
    magic = await comm.stream.read_bytes(len(MAGIC))
    if magic != MAGIC:
        if magic[:5] == MAGIC[:5]:
            raise ProtocolError(f"the peer speaks hpc-cluster wire protocol {magic[5]}, this process "
                                f"{MAGIC[5]}: run one hpc-cluster version on the client, the scheduler "
                                "and the workers")
        raise ProtocolError(f"not an hpc-cluster peer (first bytes {bytes(magic)!r})")
    started(comm)
    hello = (await comm.read(HANDSHAKE_LIMITS))[0]
    c_nonce = hello.get("nonce")
    if hello.get("op") != Op.AUTH or not isinstance(c_nonce, bytes) or len(c_nonce) != 32:
        raise ProtocolError("handshake did not start with an auth message")
    s_nonce = os.urandom(32)
    await comm.write({"op": Op.AUTH, "nonce": s_nonce, "proof": _proof(secret, b"listener", c_nonce, s_nonce)})
    msg = (await comm.read(HANDSHAKE_LIMITS))[0]
    proof = msg.get("proof")
    if msg.get("op") != Op.AUTH_PROOF or not isinstance(proof, bytes) or not hmac.compare_digest(
            proof, _proof(secret, b"connector", c_nonce, s_nonce)):
        raise AuthenticationError("peer failed to prove the cluster secret")
    peer_info = msg.get("info") if isinstance(msg.get("info"), dict) else {}
    reason = check(peer_info) if check else None
    if reason:
        await comm.write({"op": Op.REFUSED, "reason": reason})
        raise AuthenticationError(f"refused: {reason}")
    comm.peer_info = peer_info
    comm.peer_limits = _announced(msg.get("limits"))
    await comm.write({"op": Op.WELCOME, "info": info, "limits": _announce(comm.limits)})


class Listener(TCPServer):
    """Accepts connections, authenticates them, then hands each Comm to `handler`.

    A peer that fails the handshake or later sends a bad message is logged and dropped;
    the listener and every other connection carry on. How many may wait in the handshake,
    and how drops are logged: admission.py.
    """

    def __init__(self, handler: Callable[[Comm], Awaitable[None]], secret: bytes, info: dict,
                 limits: Limits | None = None, check: Callable[[dict], str | None] | None = None,
                 name: str = "server", tls: ssl.SSLContext | None = None):
        # With `tls` (a server context) every accepted stream is TLS, its handshake done on
        # the first read, so within the secret handshake's deadline.
        super().__init__(ssl_options=tls, max_buffer_size=2**62)
        self.scheme = "tls" if tls is not None else "tcp"
        self.handler, self.secret, self.info = handler, secret, info
        self.limits, self.check, self.name = limits or Limits(), check, name
        self.address: str | None = None
        self.gate = HandshakeGate(name, len(MAGIC))

    def add_sockets(self, sockets) -> None:
        for sock in sockets:
            self._sockets[sock.fileno()] = sock
            self._handlers[sock.fileno()] = self.gate.accept_handler(sock, self._handle_connection)

    def start_listening(self, host: str = "127.0.0.1", port: int = 0) -> str:
        # A long accept queue (distributed's socket-backlog too): with tornado's 128, hundreds
        # of workers connecting at once, or a client right after a flood, found it full and
        # waited out the kernel's 1 s SYN retry. The kernel caps it at net.core.somaxconn.
        sockets = __import__("tornado.netutil", fromlist=["bind_sockets"]).bind_sockets(
            port, address=host if host not in ("", "0.0.0.0") else None, family=socket.AF_INET,
            backlog=ACCEPT_BACKLOG)
        self.add_sockets(sockets)
        bound = sockets[0].getsockname()[1]
        shown = host if host not in ("", "0.0.0.0") else socket.gethostname()
        self.address = f"{self.scheme}://{shown}:{bound}"
        return self.address

    async def handle_stream(self, stream: IOStream, address) -> None:
        _nodelay(stream)
        fast_tls(stream)
        peer = f"tcp://{address[0]}:{address[1]}"
        comm = Comm(stream, peer, self.limits)
        timeout = self.gate.admit(comm, address[0]) or HANDSHAKE_TIMEOUT
        try:
            await asyncio.wait_for(_handshake_listener(comm, self.secret, self.info, self.check,
                                                       self.gate.progressed), timeout)
        except (ProtocolError, AuthenticationError, CommClosedError, StreamClosedError,
                asyncio.TimeoutError) as exc:
            if getattr(comm, "evicted", False):
                cause = "closed to make room (too many waiting)"
            elif isinstance(exc, asyncio.TimeoutError):
                cause = f"no proof of the secret within {timeout:g} s"
            else:
                cause = type(exc).__name__
            self.gate.dropped(peer, cause, str(exc) or cause)
            comm.close()
            return
        finally:
            self.gate.done(comm)
        try:
            await self.handler(comm)
        except (CommClosedError, StreamClosedError):
            pass
        except ProtocolError as exc:
            logger.warning("%s: dropped connection from %s: %s", self.name, peer, exc)
        except Exception:
            logger.exception("%s: error while serving %s; connection dropped", self.name, peer)
        finally:
            comm.close()


class Flusher:
    """Writes the BatchedSends given to it, at most `budget` seconds of writing per loop turn;
    the rest in the next turns, in the order they became due.

    A client releasing its results had the scheduler tell all 500 workers in one turn: 500
    writes of ~22 us, 11 ms in one turn while a client's question waited (issue 19). Shared by
    the streams to many peers whose messages can wait a turn (a scheduler's to its workers);
    a stream to a client that waits for an answer keeps its own call_soon."""

    def __init__(self, budget: float = 0.002):
        self.budget = budget
        self._due: collections.deque = collections.deque()
        self._scheduled = False

    def add(self, batched: "BatchedSend") -> None:
        self._due.append(batched)
        if not self._scheduled:
            self._scheduled = True
            batched._loop.call_soon(self._run, batched._loop)

    def _run(self, loop) -> None:
        self._scheduled = False
        due, deadline = self._due, time.perf_counter() + self.budget
        try:
            while due:
                due.popleft()._flush()
                if time.perf_counter() > deadline:
                    break
        finally:                                # a write that raised strands no other peer's
            if due and not self._scheduled:
                self._scheduled = True
                loop.call_soon(self._run, loop)


MEMORY_RETRY = 0.1              # seconds before a batch that met a MemoryError is written again


class BatchedSend:
    """Coalesces messages produced in one event-loop turn into one write.

    Sending never blocks the caller; a burst of completions or submissions becomes one
    frame group instead of thousands of small writes. With a `flusher`, the write waits its
    turn there (bounded writing per loop turn); without, it is made at the end of this turn.
    """

    def __init__(self, comm: Comm, flusher: Flusher | None = None):
        self.comm = comm
        self.buffer: list[dict] = []
        self._scheduled = False
        self._loop = asyncio.get_running_loop()
        self._flusher = flusher

    def _schedule(self) -> None:
        self._scheduled = True
        if self._flusher is not None:
            self._flusher.add(self)
        else:
            self._loop.call_soon(self._flush)

    def send(self, msg: dict) -> None:
        self.buffer.append(msg)
        if not self._scheduled:
            self._schedule()

    def extend(self, msgs: list[dict]) -> None:
        if msgs:
            self.buffer.extend(msgs)
            if not self._scheduled:
                self._schedule()

    def flush(self) -> None:
        """Write now instead of at the end of this loop turn."""
        self._flush()

    def _flush(self) -> None:
        self._scheduled = False
        if not self.buffer:
            return
        msgs, self.buffer = self.buffer, []
        try:
            self.comm.write_nowait(msgs)
        except MessageTooLargeError as exc:
            # The peer would drop the connection on reading it; drop it ourselves, saying why
            # (a batch cannot be half-sent, and silently losing it would leave waiters hanging).
            logger.error("%s; closing the connection", exc)
            self.comm.close()
        except MemoryError:
            # The process is out of memory this moment (a task filled a job's address-space
            # limit, and packing the batch could not get its buffer): the batch was lost, and
            # with it a task's result and the heartbeats. Kept, in order, and tried again soon.
            self.buffer[:0] = msgs
            if not self._scheduled:
                self._scheduled = True
                self._loop.call_later(MEMORY_RETRY, self._flush)

    async def drain(self) -> None:
        """Write what is buffered and wait until it is on the wire."""
        msgs, self.buffer = self.buffer, []
        if msgs:
            try:
                await self.comm.write(msgs)
            except CommClosedError:
                pass
