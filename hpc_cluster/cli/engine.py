"""What the cluster commands (cli/cluster.py) show and ask of a cluster whose engine is
dask.distributed (issue 32): its scheduler's address, scheduler file and dashboard beside ours,
how to connect distributed's Client, and its workers' logs.

Such a cluster has two schedulers (hpc_cluster/engines/): ours, the control plane the commands
talk to (jobs, scale, deaths), and distributed's, which runs the tasks. The cluster file names
both: `address` (ours) and `engine_address` (distributed's), with `engine_dashboard` (distributed's
bokeh dashboard, where bokeh is installed), `scheduler_file` (distributed's format) and, with
TLS, `engine_tls`.
"""

from __future__ import annotations

from ..engines import DEFAULT
from ..protocol.tls import Security


def engine_of(info: dict) -> str:
    return info.get("engine") or DEFAULT


def status_fields(info: dict) -> dict:
    """The engine's keys of `status --json` (docs/cli-json.md): null for our own engine."""
    return {"engine": engine_of(info), "engine_address": info.get("engine_address"),
            "engine_dashboard": info.get("engine_dashboard"), "scheduler_file": info.get("scheduler_file"),
            "engine_versions": info.get("engine_versions")}


def status_lines(info: dict) -> list[str]:
    """`status`'s lines on the engine; none for our own (its address is the cluster's)."""
    if not info.get("engine_address"):
        return []
    version = (info.get("engine_versions") or {}).get("distributed")
    lines = [f"engine: distributed{' ' + version if version else ''}, its scheduler at {info['engine_address']}"
             " (tasks and distributed's Client go there)"]
    if info.get("scheduler_file"):
        lines.append(f"scheduler file: {info['scheduler_file']}")
    none = "(none: the dashboard is off, or bokeh is not installed)"
    lines.append(f"distributed's dashboard: {info.get('engine_dashboard') or none}")
    return lines


def client_security(info: dict):
    """distributed's Security for a client of this cluster (the cluster's certificate), or None."""
    ours = Security.from_dict(info.get("engine_tls") or info.get("tls"))
    if ours is None:
        return None
    from ..engines.dask_scheduler import distributed_security
    return distributed_security(ours, "client")


def connect_hint(name: str, info: dict) -> str:
    """`up`'s lines on connecting from Python: distributed's Client for a distributed cluster."""
    if not info.get("engine_address"):
        return (f"    from hpc_cluster import Client\n"
                f"    client = Client({name!r})\n")
    address, tls = info["engine_address"], info.get("engine_tls")
    by_file = f"scheduler_file={info['scheduler_file']!r}" if info.get("scheduler_file") else None
    if not tls:
        return ("    from distributed import Client\n"
                f"    client = Client({address!r})\n"
                + (f"    # or: client = Client({by_file})\n" if by_file else ""))
    return ("    from distributed import Client, Security\n"
            f"    security = Security(tls_ca_file={tls['ca_file']!r}, tls_client_cert={tls['cert']!r},\n"
            f"                        tls_client_key={tls['key']!r}, require_encryption=True)\n"
            f"    client = Client({address!r}, security=security)\n"
            + (f"    # or: client = Client({by_file}, security=security)\n" if by_file else ""))


def dashboard_lines(info: dict) -> str:
    """`up`'s dashboard lines: distributed's, then ours (the deaths page)."""
    text = ""
    if info.get("engine_dashboard"):
        text += f"distributed's dashboard: {info['engine_dashboard']}\n"
    if info.get("dashboard"):
        what = "worker deaths and jobs; " if info.get("engine_address") else ""
        text += f"dashboard ({what}the link carries its access token): {info['dashboard']}\n"
    return text


def distributed_worker_logs(info: dict, path, tail: int) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(log lines by worker, names by address) of a distributed cluster, as our Client's
    get_worker_logs gives them for ours: the live workers' from distributed's scheduler (they
    speak distributed's protocol, not ours), the dead ones' from our death records (their
    nanny kept the last lines), keyed "<address> (died: <cause>)"."""
    from distributed import Client as DistributedClient
    from ..client.client import Client
    with DistributedClient(info["engine_address"], security=client_security(info), timeout=30,
                           set_as_default=False) as dc:
        names = {a: w.get("name") for a, w in dc.scheduler_info(n_workers=-1)["workers"].items()}
        # distributed gives (level, line) pairs, newest first
        logs = {a: [line for _level, line in reversed(entries)] for a, entries in dc.get_worker_logs(n=tail).items()}
    with Client(cluster_file=str(path), timeout=30) as client:
        deaths = client.deaths()
    for d in deaths:
        if d.get("worker"):
            names.setdefault(d["worker"], d.get("name"))
            if d.get("log_tail"):
                logs[f"{d['worker']} (died: {d['cause']})"] = list(d["log_tail"])[-tail:]
    return logs, names
