"""LSF_UNIT_FOR_LIMITS from lsf.conf: the unit bsub -M is read in.

Kept out of adapters/lsf.py, whose parsers are pure (tests/test_layering.py): reading a file
is the deploy half's business. As dask-jobqueue's lsf_detect_units: $LSF_ENVDIR (or
$LSF_CONFDIR) else /etc, the last setting in the file winning, 'kb' (LSF's default) without one.
It reads the file where hpc-cluster runs; with `ssh:`, give lsf_units= (dask-jobqueue has the
same limit).
"""

from __future__ import annotations

import os
from typing import Mapping

LSF_UNITS = ("kb", "mb", "gb", "tb", "pb", "eb")


def detect_lsf_units(environ: Mapping[str, str] = os.environ) -> str:
    path = os.path.join(environ.get("LSF_ENVDIR") or environ.get("LSF_CONFDIR") or "/etc", "lsf.conf")
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return "kb"
    for line in reversed(lines):
        key, _, value = line.strip().partition("=")
        if key.strip() == "LSF_UNIT_FOR_LIMITS" and value.strip():
            unit = value.strip().strip("\"'").lower()[:1] + "b"
            if unit in LSF_UNITS:
                return unit
    return "kb"
