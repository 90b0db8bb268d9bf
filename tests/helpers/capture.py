"""What the fixture-capture scripts share (tests/batch/slurm/capture_*.py, tests/batch/sge/
capture_fixtures.py): they are run by hand on a real cluster, outside pytest, and save what the
batch system's commands printed as the parsers' fixtures. Each puts tests/ on sys.path itself."""

from __future__ import annotations

import subprocess
from pathlib import Path


def command(argv, timeout: float | None = None, **kw) -> subprocess.CompletedProcess:
    """A command's run with its output kept as text (check=, input=, env= as subprocess.run)."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def saver(folder: Path, say: bool = True):
    """save(name, text): writes folder/name verbatim and, if `say`, says so with its line count."""
    def save(name: str, text: str) -> None:
        (folder / name).write_text(text)
        if say:
            print(f"  wrote {name} ({len(text.splitlines())} lines)")
    return save
