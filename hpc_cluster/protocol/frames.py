"""Length-prefixed frames: one msgpack header plus opaque payload frames.

A wire message is

    u32 frame count | u64 total length | u64 length per frame | frames...

(the total lets a reader take the lengths and the frames in one read).

Frame 0 is the msgpack header: a list of message dicts (a batch). Payloads that must
not be decoded on the way (pickled functions and data) are wrapped in `Opaque`; they
travel as their own frames and the header refers to them by index through a msgpack
extension type. The scheduler therefore forwards user bytes without ever unpickling
them (DESIGN principle 2).

Out-of-band buffers. An `Opaque` may carry, beside its pickle stream (`data`), the
buffers that pickle protocol 5 left out of the stream (`buffers`: a numpy array's
memory, a DataFrame's blocks). Each buffer is a frame of its own, written from the
sender's memory as it is, so a large array is never copied into a bytes object on the
way; the receiver gets each in a buffer of its own, writeable unless it was sent
read-only, for `pickle.loads(data, buffers=...)` to build the array on.

Splitting. No frame on the wire is longer than the receiver's `max_frame_bytes`: a
longer part (the buffer of a 1.2 GB array) goes as several frames, each but the last
with bit 63 of its length set, meaning "continued by the next frame". The receiver
reads such a run into one buffer, so the part arrives whole with no copy beyond the
socket read. `check_lengths` turns the wire's lengths into these logical frames.

Everything here is pure: bytes in, objects out, with sizes checked before allocation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack

from ..units import format_memory

_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_SPAN = struct.Struct("<QQ")
_EXT_OPAQUE = 1          # u64 frame index: a payload without out-of-band buffers
_EXT_OPAQUE_BUFFERS = 2  # u64 frame index of the data | u64 buffer count | a read-only byte per buffer
CONTINUED = 1 << 63      # in a frame's length: the next frame continues this part
_SIZE_MASK = CONTINUED - 1


class ProtocolError(Exception):
    """The peer sent something that is not a valid message; drop the connection."""


class MessageTooLargeError(ValueError):
    """A message we were about to send exceeds what the receiving peer accepts.

    Raised before a byte is written, so the connection stays usable."""


@dataclass(frozen=True)
class Limits:
    """Bounds checked before any buffer is allocated for a peer's message.

    `max_message_bytes` bounds one message, hence the largest single result that can
    travel. 64 GiB: a limit meant to stop a broken or hostile peer, not to refuse the
    large results of HPC nodes (hundreds of GB of memory); it costs nothing while unused,
    because large parts are read into memory that is only committed as bytes arrive.
    """

    max_frames: int = 100_000
    max_frame_bytes: int = 2**30          # 1 GiB; longer parts are split (see above)
    max_message_bytes: int = 64 * 2**30   # 64 GiB
    max_header_bytes: int = 256 * 2**20   # the msgpack part


HANDSHAKE_LIMITS = Limits(max_frames=1, max_frame_bytes=64 * 1024,
                          max_message_bytes=64 * 1024, max_header_bytes=64 * 1024)


def nbytes(buf) -> int:
    """Bytes in a buffer (len() of a memoryview counts items, not bytes)."""
    return len(buf) if isinstance(buf, (bytes, bytearray)) else memoryview(buf).nbytes


class Opaque:
    """Bytes that travel as their own frames and are never decoded by the transport.

    `data` is the payload (a pickle stream); `buffers` are its out-of-band buffers, each
    sent as it is and received in memory of its own (see the module's docstring).
    """

    __slots__ = ("data", "buffers")

    def __init__(self, data: bytes | bytearray | memoryview, buffers=()):
        self.data = data
        self.buffers = tuple(buffers)

    @property
    def nbytes(self) -> int:
        return nbytes(self.data) + sum(nbytes(b) for b in self.buffers)

    def __len__(self) -> int:
        return self.nbytes

    def __eq__(self, other) -> bool:
        return (isinstance(other, Opaque) and len(self.buffers) == len(other.buffers)
                and all(bytes(a) == bytes(b) for a, b in zip((self.data, *self.buffers),
                                                              (other.data, *other.buffers))))

    def __hash__(self) -> int:
        return hash(bytes(self.data))

    def __repr__(self) -> str:
        extra = f" + {len(self.buffers)} buffers of {self.nbytes - nbytes(self.data)} bytes" if self.buffers else ""
        return f"Opaque({nbytes(self.data)} bytes{extra})"


def byte_view(buf) -> memoryview:
    """A flat view of a buffer's bytes (to slice it by bytes; no copy)."""
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def dumps(msgs, max_frame_bytes: int = Limits.max_frame_bytes, receiver: Limits | None = None) -> list:
    """Encode a header object (usually a list of message dicts) into wire pieces:
    [prefix, frame, frame, ...], the frames being the payloads' own memory (no copies).

    Parts longer than `max_frame_bytes` are split. With `receiver` (the limits the peer
    announced), a message it would refuse raises MessageTooLargeError instead.
    """
    parts: list = []                  # logical frames after the header
    readonly: list[bool] = []         # per part: a buffer sent read-only
    index: dict[tuple, bytes] = {}    # payload identity -> packed reference: a map's function goes once

    def default(obj):
        if isinstance(obj, Opaque):
            key = (id(obj.data), *map(id, obj.buffers))
            ref = index.get(key)
            if ref is None:
                first = len(parts) + 1
                parts.append(obj.data)
                readonly.append(False)
                for b in obj.buffers:
                    parts.append(b)
                    readonly.append(memoryview(b).readonly)
                if obj.buffers:
                    flags = bytes(readonly[first:])
                    ref = index[key] = _SPAN.pack(first, len(obj.buffers)) + flags
                else:
                    ref = index[key] = _LENGTH.pack(first)
            return msgpack.ExtType(_EXT_OPAQUE_BUFFERS if len(ref) > _LENGTH.size else _EXT_OPAQUE, ref)
        if isinstance(obj, (set, frozenset)):
            return list(obj)
        raise TypeError(f"cannot put {type(obj).__name__} on the wire: {obj!r:.80}")

    header = msgpack.packb(msgs, default=default, use_bin_type=True)
    if max_frame_bytes < 1:
        raise ValueError(f"max_frame_bytes={max_frame_bytes} must be positive")
    sizes = [len(header), *(nbytes(p) for p in parts)]
    if receiver is not None:
        _check_receiver(sizes, max_frame_bytes, receiver)
    frames: list = []
    lengths: list[int] = []
    for part, size in zip((header, *parts), sizes):
        if size <= max_frame_bytes:
            frames.append(part)
            lengths.append(size)
            continue
        view = byte_view(part)           # slices of the part's own memory: no copy
        for start in range(0, size, max_frame_bytes):
            piece = view[start:start + max_frame_bytes]
            frames.append(piece)
            lengths.append(len(piece) | (CONTINUED if start + max_frame_bytes < size else 0))
    prefix = (_COUNT.pack(len(frames)) + _LENGTH.pack(8 * len(frames) + sum(sizes))
              + struct.pack(f"<{len(frames)}Q", *lengths))
    return [prefix, *frames]


def _check_receiver(sizes: list[int], max_frame_bytes: int, limits: Limits) -> None:
    """Refuse, on the sending side, what the receiver would drop the connection for."""
    total = sum(sizes)
    advice = ("Raise max_message_bytes in the cluster's settings (docs/configuration.md) on every "
              "machine, or make the result smaller: split it into pieces (e.g. chunks of an array) "
              "that are gathered or passed on one by one")
    if total > limits.max_message_bytes:
        raise MessageTooLargeError(f"a message of {format_memory(total)} is more than the receiver accepts "
                                   f"(max_message_bytes = {format_memory(limits.max_message_bytes)}). "
                                   f"{advice}")
    if sizes[0] > limits.max_header_bytes:
        raise MessageTooLargeError(f"a message header of {format_memory(sizes[0])} is more than the receiver "
                                   f"accepts ({format_memory(limits.max_header_bytes)}); send fewer tasks "
                                   "or keys per message")
    count = sum(-(-n // max_frame_bytes) or 1 for n in sizes)
    if count > limits.max_frames:
        raise MessageTooLargeError(f"a message of {count} frames is more than the receiver accepts "
                                   f"({limits.max_frames}); send fewer payloads per message")


def check_lengths(lengths, limits: Limits, expected: int | None = None) -> list[list[int]]:
    """Refuse a message whose announced sizes exceed the limits, before reading it.

    `lengths` are the wire's (bit 63 set on a frame its next one continues); `expected` is
    the total the prefix announced. Returns the logical frames, each as its frames' sizes.
    """
    if not lengths:
        raise ProtocolError("message without a header frame")
    groups: list[list[int]] = []
    run: list[int] = []
    for raw in lengths:
        n = raw & _SIZE_MASK
        if n > limits.max_frame_bytes:
            raise ProtocolError(f"frame of {n} bytes exceeds the limit of {limits.max_frame_bytes}")
        run.append(n)
        if not raw & CONTINUED:
            groups.append(run)
            run = []
    if run:
        raise ProtocolError(f"the last frame is marked as continued, but the message ends there "
                            f"({len(lengths)} frames sent)")
    header = sum(groups[0])
    if header > limits.max_header_bytes:
        raise ProtocolError(f"header of {header} bytes exceeds the limit of {limits.max_header_bytes}")
    total = sum(sum(g) for g in groups)
    if total > limits.max_message_bytes:
        raise ProtocolError(f"message of {total} bytes exceeds the limit of {limits.max_message_bytes}")
    if expected is not None and total != expected:
        raise ProtocolError("frame lengths do not add up to the announced total")
    return groups


def check_count(count: int, limits: Limits) -> None:
    if count < 1 or count > limits.max_frames:
        raise ProtocolError(f"frame count {count} outside 1..{limits.max_frames}")


def join(body, groups: list[list[int]]) -> list:
    """Cut a message's body (all frames read into one buffer) into its logical frames;
    a split part is joined into a bytearray of its own (only small messages come this way)."""
    view = memoryview(body)
    frames, pos = [], 0
    for group in groups:
        size = sum(group)
        frames.append(view[pos:pos + size] if len(group) == 1 else bytearray(view[pos:pos + size]))
        pos += size
    return frames


def loads(frames: list) -> object:
    """Decode logical frames (header first) back into the header object with Opaque payloads."""
    payloads = frames[1:]

    def ext_hook(code, data):
        if code == _EXT_OPAQUE and len(data) == _LENGTH.size:
            return Opaque(payloads[_payload_index(_LENGTH.unpack(data)[0], 0, len(payloads))])
        if code == _EXT_OPAQUE_BUFFERS and len(data) >= _SPAN.size:
            first, count = _SPAN.unpack_from(data)
            if len(data) != _SPAN.size + count:
                raise ProtocolError(f"an opaque payload claims {count} buffers but flags {len(data) - _SPAN.size}")
            start = _payload_index(first, count, len(payloads))
            buffers = [memoryview(b) for b in payloads[start + 1:start + 1 + count]]
            flags = data[_SPAN.size:]
            return Opaque(payloads[start], [b.toreadonly() if ro else b for b, ro in zip(buffers, flags)])
        raise ProtocolError(f"unknown msgpack extension type {code}")

    try:
        return msgpack.unpackb(frames[0], ext_hook=ext_hook, raw=False, strict_map_key=False,
                               use_list=True)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"malformed msgpack header: {type(exc).__name__}: {exc}") from None


def _payload_index(ref: int, buffers: int, available: int) -> int:
    """The payload list's index for a 1-based frame reference spanning 1 + `buffers` frames."""
    index = ref - 1
    if not 0 <= index or index + buffers >= available:
        raise ProtocolError(f"payload reference {index}" + (f" with {buffers} buffers" if buffers else "")
                            + f" outside the {available} frames sent")
    return index
