"""TLS under the secret handshake: the optional encryption of every connection.

`security=` takes what dask's does: True (dask's `Security.temporary()`: a throw-away
certificate for this cluster, made here and kept in 0600 files), a dask
`distributed.security.Security`, or our own `Security` (paths to a CA, a certificate and
its key). Every side presents the certificate and requires the peer's to be signed by the
CA (mutual TLS); host names are not checked, as dask does not: workers on compute nodes
have addresses nobody knows when the certificate is made, and the cluster's CA is trust
enough. The HMAC handshake on the cluster secret still runs, inside the encrypted stream.

TLS is on by default (issue 34): `choose_security` reads dask's `security=` and `protocol=`
keywords against that default (a batch cluster's site setting; for LocalCluster, whether it
listens beyond this machine: `loopback_only`).
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import ipaddress
import os
import select
import socket
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tornado.iostream import IOStream, SSLIOStream

CERT_NAME, KEY_NAME = "tls-cert.pem", "tls-key.pem"
# dask's Security keeps a certificate per role; one of them serves us for every role.
_DASK_PAIRS = (("tls_cert", "tls_key"), ("tls_client_cert", "tls_client_key"),
               ("tls_scheduler_cert", "tls_scheduler_key"), ("tls_worker_cert", "tls_worker_key"))


@dataclass(frozen=True)
class Security:
    """Encrypt every connection of a cluster with TLS: `tls_ca_file` signs the certificates
    every process presents (`tls_cert` with its key `tls_key`, paths on a file system that
    the login node and the compute nodes share). `Security.temporary(directory)` makes a
    self-signed one for a single cluster, as `security=True` does."""

    tls_ca_file: str
    tls_cert: str
    tls_key: str
    require_encryption: bool = True

    @classmethod
    def temporary(cls, directory: str | os.PathLike) -> "Security":
        return make_certificate(directory)

    def to_dict(self) -> dict:
        return {"ca_file": self.tls_ca_file, "cert": self.tls_cert, "key": self.tls_key}

    @classmethod
    def from_dict(cls, data: Any) -> "Security | None":
        if not isinstance(data, dict):
            return None
        return cls(str(data["ca_file"]), str(data["cert"]), str(data["key"]))

    def server_context(self) -> ssl.SSLContext:
        return self._context(ssl.Purpose.CLIENT_AUTH)

    def client_context(self) -> ssl.SSLContext:
        return self._context(ssl.Purpose.SERVER_AUTH)

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(purpose, cafile=self.tls_ca_file)
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot use the TLS files (CA {self.tls_ca_file}, certificate {self.tls_cert}, "
                             f"key {self.tls_key}): {exc}; check the paths of security= (they must be "
                             "readable on every node), or use security=True for a certificate made for "
                             "this cluster") from None
        ctx.check_hostname = False          # see the module's docstring
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        read_ahead(ctx)
        keep_buffers(ctx)
        return ctx


# SSL_CTX_ctrl's commands (openssl/ssl.h; the same numbers in OpenSSL 1.1 and 3).
_SET_READ_AHEAD, _GET_READ_AHEAD, _MODE, _CLEAR_MODE = 41, 40, 33, 78
_RELEASE_BUFFERS = 0x10                 # SSL_MODE_RELEASE_BUFFERS
READ_BUFFER = 2**16                     # what OpenSSL may take from the socket in one read (as tornado's
                                        # reads over TCP; 256 KiB moved large values no faster)


def read_ahead(ctx: ssl.SSLContext) -> bool:
    """Let OpenSSL take what the socket holds in one read, up to READ_BUFFER bytes
    (SSL_CTX_set_read_ahead, SSL_CTX_set_default_read_buffer_len). By default it reads each
    record's 5-byte header, then its body: two system calls per 16 KiB record where plain TCP
    takes 64 KiB and more in one, ten times the scheduler's reads in a map of 5,000 tasks. The
    ssl module has no setting for it, so this is done through libssl itself, and only where
    the context's SSL_CTX is certainly the one found: CPython (whose SSLContext object holds it
    right after the object header), the one libssl this process loaded, and the context's
    options read back through it. False where it is not done: TLS works the same, slower.
    (TLSStream below reads what the handshake's last read took along.)"""
    found = _ssl_ctx(ctx)
    if found is None:
        return False
    lib, pointer = found
    try:
        lib.SSL_CTX_set_default_read_buffer_len(pointer, READ_BUFFER)
        lib.SSL_CTX_ctrl(pointer, _SET_READ_AHEAD, 1, None)
        return lib.SSL_CTX_ctrl(pointer, _GET_READ_AHEAD, 0, None) == 1
    except (OSError, ValueError, AttributeError, ctypes.ArgumentError):
        return False


def keep_buffers(ctx: ssl.SSLContext) -> bool:
    """Let each connection keep its read and write buffers between messages. The ssl module
    turns SSL_MODE_RELEASE_BUFFERS on: a connection's buffers were freed whenever they were
    empty and allocated again for the next record, in a worker a malloc and a free of the read
    buffer per wake-up with the heap trimmed and grown again around it (brk, page faults; its
    trim threshold is 64 KiB, worker/memory.py), and before READ_BUFFER was 64 KiB an mmap and
    a munmap with TLB shootdowns: the workers of a 1,024-leaf tree spent a third more CPU than
    over TCP (BENCHMARKS.md, "The cost of TLS"). Kept, a connection holds at most READ_BUFFER
    plus one record (~17 KB) of memory, touched only as far as messages reached: ConnectionPool
    closes the connections it has not used for a while. Through the same checked SSL_CTX as
    read_ahead; False where not done (TLS works the same, slower)."""
    found = _ssl_ctx(ctx)
    if found is None:
        return False
    lib, pointer = found
    try:
        lib.SSL_CTX_ctrl(pointer, _CLEAR_MODE, _RELEASE_BUFFERS, None)
        return not lib.SSL_CTX_ctrl(pointer, _MODE, 0, None) & _RELEASE_BUFFERS
    except (OSError, ValueError, AttributeError, ctypes.ArgumentError):
        return False


def _ssl_ctx(ctx: ssl.SSLContext):
    """(libssl, the context's SSL_CTX pointer), or None where it cannot be found for certain:
    see read_ahead (the pointer right after CPython's object header, checked by reading the
    context's options back through it)."""
    lib = _libssl()
    if lib is None:
        return None
    try:
        pointer = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
        if not pointer or lib.SSL_CTX_get_options(pointer) != ctx.options:
            return None
    except (OSError, ValueError, AttributeError, ctypes.ArgumentError):
        return None
    return lib, pointer


@functools.lru_cache(maxsize=1)
def _libssl():
    """The libssl that the ssl module uses, or None. Looked up through the ssl module's own
    extension: dlsym on its handle searches what it was linked against, so a second libssl in
    the process (netCDF4's wheel bundles one: xarray users load it) is never the one called.
    Guessing from /proc/self/maps turned read-ahead off in every process holding two."""
    if sys.implementation.name != "cpython":
        return None
    import _ssl
    path = getattr(_ssl, "__file__", None)      # None: built into the interpreter (static)
    try:
        lib = ctypes.CDLL(path)                 # CDLL(None): the interpreter's own symbols
        lib.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        lib.SSL_CTX_ctrl.restype = ctypes.c_long
        lib.SSL_CTX_get_options.argtypes = [ctypes.c_void_p]
        lib.SSL_CTX_get_options.restype = ctypes.c_uint64
        lib.SSL_CTX_set_default_read_buffer_len.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.SSL_CTX_set_default_read_buffer_len.restype = None
    except (OSError, AttributeError):
        return None
    return lib


def make_certificate(directory: str | os.PathLike, days: int = 365) -> Security:
    """A self-signed certificate (its own CA) and key for one cluster, written 0600 in
    `directory` (made 0700). An EC P-256 key: made in milliseconds, and cheaper to handshake
    with than RSA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hpc-cluster")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))     # clocks of nodes differ a little
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("hpc-cluster")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_path, cert_path = directory / KEY_NAME, directory / CERT_NAME
    _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return Security(str(cert_path), str(cert_path), str(key_path))


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def resolve_security(security: Any, directory: str | os.PathLike | None = None) -> Security | None:
    """What `security=` asks for, as our Security (None: no encryption).

    True makes a certificate in `directory`; a dask Security's fields may hold paths or, as
    `Security.temporary()` makes them, the PEM text itself, which is written to 0600 files in
    `directory` so that processes started from here can read it."""
    if security is None or security is False:
        return None
    if isinstance(security, Security):
        return security
    if security is True:
        if directory is None:
            raise ValueError("security=True makes a certificate for a cluster; a Client cannot make one: "
                             "pass the cluster (Client(cluster)) or its Security")
        return make_certificate(directory)
    if isinstance(security, dict):
        found = Security.from_dict(security)
        if found is not None:
            return found
    ca = getattr(security, "tls_ca_file", None)
    pair = next(((getattr(security, c, None), getattr(security, k, None)) for c, k in _DASK_PAIRS
                 if getattr(security, c, None) and getattr(security, k, None)), None)
    if not ca or pair is None:
        if getattr(security, "require_encryption", False) or ca or pair:
            raise ValueError(f"security={security!r} asks for encryption but does not give both a CA "
                             "(tls_ca_file) and a certificate with its key (tls_cert and tls_key, or dask's "
                             "tls_client_cert and tls_client_key); give them, or use security=True for a "
                             "certificate made for this cluster")
        return None                          # a dask Security that asks for nothing
    if any(_is_pem(v) for v in (ca, *pair)):
        if directory is None:
            raise ValueError(f"security={security!r} holds certificates in memory (dask's "
                             "Security.temporary()); pass paths instead, or the cluster itself")
        directory = Path(directory)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        ca, cert, key = (_as_file(v, directory / name) for v, name in
                         ((ca, "tls-ca.pem"), (pair[0], CERT_NAME), (pair[1], KEY_NAME)))
        return Security(ca, cert, key)
    return Security(*(os.path.abspath(os.path.expanduser(str(v))) for v in (ca, *pair)))


def _is_pem(value: Any) -> bool:
    return isinstance(value, str) and "-----BEGIN" in value


def _as_file(value: str, path: Path) -> str:
    if not _is_pem(value):
        return os.path.abspath(os.path.expanduser(value))
    _write_private(path, value.encode())
    return str(path)


def asks_for_nothing(security: Any) -> bool:
    """A dask Security() with no certificate and no require_encryption: no choice either way."""
    fields = ("tls_ca_file", *(name for pair in _DASK_PAIRS for name in pair))
    return not isinstance(security, (bool, Security, dict)) and not getattr(security, "require_encryption", False) \
        and not any(getattr(security, k, None) for k in fields)


def choose_security(security: Any, protocol: Any, default: bool) -> Any:
    """What dask's `security=` and `protocol=` ask for, given our default (True: encrypt), as
    the value to hand to resolve_security (None: plain TCP).

    They keep dask-jobqueue's meaning: `security=` (True or a Security) is TLS and makes the
    protocol tls://; `protocol='tls://'` alone is TLS too (with a certificate made for the
    cluster, where dask-jobqueue had none to give); `protocol='tcp://'` alone is plain TCP, as
    asked, like security=False. Nothing given: `default`. A pair that contradicts itself is
    refused rather than one half ignored."""
    name = None if protocol is None else str(protocol).strip().lower().removesuffix("://") or None
    if name == "wss":
        raise ValueError(f"protocol={protocol!r}: hpc-cluster has no websocket transport; for encryption use "
                         "protocol='tls' (or nothing: TLS is the default)")
    if name not in (None, "tcp", "tls"):
        raise ValueError(f"protocol={protocol!r}: hpc-cluster speaks TLS (the default) or plain TCP; remove "
                         "protocol= (or use 'tls://' or 'tcp://')")
    if security is not None and asks_for_nothing(security):
        security = None
    if security is False:
        if name == "tls":
            raise ValueError(f"protocol={protocol!r} asks for TLS and security=False turns it off: drop one of them")
        return None
    if security is not None:
        if name == "tcp":
            raise ValueError(f"protocol={protocol!r} is plain TCP, but security={security!r} asks for TLS: drop "
                             "protocol= (security= makes the cluster tls://), or drop security= for plain TCP")
        return security
    if name is not None:
        return True if name == "tls" else None
    return True if default else None


def loopback_only(host: str | None) -> bool:
    """Whether a listener on `host` can be reached from this machine alone (127.0.0.1, ::1,
    localhost): then nobody else can read its traffic, an unprivileged user of this machine
    cannot either, and every connection still proves the cluster's secret."""
    if not host or host in ("0.0.0.0", "::"):
        return False
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


