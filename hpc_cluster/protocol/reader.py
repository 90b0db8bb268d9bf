"""Reading wire messages (frames.py's format) from a tornado IOStream, for comm.py's Comm.

A wake-up's read brings every byte the peer has sent so far into a buffer, and each message
complete in it is taken without calling into the stream again: two or three awaited tornado
reads per message were a quarter of the scheduler's time, and the messages of one wake-up
are now handled in one go, so what they cause goes out in one write (BatchedSend).

A large part is not copied through that buffer: what of it is buffered is copied into
memory of its own, the rest read straight into that memory, in pieces of CHUNK bytes.
Sizes are checked against the limits before anything is allocated for them.
"""

from __future__ import annotations

import mmap
import struct

from tornado.iostream import IOStream

from ..units import format_memory
from .frames import Limits, ProtocolError, check_count, check_lengths, join

CHUNK = 16 * 2**20              # large parts are written and read in pieces of this size: a few ms
                                # each, so heartbeats and other connections are served in between
_READ_BUFFER = 65536            # read from the stream up to this much at once
_SPARES_KEPT = 16               # drained read buffers kept for the next connection that reads
_READ_AT_ONCE = 65536           # a message up to this size is read whole into memory of its own
_HEAD = struct.Struct("<IQ")    # frame count, total length (frames.py)
_OWN_BUFFER = 65536             # a part this large is read into memory of its own (freed with it)
_RUN_MAX = 2**20                # smaller parts are read together, up to this much at a time
_MMAP_FROM = 2**20              # parts this large are read into anonymous mmaps (see _allocate)

# Read buffers no connection holds. Drained, a connection gives its buffer back: one between
# messages holds none (a worker with 2,000 peers would otherwise keep 128 MB of them).
_SPARES: list[memoryview] = []


class FrameReader:
    """One connection's reading side: `read_frames` returns a message's logical frames."""

    def __init__(self, stream: IOStream):
        self.stream = stream
        self.buf: memoryview | None = None      # bytes read but not yet taken: [pos, end)
        self.pos = self.end = 0
        self.waited = False                     # set when a read had to wait for the peer (Comm.batches)

    async def read_frames(self, limits: Limits) -> list:
        """The next message's logical frames (header first). Raises ProtocolError for one over
        `limits` or malformed, StreamClosedError when the stream ends first."""
        if self.end - self.pos < _HEAD.size:
            await self._fill(_HEAD.size)
        count, total = _HEAD.unpack_from(self.buf, self.pos)
        self.pos += _HEAD.size
        check_count(count, limits)
        body = total - 8 * count
        if total < 8 * count or body > limits.max_message_bytes:
            raise ProtocolError(f"message of {total} bytes exceeds the limit of {limits.max_message_bytes}")
        if total <= _READ_AT_ONCE:
            # Memory of its own, not the read buffer (reused): writeable, as arrays built on
            # it must be, and freed with the message.
            start = self.pos
            if self.end - start >= total:
                buf = bytearray(self.buf[start:start + total])
                self.pos = start + total
            else:
                buf = bytearray(total)
                await self._read_exactly(memoryview(buf))
            groups = check_lengths(struct.unpack_from(f"<{count}Q", buf), limits, body)
            frames = join(memoryview(buf)[8 * count:], groups)
        else:
            # Check the announced frame sizes before allocating anything for them.
            lengths = bytearray(8 * count)
            await self._read_exactly(memoryview(lengths))
            groups = check_lengths(struct.unpack(f"<{count}Q", lengths), limits, body)
            frames = await self._read_parts([sum(g) for g in groups])
        if self.pos == self.end and self.buf is not None:
            if len(_SPARES) < _SPARES_KEPT:
                _SPARES.append(self.buf)
            self.buf = None
            self.pos = self.end = 0
        return frames

    async def _fill(self, need: int) -> None:
        """Read until `need` bytes (at most _READ_BUFFER) are buffered, taking all that came."""
        if self.buf is None:
            try:
                self.buf = _SPARES.pop()        # (loops in other threads take them too)
            except IndexError:
                self.buf = memoryview(bytearray(_READ_BUFFER))
        have = self.end - self.pos
        if self.pos:                            # only a prefix's few bytes are left: to the front
            self.buf[:have] = bytes(self.buf[self.pos:self.end])
            self.pos, self.end = 0, have
        while self.end < need:
            self.end += await self._read_into(self.buf[self.end:], partial=True)

    def _read_into(self, view, partial: bool = False):
        fut = self.stream.read_into(view, partial=partial)
        if not fut.done():
            self.waited = True                  # the loop will have turned before it completes
        return fut

    async def _read_exactly(self, view: memoryview) -> None:
        """Fill `view` from what is buffered, then straight from the stream: the rest of a large
        part lands in its own memory without passing through the read buffer."""
        k = min(len(view), self.end - self.pos)
        if k:
            view[:k] = self.buf[self.pos:self.pos + k]
            self.pos += k
        for start in range(k, len(view), CHUNK):
            await self._read_into(view[start:start + CHUNK])

    async def _read_parts(self, sizes: list[int]) -> list[memoryview]:
        """Read the logical frames: each large one into memory of its own, so that one array
        of a reply can be freed while the others live on, and small ones a run at a time."""
        frames: list = []
        i = 0
        while i < len(sizes):
            if sizes[i] >= _OWN_BUFFER:
                buf = _allocate(sizes[i])
                await self._read_exactly(buf)
                frames.append(buf)
                i += 1
                continue
            j, run = i, 0
            while j < len(sizes) and sizes[j] < _OWN_BUFFER and run + sizes[j] <= _RUN_MAX:
                run += sizes[j]
                j += 1
            buf = memoryview(bytearray(run))
            await self._read_exactly(buf)
            pos = 0
            for n in sizes[i:j]:
                frames.append(buf[pos:pos + n])
                pos += n
            i = j
        return frames


def _allocate(n: int) -> memoryview:
    """Memory for one large part. A private anonymous mmap, not a bytearray (which zero-fills,
    so commits, all of it at once): its pages are committed only as the peer's bytes arrive,
    so a size a peer claims costs nothing until it is sent, and munmap returns it whole.
    Transparent huge pages where the kernel offers them (as numpy asks for its arrays): a
    fault per 2 MiB instead of per 4 KiB, which on a VM was most of a transfer's time."""
    try:
        if n < _MMAP_FROM:
            return memoryview(bytearray(n))
        buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE)
    except (OSError, ValueError, OverflowError, MemoryError) as exc:
        raise ProtocolError(f"cannot allocate {format_memory(n)} for a part of a message the peer announced: "
                            f"{exc}") from None
    if _HUGEPAGE is not None:
        try:
            buf.madvise(_HUGEPAGE)
        except OSError:                 # THP disabled: ordinary pages
            pass
    return memoryview(buf)


_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
