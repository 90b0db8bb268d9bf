"""What every runner returns and raises, and what an adapter asks of one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


class BatchError(RuntimeError):
    """A batch command failed or answered something we cannot read."""


@dataclass
class CommandResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs one command somewhere (here, or on a login node over SSH)."""

    def run(self, argv: Sequence[str], input: str | None = None,
            timeout: float | None = None, check: bool = True) -> CommandResult: ...
