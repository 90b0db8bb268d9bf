"""dask-jobqueue keywords whose dask meaning we cannot (yet) give, and what we do instead.

Each check returns notes for the one warning a cluster gives about a user's old setup, or
raises ValueError where going on would be wrong (a request for encryption we cannot keep).
"""

from __future__ import annotations

from typing import Any

_AUTH = ("every connection here proves the cluster's secret (an HMAC challenge; the secret is in a "
         "0600 cluster file), so strangers on the cluster's network cannot use your workers")


def check_protocol(protocol: Any) -> list[str]:
    """tcp is what we speak; tls (encryption) is not offered yet; ucx, ws, inproc are not."""
    if protocol is None:
        return []
    name = str(protocol).strip().lower().removesuffix("://")
    if name in ("", "tcp"):
        return []
    if name in ("tls", "wss"):
        raise ValueError(f"protocol={protocol!r}: hpc-cluster does not encrypt its connections yet (TLS is "
                         f"planned); {_AUTH}. Remove protocol= (or use 'tcp://')")
    raise ValueError(f"protocol={protocol!r}: hpc-cluster speaks TCP only; remove protocol= "
                     "(or use 'tcp://')")


def check_security(security: Any) -> list[str]:
    """security=True asks for TLS with throw-away certificates: the secret handshake is the
    strongest equivalent here, said in a note. A Security object that carries certificates
    (or requires encryption) asks for what we cannot do: refused with the reason."""
    if security is None or security is False:
        return []
    if security is True:
        return [f"security=True: connections are not encrypted (no TLS yet), but {_AUTH}"]
    fields = {k: getattr(security, k, None) for k in dir(security) if k.startswith("tls_")}
    wants_tls = any(v for k, v in fields.items() if k not in ("tls_min_version", "tls_max_version"))
    if wants_tls or getattr(security, "require_encryption", False):
        raise ValueError(f"security={security!r} asks for TLS with your certificates; hpc-cluster does not "
                         f"encrypt its connections yet (TLS is planned). {_AUTH[0].upper() + _AUTH[1:]}. "
                         "Remove security= to go on without encryption")
    return []


def silence_logs_note(silence_logs: Any) -> list[str]:
    """dask prints the scheduler's log at this level in your process; ours runs in the cluster
    daemon and writes its own log file, so nothing is printed here whatever the level."""
    if silence_logs in ("error", "ERROR", True, 40, None):
        return []
    return [f"silence_logs={silence_logs!r}: the scheduler runs in the cluster daemon and logs to its own "
            "file (cluster.get_logs(), `hpc-cluster logs daemon NAME`); nothing is printed here"]
