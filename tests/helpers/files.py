"""What the tests check of the files the cluster writes."""

from __future__ import annotations

import stat
from pathlib import Path


def mode(path) -> int:
    """The permission bits of `path` (0o600 for a secret the cluster wrote)."""
    return stat.S_IMODE(Path(path).stat().st_mode)
