"""Headless Chromium (Debian's package) for the dashboard's browser tests and screenshots.

No driver, no download of a browser build: `chromium --headless` loads a page, runs its script
for a stretch of virtual time and prints the DOM (`--dump-dom`) or writes a PNG
(`--screenshot`). `ensure_chromium()` installs the package when it is missing and we are root
(as scripts/test installs openssh-server), quietly and only once.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections import Counter
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser")


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def ensure_chromium() -> str | None:
    """The browser's path; installed with apt-get first when missing and we are root. None if
    it cannot be had (not root): the caller skips, saying so."""
    found = find_chromium()
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "env": env}
    subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600, **quiet)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"], check=True,
                   timeout=1200, **quiet)
    return find_chromium()


def _run(browser: str, args: list[str], url: str, budget_ms: int, timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="hpc-cluster-chromium-") as profile:
        return subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
             "--hide-scrollbars", f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", *args, url],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def dump_dom(browser: str, url: str, budget_ms: int = 5000, timeout: float = 90) -> str:
    """The page's DOM after its script ran for `budget_ms` of virtual time."""
    out = _run(browser, ["--dump-dom"], url, budget_ms, timeout)
    if out.returncode != 0 or "<html" not in out.stdout:
        raise RuntimeError(f"chromium --dump-dom {url} failed ({out.returncode}): {out.stderr[-2000:]}")
    return out.stdout


def screenshot(browser: str, url: str, path: Path, size: tuple[int, int] = (1280, 800), budget_ms: int = 5000,
               timeout: float = 90) -> Path:
    path = Path(path)
    path.unlink(missing_ok=True)
    out = _run(browser, [f"--screenshot={path}", f"--window-size={size[0]},{size[1]}"], url, budget_ms, timeout)
    if out.returncode != 0 or not path.exists():
        raise RuntimeError(f"chromium --screenshot {url} failed ({out.returncode}): {out.stderr[-2000:]}")
    return path


def png_pixels(path: Path) -> tuple[int, int, list[tuple]]:
    """(width, height, pixels) of an 8-bit RGB or RGBA PNG (what Chromium writes): a small
    decoder, so that the check needs no imaging library."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    pos, idat, width = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            if depth != 8 or colour not in (2, 6) or body[12] != 0:
                raise ValueError(f"{path}: only 8-bit RGB/RGBA without interlace is read here")
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    pixels = [tuple(row[x * channels:x * channels + 3]) for row in rows for x in range(width)]
    return width, height, pixels


def colour_summary(path: Path) -> tuple[int, float]:
    """(distinct colours, share of the most common one) of a PNG."""
    _, _, pixels = png_pixels(path)
    counts = Counter(pixels)
    return len(counts), counts.most_common(1)[0][1] / len(pixels)
