"""Starting a Client as distributed's does (issue 31, point 1): `Client()` and
`Client(n_workers=2, processes=False, ...)` start a LocalCluster the client owns (closed with
it); `Client(scheduler_file=)` and `write_scheduler_file`; `Client.current()`,
`default_client()`; `Client.shutdown()`.

The client layer may not import deploy (DESIGN.md's layering), so what `Client()` starts is
registered from there: deploy/local/starting.py calls `register_cluster_starter(LocalCluster)`
as it loads, and hpc_cluster's root hands out the Client from that module, so that
`from hpc_cluster import Client` has it. Mixed into Client (client/client.py); `_begin` is the
constructor's blocking half (it runs in a thread of its own for an asynchronous client).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from .dask_collections import as_current_client, current_client
from .exceptions import HPCClusterError, TimeoutError
from ..protocol.clusterfile import cluster_file_for, read_cluster_file, secret_from_env, write_cluster_file
from ..protocol.messages import Op
from ..protocol.tls import Security, resolve_security
from ..retry import Backoff

logger = logging.getLogger("hpc_cluster.client")

_starter = None
# A daemon asked to shut down cancels its batch jobs first (deploy/daemon/handlers.py): minutes at worst.
SHUTDOWN_TIMEOUT = 300.0


def register_cluster_starter(starter) -> None:
    """What `Client()` without an address starts: `starter(**keywords)` returns a cluster (its
    scheduler_address, secret, security and close()). deploy/local/starting.py registers
    LocalCluster, which takes the keywords distributed's Client hands to its LocalCluster."""
    global _starter
    _starter = starter


def start_cluster(keywords: dict, security):
    """The cluster `Client(**keywords)` starts and owns."""
    if _starter is None:
        raise RuntimeError("Client() without an address starts a LocalCluster, but none is registered in this "
                           "process: import the Client as `from hpc_cluster import Client` (that registers it), "
                           "or start one yourself: Client(LocalCluster(...))")
    if security is not None:
        keywords = dict(keywords, security=security)
    try:
        return _starter(**keywords)
    except TypeError as exc:
        exc.add_note("Client() hands the keywords it does not take itself to the LocalCluster it starts")
        raise


def parse_timeout(timeout) -> float:
    """Client(timeout=): seconds, or a string as distributed takes ("10s", "2 minutes")."""
    if timeout is None:
        raise ValueError("None is an invalid value for global client timeout: give seconds, e.g. timeout=30")
    if isinstance(timeout, str):
        from dask.utils import parse_timedelta
        return float(parse_timedelta(timeout, "s"))
    return float(timeout)


def check_asynchronous(asynchronous: bool, loop) -> None:
    """An asynchronous client is made in async code, as distributed's must be: its methods give
    awaitables to the loop running there (client/asynchronous.py); made outside one, nothing
    could await them. Refused in distributed's words, with what to do instead."""
    if not asynchronous or loop is not None:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError("Constructing LoopRunner(asynchronous=True) without a running loop is not supported: "
                           "make an asynchronous Client inside async code (`async with Client(..., "
                           "asynchronous=True) as client`), or a synchronous one (asynchronous=False)") from None


def check_start_arguments(address, scheduler_file, cluster_file, keywords: dict) -> None:
    """What distributed refuses before it connects, said as advice."""
    if keywords and (address is not None or scheduler_file is not None or cluster_file is not None):
        raise ValueError(f"Unexpected keyword arguments: {sorted(keywords)}: the Client hands the keywords it does "
                         "not take to the LocalCluster it starts, which it does only without an address, a "
                         "cluster, scheduler_file= or cluster_file=")
    if address is not None and not isinstance(address, str):
        starting = getattr(address, "_started", None) is not None       # an asynchronous cluster, not awaited
        if not starting and not isinstance(getattr(address, "scheduler_address", None), str):
            raise TypeError(f"Scheduler address must be a string or a Cluster instance, got {type(address).__name__}")
        if str(getattr(address, "status", "")).rsplit(".", 1)[-1] in ("closed", "closing"):
            raise RuntimeError(f"Trying to connect to an already closed or closing Cluster {address!r}: "
                               "start a new one")


def read_scheduler_file(path, timeout: float) -> dict:
    """distributed's scheduler file (what `write_scheduler_file` and `dask scheduler
    --scheduler-file` write): its address, and ours also the secret and TLS. Waited for until it
    appears (a scheduler starting elsewhere writes it), as distributed's Client waits."""
    path = Path(path).expanduser()
    deadline = time.monotonic() + timeout
    backoff = Backoff(0.01, 0.5, factor=1.5)
    while True:
        try:
            info = json.loads(path.read_text())
            if isinstance(info, dict) and isinstance(info.get("address"), str):
                break
        except (FileNotFoundError, ValueError):       # not there, or half written
            pass
        if time.monotonic() > deadline:
            what = "has no scheduler address" if path.exists() else "did not appear"
            raise TimeoutError(f"scheduler_file {str(path)!r} {what} within {timeout:g} s: start the scheduler "
                               "that writes it (or give its path as written), or raise Client(timeout=)")
        time.sleep(backoff.next())
    secret = info.get("secret")
    return {"address": info["address"], "secret": bytes.fromhex(secret) if isinstance(secret, str) else None,
            "tls": info.get("tls")}


def _configured_address() -> str | None:
    """dask's `scheduler-address` setting, which distributed's Client() connects to."""
    import dask
    return dask.config.get("scheduler-address", None)


def default_client(c=None):
    """`c`, else the current default Client (distributed's default_client); ValueError if none."""
    if c is not None:
        return c
    try:
        return current_client()
    except ValueError:
        raise ValueError("No clients found\nStart a client and point it to the scheduler address\n"
                         "  from hpc_cluster import Client\n  client = Client()  # or Client(cluster), "
                         "Client('tcp://...')\n") from None


