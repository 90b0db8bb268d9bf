"""Batch system adapters: one small module per batch system, alike in shape."""

from __future__ import annotations

from .base import (AccountingRecord, BatchAdapter, BatchError, CommandResult, JobSpec,
                   JobStatus, Runner, StepRecord)

ADAPTERS = {"slurm": "SLURMAdapter", "pbs": "PBSAdapter"}


def get_adapter(name: str, runner: Runner | None = None) -> BatchAdapter:
    """The adapter for `name` ("slurm" or "pbs"), running its commands through `runner`."""
    key = name.lower()
    if key not in ADAPTERS:
        raise ValueError(f"unknown batch system {name!r}; choose one of {', '.join(sorted(ADAPTERS))}")
    if key == "slurm":
        from .slurm import SLURMAdapter as cls
    else:
        from .pbs import PBSAdapter as cls
    return cls(runner=runner)


__all__ = ["AccountingRecord", "BatchAdapter", "BatchError", "CommandResult", "JobSpec",
           "JobStatus", "Runner", "StepRecord", "get_adapter"]
