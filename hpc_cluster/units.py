"""Memory and walltime strings: parse, validate, format.

Pure functions. Errors name the value and list the accepted forms, because these
strings come straight from users' keyword arguments and site files.
"""

from __future__ import annotations

import re

_MEMORY_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_MEMORY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")

MEMORY_FORMS = "a number of bytes, or a number with a unit: '16GB', '16 GB', '16GiB', '500MB', '512MiB', '2TB'"
WALLTIME_FORMS = ("'HH:MM:SS', 'MM:SS', 'D-HH:MM:SS', 'D-HH:MM', a number of seconds, "
                  "or units like '90m', '1h30m', '2d'")


class UnitError(ValueError):
    """A memory or walltime value that cannot be understood."""


def parse_memory(value: int | float | str, what: str = "memory") -> int:
    """Return bytes for '16GB', '16 GB', '16GiB', '512M', 1024 ... (GB = 10**9, GiB = 2**30)."""
    if isinstance(value, bool):
        raise UnitError(f"{what}={value!r} is not a size; use {MEMORY_FORMS}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise UnitError(f"{what}={value!r} must be positive; use {MEMORY_FORMS}")
        return int(value)
    m = _MEMORY_RE.match(str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _MEMORY_UNITS:
        raise UnitError(f"{what}={value!r} is not a size I understand; use {MEMORY_FORMS}")
    n = int(float(m.group(1)) * _MEMORY_UNITS[unit])
    if n <= 0:
        raise UnitError(f"{what}={value!r} must be positive; use {MEMORY_FORMS}")
    return n


def format_memory(nbytes: int | float | None) -> str:
    """Human form with binary units: 1.02 GiB."""
    if nbytes is None:
        return "?"
    n = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


_WALL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_WALL_UNIT_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)([smhd]))+$")


def parse_walltime(value: int | float | str, what: str = "walltime") -> int:
    """Return seconds for '01:00:00', '30:00', '2-00:00:00', '90m', '1h30m', 3600."""
    if isinstance(value, bool):
        raise UnitError(f"{what}={value!r} is not a duration; use {WALLTIME_FORMS}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise UnitError(f"{what}={value!r} must be positive; use {WALLTIME_FORMS}")
        return int(value)
    text = str(value).strip().lower().replace(" ", "")
    seconds: float | None = None
    try:
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        elif _WALL_UNIT_RE.match(text):
            seconds = sum(float(n) * _WALL_UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smhd])", text))
        else:
            days = 0
            if "-" in text:
                d, text = text.split("-", 1)
                days = int(d)
            parts = [int(p) for p in text.split(":")]
            if any(p < 0 for p in parts):
                raise ValueError
            if len(parts) == 3:
                h, m, s = parts
            elif len(parts) == 2 and days:  # SLURM: D-HH:MM
                h, m, s = parts[0], parts[1], 0
            elif len(parts) == 2:
                h, m, s = 0, parts[0], parts[1]
            elif len(parts) == 1 and days:
                h, m, s = parts[0], 0, 0
            else:
                raise ValueError
            if m >= 60 or s >= 60:
                raise ValueError
            seconds = days * 86400 + h * 3600 + m * 60 + s
    except ValueError:
        seconds = None
    if seconds is None:
        raise UnitError(f"{what}={value!r} is not a duration I understand; use {WALLTIME_FORMS}")
    if seconds <= 0:
        raise UnitError(f"{what}={value!r} must be positive; use {WALLTIME_FORMS}")
    return int(seconds)


def format_walltime(seconds: int | float) -> str:
    """HH:MM:SS (hours may exceed 24), the form both SLURM and PBS accept."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"
