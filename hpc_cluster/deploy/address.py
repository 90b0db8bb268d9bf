"""Which address the scheduler listens on and gives its workers when none was set (issue 33).

The scheduler used to listen on every interface and advertise this host's name; a compute
node often resolves the login node's name to an address its network cannot reach, or not at
all. Instead the daemon asks the kernel which of this host's addresses it would send from to
reach each compute node (the batch system names them: SLURM's NodeAddr) and listens on that
one address, and advertises it as an IP:

- nodes on this host (the one-node test cluster's NodeAddr 127.0.0.1): loopback;
- else the address the nodes are routed from; nodes routed from different addresses (a login
  node on two networks that both lead to nodes): the most common one, and the log says so;
- no node address known (a batch system that does not say, a failing `sinfo`, no route to
  any node): this host name's address if it is not a loopback one, else the address of the
  default route, else loopback. Each says why in the log; never every interface (0.0.0.0).

`interface=` (or scheduler_options' host/interface) still chooses explicitly (deploy/plan.py).
`choose_address` is pure; `scheduler_address_here` below gathers what it needs.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections import Counter
from dataclasses import dataclass
from typing import Mapping

logger = logging.getLogger("hpc_cluster.daemon")

LOOPBACK = "127.0.0.1"
# A documentation address (TEST-NET-1, RFC 5737): asking the routing table for it gives the
# default route's source address without sending anything.
DEFAULT_ROUTE_PROBE = "192.0.2.1"
MAX_PROBED = 64
OVERRIDE = "set interface= (or `hpc-cluster up --interface NAME`, scheduler_options' host) to choose another"


@dataclass(frozen=True)
class Choice:
    host: str               # an IP to listen on and advertise
    how: str                # one line for the daemon's log: why this one


def is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _usable(address: str | None) -> bool:
    """An address another node could use: set, not loopback, not every interface."""
    return bool(address) and not is_loopback(address) and address not in ("0.0.0.0", "::")


def choose_address(routes: Mapping[str, str | None], hostname_address: str | None = None,
                   default_route: str | None = None) -> Choice:
    """The address to listen on and advertise. Pure.

    `routes`: each compute node's address -> the local address the kernel would send from to
    reach it (None: no route, or a name that does not resolve here), in the batch system's
    order. `hostname_address`: what this host's name resolves to; `default_route`: the default
    route's source address; both only used when no node can be routed to.
    """
    routed = {node: src for node, src in routes.items() if src and src not in ("0.0.0.0", "::")}
    unrouted = [node for node in routes if node not in routed]
    missing = f"; no route to {_few(unrouted)}" if unrouted else ""
    if routed:
        counts = Counter(routed.values())
        # Most common first; ties go to the source of the earliest node, so the choice is stable.
        order = list(dict.fromkeys(routed.values()))
        host = max(order, key=lambda src: (counts[src], -order.index(src)))
        if is_loopback(host):
            return Choice(LOOPBACK, f"listening on {LOOPBACK}: the compute nodes ({_few(routed)}) are "
                                    f"on this host{missing}")
        others = [f"{src} for {_few([n for n, s in routed.items() if s == src])}" for src in order if src != host]
        if others:
            return Choice(host, f"listening on {host}, the address {counts[host]} of {len(routed)} compute nodes "
                                f"are routed from; the others are routed from {'; '.join(others)}: workers "
                                f"there must reach {host} too, or {OVERRIDE}{missing}")
        return Choice(host, f"listening on {host}, the address the compute nodes ({_few(routed)}) are routed "
                            f"from{missing}")
    why = (f"no route to any compute node ({_few(unrouted)})" if unrouted
           else "the batch system did not name its compute nodes")
    if _usable(hostname_address):
        return Choice(hostname_address, f"listening on {hostname_address}, the address this host's name "
                                        f"resolves to ({why}); {OVERRIDE} if the nodes reach it otherwise")
    if _usable(default_route):
        return Choice(default_route, f"listening on {default_route}, the default route's address ({why}; "
                                     f"this host's name resolves to {hostname_address or 'nothing'}); "
                                     f"{OVERRIDE} if the nodes reach it otherwise")
    return Choice(LOOPBACK, f"listening on {LOOPBACK} ({why}, this host's name resolves to "
                            f"{hostname_address or 'nothing'} and there is no default route): only workers on "
                            f"this host can reach it; {OVERRIDE}")


def _few(names, most: int = 4) -> str:
    names = list(names)
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


# ----------------------------------------------------------------------------- I/O

def hostname_address() -> str | None:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def scheduler_address_here(adapter, ssh: dict | None = None, partition: str | None = None) -> Choice:
    """The choice for this host, logged: routes to the compute nodes the adapter names
    (`node_addresses`), or with `ssh` (jobs submitted over SSH from this machine) to the login
    node, the one machine of the cluster we know reaches us back."""
    from ..worker.route import source_address
    if ssh and ssh.get("host"):
        nodes = [ssh["host"]]
    else:
        try:
            nodes = list(adapter.node_addresses(partition))
        except Exception as exc:              # a failing sinfo: the fallback, said in the log
            logger.warning("could not learn the compute nodes' addresses (%s)", exc)
            nodes = []
    nodes = list(dict.fromkeys(nodes))
    # Thousands of nodes share a few networks: a spread-out sample is enough, and each name
    # may cost a DNS lookup.
    nodes = nodes[::max(1, len(nodes) // MAX_PROBED)][:MAX_PROBED]
    routes = {node: source_address(node) for node in nodes}
    default = None if any(routes.values()) else source_address(DEFAULT_ROUTE_PROBE)
    choice = choose_address(routes, hostname_address(), default)
    logger.info("scheduler address: %s", choice.how)
    return choice
