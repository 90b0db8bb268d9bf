"""Where a cluster's files live on the login node when its batch commands run over SSH.

A site with `ssh:` may be driven from a laptop that shares no filesystem with the cluster,
so every path a job uses must be a path *there*: the cluster file the workers read, the
log directory, the working directory. `probe` asks the login node (through the runner,
one command) for its home, its config directory and where commands start; the rest is
pure path arithmetic, and `job_logs` reads a job's output files back through the runner.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, replace
from typing import Sequence

from ..adapters.base import BatchError
from ..config import ResolvedConfig

_PROBE = 'printf "%s\\n%s\\n%s\\n" "$HOME" "${XDG_CONFIG_HOME:-$HOME/.config}" "$(pwd)"'


@dataclass(frozen=True)
class LoginNode:
    home: str           # what '~' means there
    config_home: str    # ${XDG_CONFIG_HOME:-~/.config} there
    cwd: str            # where commands over SSH start: sbatch/qsub's submit directory

    def path(self, written: str) -> str:
        """A path as the user wrote it, meant on the login node: '~' is its home, a relative
        path starts where commands there start."""
        if written == "~" or written.startswith("~/"):
            return self.home + written[1:]
        return posixpath.normpath(posixpath.join(self.cwd, written))

    def cluster_file(self, name: str) -> str:
        return f"{self.config_home}/hpc-cluster/clusters/{name}.json"

    def as_dict(self) -> dict:
        return {"home": self.home, "config_home": self.config_home, "cwd": self.cwd}


def parse_probe(stdout: str) -> LoginNode:
    lines = stdout.splitlines()
    if len(lines) < 3 or not all(line.startswith("/") for line in lines[:3]):
        raise BatchError(f"could not read the login node's home and config directory from "
                         f"`{_PROBE}`: {stdout.strip()!r}")
    return LoginNode(home=lines[0], config_home=lines[1], cwd=lines[2])


def probe(runner) -> LoginNode:
    return parse_probe(runner.run(["sh", "-c", _PROBE], timeout=30).stdout)


def on_login_node(cfg: ResolvedConfig, login: LoginNode) -> ResolvedConfig:
    """`cfg` with its directories (logs, working, shared temp) as paths on the login node.

    Config values have '~' expanded on *this* machine; the value as written is what counts
    there, so it is taken from `cfg.raw`.
    """
    values = dict(cfg.values)
    for key in ("log_directory", "working_directory", "shared_temp_directory"):
        written = cfg.raw.get(key)
        if isinstance(written, os.PathLike):
            written = os.fspath(written)
        if values.get(key) and isinstance(written, str):
            values[key] = login.path(written)
    return replace(cfg, values=values)


def make_directories(runner, login: LoginNode, name: str, others: Sequence[str]) -> None:
    """The cluster-file directory (private) and the others (log directory), there."""
    clusters = posixpath.dirname(login.cluster_file(name))
    runner.run(["mkdir", "-p", "--", clusters, *others], timeout=30)
    runner.run(["chmod", "700", "--", clusters], timeout=30)


def remote_tls_directory(remote_cluster_file: str) -> str:
    """Where the cluster's certificate files go on the login node: beside its cluster file."""
    return posixpath.splitext(remote_cluster_file)[0] + ".tls"


def place_tls(runner, tls: dict, remote_cluster_file: str) -> dict:
    """Copy the cluster's certificate files (`tls`: the cluster file's entry, paths here) to the
    login node, 0600 in a 0700 directory beside its cluster file, where the jobs read them;
    returns the entry naming the copies. Over the runner's own connection (SFTP)."""
    directory = remote_tls_directory(remote_cluster_file)
    runner.run(["mkdir", "-p", "--", directory], timeout=30)
    runner.run(["chmod", "700", "--", directory], timeout=30)
    placed = {}
    for field, name in (("ca_file", "tls-ca.pem"), ("cert", "tls-cert.pem"), ("key", "tls-key.pem")):
        with open(tls[field]) as f:
            runner.write_file(f"{directory}/{name}", f.read(), 0o600)
        placed[field] = f"{directory}/{name}"
    return placed


# ----------------------------------------------------------------------------- job logs

def job_log_names(names: Sequence[str], job_id: str) -> list[str]:
    """Which of a directory's file names are the job's stdout/stderr. Pure.

    SLURM (our template): <name>-<id>.out/.err, or slurm-<id>.out without a log_directory (an
    array element's id, 2013_4, is in its names as %A_%a); PBS: <name>.o<seq> / <name>.e<seq>, a
    subjob 4120[3].server's <name>.o4120.3; a Grid Engine array task 123.4's <name>.o123.4.
    """
    seq = re.escape(job_id.split(".")[0])
    pattern = re.compile(rf"(?:-{seq}\.(?:out|err)|\.[oe]{seq})$")
    element = re.match(r"^(\d+)(?:\[(\d+)\]|\.(\d+)$)", job_id)
    if element:
        number, index = element.group(1), element.group(2) or element.group(3)
        pattern = re.compile(rf"(?:-{seq}\.(?:out|err)|\.[oe]{seq}|\.[oe]{number}\.{index})$")
    return sorted(n for n in names if pattern.search(n))


def job_logs(runner, directory: str, job_id: str, tail: int) -> list[tuple[str, list[str]]]:
    """(path, last lines) of each of the job's output files in `directory` on the runner's host."""
    listing = runner.run(["ls", "-1A", "--", directory], timeout=30, check=False)
    if listing.returncode != 0:
        return []
    out = []
    for name in job_log_names(listing.stdout.splitlines(), job_id):
        path = posixpath.join(directory, name)
        text = runner.run(["tail", "-n", str(int(tail)), "--", path], timeout=30, check=False).stdout
        out.append((path, text.splitlines()))
    return out
