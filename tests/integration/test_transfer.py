"""Large numpy/pandas values move without extra copies (issue 13, point 6).

Pickle protocol 5 leaves their buffers out of the pickle stream; the buffers go to the
socket from the array's own memory, are split into frames below the receiver's
max_frame_bytes, and are read into memory of their own on which the array is rebuilt.

Three levels: serialize and frames as pure functions; real connections (a Listener and
connect() over loopback, in this process); and a real LocalCluster moving a 1.2 GB
array between worker processes and the client, with each process's peak RSS read from
the kernel (VmHWM, reset through /proc/<pid>/clear_refs before each move).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import mmap
import os
import struct

import numpy as np
import pandas as pd
import psutil
import pytest

from hpc_cluster import Client, LocalCluster
from hpc_cluster.protocol import frames, serialize
from hpc_cluster.protocol.comm import MAGIC, Listener, connect, parse_address
from hpc_cluster.protocol.frames import CONTINUED, Limits, MessageTooLargeError, Opaque, ProtocolError

MiB = 2**20


# -- serialize: pickle protocol 5, buffers out of band ----------------------------------------
def test_a_numpy_array_travels_out_of_band_from_its_own_memory():
    a = np.arange(1_000_000, dtype=np.float64)
    payload = serialize.dumps_value(a)
    assert len(payload.data) < 1000                     # the stream holds no data
    [buf] = payload.buffers
    assert buf.nbytes == a.nbytes and np.shares_memory(np.frombuffer(buf, np.uint8), a)
    back = serialize.loads_value(Opaque(bytes(payload.data), [bytearray(buf)]))
    assert np.array_equal(back, a) and back.flags.writeable


def test_the_value_is_rebuilt_on_the_received_buffer_without_a_copy():
    a = np.arange(500_000, dtype=np.int64).reshape(1000, 500)
    payload = serialize.dumps_value(a)
    received = bytearray(payload.buffers[0])            # what the socket read wrote into
    back = serialize.loads_value(Opaque(payload.data, [memoryview(received)]))
    assert np.array_equal(back, a)
    assert np.shares_memory(back, np.frombuffer(received, np.uint8))
    back[0, 0] = -1                                     # writeable, as dask's users expect
    assert received[:8] == struct.pack("<q", -1)


def test_writeable_and_read_only_arrays_keep_their_flag():
    ro = np.arange(100_000, dtype=np.float64)
    ro.flags.writeable = False
    msg = {"op": "x", "rw": serialize.dumps_value(np.ones(100_000)), "ro": serialize.dumps_value(ro)}
    back = frames.loads(_through_wire(frames.dumps(msg, max_frame_bytes=300_000)))
    assert serialize.loads_value(back["rw"]).flags.writeable
    assert not serialize.loads_value(back["ro"]).flags.writeable


def test_fortran_order_and_small_and_strided_arrays():
    f = np.asfortranarray(np.arange(200_000, dtype=np.float32).reshape(400, 500))
    small = np.arange(10)
    strided = np.arange(400_000, dtype=np.float64)[::2]   # not contiguous: pickle copies it in band
    for value, n_buffers in ((f, 1), (small, 0), (strided, 0)):
        payload = serialize.dumps_value(value)
        assert len(payload.buffers) == n_buffers, value.shape
        back = serialize.loads_value(_round_trip(payload))
        assert np.array_equal(back, value)
    assert serialize.loads_value(_round_trip(serialize.dumps_value(f))).flags.f_contiguous


def test_a_dataframe_sends_its_blocks_out_of_band():
    df = pd.DataFrame({"i": np.arange(200_000), "f": np.linspace(0, 1, 200_000),
                       "s": [f"row {i}" for i in range(200_000)]})
    payload = serialize.dumps_value(df)
    numeric = df["i"].to_numpy().nbytes + df["f"].to_numpy().nbytes
    assert sum(b.nbytes for b in payload.buffers) >= numeric
    assert len(payload.data) < numeric / 4              # the numbers are not in the stream
    back = serialize.loads_value(_round_trip(payload))
    pd.testing.assert_frame_equal(back, df)


def test_tokenize_hashes_buffers_where_they_lie():
    a, b = np.arange(100_000), np.arange(100_000) + 1
    ta, tb = (serialize.tokenize(b"scatter", serialize.dumps_value(v)) for v in (a, b))
    assert ta != tb                                     # same header, other buffer
    assert ta == serialize.tokenize(b"scatter", serialize.dumps_value(a.copy()))
    # Plain bytes hash as they always did (keys of pure tasks must not change).
    assert serialize.tokenize(b"f", b"args") == hashlib.blake2b(b"f\0args", digest_size=12).hexdigest()


# -- frames: splitting and joining, references, limits (pure) -----------------------------------
def _lengths(wire) -> list[int]:
    count = struct.unpack_from("<I", wire[0])[0]
    return list(struct.unpack_from(f"<{count}Q", wire[0], 12))


def _through_wire(wire, limits: Limits | None = None) -> list:
    """What a receiver makes of `wire` read into one buffer: its logical frames."""
    data = b"".join(wire)
    count, total = struct.unpack_from("<IQ", data)
    groups = frames.check_lengths(_lengths(wire), limits or Limits(), total - 8 * count)
    return frames.join(bytearray(data[12 + 8 * count:]), groups)


def _round_trip(payload: Opaque, max_frame_bytes: int = 2**30) -> Opaque:
    return frames.loads(_through_wire(frames.dumps({"op": "x", "v": payload}, max_frame_bytes)))["v"]


def test_a_part_above_the_frame_limit_is_split_and_joined():
    a = np.random.default_rng(1).random(300_000)        # 2.4 MB in one buffer
    wire = frames.dumps({"op": "x", "v": serialize.dumps_value(a)}, max_frame_bytes=MiB)
    lengths = _lengths(wire)
    sizes = [n & ~CONTINUED for n in lengths]
    assert max(sizes) <= MiB and len(lengths) == 2 + 3   # header, pickle stream, 3 pieces of the buffer
    assert [bool(n & CONTINUED) for n in lengths] == [False, False, True, True, False]
    # The pieces are the array's own memory, not copies.
    assert all(np.shares_memory(np.frombuffer(f, np.uint8), a) for f in wire[3:])
    back = frames.loads(_through_wire(wire, Limits(max_frame_bytes=MiB)))
    assert np.array_equal(serialize.loads_value(back["v"]), a)


def test_a_split_header_and_a_split_in_band_payload_arrive_whole():
    msg = {"op": "x", "names": [f"key-{i}" for i in range(20_000)], "p": Opaque(os.urandom(50_000))}
    wire = frames.dumps(msg, max_frame_bytes=4096)
    assert len(wire) > 30
    back = frames.loads(_through_wire(wire, Limits(max_frame_bytes=4096)))
    assert back["names"] == msg["names"] and back["p"] == msg["p"]


def test_old_style_payloads_keep_their_wire_form():
    wire = frames.dumps({"op": "x", "p": Opaque(b"abc")})
    assert _lengths(wire)[1] == 3 and b"\xd7\x01" in wire[1]   # fixext 8, extension type 1, as before


def test_split_frames_are_checked_before_allocation():
    limits = Limits(max_frames=10, max_frame_bytes=1000, max_message_bytes=2500, max_header_bytes=1500)
    # A split header counts whole against the header limit, a split part against the message's.
    with pytest.raises(ProtocolError, match="header of 1800 bytes"):
        frames.check_lengths([900 | CONTINUED, 900], limits)
    with pytest.raises(ProtocolError, match="message of 2700 bytes"):
        frames.check_lengths([100, 900 | CONTINUED, 900 | CONTINUED, 800], limits)
    with pytest.raises(ProtocolError, match="frame of 1001 bytes"):
        frames.check_lengths([100, 1001 | CONTINUED, 10], limits)
    # More parts claimed than sent: the last frame says another follows.
    with pytest.raises(ProtocolError, match="marked as continued"):
        frames.check_lengths([100, 900 | CONTINUED], limits)
    with pytest.raises(ProtocolError, match="do not add up"):
        frames.check_lengths([100, 900 | CONTINUED, 900], limits, expected=1000)
    assert frames.check_lengths([100, 900 | CONTINUED, 900], limits, expected=1900) == [[100], [900, 900]]


def _ext2(first: int, count: int, flags: bytes | None = None) -> bytes:
    flags = bytes(count) if flags is None else flags
    return msgpack_packb({"op": "x", "v": _ExtType(2, struct.pack("<QQ", first, count) + flags)})


def test_out_of_band_references_are_checked():
    payload = [b"p" * 10, b"b" * 10]
    ok = frames.loads([_ext2(1, 1), *payload])
    assert ok["v"].data == b"p" * 10 and [bytes(b) for b in ok["v"].buffers] == [b"b" * 10]
    # A payload claiming more buffers than were sent, or starting at the header.
    for bad in (_ext2(1, 2), _ext2(2, 1), _ext2(0, 1)):
        with pytest.raises(ProtocolError, match="outside the 2 frames sent"):
            frames.loads([bad, *payload])
    # The count is bounded by the reference's own size (a flag byte per buffer), so a
    # huge claim is refused before anything is made for it.
    with pytest.raises(ProtocolError, match="claims 1099511627776 buffers but flags 3"):
        frames.loads([_ext2(1, 2**40, b"\0\0\0"), *payload])
    with pytest.raises(ProtocolError, match="claims 1 buffers but flags 3"):
        frames.loads([_ext2(1, 1, b"\0\0\0"), *payload])


def test_the_sender_refuses_what_the_receiver_would_drop():
    big = serialize.dumps_value(np.zeros(1_000_000))
    with pytest.raises(MessageTooLargeError, match=r"max_message_bytes = 1\.00 MiB.*Raise max_message_bytes"):
        frames.dumps({"op": "x", "v": big}, MiB, Limits(max_message_bytes=MiB))
    # header, pickle stream, and 8 MB in 8 frames of at most 1 MiB
    with pytest.raises(MessageTooLargeError, match="10 frames is more than the receiver accepts"):
        frames.dumps({"op": "x", "v": big}, MiB, Limits(max_frames=9, max_frame_bytes=MiB))
    assert len(frames.dumps({"op": "x", "v": big}, MiB, Limits(max_frames=10, max_frame_bytes=MiB))) == 1 + 10


# -- real connections (in this process, over loopback) -------------------------------------------
SECRET = b"s" * 32


async def _pair(server_limits: Limits, client_limits: Limits, handler):
    listener = Listener(handler, SECRET, {"role": "worker"}, server_limits, name="test-server")
    address = listener.start_listening("127.0.0.1", 0)
    comm = await connect(address, SECRET, {"role": "client"}, client_limits)
    return listener, comm


def _serve(values: dict):
    """A handler answering {'op': 'get', 'keys': [...]} with the values, as a worker does."""
    async def handler(comm):
        while True:
            for msg in await comm.read():
                try:
                    await comm.write({"op": "data", "data": {k: serialize.dumps_value(values[k])
                                                             for k in msg["keys"]}})
                except MessageTooLargeError as exc:
                    await comm.write({"op": "refused", "why": str(exc)})
    return handler


def test_a_value_split_to_the_receivers_frame_limit_over_a_real_connection():
    a = np.random.default_rng(2).random(3_000_000)       # 24 MB: above the client's 4 MiB frames
    b = np.arange(2_000_000, dtype=np.int32)
    small = Limits(max_frame_bytes=4 * MiB)

    async def run():
        listener, comm = await _pair(Limits(), small, _serve({"a": a, "b": b}))
        try:
            # Each side knows what the other reads with: the server splits to fit the client.
            assert comm.peer_limits == Limits()
            await comm.write({"op": "get", "keys": ["a", "b"]})
            [reply] = await comm.read()
            return reply["data"]
        finally:
            comm.close()
            listener.stop()

    data = asyncio.run(run())
    got_a, got_b = (serialize.loads_value(data[k]) for k in "ab")
    assert np.array_equal(got_a, a) and np.array_equal(got_b, b)
    assert got_a.flags.writeable and got_b.flags.writeable
    # Each buffer arrived in memory of its own (an mmap), so one can be freed without the other,
    # and the array is built on it: no copy after the socket read.
    buf_a, buf_b = (data[k].buffers[0] for k in "ab")
    assert isinstance(buf_a.obj, mmap.mmap) and buf_a.obj is not buf_b.obj
    assert np.shares_memory(got_a, np.frombuffer(buf_a, np.uint8))


def test_a_message_over_the_receivers_limit_is_refused_by_the_sender_and_the_connection_lives():
    a = np.zeros(2_000_000)                              # 16 MB

    async def run():
        listener, comm = await _pair(Limits(), Limits(max_message_bytes=8 * MiB), _serve({"a": a, "n": 7}))
        try:
            await comm.write({"op": "get", "keys": ["a"]})
            [refused] = await comm.read()
            await comm.write({"op": "get", "keys": ["n"]})     # same connection, still in step
            [reply] = await comm.read()
            return refused, serialize.loads_value(reply["data"]["n"])
        finally:
            comm.close()
            listener.stop()

    refused, n = asyncio.run(run())
    assert refused["op"] == "refused" and "Raise max_message_bytes" in refused["why"], refused
    assert "8.00 MiB" in refused["why"] and n == 7


def test_messages_queued_behind_a_large_one_keep_their_order():
    big = np.random.default_rng(3).random(8_000_000)     # 64 MB: written in pieces

    async def handler(comm):
        await comm.read()
        comm.write_nowait({"op": "big", "v": serialize.dumps_value(big)})
        for i in range(50):                              # queued while the big one is being written
            comm.write_nowait({"op": "small", "i": i})
        await comm.write({"op": "end"})
        await comm.read()

    async def run():
        listener, comm = await _pair(Limits(), Limits(), handler)
        try:
            await comm.write({"op": "go"})
            got = []
            while not got or got[-1]["op"] != "end":
                got.extend(await comm.read())
            await comm.write({"op": "bye"})
            return got
        finally:
            comm.close()
            listener.stop()

    got = asyncio.run(run())
    assert [m["op"] for m in got] == ["big"] + ["small"] * 50 + ["end"]
    assert [m["i"] for m in got[1:-1]] == list(range(50))
    assert np.array_equal(serialize.loads_value(got[0]["v"]), big)


def test_a_peer_leaving_mid_write_fails_that_write_and_those_queued_behind_it():
    big = np.zeros(8_000_000)                            # 64 MB: more than the sockets' buffers hold

    async def run():
        outcome = asyncio.get_running_loop().create_future()

        async def handler(comm):
            await comm.read()
            writes = [comm.write_nowait({"op": "big", "v": serialize.dumps_value(big)}),
                      comm.write_nowait({"op": "after"})]
            outcome.set_result(await asyncio.gather(*writes, return_exceptions=True))

        listener, comm = await _pair(Limits(), Limits(), handler)
        try:
            await comm.write({"op": "go"})
            await comm.stream.read_bytes(12)             # the big one has started; now leave
            comm.close()
            return await asyncio.wait_for(outcome, 10)   # not a hang: both writes fail
        finally:
            listener.stop()

    results = asyncio.run(run())
    assert [type(r).__name__ for r in results] == ["StreamClosedError", "StreamClosedError"], results


def test_a_peer_of_another_wire_version_is_told_so(caplog):
    async def run():
        listener = Listener(lambda comm: asyncio.sleep(0), SECRET, {"role": "worker"}, name="test-server")
        host, port = parse_address(listener.start_listening("127.0.0.1", 0))
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(MAGIC[:5] + b"\x01" + MAGIC[6:])    # an hpc-cluster of wire protocol 1
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        listener.stop()

    with caplog.at_level(logging.WARNING, logger="hpc_cluster.comm"):
        asyncio.run(run())
    assert "speaks hpc-cluster wire protocol 1, this process 2" in caplog.text


# -- a real LocalCluster: 1.2 GB worker -> worker, -> client, and back ------------------------------
N = 150_000_000                     # float64: 1.2 GB, above the default 1 GiB frame limit
SIZE = N * 8

# The bounds on peak RSS. Every process must hold the array once (SIZE); a process that
# copied it once more (an in-band pickle: the sender's bytes object, or the receiver's copy
# out of the message) would peak at 2 x SIZE. Half a copy of slack (600 MB) covers the
# interpreter, pickle's header, the frames of the reply and allocator noise, and still
# fails on any second copy of the data.
SLACK = SIZE // 2


def make_array(n: int, scale: float):
    x = np.arange(n, dtype=np.float64)
    x *= scale                                           # in place: no second array while making it
    return x


def digest(x) -> tuple:
    """What the array holds: dtype, shape, sha1 of its bytes, and whether it is writeable."""
    return (x.dtype.str, x.shape, hashlib.sha1(memoryview(x), usedforsecurity=False).hexdigest(),
            bool(x.flags.writeable))


def frame_digest(df) -> tuple:
    """dtypes, shape and a sha1 per column (of the column's own memory: no temporaries that
    would blur the peak RSS measured around it)."""
    return (list(map(str, df.dtypes)), df.shape,
            [hashlib.sha1(memoryview(np.ascontiguousarray(df[c].to_numpy())), usedforsecurity=False).hexdigest()
             for c in df.columns])


def make_frame(n: int):
    return pd.DataFrame({"i": np.arange(n), "f": np.linspace(0, 1, n), "g": np.arange(n) % 7})


def _reset_peak(pid: int) -> int:
    """Reset the kernel's record of the process's peak RSS (VmHWM) to its current RSS; return it."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return psutil.Process(pid).memory_info().rss


