"""distributed's Scheduler in the cluster daemon, beside ours (engine: distributed).

The daemon (deploy/daemon/run.py) starts our Scheduler as always (its control plane: jobs,
nannies, deaths, the CLI) and then this: distributed's own Scheduler on the same host, with
the bridge (bridge.py) as a scheduler plugin. Clients and workers use distributed's address
(the cluster file's `engine_address`); distributed's dashboard is served where bokeh is
installed, ours (the deaths page) beside it. distributed's `allowed-failures` is set out of
reach: our verdicts decide which deaths fail a task (blame.py).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

from .blame import Ledger
from .bridge import Bridge

logger = logging.getLogger("hpc_cluster.engines")

NEVER = 1_000_000_000         # distributed's allowed-failures: its own count never fails a task


@dataclass
class DistributedEngine:
    scheduler: object              # distributed.Scheduler
    bridge: Bridge
    address: str
    dashboard: str | None
    versions: dict

    def meta(self) -> dict:
        """What the cluster file says of the engine: workers and clients read it."""
        out = {"engine": "distributed", "engine_address": self.address, "engine_versions": self.versions}
        if self.dashboard:
            out["engine_dashboard"] = self.dashboard
        return out

    async def close(self) -> None:
        try:
            await self.scheduler.close()
        except Exception:
            logger.exception("closing distributed's scheduler failed")


def distributed_security(security, role: str = "scheduler"):
    """distributed's Security from ours (the cluster's certificate, one for every role)."""
    if security is None:
        return None
    from distributed import Security
    return Security(tls_ca_file=security.tls_ca_file, require_encryption=True,
                    **{f"tls_{role}_cert": security.tls_cert, f"tls_{role}_key": security.tls_key})


async def start(ours, host: str, allowed_failures: int, walltime_failures: int = 3, security=None,
                dashboard: bool = True) -> DistributedEngine:
    import dask
    import distributed
    dask.config.set({"distributed.scheduler.allowed-failures": NEVER})
    bridge = Bridge(ours, Ledger(allowed_failures, walltime_failures))
    serve_dashboard = dashboard and importlib.util.find_spec("bokeh") is not None
    sec = distributed_security(security)
    ds = distributed.Scheduler(host=host, port=0, dashboard=serve_dashboard,
                               dashboard_address=f"{host}:0" if serve_dashboard else None,
                               security=sec, protocol="tls" if sec else None, validate=False)
    ds.add_plugin(bridge)
    await ds
    ours.deaths.verdicts.append(bridge.on_verdict)
    ours.worker_events.append(bridge.worker_event)
    link = None
    if serve_dashboard and "dashboard" in ds.services:
        shown = ds.address.split("://", 1)[-1].rsplit(":", 1)[0]     # the address it is reached at
        link = f"http://{shown}:{ds.services['dashboard'].port}/status"
    versions = {"distributed": distributed.__version__, "dask": dask.__version__}
    logger.info("distributed %s scheduler at %s (dashboard %s)", distributed.__version__, ds.address, link)
    return DistributedEngine(ds, bridge, ds.address, link, versions)
