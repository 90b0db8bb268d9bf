"""A private sshd on 127.0.0.1 for tests that run commands over SSH (runner, deploy).

`SSHD(tmp, ensure_sshd())` starts `sshd -D` on a free port with its own host key, a
throwaway user key, and known_hosts files (the right one and a wrong one); the module
fixture `sshd` yields one and stops it. Import the fixture into a test module with
`from helpers.sshd import sshd  # noqa: F401`.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from hpc_cluster.runners.ssh import SSHRunner
from helpers.wait import wait_until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_sshd() -> str:
    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
    if sshd is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server"],
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                       stdin=subprocess.DEVNULL, capture_output=True, check=True)
        sshd = "/usr/sbin/sshd"
    if sshd is None or shutil.which("ssh-keygen") is None:
        pytest.skip("SSH RUNNER TESTS SKIPPED: no sshd/ssh-keygen here and not root to install "
                    "openssh-server; install it to run them")
    return sshd


class SSHD:
    """`set_env`: variables every session gets (sshd's SetEnv, applied after HOME etc., so
    HOME here makes the login node's home another directory than ours)."""

    def __init__(self, tmp: Path, sshd: str, set_env: dict[str, str] | None = None):
        self.dir = tmp
        self.port = _free_port()
        self.user = getpass.getuser()
        self.key = tmp / "user_key"
        self.log = tmp / "sshd.log"
        for name in ("host_key", "user_key", "other_host_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)],
                           check=True, stdin=subprocess.DEVNULL)
        (tmp / "authorized_keys").write_text((tmp / "user_key.pub").read_text())
        host_pub = (tmp / "host_key.pub").read_text().split()
        other_pub = (tmp / "other_host_key.pub").read_text().split()
        self.known_hosts = tmp / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        self.wrong_known_hosts = tmp / "wrong_known_hosts"
        self.wrong_known_hosts.write_text(f"[127.0.0.1]:{self.port} {other_pub[0]} {other_pub[1]}\n")
        config = tmp / "sshd_config"
        config.write_text(f"""\
Port {self.port}
ListenAddress 127.0.0.1
HostKey {tmp / 'host_key'}
PidFile {tmp / 'sshd.pid'}
AuthorizedKeysFile {tmp / 'authorized_keys'}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel VERBOSE
Subsystem sftp internal-sftp
""" + ("SetEnv " + " ".join(f'"{k}={v}"' for k, v in set_env.items()) + "\n" if set_env else ""))
        os.makedirs("/run/sshd", exist_ok=True) if os.geteuid() == 0 else None
        # -D: stay in the foreground, so the pid we hold is the daemon's and we stop only it.
        self.proc = subprocess.Popen([sshd, "-D", "-f", str(config), "-E", str(self.log)],
                                     stdin=subprocess.DEVNULL)
        wait_until(self._listening, 15, f"sshd on 127.0.0.1:{self.port} (log: {self.log})")

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"sshd exited {self.proc.returncode}: {self.log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def accepted(self) -> int:
        """Successful logins so far, from sshd's own log."""
        return self.log.read_text().count("Accepted publickey")

    def runner(self, **kw) -> SSHRunner:
        kw.setdefault("known_hosts", str(self.known_hosts))
        return SSHRunner("127.0.0.1", user=self.user, key=str(self.key), port=self.port, **kw)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = SSHD(tmp_path_factory.mktemp("sshd"), ensure_sshd())
    yield server
    server.stop()
