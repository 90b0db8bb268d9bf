"""A flood of connections that never authenticate (issue 14, point 2), against a real
scheduler process whose open-file limit is 1024 (soft and hard, so it cannot raise it): a
real client is still served within a second, the log stays small, nothing spins. And the
scheduler and the worker raise their soft limit to the hard one at start."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_cluster import Client
from hpc_cluster.protocol.clusterfile import new_secret
from helpers.funcs import inc
from helpers.wait import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, sets rlimits")

FLOOD_SECONDS = 8.0

# The flood, in a process of its own (so that it does not slow this one's client): up to
# 4,000 connections held open at ~2,000 new ones a second; most say nothing, some send half
# the magic, some a valid first message and then nothing (no proof of the secret).
FLOOD = r"""
import collections, os, resource, socket, sys, time
from hpc_cluster.protocol.comm import MAGIC
from hpc_cluster.protocol.frames import dumps
host, port, seconds, hellos = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "hellos"
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 5000), hard))
hello = MAGIC + b"".join(bytes(p) for p in dumps([{"op": "auth", "nonce": os.urandom(32)}]))
held, opened, start = collections.deque(), 0, time.monotonic()
while time.monotonic() - start < seconds:
    if opened > 2000 * (time.monotonic() - start):
        time.sleep(0.001)
        continue
    s = socket.socket()
    try:
        if hellos and opened % 10 == 3:
            s.settimeout(0.5)
            s.connect((host, port))
            s.sendall(hello)
        else:
            s.setblocking(False)
            s.connect_ex((host, port))
            if opened % 10 == 7:
                try:
                    s.send(MAGIC[:4])
                except OSError:
                    pass
    except OSError:
        pass
    held.append(s)
    opened += 1
    while len(held) > 4000:
        held.popleft().close()
