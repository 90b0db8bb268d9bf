"""Speaking the wire protocol by hand on a plain socket (a peer that is not ours): one message's
bytes as they arrive, for the protocol and fuzz tests."""

from __future__ import annotations

import socket
import struct


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def read_message(sock: socket.socket) -> bytes:
    """One message as sent: its 12-byte head (frame count, body length) and the body."""
    head = recv_exactly(sock, 12)
    return head + recv_exactly(sock, struct.unpack("<IQ", head)[1])
