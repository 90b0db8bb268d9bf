"""dask-jobqueue keywords whose dask meaning we cannot (yet) give, and what we do instead.

Each check returns notes for the one warning a cluster gives about a user's old setup, or
raises ValueError where going on would be wrong.
"""

from __future__ import annotations

from typing import Any


def check_protocol(protocol: Any, security: Any = None) -> list[str]:
    """tcp is what we speak, tls with security= (protocol/tls.py); ucx, ws, inproc are not."""
    if protocol is None:
        return []
    name = str(protocol).strip().lower().removesuffix("://")
    if name in ("", "tcp"):
        return []
    if name == "tls":
        if security in (None, False):
            raise ValueError(f"protocol={protocol!r} needs certificates: add security=True (a certificate "
                             "made for this cluster) or security=Security(...) with yours")
        return []
    if name == "wss":
        raise ValueError(f"protocol={protocol!r}: hpc-cluster has no websocket transport; for encryption use "
                         "protocol='tls' with security=True")
    raise ValueError(f"protocol={protocol!r}: hpc-cluster speaks TCP (and TLS with security=); remove "
                     "protocol= (or use 'tcp://')")


def check_security(security: Any) -> list[str]:
    """security= is honoured (TLS, protocol/tls.py): True makes a certificate for the cluster, a
    Security (ours or dask's) gives yours. One that asks for encryption without giving both a
    CA and a certificate with its key is refused, saying which; nothing to note otherwise."""
    from ..protocol.tls import resolve_security
    if security is None or security is False or security is True:
        return []
    if not any(getattr(security, k, None) for k in dir(security) if k.startswith("tls_")) \
            and not getattr(security, "require_encryption", False):
        return []                   # a dask Security that asks for nothing: nothing to do
    try:
        resolve_security(security, directory=None)
    except ValueError as exc:
        if "in memory" not in str(exc):         # PEM text is written out when the cluster starts
            raise
    return []


def silence_logs_note(silence_logs: Any) -> list[str]:
    """dask prints the scheduler's log at this level in your process; ours runs in the cluster
    daemon and writes its own log file, so nothing is printed here whatever the level."""
    if silence_logs in ("error", "ERROR", True, 40, None):
        return []
    return [f"silence_logs={silence_logs!r}: the scheduler runs in the cluster daemon and logs to its own "
            "file (cluster.get_logs(), `hpc-cluster logs daemon NAME`); nothing is printed here"]
