"""Which clusters exist and whether their daemons live: the cluster files under
clusters_dir(), for the cluster commands (cli/cluster.py). Also the exit codes and the
error those commands raise, so both modules share them.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ..protocol.clusterfile import cluster_file_for, clusters_dir, journal_for, tls_directory_for
from ..deploy.plan import Plan
from ..deploy.daemon.scheduler_job import handover_path, owner_path
from ..deploy.leftovers import liveness

OK, FAILED, USAGE, NOT_FOUND = 0, 1, 2, 3
# engines/dask_scheduler.py's scheduler_file_for (not imported: it loads distributed)
SCHEDULER_FILE_SUFFIX = ".scheduler.json"
EXIT_CODES = """exit codes:
  0  ok
  1  the operation failed (the message says why and what to try)
  2  usage error or bad configuration
  3  no such cluster (or none running)
"""
DEFAULT_NAME = "default"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class CommandError(Exception):
    """A command failed in a way the user can act on; `code` is the exit status."""

    def __init__(self, message: str, code: int = FAILED):
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------- finding clusters

def plan_file(name: str) -> Path:
    return clusters_dir() / f".{name}.plan.json"   # written by launch() next to the cluster file (deploy/plan.py)


def cluster_names() -> list[str]:
    d = clusters_dir()
    if not d.is_dir():
        return []
    # pathlib's glob matches dot files too: skip the plans and half-written temp files; and
    # the distributed engine's scheduler files (NAME.scheduler.json), which are no cluster's.
    return sorted(p.stem for p in d.glob("*.json") if not p.name.startswith(".")
                  and not p.name.endswith(SCHEDULER_FILE_SUFFIX))


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise CommandError(f"bad cluster name {name!r}: use letters, digits, '.', '_' and '-' "
                           "(it becomes a file name)", USAGE)
    if f"{name}.json".endswith(SCHEDULER_FILE_SUFFIX):
        raise CommandError(f"bad cluster name {name!r}: NAME.scheduler.json is the scheduler file of "
                           "cluster NAME (engine distributed); choose a name not ending in '.scheduler'", USAGE)
    return name


def _not_found(name: str | None) -> CommandError:
    names = [n for n in cluster_names() if _liveness(n)[0] in LIVE]
    running = f"running clusters: {', '.join(names)}" if names else "no cluster is running"
    what = f"no cluster named {name!r}; " if name else ""
    return CommandError(f"{what}{running}; start one with `hpc-cluster up"
                        f"{' --name ' + name if name else ''}`", NOT_FOUND)


LIVE = ("running", "starting")


def _liveness(name: str) -> tuple[str, dict | None]:
    """('running'|'starting'|'stopped'|'stale', cluster file contents or None): deploy/leftovers.py's
    liveness, which cleaning the files of ended clusters asks too."""
    return liveness(cluster_file_for(name))


def find_cluster(name: str | None, example: str = "status {name}") -> tuple[str, Path, dict]:
    """The named cluster, or the only one running; CommandError (exit 3) if there is none.
    `example`: the command the user typed, with {name}, for the advice when several run."""
    if name is None:
        names = [n for n in cluster_names() if _liveness(n)[0] in LIVE]
        if not names:
            raise _not_found(None)
        if len(names) > 1:
            raise CommandError(f"several clusters are running ({', '.join(names)}); name one, "
                               f"e.g. `hpc-cluster {example.format(name=names[0])}`", USAGE)
        name = names[0]
    check_name(name)
    state, info = _liveness(name)
    if info is None:
        raise _not_found(name)
    if state == "stopped":
        raise CommandError(f"cluster {name!r} is not running (its daemon, pid {info.get('pid')}, is gone) "
                           f"but left its journal: `hpc-cluster up --name {name}` resumes it (its tasks, "
                           f"the results its workers kept, its jobs); `hpc-cluster down {name}` ends it for "
                           "good", NOT_FOUND)
    if state == "stale":
        raise CommandError(f"cluster {name!r} is not running (its daemon, pid {info.get('pid')}, is "
                           f"gone); `hpc-cluster down {name}` removes its stale file", NOT_FOUND)
    return name, cluster_file_for(name), info


def journal_jobs(name: str) -> list[str]:
    """The unfinished jobs a stopped cluster's journal names (its daemon died with them)."""
    from ..scheduler.journal import load
    try:
        jobs = load(journal_for(cluster_file_for(name))).jobs
    except (OSError, ValueError):
        return []
    return [str(j) for j in jobs] if isinstance(jobs, dict) else []


def _made_tls_directory(name: str) -> Path | None:
    """The directory of the certificates made for the cluster (its private key inside), as its
    plan names it (under shared_temp_directory when set), else NAME.tls beside its cluster file."""
    try:
        named = Plan.load(plan_file(name)).tls_directory
    except (OSError, ValueError, KeyError, TypeError):
        named = None
    path = Path(named) if named else tls_directory_for(cluster_file_for(name))
    return path if path.is_dir() and not path.is_symlink() else None


def _remove_leftovers(name: str) -> list[Path]:
    removed = []
    # The journal too (issue 16): `down` says the cluster is not to be resumed.
    path = cluster_file_for(name)
    tls = _made_tls_directory(name)              # read before the plan that names it goes
    if tls is not None:
        shutil.rmtree(tls, ignore_errors=True)
        removed.append(tls)
    for p in (path, plan_file(name), journal_for(path), handover_path(path), owner_path(path),
              path.with_suffix(SCHEDULER_FILE_SUFFIX)):        # engine distributed: its scheduler file
        try:
            p.unlink()
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def _processes(name: str, pool: str | None = None) -> int:
    try:
        plan = Plan.load(plan_file(name))
        job = plan.pools[pool].job if pool else plan.job
        return job.workers_per_job            # processes on each of its nodes
    except (OSError, ValueError, KeyError, TypeError):
        return 1


def _pool_limits(name: str) -> dict[str, int | None] | None:
    """A running cluster's pools and their max_jobs (from its plan), or None when it cannot be read."""
    try:
        return {pool: p.max_jobs for pool, p in Plan.load(plan_file(name)).pools.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
