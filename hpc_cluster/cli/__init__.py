"""The `hpc-cluster` command."""

from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  hpc-cluster demo                  run work on a LocalCluster and explain a worker's death
  hpc-cluster config init           write a starter site config for this machine
  hpc-cluster config show           the merged site configuration and where each value came from
  hpc-cluster up -n 4               start 4 workers as batch jobs, cluster named 'default'
  hpc-cluster status                its jobs, workers and recent worker deaths
  hpc-cluster why                   why workers died: cause, evidence, log tail
  hpc-cluster down                  retire the workers, cancel the jobs, stop the daemon
  hpc-cluster clean                 remove ended clusters' logs and leftovers past log_retention
  sbatch -N 3 --wrap "hpc-cluster run script.py"   the script with workers on every node of the job

`hpc-cluster COMMAND --help` shows each command's options and examples.
"""


def build_parser() -> argparse.ArgumentParser:
    from .cluster import EXIT_CODES
    p = argparse.ArgumentParser(prog="hpc-cluster", description="A task cluster on HPC batch systems "
                                "that tells you why a worker died.", epilog=EXAMPLES + "\n" + EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the LocalCluster demo")
    demo.add_argument("-n", "--workers", type=int, default=2)
    from .config import add_config_commands
    add_config_commands(sub)
    from .cluster import add_cluster_commands
    add_cluster_commands(sub)
    from .clean import add_clean_command
    add_clean_command(sub)
    from .run import add_run_command
    add_run_command(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run
        return run(n_workers=args.workers)
    if args.command == "config":
        from .config import run_config
        return run_config(args)
    if args.command == "run":
        from .run import run_command
        return run_command(args)
    if getattr(args, "handler", None):
        from .cluster import run_cluster_command
        return run_cluster_command(args)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
