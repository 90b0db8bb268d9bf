"""distributed.LocalCluster's keywords that ours takes besides its own (issue 31): a program
written for distributed passes them, often through `Client(n_workers=2, silence_logs=...)`,
and should run. Each is taken and used, taken and unused (saying why), or refused with advice.
"""

from __future__ import annotations

# Taken, unused: what they tune does not exist here (docs/migrating-from-distributed.md).
UNUSED = {
    "loop": "the cluster runs in its own processes and threads, never on the caller's event loop",
    "silence_logs": "the scheduler and worker processes log to files in log_directory (cluster.logs())",
    "worker_dashboard_address": "workers serve no dashboard of their own; the scheduler's shows them all",
    "scheduler_sync_interval": "the cluster object asks the scheduler when it needs to know",
    "start": "deprecated in distributed, where it does nothing either",
}
# Refused: distributed's own classes and services, which ours cannot run.
REFUSED = {
    "worker_class": "the workers are hpc_cluster's (processes=False for threads of this process, nanny=False "
                    "for no nanny)",
    "scheduler_kwargs": "give the scheduler's settings as LocalCluster keywords (heartbeat_ttl=, allowed_failures=, "
                        "...; docs/configuration.md)",
    "services": "the scheduler serves the dashboard (dashboard_address=) and nothing else",
    "worker_services": "workers serve nothing but their results",
    "service_kwargs": "the dashboard takes no options but dashboard_address=",
    "blocked_handlers": "the scheduler takes only hpc_cluster's clients and workers, authenticated",
    "interface": "give host= the address of that interface (`ip -4 addr show IFACE`)",
}


def take_dask_keywords(keywords: dict, host: str, known: list[str]) -> str:
    """The host to listen on, after distributed's `ip=` (its old name for host; `protocol=` is
    read with security=: protocol/tls.py choose_security); raises TypeError for a keyword
    neither ours (`known`) nor distributed's, and for those we refuse. What is left in
    `keywords` is unused, by UNUSED's reasons."""
    if "ip" in keywords:
        host = keywords.pop("ip") or host
    for name in keywords:
        if name in REFUSED:
            raise TypeError(f"LocalCluster({name}=...) is distributed's and is not supported: {REFUSED[name]}")
        if name not in UNUSED:
            from ...config import did_you_mean
            raise TypeError(f"LocalCluster got an unknown keyword {name!r}"
                            f"{did_you_mean(name, [*known, *UNUSED])}")
    return host
