"""Length-prefixed frames: one msgpack header plus opaque payload frames.

A wire message is

    u32 frame count | u64 total length | u64 length per frame | frames...

(the total lets a reader take the lengths and the frames in one read).

Frame 0 is the msgpack header: a list of message dicts (a batch). Payloads that must
not be decoded on the way (pickled functions and data) are wrapped in `Opaque`; they
travel as their own frames and the header refers to them by index through a msgpack
extension type. The scheduler therefore forwards user bytes without ever unpickling
them (DESIGN principle 2).

Everything here is pure: bytes in, objects out, with sizes checked before allocation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack

_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_EXT_OPAQUE = 1


class ProtocolError(Exception):
    """The peer sent something that is not a valid message; drop the connection."""


@dataclass(frozen=True)
class Limits:
    """Bounds checked before any buffer is allocated for a peer's message."""

    max_frames: int = 100_000
    max_frame_bytes: int = 2**30          # 1 GiB
    max_message_bytes: int = 2**31        # 2 GiB
    max_header_bytes: int = 256 * 2**20   # the msgpack part


HANDSHAKE_LIMITS = Limits(max_frames=1, max_frame_bytes=64 * 1024,
                          max_message_bytes=64 * 1024, max_header_bytes=64 * 1024)


class Opaque:
    """Bytes that travel as their own frame and are never decoded by the transport."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | bytearray | memoryview):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __eq__(self, other) -> bool:
        return isinstance(other, Opaque) and bytes(self.data) == bytes(other.data)

    def __hash__(self) -> int:
        return hash(bytes(self.data))

    def __repr__(self) -> str:
        return f"Opaque({len(self.data)} bytes)"


def dumps(msgs) -> list[bytes | memoryview]:
    """Encode a header object (usually a list of message dicts) into wire frames."""
    payloads: list = []
    index: dict[int, bytes] = {}      # id(payload) -> packed reference: a map's function goes once

    def default(obj):
        if isinstance(obj, Opaque):
            ref = index.get(id(obj.data))
            if ref is None:
                payloads.append(obj.data)
                ref = index[id(obj.data)] = _LENGTH.pack(len(payloads))
            return msgpack.ExtType(_EXT_OPAQUE, ref)
        if isinstance(obj, (set, frozenset)):
            return list(obj)
        raise TypeError(f"cannot put {type(obj).__name__} on the wire: {obj!r:.80}")

    header = msgpack.packb(msgs, default=default, use_bin_type=True)
    frames = [header, *payloads]
    lengths = [len(f) for f in frames]
    prefix = (_COUNT.pack(len(frames)) + _LENGTH.pack(8 * len(frames) + sum(lengths))
              + struct.pack(f"<{len(frames)}Q", *lengths))
    return [prefix, *frames]


def check_lengths(lengths: list[int], limits: Limits) -> None:
    """Refuse a message whose announced sizes exceed the limits, before reading it."""
    if not lengths:
        raise ProtocolError("message without a header frame")
    if lengths[0] > limits.max_header_bytes:
        raise ProtocolError(f"header of {lengths[0]} bytes exceeds the limit of {limits.max_header_bytes}")
    for n in lengths:
        if n > limits.max_frame_bytes:
            raise ProtocolError(f"frame of {n} bytes exceeds the limit of {limits.max_frame_bytes}")
    total = sum(lengths)
    if total > limits.max_message_bytes:
        raise ProtocolError(f"message of {total} bytes exceeds the limit of {limits.max_message_bytes}")


def check_count(count: int, limits: Limits) -> None:
    if count < 1 or count > limits.max_frames:
        raise ProtocolError(f"frame count {count} outside 1..{limits.max_frames}")


def loads(frames: list) -> object:
    """Decode frames (header first) back into the header object with Opaque payloads."""
    payloads = frames[1:]

    def ext_hook(code, data):
        if code != _EXT_OPAQUE or len(data) != _LENGTH.size:
            raise ProtocolError(f"unknown msgpack extension type {code}")
        index = _LENGTH.unpack(data)[0] - 1
        if not 0 <= index < len(payloads):
            raise ProtocolError(f"payload reference {index} outside the {len(payloads)} frames sent")
        return Opaque(payloads[index])

    try:
        return msgpack.unpackb(frames[0], ext_hook=ext_hook, raw=False, strict_map_key=False,
                               use_list=True)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"malformed msgpack header: {type(exc).__name__}: {exc}") from None
