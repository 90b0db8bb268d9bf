"""Runs batch commands on this machine: the adapters' default runner."""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import Sequence

from .base import BatchError, CommandResult

DEFAULT_TIMEOUT = 60.0


def _describe_failure(result: CommandResult, where: str) -> str:
    stderr = result.stderr.strip() or "(no stderr)"
    return (f"`{shlex.join(result.argv)}` failed{where} with exit code {result.returncode}: "
            f"{stderr[-2000:]}")


class LocalRunner:
    """Runs commands on this machine."""

    where = "locally"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, env: dict[str, str] | None = None):
        self.timeout = timeout
        self.env = env

    def run(self, argv: Sequence[str], input: str | None = None,
            timeout: float | None = None, check: bool = True) -> CommandResult:
        argv = [str(a) for a in argv]
        timeout = self.timeout if timeout is None else timeout
        env = None if self.env is None else {**os.environ, **self.env}
        try:
            proc = subprocess.run(argv, input=input, capture_output=True, text=True,
                                  timeout=timeout, env=env)
        except FileNotFoundError:
            raise BatchError(f"command {argv[0]!r} not found: it is not on PATH on this machine. "
                             f"Is this the cluster's login node, or should commands run over SSH "
                             f"(set the login host)?") from None
        except PermissionError as e:
            raise BatchError(f"command {argv[0]!r} cannot be executed here: {e}") from None
        except subprocess.TimeoutExpired as e:
            raise BatchError(f"`{shlex.join(argv)}` did not finish within {timeout:g}s "
                             f"(the batch system may be overloaded or hung); output so far: "
                             f"{_text(e.stderr) or _text(e.stdout) or '(none)'}") from None
        result = CommandResult(argv=argv, returncode=proc.returncode,
                               stdout=proc.stdout, stderr=proc.stderr)
        if check and result.returncode != 0:
            raise BatchError(_describe_failure(result, ""))
        return result

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write `text` to `path` (created with `mode`, replaced atomically)."""
        tmp = f"{path}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)

    put_file = write_file

    def close(self) -> None:
        pass


def _text(data) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode(errors="replace").strip()
    return str(data).strip()
