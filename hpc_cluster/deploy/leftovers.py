"""What clusters leave in clusters_dir() and the cleaning of it (issue 34, point 4): a cluster
shut down on purpose leaves its daemon log (NAME.log; a class cluster's is
SLURMCluster-<id>.log, a new id each run); one whose daemon died leaves its cluster file,
plan, journal, TLS directory, owner and handover files, distributed's scheduler file and
half-written temporary files too. They are removed once the cluster has ended and its newest
file is older than `log_retention`, when a cluster starts (launch.py) and on `hpc-cluster
clean` (cli/clean.py).

Also the one answer to "does this cluster live?" (`liveness`), which `list`, `down` and the
other commands ask through cli/lookup.py.

The selection (`kind_of`, `group`, `decide`) is pure: file names, sizes and times in,
verdicts out. `scan`, `liveness` and `clean_ended` do the I/O around it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ..lifeline import alive
from ..protocol.clusterfile import cluster_file_for, clusters_dir, journal_for, read_cluster_file
from .daemon.scheduler_job import job_alive

logger = logging.getLogger(__name__)

# A cluster file without a pid is one whose daemon is still starting; older than this,
# its daemon never got as far as listening.
STARTING_GRACE = 120.0

# Our names only (cli/lookup.py's check_name: a name starts with a letter or digit). The
# first pattern that matches wins: NAME.scheduler.json is the scheduler file of NAME, not the
# cluster file of NAME.scheduler (a name `up` refuses).
_N = r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*?)"
PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple((kind, re.compile(rx)) for kind, rx in (
    ("scheduler file", rf"{_N}\.scheduler\.json"),         # engine distributed (engines/dask_scheduler.py)
    ("cluster file", rf"{_N}\.json"),
    ("plan", rf"\.{_N}\.plan\.json"),
    ("journal", rf"{_N}\.journal"),
    ("previous log", rf"{_N}\.previous\.log"),              # the log of a resumed cluster's dead daemon (launch)
    ("log", rf"{_N}\.log"),                                # the daemon's log
    ("owner", rf"{_N}\.owner"),                            # scheduler_job.py's heartbeat
    ("handover", rf"{_N}\.handover"),
    ("tls", rf"{_N}\.tls"),                                # a directory: certificates made for it
    # Written beside the file, then renamed over it: left by a process killed in between.
    ("temporary", rf"\.\.{_N}\.plan\.json\.\d+\.tmp"),
    ("temporary", rf"\.{_N}\.scheduler\.json\.\d+\.tmp"),
    ("temporary", rf"\.{_N}\.(?:json|handover)\.\d+\.tmp"),
    ("temporary", rf"\.{_N}\.journal\.\d+\.compact"),
))

LIVE = ("running", "starting")
# Why a cluster's files stay (Verdict.reason); cli/clean.py says each in words.
THIS_START, RUNNING, STARTING, RESUMABLE, RETENTION_OFF, YOUNG, UNKNOWN = (
    "this-start", "running", "starting", "resumable", "retention-off", "young", "unknown")


@dataclass(frozen=True)
class Entry:
    """One file or directory of clusters_dir(), as lstat saw it (a directory: its files' bytes
    and its newest time)."""
    name: str
    size: int
    mtime: float
    is_dir: bool = False
    is_link: bool = False


@dataclass
class Verdict:
    """One cluster's files and what becomes of them: removed, or kept for `reason`."""
    cluster: str
    state: str                       # running, starting, stopped (resumable), ended, unknown
    files: list[Entry]
    age: float                       # seconds since its newest file changed
    remove: bool
    reason: str | None = None        # why kept: one of THIS_START ... UNKNOWN
    removed: list[Entry] = field(default_factory=list)    # what clean_ended did remove

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.files)


def kind_of(entry: Entry) -> tuple[str, str] | None:
    """(cluster name, kind) of a file we write, or None: not ours, or a symbolic link (we make
    none, and removing what one points at could reach out of the directory)."""
    if entry.is_link:
        return None
    for kind, pattern in PATTERNS:
        m = pattern.fullmatch(entry.name)
        if m and entry.is_dir == (kind == "tls"):
            return m["name"], kind
    return None


def group(entries: Iterable[Entry]) -> dict[str, list[tuple[Entry, str]]]:
    """Our files by cluster name, each with its kind."""
    out: dict[str, list[tuple[Entry, str]]] = {}
    for e in entries:
        found = kind_of(e)
        if found:
            out.setdefault(found[0], []).append((e, found[1]))
    return out


def decide(groups: Mapping[str, list[tuple[Entry, str]]], states: Mapping[str, str], now: float,
           older_than: float | None, resumable_too: bool = True, keep: Iterable[str] = ()) -> list[Verdict]:
    """What becomes of each cluster's files. `states`: the liveness of the clusters that have a
    cluster file (one without is ended; one whose state was not asked is 'unknown' and kept).
    `older_than`: seconds since the newest of a cluster's files changed before they go (None:
    never); a cluster's files go together or not at all (a journal without its cluster file
    resumes nothing). `resumable_too`: a stopped cluster (its daemon died leaving its journal)
    goes too once old enough; else it stays for `down`, which cancels the jobs the journal
    names. `keep`: names left alone whatever they are (the cluster being started)."""
    keep = set(keep)
    out = []
    for name in sorted(groups):
        files = sorted((e for e, _ in groups[name]), key=lambda e: e.name)
        has_file = any(kind == "cluster file" for _, kind in groups[name])
        state = states.get(name, "unknown") if has_file else "ended"
        age = max(0.0, now - max(e.mtime for e in files))
        reason = (THIS_START if name in keep else
                  state if state in LIVE else
                  RETENTION_OFF if older_than is None else
                  RESUMABLE if state == "stopped" and not resumable_too else
                  YOUNG if age < older_than else
                  UNKNOWN if state == "unknown" else None)
        out.append(Verdict(name, state, files, age, reason is None, reason))
    return out


