"""Runs batch commands on a login node over one SSH connection (paramiko).

It returns the same `CommandResult` and raises the same `BatchError` as `local.py`'s
LocalRunner, so an adapter never knows which one it has.
"""

from __future__ import annotations

import os
import shlex
import socket
import threading
import time
from typing import Sequence

from .base import BatchError, CommandResult
from .local import DEFAULT_TIMEOUT, _describe_failure

__all__ = ["SSHRunner", "DEFAULT_TIMEOUT", "HOST_KEY_POLICIES"]
HOST_KEY_POLICIES = ("reject", "auto-add", "warn")
EXIT_GRACE = 10.0      # s a command's streams may stay open after it exited (a background child holds them)


class SSHRunner:
    """Runs commands on `host` over one SSH connection, opened on first use and reused.

    Host keys are checked against `known_hosts` (default ~/.ssh/known_hosts). An unknown
    host is refused unless `host_key_policy` is "auto-add" (remember it) or "warn"
    (accept it this once, with a warning): trusting a new host is the user's decision.
    """

    def __init__(self, host: str, user: str | None = None, key: str | None = None,
                 port: int = 22, known_hosts: str | None = None,
                 host_key_policy: str = "reject", timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = 15.0):
        if host_key_policy not in HOST_KEY_POLICIES:
            raise ValueError(f"host_key_policy={host_key_policy!r}; choose one of "
                             f"{', '.join(HOST_KEY_POLICIES)}")
        self.host = host
        self.user = user
        self.key = os.path.expanduser(key) if key else None
        self.port = int(port)
        self.known_hosts = os.path.expanduser(known_hosts or "~/.ssh/known_hosts")
        self.host_key_policy = host_key_policy
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.where = f"on {self._target()}"
        self._client = None
        # One connection shared by threads: connecting twice at once would open two.
        self._lock = threading.Lock()

    def _target(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.host}:{self.port}"

    # -- connection -----------------------------------------------------------------
    def _connect(self):
        import paramiko  # only SSH users pay for importing it

        client = paramiko.SSHClient()
        if os.path.exists(self.known_hosts):
            client.load_host_keys(self.known_hosts)
        client.set_missing_host_key_policy({
            "reject": paramiko.RejectPolicy,
            "auto-add": paramiko.AutoAddPolicy,
            "warn": paramiko.WarningPolicy,
        }[self.host_key_policy]())
        try:
            client.connect(self.host, port=self.port, username=self.user, key_filename=self.key,
                           timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                           auth_timeout=self.connect_timeout, look_for_keys=self.key is None,
                           allow_agent=self.key is None)
        except paramiko.BadHostKeyException as e:
            client.close()
            raise BatchError(f"SSH to {self._target()}: the host key DOES NOT MATCH the one in "
                             f"{self.known_hosts} ({e}). Someone may be intercepting the "
                             f"connection, or the host was reinstalled; check with your admins "
                             f"before removing the old key.") from None
        except paramiko.SSHException as e:
            client.close()
            if "not found in known_hosts" in str(e):
                raise BatchError(
                    f"SSH to {self._target()}: host key unknown, refused (not in "
                    f"{self.known_hosts}). Connect once with `ssh -p {self.port} {self.host}` "
                    f"to verify and record it, pass known_hosts=<file that lists it>, or set "
                    f"host_key_policy='auto-add' to trust it on first use.") from None
            raise BatchError(f"SSH to {self._target()} failed: {e} (key: {self.key or 'default keys'})") from None
        except (socket.error, OSError) as e:
            client.close()
            raise BatchError(f"cannot connect to {self._target()}: {e}") from None
        if self.host_key_policy == "auto-add":
            os.makedirs(os.path.dirname(self.known_hosts) or ".", exist_ok=True)
            client.save_host_keys(self.known_hosts)
        transport = client.get_transport()
        # Keepalives notice a dead login node before a command hangs on it.
        transport.set_keepalive(30)
        return client

    def _connected(self):
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if transport is None or not transport.is_active():
                if self._client is not None:
                    self._client.close()
                self._client = self._connect()
            return self._client

    @property
    def transport(self):
        """The live paramiko Transport (one per runner), or None before first use."""
        return self._client.get_transport() if self._client else None

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- commands -------------------------------------------------------------------
    def run(self, argv: Sequence[str], input: str | None = None,
            timeout: float | None = None, check: bool = True) -> CommandResult:
        argv = [str(a) for a in argv]
        timeout = self.timeout if timeout is None else timeout
        command = shlex.join(argv)
        try:
            result = self._exec(command, argv, input, timeout)
        except BatchError:
            raise  # cannot connect, or timed out: retrying would not help
        except Exception:  # noqa: BLE001 - paramiko raises SSHException, EOFError, OSError
            # A connection dropped between calls shows up only when used: retry once on
            # a fresh one. Batch queries are idempotent; a submit that died mid-way cannot
            # have been accepted without us reading its job id, so retrying it is safe too.
            self.close()
            try:
                result = self._exec(command, argv, input, timeout)
            except BatchError:
                raise
            except Exception as e2:  # noqa: BLE001  # noqa: BLE001 - reported with the target
                raise BatchError(f"SSH {self.where}: running `{command}` failed: {e2}") from None
        if result.returncode == 127 and check:
            raise BatchError(f"command {argv[0]!r} not found {self.where}: it is not on PATH "
                             f"for non-interactive SSH shells there. Is this the right host, or "
                             f"does the batch system need a module loaded? "
                             f"({result.stderr.strip() or 'exit code 127'})")
        if check and result.returncode != 0:
            raise BatchError(_describe_failure(result, f" {self.where}"))
        return result

    def _exec(self, command: str, argv: list[str], input: str | None,
              timeout: float) -> CommandResult:
        client = self._connected()
        channel = client.get_transport().open_session(timeout=self.connect_timeout)
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            if input is not None:
                channel.sendall(input.encode())
            channel.shutdown_write()
            stdout, stderr = self._collect(channel, command, timeout)
            returncode = channel.recv_exit_status()
        finally:
            channel.close()
        return CommandResult(argv=argv, returncode=returncode, stdout=stdout, stderr=stderr)

    @staticmethod
    def _collect(channel, command: str, timeout: float) -> tuple[str, str]:
        # Read both streams as they come, so a chatty stderr cannot fill its window and
        # stall the command while we wait on stdout.
        # Until the streams' end (EOF), not the exit status: sshd sends the status when the
        # command is reaped, which can come before the last of its output (seen in CI: an
        # exit 7's stderr lost under load). A background child holding the streams after the
        # command ended gets EXIT_GRACE seconds, not the whole timeout.
        out, err = [], []
        deadline = time.monotonic() + timeout
        exited = None
        while True:
            got = False
            while channel.recv_ready():
                out.append(channel.recv(65536)); got = True
            while channel.recv_stderr_ready():
                err.append(channel.recv_stderr(65536)); got = True
            drained = not channel.recv_ready() and not channel.recv_stderr_ready()
            if channel.eof_received and drained:
                break
            if channel.exit_status_ready():
                exited = time.monotonic() if exited is None else exited
                if drained and time.monotonic() - exited > EXIT_GRACE:
                    break
            if channel.closed and not got:
                break
            if time.monotonic() > deadline:
                raise _Timeout(f"`{command}` did not finish within {timeout:g}s over SSH "
                               f"(the batch system may be overloaded or hung)")
            if not got:
                time.sleep(0.005)
        return (b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"))

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write `text` to `path` on the remote host via SFTP over the same connection."""
        client = self._connected()
        sftp = client.open_sftp()
        try:
            tmp = f"{path}.tmp{os.getpid()}"
            with sftp.open(tmp, "w") as f:
                f.write(text)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        finally:
            sftp.close()

    put_file = write_file


class _Timeout(BatchError, OSError):
    """A command that outlived its timeout: not retried, the first try may still be running."""