print(opened, flush=True)
"""


def _served_during(flood, address, secret, rounds: int) -> list[float]:
    """The time a fresh client takes to connect and get a task's result, again and again
    while the flood lasts."""
    times = []
    time.sleep(1.0)             # the flood at full strength first (not a wait for a result)
    for i in range(rounds):
        if flood.poll() is not None:
            break
        started = time.monotonic()
        with Client(address, secret=secret, set_as_default=False, timeout=30) as c:
            assert c.submit(inc, i, pure=False).result(timeout=30) == i + 1
        times.append(time.monotonic() - started)
        time.sleep(0.3)
    return times


def _limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no 'Max open files' in /proc/<pid>/limits")


def _fd_limit(soft: int, hard: int):
    def set_it():
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return set_it


class Procs:
    """The processes a test starts, ended by pid at the end."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, argv, **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, **kw)
        self.procs.append(p)
        return p

    def end(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.end()


def _start_scheduler(procs, tmp_path, secret: bytes, soft: int, hard: int, log: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, HPC_CLUSTER_SECRET=secret.hex())
    addr_file = tmp_path / "scheduler.address"
    with open(log, "wb") as err:
        p = procs.start([sys.executable, "-m", "hpc_cluster.scheduler", "--host", "127.0.0.1",
                         "--address-file", str(addr_file)], env=env, stderr=err, stdout=subprocess.DEVNULL,
                        preexec_fn=_fd_limit(soft, hard))
    wait_until(lambda: addr_file.exists() or p.poll() is not None, 30, "the scheduler to listen")
    assert p.poll() is None, log.read_text()
    return p, addr_file.read_text().strip()


def _start_worker(procs, tmp_path, secret: bytes, address: str, soft: int = 0, hard: int = 0):
    env = dict(os.environ, HPC_CLUSTER_SECRET=secret.hex())
    return procs.start([sys.executable, "-m", "hpc_cluster.worker", "--scheduler", address, "--nthreads", "1",
                        "--no-nanny", "--host", "127.0.0.1", "--local-directory", str(tmp_path)],
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       preexec_fn=_fd_limit(soft, hard) if soft else None)


def test_the_scheduler_and_worker_raise_their_soft_fd_limit_to_the_hard_one(procs, tmp_path):
    secret = new_secret()
    sched, address = _start_scheduler(procs, tmp_path, secret, 1024, 4096, tmp_path / "scheduler.log")
    assert _limits(sched.pid) == (4096, 4096)
    worker = _start_worker(procs, tmp_path, secret, address, 1024, 4096)
    wait_until(lambda: _limits(worker.pid)[0] == 4096 or worker.poll() is not None, 20, "the worker to raise it")
    assert worker.poll() is None


def test_a_real_client_is_served_within_a_second_during_a_flood(procs, tmp_path):
    secret = new_secret()
    log = tmp_path / "scheduler.log"
    sched, address = _start_scheduler(procs, tmp_path, secret, 1024, 1024, log)
    assert _limits(sched.pid) == (1024, 1024)      # no room to raise: the caps must hold it
    _start_worker(procs, tmp_path, secret, address)
    with Client(address, secret=secret, set_as_default=False, timeout=30) as c:
        c.wait_for_workers(1, timeout=30)
        assert c.submit(inc, 0, pure=False).result(timeout=30) == 1
    host, port = address.rsplit("/", 1)[-1].rsplit(":", 1)
    flood = procs.start([sys.executable, "-c", FLOOD, host, port, str(FLOOD_SECONDS), "hellos"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    times = _served_during(flood, address, secret, 12)
    out, err = flood.communicate(timeout=30)
    assert flood.returncode == 0, err.decode()[-2000:]
    opened = int(out.split()[0])
    assert len(times) >= 5, times
    assert sched.poll() is None
    # Served within a second (the median), with slack for a loaded machine on the worst one.
    assert statistics.median(times) < 1.0 and max(times) < 2.5, (times, log.read_text()[-3000:])
    # One summary line per interval instead of a line (or a traceback) per connection.
    wait_until(lambda: b"connections dropped before authenticating" in log.read_bytes(), 15,
               "the summary line")
    text = log.read_text()
    assert "Traceback" not in text and "Too many open files" not in text, text[-3000:]
    assert len(text) < 20_000, f"{len(text)} bytes of log for {opened} connections:\n{text[-3000:]}"
    # The flood did flood: many more connections than the scheduler had descriptors.
    assert opened > 2500, f"the flood opened only {opened} connections (over twice the 1024 descriptors wanted)"
    print(f"{opened} connections in {FLOOD_SECONDS} s; client served in {[round(t, 3) for t in times]} s; "
          f"scheduler log {len(text)} bytes")


def test_running_out_of_descriptors_is_survived_quietly(procs, tmp_path):
    # 32 descriptors: the caps (8 waiting from one address, 16 in the lobby) and the
    # scheduler's own do not fit, so accept() fails with EMFILE during the flood. Before: a
    # traceback per attempt, a busy loop, and a client waited 5 s after the flood. Now: the
    # silent connections are closed, accepting pauses 50 ms, one summary line, and a client is
    # served at once after the flood (those queued when it ended had hung up: closed on
    # accept). (During it, at so few descriptors, a client waits in the
    # kernel's queue behind the strangers: 5-7 s measured here.)
    secret = new_secret()
    log = tmp_path / "scheduler.log"
    sched, address = _start_scheduler(procs, tmp_path, secret, 32, 32, log)
    _start_worker(procs, tmp_path, secret, address)
    with Client(address, secret=secret, set_as_default=False, timeout=30) as c:
        c.wait_for_workers(1, timeout=30)
    host, port = address.rsplit("/", 1)[-1].rsplit(":", 1)
    # No valid first messages here: with 8 places per address, strangers that have spoken
    # would take them all (the test above has them, at 128 places).
    flood = procs.start([sys.executable, "-c", FLOOD, host, port, "5", "silent"], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE)
    flood.communicate(timeout=30)
    assert sched.poll() is None
    started = time.monotonic()
    with Client(address, secret=secret, set_as_default=False, timeout=30) as c:
        assert c.submit(inc, 1, pure=False).result(timeout=30) == 2
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"served {elapsed:.2f} s after the flood"
    # The flood's connections still queued when it ended were closed as hung up, unlobbied
    # (before, a client's connect found the queue full behind them 2 times in 5: 1.1 s).
    assert "closed its end before sending anything" in log.read_text()
    wait_until(lambda: b"ran out of file descriptors" in log.read_bytes(), 15, "the summary line")
    text = log.read_text()
    assert "Traceback" not in text and len(text) < 20_000, text[-3000:]



class ClosingListener:
    """A port where every connection is closed after its first bytes: a scheduler too busy to
    take one more handshake (protocol/admission.py closes the ones it cannot wait for)."""

    def __init__(self):
        import socket
        import threading
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.dropped: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

        self.forward_to: int | None = None      # once set, connections are relayed to this port

    def _run(self):
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            if self.forward_to is not None:
                self._relay(conn, self.forward_to)
                continue
            conn.settimeout(2)
            try:
                conn.recv(100)                    # the peer's first bytes, then a hang-up
            except OSError:
                pass
            conn.close()
            self.dropped.append(time.monotonic())

    def _relay(self, conn, port: int):
        import socket
        import threading
        upstream = socket.create_connection(("127.0.0.1", port))
        conn.settimeout(None)

        def pump(a, b):
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def _scheduler_on(procs, tmp_path, secret: bytes, port: int) -> str:
    addr_file = tmp_path / "scheduler.address"
    sched = procs.start([sys.executable, "-m", "hpc_cluster.scheduler", "--host", "127.0.0.1", "--port", str(port),
                         "--address-file", str(addr_file)], env=dict(os.environ, HPC_CLUSTER_SECRET=secret.hex()),
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: addr_file.exists() or sched.poll() is not None, 30, "the scheduler to listen")
    assert sched.poll() is None
    return addr_file.read_text().strip()


def test_a_worker_whose_handshake_is_closed_unanswered_retries_until_a_scheduler_takes_it(procs, tmp_path):
    """Hundreds of workers starting at once: the scheduler closes the handshakes it cannot wait
    for. The worker read that as a refused secret and exited with code 3 at once (the 250- and
    500-worker benchmark runs lost workers so); it now retries, with jitter, until
    --death-timeout, and joins the scheduler that answers."""
    busy = ClosingListener()
    secret = new_secret()
    log = tmp_path / "worker.log"
    env = dict(os.environ, HPC_CLUSTER_SECRET=secret.hex())
    with open(log, "wb") as err:
        worker = procs.start([sys.executable, "-m", "hpc_cluster.worker", "--scheduler",
                              f"tcp://127.0.0.1:{busy.port}", "--nthreads", "1", "--no-nanny", "--host", "127.0.0.1",
                              "--death-timeout", "60", "--local-directory", str(tmp_path)],
                             env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: len(busy.dropped) >= 3 or worker.poll() is not None, 30, "three handshakes closed")
        assert worker.poll() is None, log.read_text()
        assert "closed the connection during the handshake" in log.read_text()
    finally:
        busy.close()
    address = _scheduler_on(procs, tmp_path, secret, busy.port)
    with Client(address, secret=secret, set_as_default=False, timeout=30) as c:
        c.wait_for_workers(1, timeout=30)
        assert c.submit(inc, 1).result(timeout=30) == 2


def test_a_client_whose_handshake_is_closed_unanswered_retries_within_its_timeout(procs, tmp_path):
    """The same for a client: Client() gave up at the first closed handshake ("closed the
    connection during the handshake") though the scheduler was only busy; it tries again
    until its timeout, as dask's client retries its connect."""
    import threading
    busy = ClosingListener()
    secret = new_secret()
    got: dict = {}

    def connect():
        try:
            with Client(f"tcp://127.0.0.1:{busy.port}", secret=secret, set_as_default=False, timeout=60) as c:
                got["answer"] = c.scheduler_info()["workers"]
        except Exception as exc:        # the test's assertion shows it
            got["error"] = exc
    address = _scheduler_on(procs, tmp_path, secret, 0)
    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(busy.dropped) >= 3 or "error" in got, 30, "three handshakes closed")
        assert "error" not in got, got
        busy.forward_to = int(address.rsplit(":", 1)[1])     # the scheduler has room now
        thread.join(60)
    finally:
        busy.close()
    assert got == {"answer": {}}, got
