"""The `hpc-cluster` command."""

from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  hpc-cluster demo                  run work on a LocalCluster and explain a worker's death
  hpc-cluster config show           the merged site configuration and where each value came from
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpc-cluster", description="A task cluster on HPC batch systems "
                                "that tells you why a worker died.", epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the LocalCluster demo")
    demo.add_argument("-n", "--workers", type=int, default=2)
    from .cli_config import add_config_commands
    add_config_commands(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run
        return run(n_workers=args.workers)
    if args.command == "config":
        from .cli_config import run_config
        return run_config(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
