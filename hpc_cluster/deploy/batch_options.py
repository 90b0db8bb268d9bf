"""A batch system's own settings, for its adapter (JobSpec.batch_options).

Which settings are a batch system's own is its adapter's declaration (`keywords`,
adapters/options.py), as config collected it (each setting's `owners`); the adapter's
`job_options` then fills in what its site's files say (LSF's units from lsf.conf). Reading
those files is the deploy half's business, so it is handed to the adapter here as
`read_text`: the adapters' modules stay pure (tests/unit/test_layering.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from ..adapters import adapter_class
from ..adapters.base import JobSpec
from ..config import option_by_name

# Settings that are JobSpec fields of their own (SLURM's job_cpu and job_mem, PBS's and SGE's
# resource_spec: older than batch_options) go there, not into batch_options.
_SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(JobSpec))


def read_text(path: str) -> str | None:
    """A file's text, or None where there is none (or it cannot be read)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def batch_options(v: dict, environ: Mapping[str, str] = os.environ) -> dict:
    """The batch system's own settings that are set, for its adapter (JobSpec.batch_options)."""
    batch = v.get("batch")
    own = {name: v[name] for name, o in option_by_name().items()
           if batch in o.owners and name not in _SPEC_FIELDS and v.get(name) not in (None, [])}
    try:
        cls = adapter_class(batch)
    except ValueError:               # 'local', or none installed: nothing of a batch system's own
        return own
    return cls.job_options(own, read_text, dict(environ))
