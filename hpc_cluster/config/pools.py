"""Worker pools and the escalation policy: `pools:` and `escalate:` (keywords, site YAML).

A cluster has a pool named "default": its own job spec. Extra pools name what differs
from it (memory, walltime, queue, ...) plus their own policy (`max_jobs`, `escalation_only`,
jobs to start with); everything they do not name is the cluster's. `check_pools` and
`check_escalate` are the settings table's validators (schema.py); `resolve_pools` makes
each pool's full settings once the cluster's are merged (it needs the batch system to read
a walltime). Pure: no I/O.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..units import UnitError, parse_walltime
from .adapter_options import walltime_reading

DEFAULT_POOL = "default"

# The cluster's settings a pool may change: what its job script and worker command are made of,
# and the adapters' own settings declared `per_pool` (inserted after job_script_epilogue).
POOL_JOB_KEYS = ("cores", "memory", "processes", "walltime", "queue", "account", "job_name",
                 "job_extra_directives", "job_directives_skip", "job_script_prologue", "job_script_epilogue",
                 "worker_extra_args", "env", "memory_limit", "local_directory", "nanny")
# A pool's own policy.
POOL_OWN_KEYS = ("max_jobs", "escalation_only", "n_workers", "jobs", "resources")
# What the default pool (the cluster's own spec) may say under pools: its policy alone.
DEFAULT_POOL_KEYS = ("max_jobs",)

ESCALATE_DEFAULTS = {"memory": True, "walltime": True, "margin": 1.5}

_POOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class PoolKeyError(ValueError):
    """A bad key or value in a pool, with the line of that key when it came from a file."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


