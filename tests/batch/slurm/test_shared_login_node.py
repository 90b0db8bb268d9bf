"""A login node shared with other users (issue 34, point 4), on the real SLURM.

Root starts a cluster with `hpc-cluster up` in a home every user may enter (0755, with a 0755
~/.config, as on many sites): what keeps the cluster private is the product's own doing, not a
0700 home. A second, unprivileged user (`hpcother`, made by the tests: helpers/other_user.py)
then tries, as real processes under its own uid, what a curious or hostile neighbour on a login
node would: read the cluster's files, connect to its scheduler and worker, open its dashboard,
list, stop or cancel it, and find its secret in a process's arguments or environment. Every
attempt must fail, and the cluster must serve on, unharmed (checked as root after each).

Each test runs against two clusters, one with `security: false` (plain TCP, the secret's
handshake alone) and one with `security: true` (TLS with certificates made for the cluster,
whose files are then private too).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from hpc_cluster import Client
from hpc_cluster.lifeline import alive
from hpc_cluster.protocol.clusterfile import read_cluster_file
from helpers.other_user import (ensure_other_user, other_user_python, probe_as_other_user, probe_http,
                                run_as_other_user, run_python_as_other_user)
from helpers.slurm import squeue_ids
from helpers.wait import wait_until
from slurm_jobs import cli, job_pids  # noqa: E402  (tests/batch/slurm on sys.path: conftest.py)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

# Plain TCP and TLS, each said in the site (whichever is the default, both are tried).
TRANSPORTS = {"tcp": "false", "tls": "true"}


@dataclass
class LoginNodeCluster:
    """The cluster root started, and where its private files are."""
    name: str
    info: dict                    # its cluster file, as root reads it
    clusters: Path                # ~/.config/hpc-cluster/clusters
    private: list[Path]           # the files and directories no other user may read
    job_id: str
    base: Path                    # the shared home's parent: every file of the test is under it

    @property
    def cluster_file(self) -> Path:
        return self.clusters / f"{self.name}.json"

    @property
    def secret_hex(self) -> str:
        return self.info["secret"].hex()


def private_paths(clusters: Path, name: str, info: dict) -> list[Path]:
    """The cluster file, its journal, the daemon's log and plan, and the TLS files, if any."""
    paths = [clusters / f"{name}.json", clusters / f"{name}.journal", Path(info["daemon_log"]),
             clusters / f".{name}.plan.json"]
    tls = info.get("tls") or {}
    for key in ("ca_file", "cert", "key"):
        if tls.get(key):
            paths += [Path(tls[key]), Path(tls[key]).parent]
    if info.get("scheduler_file"):            # engine distributed: its scheduler file
        paths.append(Path(info["scheduler_file"]))
    return list(dict.fromkeys(paths))


@pytest.fixture(scope="module", params=list(TRANSPORTS))
def login_cluster(request, slurm_cluster):
    if os.geteuid() != 0:
        pytest.skip("the shared login node tests make a second user: run them as root")
    ensure_other_user()
    try:
        other_user_python()
    except LookupError as exc:
        pytest.skip(str(exc))
    base = Path(tempfile.mkdtemp(prefix="hpc-cluster-shared-login-"))
    home = base / "home"
    (home / ".config").mkdir(parents=True)
    for d in (base, home, home / ".config"):
        os.chmod(d, 0o755)                    # a home open to every user: only our modes protect
    name = f"t-shared-login-{request.param}"
    site = base / "site.yaml"
    site.write_text(f"default: t\nsites:\n  t:\n    batch: slurm\n    cores: 1\n    memory: 300MB\n"
                    f"    walltime: '00:10:00'\n    job_name: {name}\n    security: {TRANSPORTS[request.param]}\n")
    jobs: set[str] = set()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("XDG_CONFIG_HOME", str(home / ".config"))
        mp.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(base / "etc"))
        for var in ("HPC_CLUSTER_CONFIG", "HPC_CLUSTER_SITE"):
            mp.delenv(var, raising=False)
        mp.chdir(home)                        # the jobs' own logs (no log_directory) land here
        try:
            up = cli("up", "--config", str(site), "-n", "1", "--name", name, "--timeout", "240")
            assert up.returncode == 0, up.stdout + up.stderr
            jobs = set(re.findall(r"^job (\d+): (?:pending|running)", up.stdout, re.M))
            assert len(jobs) == 1, up.stdout
            clusters = home / ".config" / "hpc-cluster" / "clusters"
            info = read_cluster_file(clusters / f"{name}.json")
            assert info["address"].startswith(f"{request.param}://"), info["address"]
            yield LoginNodeCluster(name, info, clusters, private_paths(clusters, name, info), next(iter(jobs)),
                                   base)
        finally:
            down = cli("down", name, timeout=240)
            try:
                wait_until(lambda: not (jobs & squeue_ids()), 120, "the cluster's job to leave squeue", interval=0.5)
            finally:
                shutil.rmtree(base, ignore_errors=True)
    assert down.returncode == 0, down.stdout + down.stderr


