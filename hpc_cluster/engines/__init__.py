"""What runs as the scheduler and the workers (issue 32): hpc-cluster's own engine (the
default), or dask.distributed's Scheduler and Worker, deployed by the same job scripts,
adapters, pools and CLI, watched by our nanny and diagnosed by our evidence collector.

    dask_scheduler.py  distributed's Scheduler in the cluster daemon, beside ours
    bridge.py          the scheduler plugin between the two: workers joining and leaving,
                       heartbeats and memory, drains and retirements, blame on final verdicts
    blame.py           which distributed tasks a final verdict charges, and when they fail (pure)
    errors.py          the KilledWorker a distributed client receives: distributed's class and
                       ours at once, its text the cause, the evidence and the fix
    dask_worker.py     the worker process our nanny starts: distributed's Worker, naming each
                       task it executes to the nanny

This module names the engines and checks that the one asked for can run here, at construction,
before any job is submitted.
"""

from __future__ import annotations

DEFAULT = "hpc-cluster"
ENGINES = ("hpc-cluster", "distributed")

# The distributed versions the engine is tested with (pyproject.toml's `distributed` extra says
# the same): the scheduler plugin and the worker use distributed's plugin and transition API.
DISTRIBUTED_MIN, DISTRIBUTED_BELOW = (2024, 12), (2027, 1)


class EngineError(ValueError):
    """The engine asked for cannot run here; the message says what to install or write."""


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def supported_range() -> str:
    return (f">={DISTRIBUTED_MIN[0]}.{DISTRIBUTED_MIN[1]}, "
            f"<{DISTRIBUTED_BELOW[0]}.{DISTRIBUTED_BELOW[1]}")


def check_engine(name: str, installed: str | None = None) -> str:
    """The engine's name if it can run here; else EngineError saying what to change.
    `installed`: distributed's version (None: the one importable here)."""
    if name not in ENGINES:
        raise EngineError(f"engine={name!r} is not an engine; use engine='hpc-cluster' (the default) or "
                          "engine='distributed' (dask.distributed's scheduler and workers)")
    if name != "distributed":
        return name
    if installed is None:
        from importlib import metadata
        try:
            installed = metadata.version("distributed")
        except metadata.PackageNotFoundError:
            raise EngineError("engine='distributed' needs dask.distributed in this environment and on the "
                              "compute nodes: pip install 'hpc-cluster[distributed]' (or pip install "
                              f"'distributed{supported_range().replace(' ', '')}'), or leave engine unset "
                              "for hpc-cluster's own engine") from None
    version = _version_tuple(installed)
    if not DISTRIBUTED_MIN <= version < DISTRIBUTED_BELOW:
        raise EngineError(f"engine='distributed' supports distributed {supported_range()}; this environment "
                          f"has {installed}: pip install 'hpc-cluster[distributed]' to get a supported one")
    return name
