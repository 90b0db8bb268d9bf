"""dask-jobqueue keywords whose dask meaning we cannot (yet) give, and what we do instead.

Each check returns notes for the one warning a cluster gives about a user's old setup, or
raises ValueError where going on would be wrong.
"""

from __future__ import annotations

from typing import Any


def cluster_security(security: Any, protocol: Any, values: dict) -> Any:
    """The security= a batch cluster starts with, False for plain TCP (protocol/tls.py's
    choose_security): the keywords, else scheduler_options' (a keyword, a site file or
    jobqueue.yaml's scheduler-options), else the site's `security` setting (true by default).
    Raises ValueError for a protocol we do not speak, or a protocol= and security= that
    contradict each other."""
    from ..protocol.tls import choose_security
    options = values.get("scheduler_options") or {}
    chosen = choose_security(security if security is not None else options.get("security"),
                             protocol if protocol is not None else options.get("protocol"),
                             bool(values.get("security", True)))
    return False if chosen is None else chosen


def check_security(security: Any) -> list[str]:
    """security= is honoured (TLS, protocol/tls.py): True makes a certificate for the cluster, a
    Security (ours or dask's) gives yours. One that asks for encryption without giving both a
    CA and a certificate with its key is refused, saying which; nothing to note otherwise."""
    from ..protocol.tls import asks_for_nothing, resolve_security
    if security is None or security is False or security is True or asks_for_nothing(security):
        return []                   # a dask Security that asks for nothing: the default decides
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
