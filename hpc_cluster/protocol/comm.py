"""Authenticated connections over tornado IOStreams, and batched sends.

Every connection starts with a magic string and a mutual HMAC challenge/response on the
per-cluster secret; package versions are exchanged only after both sides have proven
the secret. Until then a peer may send at most one tiny frame (HANDSHAKE_LIMITS), so an
unauthenticated peer can neither make us allocate nor make us decode anything large.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import socket
import struct
from typing import Awaitable, Callable

from tornado.iostream import IOStream, StreamClosedError
from tornado.tcpclient import TCPClient
from tornado.tcpserver import TCPServer

from .frames import HANDSHAKE_LIMITS, Limits, ProtocolError, check_count, check_lengths, dumps, loads

logger = logging.getLogger("hpc_cluster.comm")

MAGIC = b"HPCC\x00\x01\r\n"      # protocol name + version; garbage fails here at once
HANDSHAKE_TIMEOUT = 10.0
_JOIN_BELOW = 8 * 2**20


class AuthenticationError(ConnectionError):
    """The peer could not prove the cluster secret (or we could not)."""


class CommClosedError(ConnectionError):
    pass


def parse_address(address: str) -> tuple[str, int]:
    """'tcp://host:port' or 'host:port' -> (host, port)."""
    text = address.split("://", 1)[1] if "://" in address else address
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {address!r} is not of the form tcp://host:port")
    return host.strip("[]"), int(port)


def _proof(secret: bytes, side: bytes, c_nonce: bytes, s_nonce: bytes) -> bytes:
    return hmac.new(secret, side + b"|" + c_nonce + b"|" + s_nonce, hashlib.sha256).digest()


class Comm:
    """One authenticated connection; reads and writes batches of message dicts."""

    def __init__(self, stream: IOStream, peer: str, limits: Limits | None = None):
        self.stream = stream
        self.peer = peer
        self.limits = limits or Limits()
        self.peer_info: dict = {}           # role, versions ... from the handshake
        self._close_callbacks: list[Callable[[], None]] = []
        stream.set_close_callback(self._on_close)

    # -- reading ----------------------------------------------------------------
    async def _read_frames(self, limits: Limits) -> list:
        try:
            head = await self.stream.read_bytes(12)
            count, total = struct.unpack("<IQ", head)
            check_count(count, limits)
            if total < 8 * count or total - 8 * count > limits.max_message_bytes:
                raise ProtocolError(f"message of {total} bytes exceeds the limit of {limits.max_message_bytes}")
            if total <= 65536:
                buf = memoryview(await self.stream.read_bytes(total))
            else:
                # Check the announced frame sizes before allocating the whole message.
                lengths = list(struct.unpack(f"<{count}Q", await self.stream.read_bytes(8 * count)))
                check_lengths(lengths, limits)
                if sum(lengths) != total - 8 * count:
                    raise ProtocolError("frame lengths do not add up to the announced total")
                body = memoryview(bytearray(total - 8 * count))
                await self.stream.read_into(body)
                return _split(body, lengths)
        except StreamClosedError:
            raise CommClosedError(f"connection to {self.peer} closed") from None
        lengths = list(struct.unpack_from(f"<{count}Q", buf))
        check_lengths(lengths, limits)
        if sum(lengths) != total - 8 * count:
            raise ProtocolError("frame lengths do not add up to the announced total")
        return _split(buf[8 * count:], lengths)

    async def read(self, limits: Limits | None = None) -> list[dict]:
        """Read one batch: a list of dicts, each with a string 'op'."""
        msgs = loads(await self._read_frames(limits or self.limits))
        if isinstance(msgs, dict):
            msgs = [msgs]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("op"), str)
                                                 for m in msgs):
            raise ProtocolError("a message must be a map with a string 'op' (or a list of them)")
        return msgs

    # -- writing ----------------------------------------------------------------
    def write_nowait(self, msgs) -> Awaitable | None:
        """Queue a batch on the stream; returns the write future (errors are swallowed)."""
        if self.stream.closed():
            return None
        frames = dumps(msgs)
        try:
            if sum(len(f) for f in frames) < _JOIN_BELOW:
                fut = self.stream.write(b"".join(frames))
            else:
                for f in frames[:-1]:
                    self.stream.write(f)
                fut = self.stream.write(frames[-1])
        except StreamClosedError:
            return None
        fut.add_done_callback(_swallow)
        return fut

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


def _split(buf: memoryview, lengths: list[int]) -> list[memoryview]:
    frames, pos = [], 0
    for n in lengths:
        frames.append(buf[pos:pos + n])
        pos += n
    return frames


def _swallow(fut) -> None:
    if not fut.cancelled():
        fut.exception()


def _nodelay(stream: IOStream) -> None:
    try:
        stream.set_nodelay(True)
    except (OSError, AttributeError):
        pass


async def connect(address: str, secret: bytes, info: dict, limits: Limits | None = None,
                  timeout: float = 10.0) -> Comm:
    """Open a connection and run the handshake as the connecting side."""
    host, port = parse_address(address)
    try:
        stream = await asyncio.wait_for(TCPClient().connect(host, port, max_buffer_size=2**62), timeout)
    except (OSError, StreamClosedError, asyncio.TimeoutError) as exc:
        raise ConnectionError(f"could not connect to {address}: {exc or type(exc).__name__}") from None
    _nodelay(stream)
    comm = Comm(stream, f"tcp://{host}:{port}", limits)
    try:
        await asyncio.wait_for(_handshake_connector(comm, secret, info), HANDSHAKE_TIMEOUT)
    except BaseException:
        comm.close()
        raise
    return comm


async def _handshake_connector(comm: Comm, secret: bytes, info: dict) -> None:
    c_nonce = os.urandom(32)
    comm.stream.write(MAGIC)
    await comm.write({"op": "auth", "nonce": c_nonce})
    try:
        reply = (await comm.read(HANDSHAKE_LIMITS))[0]
    except (CommClosedError, ProtocolError) as exc:
        raise AuthenticationError(f"{comm.peer} closed the connection during the handshake ({exc}); "
                                  "is it an hpc-cluster scheduler or worker with the same secret?") from None
    s_nonce, proof = reply.get("nonce"), reply.get("proof")
    if not isinstance(s_nonce, bytes) or not isinstance(proof, bytes) or not hmac.compare_digest(
            proof, _proof(secret, b"listener", c_nonce, s_nonce)):
        raise AuthenticationError(f"{comm.peer} did not prove the cluster secret; check that you use "
                                  "the cluster file (or secret) of the cluster you meant")
    await comm.write({"op": "auth-proof", "proof": _proof(secret, b"connector", c_nonce, s_nonce),
                      "info": info})
    try:
        welcome = (await comm.read(HANDSHAKE_LIMITS))[0]
    except CommClosedError:
        raise AuthenticationError(f"{comm.peer} refused our proof of the cluster secret; the secret "
                                  "you passed is not this cluster's") from None
    if welcome.get("op") == "refused":
        raise AuthenticationError(f"{comm.peer} refused the connection: {welcome.get('reason')}")
    comm.peer_info = welcome.get("info") or {}


async def _handshake_listener(comm: Comm, secret: bytes, info: dict,
                              check: Callable[[dict], str | None] | None) -> None:
    magic = await comm.stream.read_bytes(len(MAGIC))
    if magic != MAGIC:
        raise ProtocolError(f"not an hpc-cluster peer (first bytes {bytes(magic)!r})")
    hello = (await comm.read(HANDSHAKE_LIMITS))[0]
    c_nonce = hello.get("nonce")
    if hello.get("op") != "auth" or not isinstance(c_nonce, bytes) or len(c_nonce) != 32:
        raise ProtocolError("handshake did not start with an auth message")
    s_nonce = os.urandom(32)
    await comm.write({"op": "auth", "nonce": s_nonce, "proof": _proof(secret, b"listener", c_nonce, s_nonce)})
    msg = (await comm.read(HANDSHAKE_LIMITS))[0]
    proof = msg.get("proof")
    if msg.get("op") != "auth-proof" or not isinstance(proof, bytes) or not hmac.compare_digest(
            proof, _proof(secret, b"connector", c_nonce, s_nonce)):
        raise AuthenticationError("peer failed to prove the cluster secret")
    peer_info = msg.get("info") if isinstance(msg.get("info"), dict) else {}
    reason = check(peer_info) if check else None
    if reason:
        await comm.write({"op": "refused", "reason": reason})
        raise AuthenticationError(f"refused: {reason}")
    comm.peer_info = peer_info
    await comm.write({"op": "welcome", "info": info})


class Listener(TCPServer):
    """Accepts connections, authenticates them, then hands each Comm to `handler`.

    A peer that fails the handshake or later sends a bad message is logged and dropped;
    the listener and every other connection carry on.
    """

    def __init__(self, handler: Callable[[Comm], Awaitable[None]], secret: bytes, info: dict,
                 limits: Limits | None = None, check: Callable[[dict], str | None] | None = None,
                 name: str = "server"):
        super().__init__(max_buffer_size=2**62)
        self.handler, self.secret, self.info = handler, secret, info
        self.limits, self.check, self.name = limits or Limits(), check, name
        self.address: str | None = None

    def start_listening(self, host: str = "127.0.0.1", port: int = 0) -> str:
        sockets = __import__("tornado.netutil", fromlist=["bind_sockets"]).bind_sockets(
            port, address=host if host not in ("", "0.0.0.0") else None, family=socket.AF_INET)
        self.add_sockets(sockets)
        bound = sockets[0].getsockname()[1]
        shown = host if host not in ("", "0.0.0.0") else socket.gethostname()
        self.address = f"tcp://{shown}:{bound}"
        return self.address

    async def handle_stream(self, stream: IOStream, address) -> None:
        _nodelay(stream)
        peer = f"tcp://{address[0]}:{address[1]}"
        comm = Comm(stream, peer, self.limits)
        try:
            await asyncio.wait_for(_handshake_listener(comm, self.secret, self.info, self.check),
                                   HANDSHAKE_TIMEOUT)
        except (ProtocolError, AuthenticationError, CommClosedError, StreamClosedError,
                asyncio.TimeoutError) as exc:
            logger.warning("%s: dropped connection from %s during handshake: %s", self.name, peer,
                           exc or type(exc).__name__)
            comm.close()
            return
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


class ConnectionPool:
    """Request/response to peers over reused connections (one request per connection at a time)."""

    def __init__(self, secret: bytes, info: dict, limits: Limits | None = None):
        self.secret, self.info, self.limits = secret, info, limits
        self._idle: dict[str, list[Comm]] = {}

    async def request(self, address: str, msg: dict) -> dict:
        idle = self._idle.setdefault(address, [])
        comm = idle.pop() if idle else await connect(address, self.secret, self.info, self.limits)
        try:
            await comm.write(msg)
            reply = (await comm.read())[0]
        except BaseException:
            comm.close()            # a half-done exchange leaves the stream unusable
            raise
        idle.append(comm)
        return reply

    def close(self) -> None:
        for comms in self._idle.values():
            for c in comms:
                c.close()
        self._idle.clear()


class BatchedSend:
    """Coalesces messages produced in one event-loop turn into one write.

    Sending never blocks the caller; a burst of completions or submissions becomes one
    frame group instead of thousands of small writes.
    """

    def __init__(self, comm: Comm):
        self.comm = comm
        self.buffer: list[dict] = []
        self._scheduled = False
        self._loop = asyncio.get_running_loop()

    def send(self, msg: dict) -> None:
        self.buffer.append(msg)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def extend(self, msgs: list[dict]) -> None:
        if msgs:
            self.buffer.extend(msgs)
            if not self._scheduled:
                self._scheduled = True
                self._loop.call_soon(self._flush)

    def flush(self) -> None:
        """Write now instead of at the end of this loop turn."""
        self._flush()

    def _flush(self) -> None:
        self._scheduled = False
        if not self.buffer:
            return
        msgs, self.buffer = self.buffer, []
        self.comm.write_nowait(msgs)

    async def drain(self) -> None:
        """Write what is buffered and wait until it is on the wire."""
        msgs, self.buffer = self.buffer, []
        if msgs:
            try:
                await self.comm.write(msgs)
            except CommClosedError:
                pass
