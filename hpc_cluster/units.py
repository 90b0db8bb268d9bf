"""Memory and walltime strings: parse, validate, format.

Pure functions. Errors name the value and list the accepted forms, because these
strings come straight from users' keyword arguments and site files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


_BINARY = ("B", "KiB", "MiB", "GiB", "TiB")
_DECIMAL = ("B", "kB", "MB", "GB", "TB")


def format_memory(nbytes: int | float | None, unit: str | None = None, digits: int = 2, *,
                  decimal: bool = False, significant: int | None = None, sep: str = " ",
                  unknown: str = "?") -> str:
    """The one byte formatter. By default binary units, two decimals: '1.02 GiB', '512 B'.

    unit: the unit to write it in ('MiB', 'GB'), for numbers that share an axis or a sentence;
        else the largest one the size reaches.
    digits: decimals (bytes are always whole); or `significant`: at most that many significant
        digits, the whole part always, no trailing zeros (2: '16', '1.5', '300').
    decimal: powers of 1000 (kB, MB, GB), as users write sizes in configs (memory: 16GB).
    sep: between the number and the unit ('' gives '16GB'); unknown: the text for None.
    """
    if nbytes is None:
        return unknown
    names, step = (_DECIMAL, 1000) if decimal else (_BINARY, 1024)
    n = float(nbytes)
    if unit is None:
        power = 0
        while abs(n) >= step and power < len(names) - 1:
            n /= step
            power += 1
        unit = names[power]
    elif unit in names:
        n /= step ** names.index(unit)
    else:
        raise ValueError(f"unit={unit!r}: use one of {', '.join(names)}")
    if unit == "B":
        text = f"{n:.0f}"
    elif significant is not None:
        text = f"{n:.{max(0, significant - len(str(int(abs(n)))))}f}"
        text = text.rstrip("0").rstrip(".") if "." in text else text
    else:
        text = f"{n:.{digits}f}"
    return f"{text}{sep}{unit}"


_WALL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_WALL_UNIT_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)([smhd]))+$")

@dataclass(frozen=True)
class WalltimeReading:
    """How one batch system reads a walltime string: each adapter declares its own
    (`BatchAdapter.walltime_reading`), so units.py holds no list of batch systems. dask-jobqueue
    hands the string to the batch system as written, so we read it as that batch system would;
    without a reading (None: 'local', or a plugin that declares none) it is ours: a bare number
    is seconds, 'MM:SS' is clock form."""

    title: str                       # as the errors name it: "SLURM"
    forms: str                       # the forms it accepts, for the error that lists them
    bare_minutes: bool = False       # a bare number is minutes (sbatch -t, bsub -W), else seconds
    days: bool = False               # the 'D-HH:MM:SS' form ('2-00:00:00')
    hours_minutes: bool = False      # two parts are 'HH:MM' (bsub -W), else 'MM:SS' with any minutes


class _Hint(ValueError):
    """A reason worth showing the user (not int()'s own complaint)."""


def _colon_seconds(text: str, reading: WalltimeReading | None) -> float:
    """Seconds for 'H:M:S', 'M:S', 'D-H[:M[:S]]' as `reading` reads them; ValueError if not."""
    days = 0
    if "-" in text:
        if reading is not None and not reading.days:
            raise _Hint(f"{reading.title} has no day form")
        d, text = text.split("-", 1)
        days = int(d)
    parts = [int(p) for p in text.split(":")]
    if any(p < 0 for p in parts) or not 1 <= len(parts) <= 3:
        raise ValueError
    if days:                                   # after a day count, hours come first
        h, m, s = (parts + [0, 0])[:3]
        if h >= 24 or m >= 60 or s >= 60:
            raise ValueError
    elif len(parts) == 3:
        h, m, s = parts
        if m >= 60 or s >= 60:
            raise ValueError
    elif len(parts) == 2 and reading is not None and reading.hours_minutes:
        (h, m), s = parts, 0                   # bsub -W HH:MM
        if m >= 60:
            raise ValueError
    elif len(parts) == 2:
        h, (m, s) = 0, parts
        # SLURM and PBS both read 'MM:SS' with any number of minutes; our own reading
        # kept to clock form, where '90:00' would more likely be a typo for '01:30:00'.
        if s >= 60 or (reading is None and m >= 60):
            raise ValueError
    else:
        raise ValueError                       # a bare number is handled by the caller
    return days * 86400 + h * 3600 + m * 60 + s


def parse_walltime(value: int | float | str, what: str = "walltime", batch: WalltimeReading | None = None) -> int:
    """Seconds for a walltime, read as a batch system reads it (`batch`: its adapter's
    WalltimeReading), or as we do (None).

    '01:00:00', '30:00', '2-00:00:00' (SLURM), '90m', '1h30m', 3600 ... A bare number is
    minutes for SLURM and LSF and seconds otherwise, whether written as text or as a number.
    """
    forms = batch.forms if batch is not None else WALLTIME_FORMS
    minutes = batch is not None and batch.bare_minutes
    if isinstance(value, bool):
        raise UnitError(f"{what}={value!r} is not a duration; use {forms}")
    text = str(value).strip().lower().replace(" ", "")
    seconds: float | None = None
    try:
        if re.fullmatch(r"\d+(\.\d+)?", text):
            number = float(text)
            if minutes and not number.is_integer():
                raise ValueError
            seconds = number * 60 if minutes else number
        elif _WALL_UNIT_RE.match(text):
            seconds = sum(float(n) * _WALL_UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smhd])", text))
        else:
            seconds = _colon_seconds(text, batch)
    except ValueError as exc:
        hint = f" ({exc})" if isinstance(exc, _Hint) else ""
        raise UnitError(f"{what}={value!r} is not a duration I understand{hint}; use {forms}") from None
    if seconds <= 0:
        raise UnitError(f"{what}={value!r} must be positive; use {forms}")
    return int(seconds)


def format_walltime(seconds: int | float) -> str:
    """HH:MM:SS (hours may exceed 24), the form both SLURM and PBS accept."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"
