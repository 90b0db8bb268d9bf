"""Memory and walltime strings as users write them."""

from __future__ import annotations

import pytest

from hpc_cluster.units import (MEMORY_FORMS, UnitError, format_memory, format_walltime,
                                        parse_memory, parse_walltime)


@pytest.mark.parametrize("value, expected", [
    ("16 GB", 16 * 10**9), ("16GB", 16 * 10**9), ("16GiB", 16 * 2**30), ("16 gib", 16 * 2**30),
    ("512MiB", 512 * 2**20), ("500MB", 500 * 10**6), ("2TB", 2 * 10**12), ("1.5 GB", 15 * 10**8),
    ("1024", 1024), (1024, 1024), (2.5e9, 2_500_000_000), ("512M", 512 * 10**6), ("4k", 4000),
])
def test_memory_accepted(value, expected):
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["16 parsecs", "GB", "", "-1GB", "1e3GB", "16 G B"])
def test_memory_refused_with_the_accepted_forms(value):
    with pytest.raises(UnitError) as info:
        parse_memory(value)
    assert repr(value) in str(info.value)
    assert MEMORY_FORMS in str(info.value)


@pytest.mark.parametrize("value", [0, -5, "0GB", True])
def test_memory_must_be_a_positive_size(value):
    with pytest.raises(UnitError):
        parse_memory(value)


def test_memory_error_names_the_keyword():
    with pytest.raises(UnitError, match=r"^memory_limit='16 parsecs'"):
        parse_memory("16 parsecs", what="memory_limit")


def test_format_memory():
    assert format_memory(16 * 2**30) == "16.00 GiB"
    assert format_memory(512) == "512 B"
    assert format_memory(None) == "?"


def test_the_one_byte_formatter_writes_each_form_the_messages_use():
    # The diagnosis and the logs: binary, two decimals; 0 is a size, None unknown.
    assert format_memory(1.02 * 2**30) == "1.02 GiB" and format_memory(0) == "0 B"
    assert format_memory(5 * 2**50) == "5120.00 TiB"                   # no unit past TiB
    # A fixed unit, for numbers that share a chart's axis or a sentence ('3.9 of 4.0 GiB').
    assert format_memory(3.9 * 2**30, "GiB", 1) == "3.9 GiB" and format_memory(101 * 2**20, "MiB", 0) == "101 MiB"
    assert format_memory(0, "MiB", 0) == "0 MiB" and format_memory(2**29, "GiB") == "0.50 GiB"
    # As users write sizes in configs: the status table ('16GB', '1.5GB'), pool sizes ('1.25 GB').
    table = dict(decimal=True, significant=2, sep="", unknown="-")
    assert [format_memory(n, **table) for n in (16e9, 1.5e9, 2e9, 1.25e9, 300e6, 999.6e6, 512, None)] == [
        "16GB", "1.5GB", "2GB", "1.2GB", "300MB", "1000MB", "512B", "-"]
    assert [format_memory(n, decimal=True, significant=3) for n in (64e9, 1.5e9, 1.25e9, 123.4e9, 1.5e12)] == [
        "64 GB", "1.5 GB", "1.25 GB", "123 GB", "1.5 TB"]
    with pytest.raises(ValueError, match="unit='GB': use one of B, KiB, MiB, GiB, TiB"):
        format_memory(1, "GB")


def test_no_byte_formatter_of_its_own():
    # One formatter (issue 30): a size written by hand in MiB or GiB is a sixth one starting.
    import re
    from pathlib import Path
    package = Path(__file__).resolve().parents[2] / "hpc_cluster"
    hand = re.compile(r'/ ?(2 ?\*\* ?(20|30)|1e[69]|1024|size|unit)\b.*[KMG]i?B|for unit in \("B"')
    found = [f"{p.relative_to(package)}:{i}" for p in package.rglob("*.py") if p.name != "units.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if hand.search(line)]
    assert not found, f"use hpc_cluster.units.format_memory: {found}"


@pytest.mark.parametrize("value, expected", [
    ("01:00:00", 3600), ("30:00", 1800), ("2-00:00:00", 172800), ("1-12:30", 86400 + 12 * 3600 + 1800),
    ("90m", 5400), ("1h30m", 5400), ("2d", 172800), ("45s", 45), ("3600", 3600), (3600, 3600),
    ("100:00:00", 360000), (" 1h ", 3600),
])
def test_walltime_accepted(value, expected):
    assert parse_walltime(value) == expected


@pytest.mark.parametrize("value", ["soon", "1:60:00", "00:00:00", "1:2:3:4", "-1:00", "", "1y", False])
def test_walltime_refused(value):
    with pytest.raises(UnitError) as info:
        parse_walltime(value)
    assert "walltime=" in str(info.value)


@pytest.mark.parametrize("seconds, expected", [
    (3600, "01:00:00"), (59, "00:00:59"), (90061, "25:01:01"), (0, "00:00:00"), (89.6, "00:01:30"),
])
def test_format_walltime(seconds, expected):
    assert format_walltime(seconds) == expected


def test_walltime_round_trip():
    for seconds in (1, 59, 60, 3599, 3600, 86399, 86400 * 3 + 7):
        assert parse_walltime(format_walltime(seconds)) == seconds
