"""TLS streams as tls.py tunes them (issue 34, point 3: its cost against plain TCP):
OpenSSL reads ahead (one read for what the socket holds, not two per 16 KiB record), keeps a
connection's buffers between messages, a stream's read takes every record that has come (not
one), and the first message that the handshake's last read took along is still served
(without an event for it on the socket, a server waited for the next bytes: the handshake
timed out). And the connection pool closes the connections it has stopped using."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

from hpc_cluster.protocol.comm import Listener, connect
from hpc_cluster.protocol.pool import ConnectionPool
from hpc_cluster.protocol.tls import (_GET_READ_AHEAD, _MODE, _RELEASE_BUFFERS, TLSStream, _ssl_ctx,
                                      make_certificate, read_ahead)

SECRET = b"s" * 32


def test_the_contexts_read_ahead(tmp_path):
    sec = make_certificate(tmp_path / "tls")
    assert read_ahead(sec.client_context()) and read_ahead(sec.server_context())
    lib, pointer = _ssl_ctx(sec.server_context())
    assert lib.SSL_CTX_ctrl(pointer, _GET_READ_AHEAD, 0, None) == 1


def test_the_contexts_keep_their_connections_buffers(tmp_path):
    """The ssl module frees a connection's buffers whenever they are empty: a malloc and a free
    (a heap trim, or an mmap) per message. Our contexts keep them."""
    sec = make_certificate(tmp_path / "tls")
    for ctx in (sec.client_context(), sec.server_context()):
        lib, pointer = _ssl_ctx(ctx)
        assert not lib.SSL_CTX_ctrl(pointer, _MODE, 0, None) & _RELEASE_BUFFERS


def test_a_read_takes_every_record_that_has_come(tmp_path):
    """Five writes of the peer are five TLS records; an SSL read returns one. The stream's read
    takes all five, as a socket's read takes all that came over TCP (the scheduler read once per
    worker message before: seven times as often as over TCP). Once a read has found nothing
    more, the next asks the socket (a poll), not OpenSSL (a failing read and an exception),
    until something comes, which is then read."""
    import socket
    sec = make_certificate(tmp_path / "tls")
    ours, theirs = socket.socketpair()          # a send returns once its bytes are in the peer's queue
    done: queue.Queue = queue.Queue()
    more = threading.Event()

    def peer():
        conn = sec.server_context().wrap_socket(theirs, server_side=True)
        done.put(conn)
        for _ in range(5):
            conn.sendall(b"x" * 100)            # a record each
        done.put("sent")
        if more.wait(30):
            conn.sendall(b"y" * 7)
            done.put("sent")

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    client = sec.client_context().wrap_socket(ours)
    server = done.get(timeout=30)
    assert done.get(timeout=30) == "sent"
    client.setblocking(False)

    class Counted:                              # the SSL object, its reads counted
        def __init__(self, sslobj):
            self.sslobj, self.reads = sslobj, 0

        def read(self, *args):
            self.reads += 1
            return self.sslobj.read(*args)

    async def main():
        stream = TLSStream(client)
        stream._ssl_accepting = False           # the handshake was made above
        try:
            assert stream.read_from_fd(memoryview(bytearray(65536))) == 500
            counted = client._sslobj = Counted(client._sslobj)
            assert stream.read_from_fd(memoryview(bytearray(65536))) is None     # nothing more yet
            assert counted.reads == 0
            more.set()
            assert done.get(timeout=30) == "sent"
            buf = bytearray(65536)
            assert stream.read_from_fd(memoryview(buf)) == 7 and buf[:7] == b"y" * 7
        finally:
            client._sslobj = getattr(client._sslobj, "sslobj", client._sslobj)
            stream.close()

    try:
        asyncio.run(main())
    finally:
        more.set()
        server.close()
        thread.join(30)


def test_the_pool_closes_connections_it_stopped_using(tmp_path):
    """A burst of requests opens a connection each; those the pool has not used for its
    idle_seconds are closed at the next sweep (the worker sweeps at each heartbeat), the rest
    are reused. Over TLS and TCP alike."""
    sec = make_certificate(tmp_path / "tls")

    async def main():
        opened = []

        async def serve(comm):
            opened.append(comm)
            while True:
                for msg in await comm.read():
                    comm.write_nowait({"op": "reply", "n": msg["n"]})

        for tls in (sec, None):
            opened.clear()
            listener = Listener(serve, SECRET, {}, tls=tls.server_context() if tls else None)
            address = listener.start_listening("127.0.0.1", 0)
            pool = ConnectionPool(SECRET, {}, tls=tls.client_context() if tls else None, idle_seconds=30)
            try:
                # The four start in one loop turn, before any connection is made: a connection each.
                replies = await asyncio.gather(*(pool.request(address, {"op": "q", "n": i}) for i in range(4)))
                assert [r["n"] for r in replies] == [0, 1, 2, 3] and len(opened) == 4
                await pool.request(address, {"op": "q", "n": 4})        # reuses one of them
                assert len(opened) == 4
                assert pool.sweep(time.monotonic()) == 0                # none idle that long yet
                assert pool.sweep(time.monotonic() + 31) == 4           # all four now
                deadline = time.monotonic() + 10
                while not all(c.closed for c in opened):                # the server sees them go
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
                assert (await pool.request(address, {"op": "q", "n": 5}))["n"] == 5
                assert len(opened) == 5                                 # a new one
            finally:
                pool.close()
                listener.stop()

    asyncio.run(main())


def test_every_connection_is_served_at_once_and_messages_flow(tmp_path):
    """The listener runs on a loop of its own (a thread), busy, as a worker's is when a peer
    fetches from it: a client's first message arrives with its last handshake record."""
    sec = make_certificate(tmp_path / "tls")
    ready: queue.Queue = queue.Queue()
    stop = threading.Event()

    async def serve():
        async def echo(comm):
            assert isinstance(comm.stream, TLSStream)
            async for msgs in comm.batches():
                comm.write_nowait([{"op": "pong", "data": m["data"]} for m in msgs])

        listener = Listener(echo, SECRET, {}, tls=sec.server_context())
        ready.put(listener.start_listening("127.0.0.1", 0))
        while not stop.is_set():
            # A busy loop, as a worker's running tasks make it: bytes pile up between its turns,
            # so the handshake's last record and the first message are read together.
            time.sleep(0.01)
            await asyncio.sleep(0.001)
        listener.stop()

    server = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    server.start()
    address = ready.get(timeout=30)

    async def main():
        for i in range(40):
            # A stalled handshake would end in HandshakeClosed after HANDSHAKE_TIMEOUT.
            comm = await connect(address, SECRET, {}, timeout=10, tls=sec.client_context())
            assert isinstance(comm.stream, TLSStream)
            big = bytes(range(256)) * (1 + i * 250)        # up to 2.5 MB: many records, read ahead
            comm.write_nowait({"op": "ping", "data": big})
            assert (await asyncio.wait_for(comm.read(), 30))[0]["data"] == big
            comm.close()

    try:
        asyncio.run(main())
    finally:
        stop.set()
        server.join(30)


def test_read_ahead_with_a_second_libssl_in_the_process(tmp_path):
    """netCDF4's wheel bundles its own libssl (xarray users load it): with two in the process,
    read-ahead was turned off (the maps could not tell ours). The ssl module's own link decides."""
    import subprocess
    import sys

    import pytest
    pytest.importorskip("netCDF4")
    code = f"""
import netCDF4, ssl
from hpc_cluster.protocol.tls import make_certificate, read_ahead
paths = {{l.split()[-1] for l in open('/proc/self/maps') if '/libssl' in l and '.so' in l}}
assert len(paths) == 2, paths
sec = make_certificate({str(tmp_path / 'tls')!r})
assert read_ahead(sec.client_context()) and read_ahead(sec.server_context())
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
