"""`hpc-cluster config check | init | show | import-jobqueue`: the command-line face of hpc_cluster/config.

Kept out of cli/__init__.py so that file stays a list of commands; it calls
`add_config_commands(subparsers)` and hands `args` to `run_config`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from .. import config as cfg


_EXAMPLES = {
    "check": ("""\
  hpc-cluster config check                 every file a command would read, and HPC_CLUSTER_*
  hpc-cluster config check --config ./site.yaml
  hpc-cluster config check && hpc-cluster up -n 4     gate a deployment script on it
""", """exit codes:
  0  every file is valid
  2  a file (or HPC_CLUSTER_* variable) has problems; each is printed with its file and line
"""),
    "init": ("""\
  hpc-cluster config init                  ~/.config/hpc-cluster/config.yaml, batch system detected
  hpc-cluster config init --site mylab --path ./hpc-cluster.yaml
  hpc-cluster config init --force          replace the existing user file
""", """exit codes:
  0  written
  1  the file exists (pass --force or --path)
"""),
    "show": ("""\
  hpc-cluster config show                  the default site: every key, its value and its source
  hpc-cluster config show --site gpu
  hpc-cluster config show --batch slurm    what SLURMCluster() gets with no site (jobqueue.yaml too)
  HPC_CLUSTER_CORES=8 hpc-cluster config show --config ./site.yaml
""", """exit codes:
  0  ok
  2  bad configuration (the problems are printed)
"""),
    "import-jobqueue": ("""\
  hpc-cluster config import-jobqueue       dask's jobqueue config (~/.config/dask/jobqueue.yaml,
                                           DASK_JOBQUEUE__*) -> ~/.config/hpc-cluster/config.yaml
  hpc-cluster config import-jobqueue ./jobqueue.yaml --path ./hpc-cluster.yaml
  hpc-cluster config import-jobqueue --section mylab=slurm --path -     a section of your own, to stdout
""", """exit codes:
  0  written; what could not be carried over is listed
  1  the file exists (pass --force or --path), or there was nothing to import
  2  the jobqueue file cannot be read or is not valid