def _peak(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


class Peaks:
    """Peak RSS growth of some processes over a `with` block."""

    def __init__(self, **pids: int):
        self.pids = pids

    def __enter__(self):
        self.base = {name: _reset_peak(pid) for name, pid in self.pids.items()}
        return self

    def __exit__(self, *exc):
        self.growth = {name: _peak(pid) - self.base[name] for name, pid in self.pids.items()}

    def check(self, bound: int, received: int) -> None:
        """Every process grew by at most `bound`; one by about `received` (9/10 of it: the RSS
        at the reset counts pages that are freed and reused), or the value did not move and
        there was nothing to measure."""
        shown = {k: f"{v / 1e9:.2f} GB" for k, v in self.growth.items()}
        assert max(self.growth.values()) >= received * 0.9, f"nothing was received: growth {shown}"
        over = {k: shown[k] for k, v in self.growth.items() if v > bound}
        assert not over, f"peak RSS grew by more than {bound / 1e9:.2f} GB: {over}; all: {shown}"


@pytest.fixture(scope="module")
def pair():
    """Two workers told apart by resources (A and B), so that a task can be sent to the
    worker that does not hold its input. 8 GB each: room for a copy too many (so that
    the RSS checks, not the nanny, report it)."""
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="8GB", resources={"A": 1}) as cluster:
        cluster.resources = {"B": 1}          # LocalCluster starts each worker with its resources
        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            workers = client.scheduler_info()["workers"].values()
            pids = {next(iter(w["resources"])): w["pid"] for w in workers}
            assert set(pids) == {"A", "B"}, pids
            yield client, pids


