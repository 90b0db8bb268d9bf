"""Which of this node's addresses a worker listens on when none was chosen for it.

A worker started with `--host 0.0.0.0` (what job scripts pass when no interface= is set) used
to listen on every interface and give its peers its host name; on a multi-node cluster the
login node often cannot resolve compute nodes' names, and listening everywhere is more than
needed. The address the kernel would send from to reach the scheduler is one the scheduler's
network can reach back, so the worker listens on that and advertises it (an IP, not a name).
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

ANY = ("", "0.0.0.0", None)


def source_address(scheduler_address: str) -> str | None:
    """The local IPv4 address routing to the scheduler, or None when that cannot be told
    (no route, a name that does not resolve). A UDP socket's connect() only asks the routing
    table: nothing is sent."""
    host = urlsplit(scheduler_address if "://" in scheduler_address else f"tcp://{scheduler_address}").hostname
    if not host:
        return None
    try:
        ip = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def listen_host(host: str | None, scheduler_address: str) -> str | None:
    """`host` as given, or, for every interface, the address routing to the scheduler."""
    if host not in ANY:
        return host
    return source_address(scheduler_address) or host
