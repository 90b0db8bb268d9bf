"""distributed's Scheduler in the cluster daemon, beside ours (engine: distributed).

The daemon (deploy/daemon/run.py) starts our Scheduler as always (its control plane: jobs,
nannies, deaths, the CLI) and then this: distributed's own Scheduler on the same host, with
the bridge (bridge.py) as a scheduler plugin. Clients and workers use distributed's address
(the cluster file's `engine_address`); distributed's dashboard is served where bokeh is
installed, ours (the deaths page) beside it. distributed's `allowed-failures` is set out of
reach: our verdicts decide which deaths fail a task (blame.py). The daemon also writes
distributed's own scheduler file (NAME.scheduler.json beside the cluster file), so
distributed's `Client(scheduler_file=...)` finds the scheduler; it goes with the scheduler.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .blame import Ledger
from .bridge import Bridge

logger = logging.getLogger("hpc_cluster.engines")

NEVER = 1_000_000_000         # distributed's allowed-failures: its own count never fails a task
SCHEDULER_FILE_SUFFIX = ".scheduler.json"


def scheduler_file_for(cluster_file) -> Path:
    """NAME.scheduler.json beside the cluster file NAME.json."""
    return Path(cluster_file).with_suffix(SCHEDULER_FILE_SUFFIX)


@dataclass
class DistributedEngine:
    scheduler: object              # distributed.Scheduler
    bridge: Bridge
    address: str
    dashboard: str | None
    versions: dict
    scheduler_file: Path | None = None

    def meta(self) -> dict:
        """What the cluster file says of the engine: workers and clients read it."""
        out = {"engine": "distributed", "engine_address": self.address, "engine_versions": self.versions}
        if self.dashboard:
            out["engine_dashboard"] = self.dashboard
        if self.scheduler_file:
            out["scheduler_file"] = str(self.scheduler_file)
        return out

    def write_scheduler_file(self, path) -> Path:
        """What distributed's Scheduler(scheduler_file=...) writes (its identity, whose "address"
        its Client and workers read), but atomic and 0600 like the cluster file: it names where
        the cluster listens. Removed by close()."""
        from ..protocol.clusterfile import open_private
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open_private(tmp, "w") as f:
            json.dump(self.scheduler.identity(), f, indent=2, default=str)
        os.replace(tmp, path)
        self.scheduler_file = path
        return path

    async def close(self) -> None:
        try:
            await self.scheduler.close()
        except Exception:
            logger.exception("closing distributed's scheduler failed")
        if self.scheduler_file is not None:
            self.scheduler_file.unlink(missing_ok=True)


def distributed_security(security, role: str = "scheduler"):
    """distributed's Security from ours (the cluster's certificate, one for every role)."""
    if security is None:
        return None
    from distributed import Security
    return Security(tls_ca_file=security.tls_ca_file, require_encryption=True,
                    **{f"tls_{role}_cert": security.tls_cert, f"tls_{role}_key": security.tls_key})


async def start(ours, host: str, allowed_failures: int, walltime_failures: int = 3, security=None,
                dashboard: bool = True, dashboard_host: str | None = None) -> DistributedEngine:
    """distributed's Scheduler beside ours. Its dashboard (bokeh's, without our token) listens on
    `dashboard_host` (ours: 127.0.0.1 unless dashboard_address names a host), else `host`."""
    import dask
    import distributed
    dask.config.set({"distributed.scheduler.allowed-failures": NEVER})
    bridge = Bridge(ours, Ledger(allowed_failures, walltime_failures))
    serve_dashboard = dashboard and importlib.util.find_spec("bokeh") is not None
    sec = distributed_security(security)
    ds = distributed.Scheduler(host=host, port=0, dashboard=serve_dashboard,
                               dashboard_address=f"{dashboard_host or host}:0" if serve_dashboard else None,
                               security=sec, protocol="tls" if sec else None, validate=False)
    ds.add_plugin(bridge)
    await ds
    ours.deaths.verdicts.append(bridge.on_verdict)
    ours.worker_events.append(bridge.worker_event)
    link = None
    if serve_dashboard and "dashboard" in ds.services:
        shown = (dashboard_host if dashboard_host not in (None, "", "0.0.0.0", "::")      # where it is reached
                 else ds.address.split("://", 1)[-1].rsplit(":", 1)[0])
        link = f"http://{shown}:{ds.services['dashboard'].port}/status"
    versions = {"distributed": distributed.__version__, "dask": dask.__version__}
    logger.info("distributed %s scheduler at %s (dashboard %s)", distributed.__version__, ds.address, link)
    return DistributedEngine(ds, bridge, ds.address, link, versions)