"""),
}


def _action(sub, name: str, help: str):
    examples, codes = _EXAMPLES[name]
    return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                          epilog="examples:\n" + examples + "\n" + codes,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_config_commands(subparsers) -> None:
    p = subparsers.add_parser("config", help="check, create or show the site configuration",
                              description="Config files, HPC_CLUSTER_* variables and keyword "
                              "arguments: see docs/configuration.md.",
                              epilog="examples:\n" + "".join(e.splitlines(True)[0] for e, _ in _EXAMPLES.values()),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = _action(sub, "check", "validate every config file that would be read")
    check.add_argument("--config", metavar="PATH", help="check this file (plus the system file)")
    init = _action(sub, "init", "write a commented starter file for this machine")
    init.add_argument("--path", metavar="P", help="where to write (default: the user config dir)")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.add_argument("--site", metavar="S", default="mysite", help="name of the site (default: mysite)")
    show = _action(sub, "show", "print the merged settings and where each came from")
    show.add_argument("--config", metavar="PATH", help="read this file (plus the system file)")
    show.add_argument("--site", metavar="S", help="the site to show (default: the file's default)")
    show.add_argument("--batch", choices=("slurm", "pbs", "sge"),
                      help="as SLURMCluster()/PBSCluster() would see it: this batch system's jobqueue config too")
    show.add_argument("--config-name", metavar="NAME", help="read jobqueue.NAME (dask-jobqueue's config_name)")
    imp = _action(sub, "import-jobqueue", "write a site config from a dask-jobqueue jobqueue.yaml")
    imp.add_argument("source", nargs="?", metavar="PATH",
                     help="a jobqueue.yaml (default: dask's configuration, as dask-jobqueue reads it)")
    imp.add_argument("--path", metavar="P", help="where to write (default: the user config file; - for stdout)")
    imp.add_argument("--force", action="store_true", help="replace an existing file")
    imp.add_argument("--section", action="append", default=[], metavar="NAME=BATCH",
                     help="the batch system (slurm or pbs) of a section with a name of your own")


def run_config(args: argparse.Namespace, out=None, err=None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    handler = {"check": _check, "init": _init, "show": _show, "import-jobqueue": _import_jobqueue}[args.config_command]
    return handler(args, out, err)


def _check(args, out, err) -> int:
    problems: list[str] = []
    files = []
    print("config files, highest priority first (earlier wins per key):", file=out)
    for i, c in enumerate(cfg.candidate_paths(args.config), 1):
        head = f"  {i}. {c.label:<20} {c.path}"
        if not c.path.is_file():
            if c.required:
                problems.append(f"{c.path}: no such config file (given by {c.label})")
                print(f"{head}  MISSING", file=out)
            else:
                print(f"{head}  (not present)", file=out)
            continue
        try:
            f = cfg.load_config_files([c.path])[0]
        except cfg.ConfigError as e:
            problems.extend(e.problems)
            print(f"{head}  {len(e.problems)} problem(s)", file=out)
            continue
        files.append(f)
        sites = ", ".join(f.sites) or "no sites"
        default = f" default {f.default.value}," if f.default else ""
        print(f"{head}  ok:{default} sites: {sites}; settings: {len(f.settings)}", file=out)
    try:
        env = cfg.env_overrides()
        names = ", ".join(e.source.removeprefix("env:") for e in env.values())
        print(f"environment: {names or 'no HPC_CLUSTER_<KEY> settings'}", file=out)
    except cfg.ConfigError as e:
        problems.extend(e.problems)
    problems += _check_jobqueue(out)
    if files and not problems:
        # The default named in one file must exist in the merged set of sites.
        try:
            site, why = cfg.select_site(files, None, os.environ)
            print(f"site used by default: {site or 'none (defaults only)'} ({why})", file=out)
        except cfg.ConfigError as e:
            problems.extend(e.problems)
    if problems:
        print(f"\n{len(problems)} problem(s):", file=err)
        for p in problems:
            print(f"  {p}", file=err)
        return 2                                    # bad configuration, as for every command
    print("all good" if files else "no config files found: the defaults apply "
          "(`hpc-cluster config init` writes a starter file)", file=out)
    return 0


def _check_jobqueue(out) -> list[str]:
    """dask-jobqueue's SLURM and PBS sections, as SLURMCluster()/PBSCluster() would read them."""
    import warnings

    from ..config.jobqueue import jobqueue_layer
    problems = []
    for batch in ("slurm", "pbs", "sge"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)     # renamed keys: listed as notes below
                layer = jobqueue_layer(batch, batch)
        except cfg.ConfigError as e:
            problems.extend(e.problems)
            continue
        problems.extend(layer.problems)
        if layer.entries or layer.fallbacks or layer.notes:
            keys = ", ".join(sorted(layer.entries)) or "nothing we use"
            print(f"dask-jobqueue's jobqueue.{batch}: {keys}", file=out)
            for note in layer.notes:
                print(f"  note: {note}", file=out)
    return problems


def _show(args, out, err) -> int:
    given = {k: v for k, v in (("batch", args.batch), ("config_name", args.config_name)) if v}
    try:
        rc = cfg.resolve(site=args.site, config=args.config, **given)
    except cfg.ConfigError as e:
        for p in e.problems:
            print(p, file=err)
        return 2
    print(f"site: {rc.site or 'none (defaults only)'}  (chosen by: {rc.site_source})", file=out)
    print("files, highest priority first: " + (", ".join(rc.files) or "none"), file=out)
    batch = rc.values["batch"]
    if batch not in (None, "local"):
        section = rc.values["config_name"] or batch
        print(f"dask-jobqueue's configuration: jobqueue.{section} (sources marked 'jobqueue:')", file=out)
    print("precedence: keyword > env > files > dask-jobqueue's jobqueue config > default\n", file=out)
    print(rc.table(), file=out)
    if rc.notes:
        print("\nnot used here (what happens instead):", file=out)
        for note in rc.notes:
            print(f"  {note}", file=out)
    if batch in (None, "local"):
        print("\nno batch system chosen, so no jobqueue config was read; `--batch slurm` shows what "
              "SLURMCluster() would read", file=out)
    return 0


