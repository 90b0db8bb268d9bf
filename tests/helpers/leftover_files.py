"""Files as clusters leave them in clusters_dir() (deploy/leftovers.py), for the tests of their
cleaning: written where and as launch() and the daemon write them, and aged with os.utime."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_cluster.lifeline import process_start
from hpc_cluster.protocol.clusterfile import (cluster_file_for, clusters_dir, journal_for, new_secret,
                                              private_directory, write_cluster_file)

DAY = 86400.0


def left_by(name: str, *kinds: str, pid: int | None = None) -> list[Path]:
    """The files of cluster `name` of these kinds: 'log', 'plan', 'tls' (a directory with a key),
    'journal', and 'cluster' (its cluster file; with `pid`, recorded with its start time as the
    daemon records its own: a pid-less one is what launch() writes before its daemon listens)."""
    d = private_directory(clusters_dir())
    made = []
    for kind in kinds:
        if kind == "cluster":
            meta = {"pid": pid, "pid_started": process_start(pid)} if pid else {}
            made.append(write_cluster_file(cluster_file_for(name), "tcp://127.0.0.1:1" if pid else "",
                                           new_secret(), name=name, **meta))
        elif kind == "tls":
            (d / f"{name}.tls").mkdir()
            (d / f"{name}.tls" / "key.pem").write_text("a private key\n")
            made.append(d / f"{name}.tls")
        else:
            path = {"log": d / f"{name}.log", "plan": d / f".{name}.plan.json",
                    "journal": journal_for(cluster_file_for(name))}[kind]
            path.write_text(f"{kind} of {name}\n")
            made.append(path)
    return made


def aged(paths, days: float) -> None:
    """Last changed `days` ago (a directory's files too), as if the cluster had ended then."""
    when = time.time() - days * DAY
    for p in paths:
        for root, _dirs, names in (os.walk(p) if Path(p).is_dir() else []):
            for n in names:
                os.utime(os.path.join(root, n), (when, when), follow_symlinks=False)
        os.utime(p, (when, when), follow_symlinks=False)


@pytest.fixture
def daemon_pid():
    """A live process standing for a cluster daemon (left_by(..., pid=) records it as the daemon
    records itself). A fixture: import it into the test module."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def ended_pid() -> int:
    """The pid of a daemon that died."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
