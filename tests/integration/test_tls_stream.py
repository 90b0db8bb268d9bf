"""TLS streams as tls.py tunes them (issue 34, point 3: its cost against plain TCP):
OpenSSL reads ahead (one read for what the socket holds, not two per 16 KiB record), and the
first message that the handshake's last read took along is still served (without an event
for it on the socket, a server waited for the next bytes: the handshake timed out)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

from hpc_cluster.protocol.comm import Listener, connect
from hpc_cluster.protocol.tls import (_GET_READ_AHEAD, TLSStream, _libssl, make_certificate,
                                      read_ahead)

SECRET = b"s" * 32


def test_the_contexts_read_ahead(tmp_path):
    sec = make_certificate(tmp_path / "tls")
    assert read_ahead(sec.client_context()) and read_ahead(sec.server_context())
    import ctypes
    ctx = sec.server_context()
    pointer = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    assert _libssl().SSL_CTX_ctrl(pointer, _GET_READ_AHEAD, 0, None) == 1


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
