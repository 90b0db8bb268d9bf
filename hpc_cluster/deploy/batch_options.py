"""A batch system's own keywords, for its adapter (JobSpec.batch_options), and
LSF_UNIT_FOR_LIMITS from lsf.conf: the unit bsub -M is read in.

Kept out of adapters/lsf.py, whose parsers are pure (tests/unit/test_layering.py): reading a file
is the deploy half's business. As dask-jobqueue's lsf_detect_units: $LSF_ENVDIR (or
$LSF_CONFDIR) else /etc, the last setting in the file winning, 'kb' (LSF's default) without one.
It reads the file where hpc-cluster runs; with `ssh:`, give lsf_units= (dask-jobqueue has the
same limit).
"""

from __future__ import annotations

import os
from typing import Mapping

from ..config.jobqueue import BATCH_ONLY, BATCH_ONLY_DEFAULTED, BATCH_OPTIONS

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


def batch_options(v: dict) -> dict:
    """The batch system's own keywords that are set, for its adapter (JobSpec.batch_options)."""
    only = {**BATCH_ONLY, **BATCH_ONLY_DEFAULTED}
    out = {k: v[k] for k in BATCH_OPTIONS if v.get(k) not in (None, []) and v["batch"] in only[k]}
    if v["batch"] == "lsf" and "lsf_units" not in out:
        out["lsf_units"] = detect_lsf_units()          # as dask-jobqueue: the site's lsf.conf
    return out