def still_serving(c: LoginNodeCluster) -> None:
    """As root: the daemon lives, `status` answers with its worker, and a task runs."""
    assert alive(int(c.info["pid"]), c.info.get("pid_started")), "the daemon is gone"
    status = cli("status", c.name, timeout=120)
    assert status.returncode == 0 and "1 worker(s) connected" in status.stdout, status.stdout + status.stderr
    with Client(c.name) as client:
        assert client.submit(pow, 2, 10, pure=False).result(60) == 1024


def test_the_other_user_reads_none_of_the_clusters_files(login_cluster):
    c = login_cluster
    for path in c.private:
        assert path.exists(), f"{path} should exist while the cluster runs"
        mode = path.stat().st_mode & 0o777
        # Private on its own too, should someone open the directory up by hand.
        assert mode & 0o077 == 0, f"{path} has mode {mode:o}"
    assert c.clusters.stat().st_mode & 0o077 == 0
    tried = probe_as_other_user("open", [str(p) for p in [c.clusters, *c.private]])
    assert tried == {str(p): "EACCES" for p in [c.clusters, *c.private]}, tried
    # The same with the plain tools a user would reach for.
    for argv in (["cat", str(c.cluster_file)], ["ls", str(c.clusters)]):
        done = run_as_other_user(argv)
        assert done.returncode != 0 and "Permission denied" in done.stderr, (argv, done.stdout, done.stderr)


def test_the_other_user_cannot_connect_and_the_cluster_serves_on(login_cluster):
    c = login_cluster
    with Client(c.name) as client:
        [worker] = client.scheduler_info()["workers"]
    for address in (c.info["address"], worker):
        forged = probe_as_other_user("forged_handshake", address)
        assert not forged["welcomed"] and forged["closed"], (address, forged)
        garbage = probe_as_other_user("garbage", address)
        assert garbage["closed"], (address, garbage)
    tried = probe_as_other_user("client", c.info["address"], str(c.cluster_file))
    assert tried["secret"].startswith(("AuthenticationError", "ConnectionError")), tried
    assert tried["cluster_file"].startswith("PermissionError"), tried
    still_serving(c)


def test_the_other_user_cannot_open_the_dashboard(login_cluster):
    link = login_cluster.info.get("dashboard")
    assert link, "the cluster has no dashboard (it is on by default)"
    parts = urlsplit(link)
    origin = f"{parts.scheme}://{parts.netloc}"
    refused = [f"{origin}/", f"{origin}/status", f"{origin}/api/jobs", f"{origin}/status?token={'0' * 32}"]
    seen = probe_as_other_user("http", refused)
    assert all(seen[url] in (401, 403) for url in refused), seen
    assert probe_http([link]) == {link: 200}          # the control: with the token, as its owner


