"""LocalCluster's scheduler process: `python -m hpc_cluster.scheduler`'s scheduler with the
dashboard beside it (issue 17).

The scheduler package must not import the dashboard (the dashboard reads the scheduler), so
the process that runs both is started from here, as the cluster daemon is for batch clusters.
Its flags are the scheduler's plus `--dashboard-port` (none: no dashboard), `--dashboard-host`
(default: the scheduler's --host) and `--dashboard-file`, where the dashboard's address is
written (0600) before the scheduler's address file, so LocalCluster finds it once it sees that.
"""

from __future__ import annotations

import json
import os
import sys

from ...dashboard.server import Dashboard
from ...protocol.clusterfile import open_private
from ...scheduler.__main__ import main as scheduler_main


def add_arguments(p) -> None:
    p.add_argument("--dashboard-port", type=int, help="serve the dashboard on this port (0: any free one)")
    p.add_argument("--dashboard-host", help="where the dashboard listens (default: the scheduler's --host)")
    p.add_argument("--dashboard-file", help="write the dashboard's address here (JSON) once it listens")


def start_dashboard(sched, args, secret: bytes):
    if args.dashboard_port is None:
        return None
    host = args.dashboard_host if args.dashboard_host is not None else args.host
    dashboard = Dashboard(sched, secret, host=host, port=args.dashboard_port)
    dashboard.start()
    if args.dashboard_file:
        tmp = args.dashboard_file + ".tmp"
        with open_private(tmp, "w") as f:
            json.dump({"address": dashboard.address}, f)
        os.replace(tmp, args.dashboard_file)
    return dashboard.stop


def main(argv=None) -> int:
    return scheduler_main(argv, prog="python -m hpc_cluster.deploy.local.scheduler",
                          add_arguments=add_arguments, beside=start_dashboard)


if __name__ == "__main__":
    sys.exit(main())
