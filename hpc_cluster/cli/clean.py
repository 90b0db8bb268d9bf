"""`hpc-cluster clean`: remove the files ended clusters left in ~/.config/hpc-cluster/clusters
(daemon logs, a crashed daemon's cluster file, journal, plan ...) once older than log_retention,
or all of them now with --all; list what stays and why. The selection is deploy/leftovers.py's,
the same that runs when a cluster starts."""

from __future__ import annotations

import argparse
import json

from ..config import resolve
from ..deploy import leftovers
from ..protocol.clusterfile import clusters_dir
from ..units import UnitError, format_memory, parse_walltime
from .lookup import EXIT_CODES, OK, USAGE, CommandError
from .views import aligned, dur


def cmd_clean(args, out, err) -> int:
    if args.all and args.older_than is not None:
        raise CommandError("--all and --older-than: give one (--all is --older-than 0 sparing resumable "
                           "clusters)", USAGE)
    if args.all:
        older_than, resumable_too, source = 0.0, False, "--all"
    elif args.older_than is not None:
        older_than, resumable_too, source = _duration(args.older_than), True, f"--older-than {args.older_than}"
    else:
        cfg = resolve(site=args.site, config=args.config)
        older_than, resumable_too = cfg.values["log_retention"], True
        where = cfg.sources["log_retention"]
        source = f"log_retention {cfg.raw['log_retention']}" + ("" if where == "default" else f" from {where}")
    verdicts = leftovers.clean_ended(older_than, resumable_too, dry_run=args.dry_run, describe_all=True)
    # What went (with --dry-run: what would): a removal can leave a file that changed meanwhile.
    went = {v.cluster: (v.files if v.remove else []) if args.dry_run else v.removed for v in verdicts}
    gone = [v for v in verdicts if went[v.cluster]]
    files, size = sum(map(len, went.values())), sum(e.size for done in went.values() for e in done)
    if args.json:                              # docs/cli-json.md: `clean`
        json.dump({"directory": str(clusters_dir()), "dry_run": args.dry_run, "older_than": older_than,
                   "files": files, "bytes": size,
                   "clusters": [_row(v, args.dry_run, older_than, source) for v in verdicts]}, out, indent=1)
        print(file=out)
        return OK
    if not verdicts:
        print(f"nothing to clean in {clusters_dir()}", file=out)
        return OK
    head = ("CLUSTER", "STATE", "FILES", "SIZE", "CHANGED", "")
    rows = [(v.cluster, v.state, str(len(v.files)), format_memory(v.bytes, significant=3),
             f"{dur(v.age)} ago", _action(v, args.dry_run, older_than, source)) for v in verdicts]
    print(aligned([head, *rows]), file=out)
    kept = [v for v in verdicts if not v.remove]
    did = "would remove" if args.dry_run else "removed"
    print(f"\n{did} {files} file(s), {format_memory(size, significant=3)}, of {len(gone)} ended cluster(s)"
          f" ({source}); kept the files of {len(kept)} cluster(s) in {clusters_dir()}", file=out)
    return OK


def _duration(text: str) -> float:
    if text.strip() == "0":
        return 0.0
    try:
        return float(parse_walltime(text, what="--older-than"))
    except UnitError as e:
        raise CommandError(f"{e}; or 0 for every ended cluster's files", USAGE) from None


def _why(v: leftovers.Verdict, older_than: float | None, source: str) -> str:
    """Why a cluster's files stay, in words (Verdict.reason)."""
    name = v.cluster
    return {
        leftovers.RUNNING: "its daemon is running (`hpc-cluster down " + name + "` ends it)",
        leftovers.STARTING: "its daemon is starting",
        leftovers.RESUMABLE: (f"resumable: its daemon died leaving its journal; `hpc-cluster up --name {name}` "
                              f"resumes it, `hpc-cluster down {name}` ends it and cancels the jobs its journal names"),
        leftovers.RETENTION_OFF: f"{source}: `hpc-cluster clean --all` removes it",
        leftovers.YOUNG: f"removed in {dur((older_than or 0) - v.age)} ({source})",
        leftovers.THIS_START: "the cluster being started",
        leftovers.UNKNOWN: f"its cluster file {name}.json could not be read: is it yours?",
    }.get(v.reason, v.reason or "")


def _action(v: leftovers.Verdict, dry_run: bool, older_than: float | None, source: str) -> str:
    if not v.remove:
        return f"kept: {_why(v, older_than, source)}"
    if dry_run:
        return "would be removed"
    if len(v.removed) < len(v.files):
        return (f"removed {len(v.removed)} of its {len(v.files)} file(s) (the rest changed meanwhile or could not "
                "be removed: run clean again)")
    return "removed"


def _row(v: leftovers.Verdict, dry_run: bool, older_than: float | None, source: str) -> dict:
    return {"name": v.cluster, "state": v.state, "age": v.age, "bytes": v.bytes,
            "files": [e.name for e in v.files], "remove": v.remove,
            "removed": [] if dry_run else [e.name for e in v.removed],
            "kept": v.reason, "why": None if v.remove else _why(v, older_than, source)}


def add_clean_command(sub) -> None:
    help = "remove the files of ended clusters: daemon logs and what a crashed daemon left"
    p = sub.add_parser("clean", help=help, description=help[0].upper() + help[1:] + ".",
                       epilog="""examples:
  hpc-cluster clean                        files of clusters ended longer ago than log_retention (7 days)
  hpc-cluster clean --dry-run              what would go, and what stays and why
  hpc-cluster clean --all                  every ended cluster's files now (resumable ones stay)
  hpc-cluster clean --older-than 1d        ended more than a day ago, resumable ones too
  hpc-cluster clean --json                 the same as JSON, for scripts (docs/cli-json.md)
""" + "\n" + EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=cmd_clean)
    p.add_argument("--all", action="store_true",
                   help="every ended cluster's files, however recent; a resumable cluster (its daemon died "
                        "leaving its journal) stays: `hpc-cluster down NAME` ends it")
    p.add_argument("--older-than", metavar="DURATION",
                   help="instead of log_retention: files of clusters whose newest file is older than this "
                        "(7d, 12h, 90m, 0), resumable ones too")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    p.add_argument("--json", action="store_true", help="print JSON instead (schema: docs/cli-json.md)")
    p.add_argument("--site", metavar="S", help="read log_retention from this site (default: the default site)")
    p.add_argument("--config", metavar="PATH", help="read this config file (plus the system file)")