@pytest.mark.slow
def test_a_large_array_moves_worker_to_worker_with_one_copy(pair):
    client, pids = pair
    a = client.submit(make_array, N, 1.5, resources={"A": 1}, pure=False)
    here = client.submit(digest, a, resources={"A": 1}, pure=False).result(120)
    with Peaks(sender=pids["A"], receiver=pids["B"]) as peaks:
        there = client.submit(digest, a, resources={"B": 1}, pure=False).result(300)
    assert there == here and here[3], (here, there)       # same bytes, and writeable on B too
    peaks.check(SIZE + SLACK, received=SIZE)
    assert peaks.growth["sender"] < SLACK, "the sender copied the array to send it"


@pytest.mark.slow
def test_a_large_array_goes_to_the_client_and_back(pair):
    client, pids = pair
    a = client.submit(make_array, N, 2.5, resources={"A": 1}, pure=False)
    expected = client.submit(digest, a, resources={"A": 1}, pure=False).result(120)
    me = os.getpid()
    with Peaks(sender=pids["A"], client=me) as peaks:
        x = a.result(300)
    assert digest(x) == expected
    peaks.check(SIZE + SLACK, received=SIZE)
    assert peaks.growth["sender"] < SLACK, "the sender copied the array to send it"
    del a

    # Back: scatter from the client to a worker, which holds it once; the client, which
    # already holds x, sends it from x's memory.
    with Peaks(client=me, A=pids["A"], B=pids["B"]) as peaks:
        f = client.scatter(x)
        there = client.submit(digest, f, pure=False).result(300)
    assert there == expected
    peaks.check(SIZE + SLACK, received=SIZE)
    assert peaks.growth["client"] < SLACK, "the client copied the array to scatter it"
    del f, x