def test_the_other_user_can_neither_list_nor_stop_the_cluster(login_cluster):
    c = login_cluster
    owner = pwd.getpwuid(os.getuid()).pw_name

    def as_other(*argv, env=None):
        done = run_python_as_other_user(["-m", "hpc_cluster.cli", *argv], env=env)
        assert "Traceback" not in done.stderr, (argv, env, done.stderr)
        if argv[0] != "list":              # `list` says so bare; the others name themselves
            assert done.stderr.startswith(f"hpc-cluster {argv[0]}: "), (argv, env, done.stderr)
        return done.returncode, done.stderr

    # In its own home: no cluster of its own to list, show or stop.
    assert as_other("list") == (3, "no cluster is running; start one with `hpc-cluster up`\n")
    for argv in (["status", c.name], ["down", c.name]):
        code, said = as_other(*argv)
        assert code == 3 and f"no cluster named {c.name!r}" in said, said
    # Pointed at the owner's files: nothing listed; the named cluster refused, saying whose it is.
    # (Was: a PermissionError traceback.)
    owners = {"XDG_CONFIG_HOME": str(c.clusters.parents[1])}
    assert as_other("list", env=owners)[0] == 3
    assert as_other("down", "--all", env=owners)[0] == 3
    for argv in (["status", c.name], ["down", c.name], ["why", c.name]):
        code, said = as_other(*argv, env=owners)
        assert code == 1 and f"permission denied on {c.cluster_file}, which belongs to user " \
            f"{owner} (uid {os.getuid()})" in said, said
    signalled = probe_as_other_user("signal", [int(c.info["pid"])], int(signal.SIGTERM))
    assert signalled == {str(c.info["pid"]): "EPERM"}, signalled
    still_serving(c)
    assert c.cluster_file.exists()


def test_the_other_user_cannot_cancel_the_clusters_job(login_cluster):
    c = login_cluster
    done = run_as_other_user(["scancel", c.job_id])
    # SLURM's own rule: only the job's owner (or an operator) may cancel it.
    assert done.returncode != 0 and "denied" in done.stderr.lower(), done.stdout + done.stderr
    assert c.job_id in squeue_ids()
    still_serving(c)


def test_no_secret_in_any_process_argument_or_readable_file(login_cluster):
    c = login_cluster
    token = c.info["dashboard_token"]
    needles = [c.secret_hex.encode(), c.secret_hex.upper().encode(), token.encode()]
    # The cluster's processes: the daemon (scheduler + job manager) and the job's (slurmstepd,
    # the job script's shell, the nanny, the worker), found by its cgroups.
    ours = {int(c.info["pid"]), *job_pids(c.job_id)}
    commands = {pid: _cmdline(pid) for pid in ours}
    workers = [pid for pid, cmd in commands.items() if b"hpc_cluster" in cmd and pid != int(c.info["pid"])]
    assert len(workers) >= 2, f"expected the job's nanny and worker among {commands}"
    # Every process on the machine, not only those found: none carries the secret or the token.
    carrying = {pid: cmd for pid in _all_pids() if any(n in (cmd := _cmdline(pid)) for n in needles)}
    assert not carrying, f"the secret or the dashboard token is in the arguments of {carrying}"
    # Their environments are their owner's alone (the kernel's rule, which the worker relies on
    # when its nanny hands it the secret in $HPC_CLUSTER_SECRET).
    environ = probe_as_other_user("open", [f"/proc/{pid}/environ" for pid in sorted(ours)])
    assert set(environ.values()) <= {"EACCES", "ENOENT"} and "EACCES" in environ.values(), environ
    # Nothing the other user can read under the shared home holds them either (the jobs' own
    # logs, written by SLURM with the submitter's umask, included).
    found = probe_as_other_user("files_holding", str(c.base), [n.decode() for n in needles])
    assert found["read"] >= 2 and not found["holding"], found


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:                            # ended meanwhile
        return b""