def _hint(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def parse_resources(key: str, v: Any) -> dict[str, float]:
    """'GPU=2 MEM=10e9' (or a map {GPU: 2}) -> {'GPU': 2.0, 'MEM': 1e10}, as --resources reads it."""
    if isinstance(v, Mapping):
        items = list(v.items())
    elif isinstance(v, str):
        items = []
        for item in filter(None, v.replace(",", " ").split()):
            name, eq, value = item.partition("=")
            if not name or not eq:
                raise ValueError(f"{key}={v!r}: {item!r} is not NAME=NUMBER; write e.g. 'GPU=2' or {{GPU: 2}}")
            items.append((name, value))
    else:
        raise ValueError(f"{key}={v!r} must be 'NAME=NUMBER ...' or a map, e.g. 'GPU=2' or {{GPU: 2}}")
    out = {}
    for name, value in items:
        try:
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not math.isfinite(number) or number < 0:
                raise ValueError
        except (TypeError, ValueError):
            raise ValueError(f"{key}: {name}={value!r} must be a number >= 0, e.g. GPU=2") from None
        out[str(name)] = number
    return out


def resources_flag(resources: Mapping[str, float]) -> str:
    """{'GPU': 2.0} -> 'GPU=2' (the worker's --resources value)."""
    return " ".join(f"{k}={v:g}" for k, v in resources.items())


def _count(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{key}={v!r} must be a whole number >= 0")
    return v


def _own(key: str, sub: str, v: Any) -> Any:
    if sub == "max_jobs":
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{key}={v!r} must be a whole number >= 0 (the most jobs this pool may have at "
                             "once), or null for no limit")
        return v
    if sub == "escalation_only":
        if not isinstance(v, bool):
            raise ValueError(f"{key}={v!r} must be true or false")
        return v
    if sub in ("n_workers", "jobs"):
        return _count(key, v)
    return parse_resources(key, v)


def pool_job_keys(options: Mapping[str, Any]) -> tuple[str, ...]:
    """POOL_JOB_KEYS with the adapters' settings a pool may set (`per_pool`) among them."""
    at = POOL_JOB_KEYS.index("job_script_epilogue") + 1
    own = tuple(name for name, o in options.items() if getattr(o, "per_pool", False))
    return POOL_JOB_KEYS[:at] + own + POOL_JOB_KEYS[at:]


def check_pools(key: str, v: Any, options: Mapping[str, Any], canonical) -> dict[str, dict[str, Any]]:
    """`pools`: {name: {key: value}} -> the same, each value parsed by the settings table's own
    validator (`options`: name -> Option; `canonical`: schema.canonical_key). Errors name the
    pool, the key and what to write instead."""
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ValueError(f"{key}={v!r} must be a map of pool names to settings, e.g. "
                         "{bigmem: {memory: 64GB, queue: bigmem}}")
    allowed = pool_job_keys(options) + POOL_OWN_KEYS
    out: dict[str, dict[str, Any]] = {}
    for name, block in v.items():
        line = getattr(v, "lines", {}).get(name)
        if not isinstance(name, str) or not _POOL_NAME.match(name):
            raise PoolKeyError(f"{key}: pool name {name!r} must be letters, digits, '_', '.' or '-' (it is "
                               "given to the worker as --pool NAME and to `hpc-cluster up --pool NAME=N`)", line)
        if block is None:
            block = {}
        if not isinstance(block, Mapping):
            raise PoolKeyError(f"{key}.{name}={block!r} must be a map of settings, e.g. {{memory: 64GB}}", line)
        parsed: dict[str, Any] = {}
        for sub, raw in block.items():
            where = f"{key}.{name}.{sub}"
            sub_line = getattr(block, "lines", {}).get(sub, line)
            canon = sub if sub in POOL_OWN_KEYS else canonical(str(sub).replace("-", "_"))
            if canon not in allowed:
                raise PoolKeyError(f"unknown key '{sub}' in pool '{name}'" + _hint(str(sub), allowed)
                                   + f" (a pool takes: {', '.join(allowed)})", sub_line)
            if name == DEFAULT_POOL and canon not in DEFAULT_POOL_KEYS:
                raise PoolKeyError(f"{where}: the pool 'default' is the cluster's own job spec; set {canon}= on "
                                   "the cluster itself (a keyword or the site's key), or give this pool another "
                                   f"name (under 'default' only {', '.join(DEFAULT_POOL_KEYS)} may go)", sub_line)
            if canon in parsed:
                raise PoolKeyError(f"{where}: given twice in pool '{name}' (as '{sub}' and another spelling); "
                                   "keep one", sub_line)
            try:
                if canon in POOL_OWN_KEYS:
                    parsed[canon] = _own(where, canon, raw)
                elif raw is None:
                    continue
                else:
                    parsed[canon] = options[canon].check(where, raw)
            except ValueError as e:
                raise PoolKeyError(f"pool '{name}': {e}", sub_line) from None
        if "n_workers" in parsed and "jobs" in parsed:
            raise PoolKeyError(f"{key}.{name}: give n_workers or jobs (how many to start with), not both", line)
        out[name] = parsed
    return out


def check_escalate(key: str, v: Any) -> dict[str, Any]:
    """`escalate`: {memory: true, walltime: true, margin: 1.5}; keys left out keep those defaults."""
    if isinstance(v, bool):               # escalate: false turns both off
        return {**ESCALATE_DEFAULTS, "memory": v, "walltime": v}
    if not isinstance(v, Mapping):
        raise ValueError(f"{key}={v!r} must be a map like {{memory: true, walltime: true, margin: 1.5}}, "
                         "or false to turn escalation off")
    out = dict(ESCALATE_DEFAULTS)
    for sub, value in v.items():
        if sub not in ESCALATE_DEFAULTS:
            raise ValueError(f"unknown key '{sub}' in {key}" + _hint(str(sub), ESCALATE_DEFAULTS)
                             + f" (allowed: {', '.join(ESCALATE_DEFAULTS)})")
        if sub == "margin":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 100:
                raise ValueError(f"{key}.margin={value!r} must be a number >= 1, e.g. 1.5 (a task that peaked at "
                                 "4 GB then needs a pool of at least 6 GB)")
            out[sub] = float(value)
        else:
            if not isinstance(value, bool):
                raise ValueError(f"{key}.{sub}={value!r} must be true or false")
            out[sub] = value
    return out


@dataclass
class Pool:
    """One pool: the cluster's settings with its own changes, and its policy."""

    name: str
    values: dict[str, Any]                  # every setting, as the cluster's `values` (parsed)
    max_jobs: int | None = None
    escalation_only: bool = False
    start_jobs: int = 0                     # jobs submitted when the cluster starts
    resources: dict[str, float] = field(default_factory=dict)
    given: tuple[str, ...] = ()             # the keys the pool set itself


def _default_processes(cores: int) -> int:
    if cores <= 4:
        return cores
    return min(f for f in range(1, cores + 1) if cores % f == 0 and f * f >= cores)


def resolve_pools(values: Mapping[str, Any], raw: Mapping[str, Any], sources: Mapping[str, str],
                  batch: str | None) -> dict[str, Pool]:
    """The cluster's pools, "default" first: each pool's full settings (walltime read as
    `batch` reads it, processes and memory_limit worked out anew where the pool changes what
    they come from). Raises ValueError naming the pool and key."""
    pools = dict(values.get("pools") or {})
    own_default = pools.pop(DEFAULT_POOL, {})
    out = {DEFAULT_POOL: Pool(DEFAULT_POOL, dict(values), max_jobs=own_default.get("max_jobs"))}
    raw_pools = raw.get("pools") or {}
    for name, given in pools.items():
        v = dict(values)
        v.update({k: x for k, x in given.items() if k not in POOL_OWN_KEYS})   # check_pools let only these by
        if "walltime" in given:
            written = (raw_pools.get(name) or {}).get("walltime", given["walltime"])
            try:
                v["walltime"] = parse_walltime(written, what=f"pools.{name}.walltime",
                                               batch=walltime_reading(batch))
            except UnitError as e:
                raise ValueError(f"pool '{name}': {e}") from None
        if "cores" in given and "processes" not in given:
            # The cluster's split was worked out from its cores: work this pool's out from its own.
            derived = str(sources.get("processes", "")).startswith("default")
            v["processes"] = _default_processes(v["cores"]) if derived else values["processes"]
        if v["processes"] is not None and v["cores"] is not None and v["processes"] > v["cores"]:
            raise ValueError(f"pool '{name}': processes={v['processes']} with cores={v['cores']} leaves a worker "
                             f"without a core: give the pool processes <= {v['cores']} or more cores")
        if "memory_limit" not in given and ("memory" in given or "processes" in given or "cores" in given):
            v["memory_limit"] = None          # memory / processes of this pool, not the cluster's budget
        processes = v["processes"] or 1
        if "jobs" in given:
            start = given["jobs"]
        else:
            start = math.ceil(given.get("n_workers", 0) / processes)
        resources = given.get("resources", {})
        if resources:
            v["worker_extra_args"] = list(v["worker_extra_args"]) + ["--resources", resources_flag(resources)]
        out[name] = Pool(name, v, max_jobs=given.get("max_jobs"), escalation_only=given.get("escalation_only", False),
                         start_jobs=start, resources=dict(resources), given=tuple(given))
        if out[name].max_jobs is not None and start > out[name].max_jobs:
            raise ValueError(f"pool '{name}': starts with {start} job(s) but max_jobs={out[name].max_jobs}; "
                             f"lower n_workers/jobs or raise max_jobs")
    return out