@pytest.mark.slow
def test_a_dataframe_moves_worker_to_worker_and_to_the_client(pair):
    client, pids = pair
    n = 10_000_000                                       # 3 columns of 8 bytes: 240 MB
    df = client.submit(make_frame, n, resources={"A": 1}, pure=False)
    here = client.submit(frame_digest, df, resources={"A": 1}, pure=False).result(120)
    # Import pandas on B first: its ~110 MB are not the transfer's.
    client.submit(make_frame, 10, resources={"B": 1}, pure=False).result(60)
    with Peaks(receiver=pids["B"]) as peaks:
        there = client.submit(frame_digest, df, resources={"B": 1}, pure=False).result(300)
    assert there == here
    got = df.result(300)
    pd.testing.assert_frame_equal(got, make_frame(n))
    peaks.check(240_000_000 * 3 // 2, received=240_000_000)


@pytest.mark.slow
def test_a_result_above_the_old_2_gib_message_limit_reaches_the_client(pair):
    # The client reads with the default limits (64 GiB a message); 2.4 GB is 3 frames.
    client, _ = pair
    n = 300_000_000
    a = client.submit(make_array, n, 0.5, resources={"A": 1}, pure=False)
    expected = client.submit(digest, a, resources={"A": 1}, pure=False).result(120)
    x = a.result(300)
    assert x.nbytes > 2**31 and digest(x) == expected


@pytest.mark.slow
def test_a_claimed_size_costs_nothing_until_its_bytes_arrive(pair):
    # An authenticated peer announces a 1.5 GiB part (two frames: 1 GiB continued, then
    # 0.5 GiB), sends 1 MiB of it, and stalls. The worker reads into memory committed as
    # bytes arrive, so its RSS grows by about the 1 MiB, not by the 1.5 GiB claimed.
    client, pids = pair
    worker = next(a for a, w in client.scheduler_info()["workers"].items() if w["pid"] == pids["B"])
    header = msgpack_packb({"op": "get-data", "keys": []})
    lengths = [len(header), 2**30 | CONTINUED, 2**29]
    total = 8 * len(lengths) + len(header) + 2**30 + 2**29
    raw = struct.pack(f"<IQ{len(lengths)}Q", len(lengths), total, *lengths) + header + b"\0" * MiB

    async def claim_and_stall():
        comm = await connect(worker, client.cluster.secret, {"role": "client", "versions": {}})
        try:
            base = _reset_peak(pids["B"])
            await comm.stream.write(raw)      # done: all of it is in the kernel's hands
            # Not a wait for something to happen but a window in which it must not: a worker
            # that allocated (committed) the claimed size would do so as soon as it read the
            # lengths, milliseconds after they arrive.
            await asyncio.sleep(1.0)
            return base, _peak(pids["B"])
        finally:
            comm.close()

    base, peak = asyncio.run(claim_and_stall())
    assert peak - base < 256 * MiB, f"RSS grew by {(peak - base) / MiB:.0f} MiB for 1 MiB received"
    small = client.submit(make_array, 10, 1.0, resources={"B": 1}, pure=False)
    assert client.submit(digest, small, resources={"B": 1}, pure=False).result(60)[1] == (10,)


# -- helpers -------------------------------------------------------------------------------------
def msgpack_packb(obj) -> bytes:
    import msgpack
    return msgpack.packb(obj, use_bin_type=True)


def _ExtType(code, data):
    import msgpack
    return msgpack.ExtType(code, data)