class TLSStream(SSLIOStream):
    """tornado's SSLIOStream, reading and writing through the socket's SSL object directly:
    the ssl module's Python wrappers around each call (recv_into, read, send: three frames and
    an exception passed through them per message) cost more than the encryption of a small
    message (BENCHMARKS.md, "The cost of TLS"). What they add is kept: a TLS end without
    close_notify is the end of the stream (suppress_ragged_eofs), as tornado expects of them.
    A stream whose socket has no SSL object (closed) falls back to tornado's own path."""

    def _handle_read(self) -> None:
        # With read-ahead (read_ahead above) the handshake's last read may take the peer's first message
        # along: no event will come for it, so a read waiting for it is served at once (a
        # worker busy when a peer connected waited out the 10 s handshake timeout instead).
        if self._ssl_accepting:
            self._do_ssl_handshake()
            if self._ssl_accepting or not self.reading():
                return
        IOStream._handle_read(self)

    def _handle_write(self) -> None:
        if self._ssl_accepting:
            self._do_ssl_handshake()
            if not self._ssl_accepting and self.reading():
                IOStream._handle_read(self)
            return
        IOStream._handle_write(self)

    _peer_ended = False     # the peer closed (close_notify, or a TLS end without it)
    _dry = False            # the last SSL read found OpenSSL's buffer and the socket empty
    _probe = None           # a poll of the socket alone: is anything new there?

    def read_from_fd(self, buf):
        # Every record that is here, not one: an SSL read returns one record's bytes, where a
        # socket's read takes all that came. A worker writes each batch as a record of its
        # own, so the scheduler, reading one per call, went through tornado's read (a future,
        # a turn of the frame reader) 1.3 times per task where TCP takes 0.2.
        sslobj = getattr(self.socket, "_sslobj", None)
        if self._ssl_accepting or sslobj is None:
            return super().read_from_fd(buf)
        if self._peer_ended:
            return 0
        if self._dry:
            # OpenSSL takes bytes from the socket only in a read: with nothing new in the socket
            # since the last read found it empty, a read would fail, through OpenSSL's error
            # path and an exception the ssl module builds (its message, its error codes); a
            # poll of the socket says so for a fraction of that (the workers of a tree
            # reduction: 7% less CPU than with the failing reads). Nothing is missed: bytes
            # that come are in the socket, where the poll and the loop's epoll both see them.
            if self._probe is None:
                self._probe = select.poll()
                self._probe.register(self.socket.fileno(), select.POLLIN)
            if not self._probe.poll(0):
                return None
            self._dry = False
        size, got = min(len(buf), 1 << 30), 0
        try:
            while got < size:
                n = sslobj.read(size - got, memoryview(buf)[got:] if got else buf)
                if not n:                       # the peer's close_notify
                    self._peer_ended = True
                    break
                got += n
        except ssl.SSLWantReadError:
            self._dry = True
            return got or None
        except ssl.SSLEOFError:
            self._peer_ended = True
        return got

    def write_to_fd(self, data: memoryview) -> int:
        sslobj = getattr(self.socket, "_sslobj", None)
        if sslobj is None:
            return super().write_to_fd(data)
        try:
            return sslobj.write(data[:1 << 30])
        except ssl.SSLWantWriteError:
            return 0


def fast_tls(stream: IOStream) -> None:
    """comm.py's streams: one that tornado made for TLS (TCPClient, TCPServer) becomes a
    TLSStream (the same state, these methods)."""
    if type(stream) is SSLIOStream:
        stream.__class__ = TLSStream
