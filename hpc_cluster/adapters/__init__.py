"""Batch system adapters: one small module per batch system, alike in shape.

Adapters are plugins: `get_adapter(name)` finds `name` in the `hpc_cluster.adapters`
entry-point group (plugins.py), where our own slurm, pbs and sge are registered by
pyproject.toml exactly as a third party's adapter would be. There is no list of batch
systems here to keep in step with the installed ones.
"""

from __future__ import annotations

from ..plugins import ADAPTER_GROUP, AdapterLookupError, adapter_entry_points, unknown_batch_message
from .base import (AccountingRecord, BatchAdapter, BatchError, CommandResult, JobSpec,
                   JobStatus, Runner, StepRecord)


def adapter_class(name: str) -> type[BatchAdapter]:
    """The adapter class registered as `name` (any case); AdapterLookupError, naming the
    installed ones, when none is, or when what is registered cannot serve."""
    ep = adapter_entry_points().get(str(name).lower())
    if ep is None:
        raise AdapterLookupError(unknown_batch_message(name))
    try:
        cls = ep.load()
    except Exception as exc:          # a plugin's own import error: say whose, not just what
        raise AdapterLookupError(f"the batch system {name!r} is registered ({ep.value}) but failed to "
                                 f"load: {type(exc).__name__}: {exc}; reinstall the package that "
                                 f"provides it") from exc
    if not (isinstance(cls, type) and issubclass(cls, BatchAdapter)):
        raise AdapterLookupError(f"the {ADAPTER_GROUP!r} entry point {ep.name!r} = {ep.value} is not a "
                                 "BatchAdapter subclass; point it at the adapter class")
    return cls


def get_adapter(name: str, runner: Runner | None = None) -> BatchAdapter:
    """The adapter for `name` ("slurm", "pbs", "sge" or a plugin's), running its commands through `runner`."""
    return adapter_class(name)(runner=runner)


__all__ = ["AccountingRecord", "AdapterLookupError", "BatchAdapter", "BatchError", "CommandResult",
           "JobSpec", "JobStatus", "Runner", "StepRecord", "adapter_class", "get_adapter"]