# ----------------------------------------------------------------------------- I/O

def liveness(cluster_file: Path) -> tuple[str, dict | None]:
    """('running'|'starting'|'stopped'|'stale', cluster file contents or None). 'stopped': its
    daemon died but left a journal, so `hpc-cluster up --name NAME` resumes it (issue 16)."""
    path = Path(cluster_file)
    try:
        info = read_cluster_file(path)
    except (FileNotFoundError, ValueError):
        return "stale", None
    pid = info.get("pid")
    in_job = job_alive(info, path)            # a daemon in a scheduler job: its job's state tells
    if in_job is not None:
        if in_job:
            return ("running" if pid and info.get("address") else "starting"), info
        return ("stopped" if journal_for(path).exists() else "stale"), info
    if pid:
        if alive(int(pid), info.get("pid_started")):     # its start time: a pid may be reused
            return "running", info
        return ("stopped" if journal_for(path).exists() else "stale"), info
    try:
        young = time.time() - path.stat().st_mtime < STARTING_GRACE
    except OSError:
        young = False
    return ("starting" if young else "stale"), info


def scan(directory: Path) -> list[Entry]:
    """Every entry of `directory`, links not followed (a link is listed as one, never entered)."""
    out = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for d in entries:
        try:
            st = d.stat(follow_symlinks=False)
        except OSError:                        # removed meanwhile
            continue
        is_dir = d.is_dir(follow_symlinks=False)
        size, mtime = (0, st.st_mtime) if is_dir else (st.st_size, st.st_mtime)
        if is_dir:
            for root, _dirs, names in os.walk(d.path, followlinks=False):
                for n in names:
                    try:
                        s = os.lstat(os.path.join(root, n))
                    except OSError:
                        continue
                    size, mtime = size + s.st_size, max(mtime, s.st_mtime)
        out.append(Entry(d.name, size, mtime, is_dir, d.is_symlink()))
    return out


def _state(name: str) -> str:
    try:
        state = liveness(cluster_file_for(name))[0]
    except OSError:                            # unreadable (not ours to judge): kept
        return "unknown"
    return "ended" if state == "stale" else state


def clean_ended(older_than: float | None, resumable_too: bool = True, keep: Iterable[str] = (),
                dry_run: bool = False, describe_all: bool = False,
                state_of: Callable[[str], str] = _state, now: float | None = None) -> list[Verdict]:
    """Remove the files of ended clusters whose newest file is older than `older_than` seconds
    (decide() says which); return every cluster's verdict. `describe_all`: ask every cluster's
    liveness, for a listing (else only those old enough to go: a scheduler job's costs a batch
    command). Never raises for a file that cannot be removed: the next clean tries again."""
    directory = clusters_dir()
    now = time.time() if now is None else now
    groups = group(scan(directory))
    states = {}
    for name, files in groups.items():
        newest = max(e.mtime for e, _ in files)
        wanted = describe_all or (older_than is not None and now - newest >= older_than)
        if wanted and any(kind == "cluster file" for _, kind in files):
            states[name] = state_of(name)
    verdicts = decide(groups, states, now, older_than, resumable_too, keep)
    if not dry_run:
        for v in verdicts:
            if v.remove:
                v.removed = _remove(directory, v)
    return verdicts


def _remove(directory: Path, v: Verdict) -> list[Entry]:
    # Looked at again just before: a cluster of this name started since it was decided on
    # (a file of its came, its cluster file first, or one changed) keeps all of them.
    before = {e.name: e for e in v.files}
    again = [e for e, _ in group(scan(directory)).get(v.cluster, [])]
    if any(e.name not in before or e.mtime > before[e.name].mtime for e in again):
        return []
    removed = []
    for e in v.files:
        path = directory / e.name
        try:
            if e.is_dir:
                shutil.rmtree(path)            # removes links inside, never what they point at
            else:
                path.unlink()
            removed.append(e)
        except FileNotFoundError:
            removed.append(e)
        except OSError as exc:
            logger.warning("could not remove %s (%s); `hpc-cluster clean` tries again", path, exc)
    return removed


def clean_at_start(retention: float | None, name: str) -> None:
    """launch()'s cleaning: the ended clusters' files older than `retention` (log_retention),
    never the cluster `name` being started. A failure is logged, never raised: it must not
    stop a cluster from starting."""
    if retention is None:
        return
    try:
        removed = [v for v in clean_ended(retention, keep=[name]) if v.removed]
    except Exception as exc:
        logger.warning("cleaning the files of ended clusters failed (%s); `hpc-cluster clean` says more", exc)
        return
    if removed:
        logger.info("removed the files of %d ended cluster(s) older than log_retention (%g s): %s",
                    len(removed), retention, ", ".join(v.cluster for v in removed))
