"""`hpc-cluster run script.py [ARGS]`: a script against a cluster spread over the SLURM allocation
this command runs in (deploy/runner.py; docs/slurm.md, "Runner mode")."""

from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  sbatch -N 3 --wrap "hpc-cluster run script.py"        scheduler on the first node, workers on all 3
  sbatch -N 2 -c 8 --mem=32G --wrap "hpc-cluster run --processes 4 script.py --input data.zarr"
  salloc -N 2 hpc-cluster run script.py                  the same, interactively

The script's Client() (from hpc_cluster import Client) connects without arguments; the job's
exit status is the script's. Outside an allocation it refuses (exit 2).
"""


def add_run_command(sub) -> None:
    p = sub.add_parser("run", help="inside a SLURM allocation: scheduler here, workers on every node, then the script",
                       description="Run a Python script against a cluster spread over the SLURM allocation this "
                                   "command runs in: the scheduler on this (the first) node, one worker set per "
                                   "node started with srun, the script's Client() connecting to it.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="worker processes per node (default 1: one worker with all the node's cores)")
    p.add_argument("--cores", type=int, metavar="N", help="cores per node (default: SLURM_CPUS_ON_NODE)")
    p.add_argument("--memory", metavar="SIZE",
                   help="memory per node, e.g. 32GB (default: SLURM_MEM_PER_NODE, else the node's)")
    p.add_argument("--no-nanny", action="store_true", help="workers without a nanny")
    p.add_argument("--no-tls", action="store_true",
                   help="plain TCP instead of TLS under a certificate made for the run (each connection still "
                        "proves the run's secret), as a site's `security: false` does for `up`")
    p.add_argument("--wait-workers", type=float, default=120.0, metavar="SECONDS",
                   help="how long to wait for every node's workers before starting the script (default 120)")
    p.add_argument("script", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS]",
                   help="the Python script (a .py file, run with this Python) or command, and its arguments")


def run_command(args, err=None) -> int:
    err = err or sys.stderr                 # looked up now: a test's capture replaces it
    from ..deploy.runner import RunnerError, RunSettings, run
    from ..units import UnitError, parse_memory
    try:
        if args.processes < 1 or (args.cores is not None and args.cores < 1):
            raise RunnerError("--processes and --cores take a number >= 1")
        memory = parse_memory(args.memory, "--memory") if args.memory else None
        settings = RunSettings(processes=args.processes, cores=args.cores, memory=memory, nanny=not args.no_nanny,
                               tls=not args.no_tls)
        status = run(args.script, settings, wait_workers=args.wait_workers, out=err)
    except (RunnerError, UnitError) as e:
        print(f"hpc-cluster run: {e}", file=err)
        return 2
    return status if status >= 0 else 128 - status        # a script killed by signal N: 128 + N, as the shell says
