"""The `hpc-cluster` command."""

from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  hpc-cluster demo                  run work on a LocalCluster and explain a worker's death
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpc-cluster", description="A task cluster on HPC batch systems "
                                "that tells you why a worker died.", epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the LocalCluster demo")
    demo.add_argument("-n", "--workers", type=int, default=2)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run
        return run(n_workers=args.workers)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
