"""Socket-level fuzzing of a real scheduler (issue 14, "kept held"): mutated frames before
and after a real HMAC handshake with the cluster's secret, in batches; after each batch the
scheduler process is alive and a normal Client gets a task result within a second.

Bounded: BATCHES x PER_BATCH connections and at most BUDGET seconds. Seeded: the suite runs
a fixed seed, so that a CI run's verdict is the code's and not the draw's (the one below found
the empty-message bug); HPC_FUZZ_SEED=random draws a new one to explore, HPC_FUZZ_SEED=<n>
replays one, and a failure names its seed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import socket
import statistics
import struct
import time

import msgpack
import pytest

from hpc_cluster import Client, LocalCluster
from hpc_cluster.protocol.comm import MAGIC, parse_address
from hpc_cluster.protocol.frames import Opaque, dumps
from hpc_cluster.protocol.versions import get_versions
from helpers.funcs import inc
from helpers.wait import wait_until
from helpers.wire import read_message

BATCHES, PER_BATCH, BUDGET = 12, 25, 40.0
_SEED = os.environ.get("HPC_FUZZ_SEED", "251113542")
SEED = random.SystemRandom().randrange(1, 2**31) if _SEED == "random" else int(_SEED)


def _wire(obj) -> bytes:
    return b"".join(bytes(p) for p in dumps(obj))


def _frames(*parts: bytes) -> bytes:
    """A message with these frames as they are (the header need not be valid msgpack)."""
    return struct.pack("<IQ", len(parts), 8 * len(parts) + sum(map(len, parts))) + \
        struct.pack(f"<{len(parts)}Q", *map(len, parts)) + b"".join(parts)


def _authenticate(address: str, secret: bytes, role) -> socket.socket:
    """A real handshake by hand (HMAC on the secret), then the open socket."""
    host, port = parse_address(address)
    s = socket.create_connection((host, port), timeout=5)
    c_nonce = os.urandom(32)
    s.sendall(MAGIC + _wire({"op": "auth", "nonce": c_nonce}))
    challenge = msgpack.unpackb(read_message(s)[20:], raw=False)
    s_nonce = challenge[0]["nonce"] if isinstance(challenge, list) else challenge["nonce"]
    proof = hmac.new(secret, b"connector|" + c_nonce + b"|" + s_nonce, hashlib.sha256).digest()
    s.sendall(_wire({"op": "auth-proof", "proof": proof, "info": {"role": role, "versions": get_versions()}}))
    read_message(s)                                     # welcome
    return s


# -- mutations: rng -> bytes ------------------------------------------------------------------
def _random_bytes(rng):
    return rng.randbytes(rng.randrange(0, 600))


def _bad_prefix(rng):
    count = rng.choice([0, 1, 2, 3, 2**16, 2**32 - 1, rng.randrange(2**32)])
    total = rng.choice([0, 7, 8 * max(count, 1), 2**31, 2**62, 2**64 - 1, rng.randrange(2**64)])
    lengths = b"".join(struct.pack("<Q", rng.choice([0, 1, 2**30, 2**63 | 5, 2**64 - 1, rng.randrange(2**64)]))
                       for _ in range(min(count, 4)))
    return struct.pack("<IQ", count, total) + lengths + rng.randbytes(rng.randrange(0, 64))


def _truncated(rng):
    msg = _wire([{"op": "who-has", "keys": ["a", "b"]}, {"op": "heartbeat"}])
    return msg[:rng.randrange(1, len(msg))]


def _flipped(rng):
    msg = bytearray(_wire([{"op": "update-graph", "keys": ["k"], "tasks": [{
        "key": "k", "func": Opaque(b"\x80\x05N."), "args": Opaque(b"\x80\x05N."), "deps": [], "priority": 0,
        "retries": 0, "resources": {}}]}]))
    for _ in range(rng.randrange(1, 6)):
        msg[rng.randrange(len(msg))] ^= 1 << rng.randrange(8)
    return bytes(msg)


def _ext_refs(rng):
    code = rng.choice([0, 1, 2, 3, 99, 127])
    data = rng.choice([struct.pack("<Q", rng.randrange(2**64)), struct.pack("<QQ", 1, 2**40), b"", b"\x01"])
    header = msgpack.packb([{"op": "update-graph", "keys": [], "tasks": [{"key": "x", "func": msgpack.ExtType(code, data),
                                                                         "args": msgpack.ExtType(code, data)}]}])
    return _frames(header, *(rng.randbytes(8) for _ in range(rng.randrange(0, 3))))


def _deep_nesting(rng):
    depth = rng.choice([100, 2000, 100_000])
    return _frames(b"\x91" * depth + b"\xc0")


def _huge_claims(rng):
    return _frames(rng.choice([b"\xdf\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
                               b"\xc6\xff\xff\xff\xff"]))


_JUNK = [None, True, -1, 2**63, 2**64 - 1, -2**63, 1.5, float("nan"), "", "x" * 300, b"\x00", [], {}, [1, "a"],
         {"a": 1}, {1: 2}]


def _junk(rng):
    return rng.choice(_JUNK)


_CLIENT_OPS = ["update-graph", "release-keys", "cancel", "scatter", "who-has", "workers", "deaths", "replicate",
               "task-spec", "why", "versions", "counts", "heartbeat", "want-keys", "nope", 5, None]
_WORKER_OPS = ["register-worker", "task-finished", "task-started", "task-erred", "missing-data", "handed-back",
               "task-seceded", "abandoned-done", "add-replica", "replica-failed", "heartbeat", "goodbye", "x"]
_NANNY_OPS = ["register-nanny", "exit-report", "x"]
_FIELDS = ["keys", "key", "tasks", "who_has", "nbytes", "n", "reason", "rid", "address", "nthreads", "memory",
           "dep", "holders", "report", "nanny_id", "duration", "exception", "traceback", "text", "held", "running"]


def _shaped(rng, ops):
    """Valid msgpack in a valid frame, of the wrong shapes: ops with junk fields, or not maps."""
    msgs = []
    for _ in range(rng.randrange(1, 4)):
        if rng.random() < 0.15:
            msgs.append(_junk(rng))
            continue
        msg = {"op": rng.choice(ops)}
        for name in rng.sample(_FIELDS, rng.randrange(0, 5)):
            msg[name] = _junk(rng)
        if msg["op"] == "update-graph" and rng.random() < 0.5:
            msg["tasks"] = [{"key": _junk(rng), "func": Opaque(b""), "args": _junk(rng), "deps": _junk(rng),
                             "priority": _junk(rng), "retries": _junk(rng), "resources": _junk(rng)}]
        if msg["op"] == "register-worker" and rng.random() < 0.5:
            # never the real worker's address (taking it over is issue 14 point 7, not a crash)
            msg.update(address=f"tcp://127.0.0.1:{rng.randrange(1, 1024)}", nthreads=_junk(rng))
        msgs.append(msg)
    try:
        return _wire(msgs if rng.random() < 0.8 else msgs[0])
    except Exception:                   # something msgpack cannot pack: a junk frame instead
        return _random_bytes(rng)


PRE_AUTH = [_random_bytes, lambda r: MAGIC + _random_bytes(r), lambda r: MAGIC + _bad_prefix(r),
            lambda r: MAGIC + _truncated(r), lambda r: MAGIC + _shaped(r, ["auth", "auth-proof", "x"]),
            lambda r: MAGIC[:5] + bytes([r.randrange(256)]) + MAGIC[6:] + _random_bytes(r),
            lambda r: MAGIC + _deep_nesting(r), lambda r: MAGIC + _huge_claims(r)]
POST_AUTH = [_random_bytes, _bad_prefix, _truncated, _flipped, _ext_refs, _deep_nesting, _huge_claims]


def _one(rng, address: str, secret: bytes) -> str:
    """One connection: maybe authenticate (as some role), send one mutation, read a little, close."""
    if rng.random() < 0.35:
        kind, payload, s = "pre-auth", rng.choice(PRE_AUTH)(rng), socket.create_connection(parse_address(address), 5)
    else:
        role = rng.choice(["client", "client", "worker", "nanny", "stranger", 7])
        s = _authenticate(address, secret, role)
        ops = {"client": _CLIENT_OPS, "worker": _WORKER_OPS, "nanny": _NANNY_OPS}.get(role, _CLIENT_OPS)
        maker = rng.choice(POST_AUTH + [lambda r: _shaped(r, ops)] * 4)
        kind, payload = f"after auth as {role!r}", maker(rng)
    try:
        s.settimeout(0.2)
        s.sendall(payload)
        while s.recv(65536):
            pass
    except OSError:
        pass
    finally:
        s.close()
    return kind


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=1, threads_per_worker=2, memory_limit="1GB") as c:
        yield c


def test_mutated_frames_before_and_after_auth_never_stop_the_scheduler(cluster):
    rng = random.Random(SEED)
    started = time.monotonic()
    times, kinds = [], {}
    with Client(cluster, set_as_default=False) as client:
        assert client.submit(inc, -1, pure=False).result(timeout=30) == 0
        for batch in range(BATCHES):
            if time.monotonic() - started > BUDGET:
                break
            for _ in range(PER_BATCH):
                kind = _one(rng, cluster.scheduler_address, cluster.secret)
                kinds[kind] = kinds.get(kind, 0) + 1
            assert cluster._scheduler.poll() is None, f"seed {SEED}: the scheduler died in batch {batch}"
            t = time.monotonic()
            assert client.submit(inc, batch, pure=False).result(timeout=20) == batch + 1, f"seed {SEED}"
            times.append(time.monotonic() - t)
        assert client.status == "running", f"seed {SEED}"
    assert len(times) >= 4, f"seed {SEED}: only {len(times)} batches within {BUDGET} s"
    # Within a second (the median); some slack on the worst one for a loaded machine.
    assert statistics.median(times) < 1.0 and max(times) < 5.0, f"seed {SEED}: {times}"
    assert kinds.get("pre-auth") and len(kinds) >= 3, kinds
    # Every bad message was refused as one (a warning, the connection dropped), never an
    # exception nobody expected (a check missing in the server).
    log = cluster.logs()["scheduler"]
    assert "error while serving" not in log and "Traceback" not in log, f"seed {SEED}:\n{log[-4000:]}"
    print(f"seed {SEED}: {sum(kinds.values())} connections {kinds}; results in "
          f"{[round(t, 3) for t in times]} s")


def test_an_empty_message_in_the_handshake_is_refused_without_a_traceback(cluster):
    # Seed 251113542 of the fuzzer sent an empty list where the handshake's first message
    # goes: the reader took msgs[0] and the scheduler logged IndexError with a traceback.
    host, port = parse_address(cluster.scheduler_address)
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(MAGIC + _wire([]))
        s.settimeout(10)
        assert s.recv(1024) == b""                   # dropped
    log = wait_until(lambda: (lambda t: t if "a message must be a map" in t else None)(cluster.logs()["scheduler"]),
                     10, "the refusal to be logged")
    assert "Traceback" not in log and "IndexError" not in log, log[-3000:]