def _import_jobqueue(args, out, err) -> int:
    from ..config.jobqueue import import_jobqueue
    batches = {}
    for item in args.section:
        name, _, batch = item.partition("=")
        if batch not in ("slurm", "pbs", "sge"):
            print(f"--section {item!r}: write NAME=slurm, NAME=pbs or NAME=sge", file=err)
            return 2
        batches[name] = batch
    try:
        tree, where = _jobqueue_tree(args.source)
    except cfg.ConfigError as e:
        for p in e.problems:
            print(p, file=err)
        return 2
    sites, notes = import_jobqueue(tree, batches)
    if not sites:
        print(f"nothing to import from {where}: no SLURM, PBS or SGE section", file=err)
        for note in notes:
            print(f"  {note}", file=err)
        return 1
    default = _detected_batch() if _detected_batch() in sites else next(iter(sites))
    doc = {"default": default, "sites": sites}
    text = (f"# Imported by `hpc-cluster config import-jobqueue` from {where}.\n"
            "# Check it with `hpc-cluster config check`; docs/migrating-from-dask-jobqueue.md explains each key.\n"
            + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    target = args.path or str(cfg.user_config_dir(os.environ) / cfg.CONFIG_FILENAME)
    cfg.parse_config_text(text, target)       # what we write must pass our own check
    if target == "-":
        print(text, file=out, end="")
    else:
        path = Path(target).expanduser()
        if path.exists() and not args.force:
            print(f"{path} already exists; not overwriting it. Pass --force to replace it, or --path to "
                  "write elsewhere (- for stdout).", file=err)
            return 1
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}: " + ", ".join(f"site '{n}' ({len(s) - 1} settings, batch {s['batch']})"
                                            for n, s in sites.items()) + f"; default: {default}", file=out)
    dest = err if target == "-" else out
    if notes:
        print("not carried over, or changed on the way:", file=dest)
        for note in notes:
            print(f"  {note}", file=dest)
    print("see the result with `hpc-cluster config show`", file=dest)
    return 0


def _jobqueue_tree(source: str | None) -> tuple[dict, str]:
    """The `jobqueue:` tree of a file, or of dask's configuration (files, DASK_* variables)."""
    if source:
        text = Path(source).expanduser().read_text() if Path(source).expanduser().is_file() else None
        if text is None:
            raise cfg.ConfigError(f"{source}: no such file")
        doc = cfg.load_yaml(text, source) or {}
        tree = doc.get("jobqueue") if isinstance(doc, dict) else None
        if not isinstance(tree, dict):
            raise cfg.ConfigError(f"{source}: no 'jobqueue:' map at the top (is it a dask-jobqueue jobqueue.yaml?)")
        return tree, source
    import dask.config
    tree = dask.config.get("jobqueue", default={}) or {}
    return dict(tree), "dask's configuration (" + ", ".join(dask.config.paths) + ", DASK_JOBQUEUE__*)"


def _detected_batch() -> str | None:
    return "slurm" if shutil.which("sbatch") else "pbs" if shutil.which("qsub") else None


def default_partition(timeout: float = 10) -> str | None:
    """SLURM's default partition (marked '*' by sinfo), or None when sinfo cannot say."""
    try:
        res = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True,
                             timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in res.stdout.split():
        if line.endswith("*"):
            return line.rstrip("*")
    return None


def _init(args, out, err) -> int:
    path = Path(args.path).expanduser() if args.path else \
        cfg.user_config_dir(os.environ) / cfg.CONFIG_FILENAME
    if path.exists() and not args.force:
        print(f"{path} already exists; not overwriting it. Pass --force to replace it, or "
              "--path to write elsewhere.", file=err)
        return 1
    queue, found = None, []
    if shutil.which("sbatch"):
        batch = "slurm"
        found.append(f"sbatch at {shutil.which('sbatch')}")
        if shutil.which("sinfo"):
            queue = default_partition()
            if queue:
                found.append(f"default partition '{queue}' from sinfo")
    elif shutil.which("qsub"):
        batch = "pbs"
        found.append(f"qsub at {shutil.which('qsub')}")
    else:
        batch = "local"
        found.append("neither sbatch nor qsub on PATH")
    note = "batch detected by `config init`: " + "; ".join(found)
    text = cfg.starter_config(batch=batch, site=args.site, queue=queue, note=note)
    cfg.parse_config_text(text, str(path))   # what we write must pass our own check
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path} (site '{args.site}', batch: {batch}; {'; '.join(found)})", file=out)
    print("edit it, then run `hpc-cluster config check`", file=out)
    return 0