class StartingMixin:
    """Client's part of starting: where to connect (maybe starting a cluster), the connection,
    and the cluster it owns (closed with it)."""

    _owns_cluster = False

    def _begin(self, where: dict, set_as_default: bool, stacklevel: int = 3) -> None:
        """Find the scheduler (starting the client's own cluster if need be), connect, check
        versions. Until connected the status is 'newly-created': what an asynchronous client's
        user submits meanwhile waits in the queue, and goes before the first request."""
        try:
            address, secret, security = self._find_scheduler(**where)
            if isinstance(secret, str):
                secret = bytes.fromhex(secret)
            secret = secret or secret_from_env()
            if secret is None:
                raise ValueError(f"no secret for {address}: pass secret=, set $HPC_CLUSTER_SECRET, or connect "
                                 "with the cluster object, its cluster file or a scheduler file of ours")
            self.scheduler_address, self._secret = address, secret
            self.security = resolve_security(security)
            self._tls = self.security.client_context() if self.security else None
            self._lt.run(self._start(self.timeout), self.timeout)
            self.status = "running"
            versions = self._lt.run(self._request({"op": Op.VERSIONS}), self.timeout)
        except BaseException:
            self._close_own_cluster()
            raise
        self._warn_on_other_versions(versions["scheduler"], versions["workers"], stacklevel=stacklevel)
        if set_as_default:
            self._make_default()

    def _find_scheduler(self, address, scheduler_file, cluster_file, secret, security, keywords):
        """(address, secret, security) to connect to. May block: a cluster starting, a
        scheduler file not written yet."""
        if address is None and scheduler_file is None and cluster_file is None:
            address = _configured_address()
        if address is None and scheduler_file is None and cluster_file is None:
            address = start_cluster(keywords, security)
            self._owns_cluster = True
        if address is not None and not isinstance(address, str):
            if getattr(address, "engine", "hpc-cluster") != "hpc-cluster":
                raise ValueError(f"{type(address).__name__} {getattr(address, 'name', '')!r} runs dask.distributed's "
                                 "engine: connect with distributed's Client (from dask.distributed import Client; "
                                 "Client(cluster)). Its deaths: `hpc-cluster why`, or this Client with "
                                 "cluster_file=cluster.cluster_file (no tasks: they run on distributed's scheduler)")
            self.cluster = address
            if address.scheduler_address is None and getattr(address, "_started", None) is not None:
                address._started.result(self.timeout)    # an asynchronous cluster whose scheduler is starting
            return address.scheduler_address, address.secret, security or getattr(address, "security", None)
        if scheduler_file is not None:
            info = read_scheduler_file(scheduler_file, self.timeout)
            if info["secret"] is not None:
                self._cluster_file = str(scheduler_file)     # re-read for a restarted scheduler's address
            return info["address"], info["secret"] or secret, security or Security.from_dict(info["tls"])
        if cluster_file is not None or ("://" not in address and ":" not in address):
            self._cluster_file = cluster_file or cluster_file_for(address)
            info = read_cluster_file(self._cluster_file)
            return info["address"], info["secret"], security or Security.from_dict(info.get("tls"))
        return address, secret, security

    def _close_own_cluster(self) -> None:
        if self._owns_cluster and self.cluster is not None:
            self.cluster.close()

    @classmethod
    def current(cls, allow_global: bool = True):
        """The client of the innermost `as_current()` block, else (allow_global) the default one."""
        client = as_current_client()
        if client is not None:
            return client
        if allow_global:
            return default_client()
        raise ValueError("Not running inside the `as_current` context manager")

    def write_scheduler_file(self, scheduler_file) -> None:
        """distributed's scheduler file (JSON: the scheduler's address, services and workers), for
        `Client(scheduler_file=)` elsewhere. Ours adds the cluster's secret (and TLS paths), without
        which nobody connects, so the file is readable by its owner alone (0600, written atomically)."""
        if self.scheduler_file:
            raise ValueError("Scheduler file already set")
        self.scheduler_file = scheduler_file
        # From async code, the info last fetched (as distributed's asynchronous scheduler_info): no wait.
        workers = (self._last_info if self.asynchronous else self._scheduler_info(stacklevel=2)).get("workers", {})
        extra = {"type": "Scheduler", "services": self.services, "workers": workers}
        if self.security is not None:
            extra["tls"] = self.security.to_dict()
        write_cluster_file(scheduler_file, self.scheduler_address, self._secret, **extra)

    def shutdown(self) -> None:
        """Shut down the scheduler and workers (distributed's Client.shutdown): the close() of
        this client's cluster object when it has one (the LocalCluster Client() started, or the
        cluster it was given), else the scheduler is asked to (`hpc-cluster up`'s daemon cancels
        its jobs too). Other clients of the cluster lose it as well; close() ends only this one."""
        cluster = self.cluster
        if cluster is not None and callable(getattr(cluster, "close", None)):
            self.close()
            if not self._owns_cluster:            # close() ended an owned one already
                cluster.close()
            return
        try:
            reply = self._lt.run(self._request({"op": Op.SHUTDOWN}, SHUTDOWN_TIMEOUT), SHUTDOWN_TIMEOUT + 5)
        except ConnectionError:
            raise HPCClusterError(f"the scheduler at {self.scheduler_address} does not take shutdown requests "
                                  "(one run inside another program, or an older version): stop its process, "
                                  "or `hpc-cluster down NAME` for a cluster started with `hpc-cluster up`") from None
        finally:
            self.close()
        if not reply.get("ok"):
            raise HPCClusterError(f"the scheduler did not shut down: {reply.get('error')}")
