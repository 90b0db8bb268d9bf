"""Merging the settings of one site: keyword arguments > HPC_CLUSTER_<KEY> variables >
config files (earlier file in the lookup order wins per key; inside one file a site's own
entry wins over `settings`) > the defaults in the settings table. See docs/configuration.md.

`resolve()` is what the cluster classes and the CLI call; the merge itself is pure.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from ..plugins import LOCAL
from ..units import UnitError, format_memory, format_walltime, parse_walltime
from .files import CONFIG_FILENAME, ConfigFile, Entry, _flow, find_config_files, load_config_files  # noqa: F401
from .adapter_options import multi_node, native_keywords, resolve_hook, walltime_reading
from .jobqueue import DEPRECATED, deprecation_message, elsewhere, jobqueue_layer, scheduler_option_notes
from .pools import Pool, resolve_pools
from .schema import ConfigError, Option, canonical_key, did_you_mean, option_by_name, options, parse_value

ENV_PREFIX = "HPC_CLUSTER_"

# HPC_CLUSTER_* names that are not settings: the config machinery's own, and the ones our
# job scripts and processes export at run time. Any other HPC_CLUSTER_* variable must be
# a setting; an unknown one is refused, because a typo would otherwise do nothing.
ENV_META = {"CONFIG", "SITE", "SYSTEM_CONFIG_DIR"}
ENV_RUNTIME = {"SECRET", "JOB_ID", "JOB_START", "JOB_WALLTIME", "WORKER_STATUS", "WORKER_INDEX",
               "INLINE_TASKS", "INLINE_BELOW",   # read by each worker (worker/inline.py), not a cluster's setting
               "DEBUG_STATE"}     # read by the scheduler (scheduler/server.py), not a cluster's setting

# ---------------------------------------------------------------------------- env and keywords

def _env_text_to_value(opt: Option, text: str) -> Any:
    # Strings stay strings ('01:00:00' would be read by YAML 1.1 as 3600, 'no' as False);
    # numbers, booleans, lists and maps are parsed as YAML.
    if opt.kind in ("str", "path", "size", "duration") or "|" in opt.kind:
        return text
    if opt.kind == "seconds":
        try:
            return float(text)
        except ValueError:
            return text
    return yaml.safe_load(text)


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Entry]:
    """Settings from HPC_CLUSTER_<KEY> variables. Unknown HPC_CLUSTER_* names are refused."""
    environ = os.environ if environ is None else environ
    out: dict[str, Entry] = {}
    problems: list[str] = []
    valid = [ENV_PREFIX + o.name.upper() for o in options()]
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX):
            continue
        suffix = var[len(ENV_PREFIX):]
        if suffix in ENV_META or suffix in ENV_RUNTIME:
            continue
        name = canonical_key(suffix.lower())
        if name is None:
            problems.append(f"environment variable {var} is not a setting" + did_you_mean(var, valid)
                            + " (unset it, or see docs/configuration.md for the names)")
            continue
        text = environ[var]
        if text.strip() == "":
            problems.append(f"environment variable {var} is set but empty; unset it or give a value")
            continue
        try:
            raw = _env_text_to_value(option_by_name()[name], text)
            out[name] = Entry(text, parse_value(name, raw), f"env:{var}")
        except yaml.YAMLError:
            problems.append(f"environment variable {var}={text!r} is not valid YAML for a {option_by_name()[name].kind}")
        except ValueError as e:
            problems.append(f"environment variable {var}: {e}")
    if problems:
        raise ConfigError(problems)
    return out


def check_keywords(kwargs: Mapping[str, Any]) -> dict[str, Entry]:
    """Validate keyword arguments. None means "not given" (cluster classes pass their defaults)."""
    out: dict[str, Entry] = {}
    problems: list[str] = []
    for key, raw in kwargs.items():
        name = canonical_key(key) if "-" not in key else None
        if name is None:
            problems.append(f"unknown keyword '{key}'" + did_you_mean(key, list(option_by_name())))
            continue
        if raw is None:
            continue
        try:
            out[name] = Entry(raw, parse_value(name, raw), "keyword")
        except ValueError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError(problems)
    return out


# ---------------------------------------------------------------------------- merging

@dataclass
class ResolvedConfig:
    """The merged settings of one site.

    `values` are parsed (memory and other sizes in bytes, walltime and other durations in
    seconds, paths with ~ expanded); `raw` holds each value as written, for display;
    `sources` says where each came from: "default", "file:/path:line", "env:HPC_CLUSTER_X"
    or "keyword".
    """

    site: str | None
    values: dict[str, Any]
    raw: dict[str, Any]
    sources: dict[str, str]
    files: list[str] = field(default_factory=list)
    site_source: str = "none"
    # Settings from the user's old setup that have no meaning here, each with what happens
    # instead: the cluster classes warn with them, `config show` prints them.
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def pools(self) -> dict[str, Pool]:
        """Each pool's full settings ("default", the cluster's own, first); config/pools.py."""
        try:
            return resolve_pools(self.values, self.raw, self.sources, self.values.get("batch"))
        except ValueError as e:
            raise ConfigError(f"{e} ({self.sources.get('pools', 'pools')})") from None

    def table(self) -> str:
        """A readable table: key, value as written (and parsed, where that differs), source."""
        rows = [("key", "value", "source")]
        for o in options():
            raw, value = self.raw[o.name], self.values[o.name]
            if raw is None and value is not None:
                raw = value                   # worked out, not written (processes from cores)
            shown = "-" if raw is None else raw if isinstance(raw, str) else _flow(raw)
            if value is not None and o.kind == "size" and str(raw) != str(value):
                shown += f"  (= {format_memory(value)})"
            elif value is not None and o.kind == "duration" and str(raw) != format_walltime(value):
                shown += f"  (= {format_walltime(value)})"
            elif value is not None and o.kind == "seconds" and isinstance(raw, str):
                shown += f"  (= {value:g} s)"
            rows.append((o.name, str(shown).strip(), self.sources[o.name]))
        w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
        return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows)


def select_site(files: list[ConfigFile], site: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """Which site to use, and why: site= > $HPC_CLUSTER_SITE > first `default` > the only site."""
    available = sorted({name for f in files for name in f.sites})
    where = ", ".join(f.path for f in files) or "no config files"
    if site is not None:
        chosen, why = site, "keyword"
    elif environ.get("HPC_CLUSTER_SITE"):
        chosen, why = environ["HPC_CLUSTER_SITE"], "env:HPC_CLUSTER_SITE"
    else:
        default = next((f.default for f in files if f.default is not None), None)
        if default is not None:
            chosen, why = default.value, default.source
        elif len(available) == 1:
            return available[0], "the only site"
        elif available:
            raise ConfigError(f"sites {', '.join(available)} are defined in {where} but none is the "
                              "default; pass site=NAME (--site NAME) or add 'default: NAME'")
        else:
            return None, "none"
    if chosen not in available:
        raise ConfigError(f"no site '{chosen}' (from {why}) in {where}; available sites: "
                          f"{', '.join(available) or 'none'}" + did_you_mean(chosen, available))
    return chosen, why


def merge(files: list[ConfigFile], site: str | None, env: Mapping[str, Entry],
          keywords: Mapping[str, Entry], jobqueue: Mapping[str, Entry] | None = None) -> dict[str, Entry]:
    """Pure merge: keywords > env > files (earlier wins; in a file, site > settings) >
    dask-jobqueue's configuration (jobqueue.py) > default."""
    merged: dict[str, Entry] = {}
    for o in options():
        entry = keywords.get(o.name) or env.get(o.name)
        if entry is None:
            for f in files:
                entry = f.sites.get(site, {}).get(o.name) or f.settings.get(o.name)
                if entry is not None:
                    break
        if entry is None and jobqueue:
            entry = jobqueue.get(o.name)
        if entry is None:
            parsed = None if o.default is None else o.check(o.name, o.default)
            entry = Entry(o.default, parsed, "default")
        merged[o.name] = entry
    return merged


def resolve(site: str | None = None, config: str | os.PathLike | None = None, *,
            environ: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
            jobqueue: bool = True, **kwargs) -> ResolvedConfig:
    """Find, read, validate and merge everything for one site. Raises ConfigError.

    With a batch system (slurm, pbs) known, dask-jobqueue's configuration for it is read
    beneath the site files (`jobqueue=False`: not). `environ` and `cwd` default to the
    process's; tests pass their own.
    """
    environ = os.environ if environ is None else environ
    for native, setting in native_keywords(kwargs.get("batch")).items():   # SGECluster(project=...)
        if kwargs.get(native) is not None:
            if kwargs.get(setting) is not None:
                raise ConfigError([f"{native}={kwargs[native]!r} and {setting}="
                                   f"{kwargs[setting]!r} name one setting; give only {native}"])
            kwargs[setting] = kwargs.pop(native)
    renamed = {old: kwargs.pop(old) for old in list(kwargs) if old in DEPRECATED}
    keywords = check_keywords(kwargs)        # cheapest mistakes first: a typo in the call
    fallbacks = renamed_keywords(renamed)
    files = load_config_files(find_config_files(config, environ, cwd))
    env = env_overrides(environ)
    chosen, why = select_site(files, site, environ)
    merged = merge(files, chosen, env, keywords)
    batch = merged["batch"].value
    notes: list[str] = []
    if jobqueue and batch not in (None, LOCAL):
        layer = jobqueue_layer(merged["config_name"].value or batch, batch, merged["jobqueue_config"].value)
        if layer.problems:
            raise ConfigError(layer.problems)
        merged = merge(files, chosen, env, keywords, layer.entries)
        fallbacks = {**layer.fallbacks, **fallbacks}
        notes += layer.notes
    for option, entry in fallbacks.items():
        if not merged[option].value:          # the renamed key counts only where the new one is empty
            merged[option] = entry
    finish(merged, batch, environ)
    notes += scheduler_option_notes(merged["scheduler_options"].value or {})
    resolved = ResolvedConfig(site=chosen, values={k: e.value for k, e in merged.items()},
                              raw={k: e.raw for k, e in merged.items()},
                              sources={k: e.source for k, e in merged.items()},
                              files=[f.path for f in files], site_source=why, notes=notes)
    resolved.pools()                         # a pool's walltime or split is checked now, not at submission
    return resolved


def renamed_keywords(renamed: Mapping[str, Any]) -> dict[str, Entry]:
    """dask-jobqueue's renamed keywords (extra=, env_extra= ...): a FutureWarning each, as
    there, and an entry for the new name that counts only where the new one ends up empty."""
    out, problems = {}, []
    for old, raw in renamed.items():
        if raw is None:
            continue
        new = DEPRECATED[old]
        warnings.warn(deprecation_message(old, new), FutureWarning, stacklevel=4)
        try:
            out[new] = Entry(raw, parse_value(new, raw), f"keyword ({old}, renamed)")
        except ValueError as e:
            problems.append(f"{old} (renamed to {new}): {e}")
    if problems:
        raise ConfigError(problems)
    return out


def default_processes(cores: int) -> int:
    """dask-jobqueue's split of a job's cores into worker processes: one per core up to 4,
    else the smallest divisor of `cores` not below its square root (so processes and threads
    per process come out about equal: 16 -> 4 x 4, 6 -> 3 x 2, 12 -> 4 x 3)."""
    if cores <= 4:
        return cores
    return min(f for f in range(1, cores + 1) if cores % f == 0 and f * f >= cores)


def finish(merged: dict[str, Entry], batch: str | None, environ: Mapping[str, str]) -> None:
    """What needs the whole picture: the walltime read as this batch system reads it, the
    processes split when none was given, and settings that belong to another batch system."""
    problems = []
    wall = merged["walltime"]
    try:
        seconds = parse_walltime(wall.raw, what="walltime", batch=walltime_reading(batch))
        merged["walltime"] = Entry(wall.raw, seconds, wall.source)
    except UnitError as e:
        problems.append(f"{e} ({wall.source})")
    sched_wall = merged["scheduler_job_walltime"]
    if sched_wall.raw is not None:
        try:
            seconds = parse_walltime(sched_wall.raw, what="scheduler_job_walltime",
                                     batch=walltime_reading(batch))
            merged["scheduler_job_walltime"] = Entry(sched_wall.raw, seconds, sched_wall.source)
        except UnitError as e:
            problems.append(f"{e} ({sched_wall.source})")
    in_job = merged["scheduler_in_job"]
    if in_job.value and batch == "local":
        problems.append(f"scheduler_in_job: true ({in_job.source}) needs a batch system to submit the scheduler "
                        "to, and this site has batch: local; set batch: slurm or batch: pbs, or remove "
                        "scheduler_in_job")
    elif in_job.value and not merged["journal"].value:
        problems.append(f"scheduler_in_job: true ({in_job.source}) needs journal: true ({merged['journal'].source}): "
                        "the scheduler job hands its tasks and worker jobs to its successor through the journal "
                        "before its walltime; remove journal: false, or scheduler_in_job")
    elif in_job.value and merged["ssh"].value:
        problems.append(f"scheduler_in_job: true ({in_job.source}) with ssh is not supported yet: the scheduler "
                        "job's plan and cluster file would have to be on the login node; run `hpc-cluster up "
                        "--scheduler-in-job` on the login node itself, or remove one of them")
    fast, steady = merged["poll_interval_fast"], merged["poll_interval"]
    if fast.value > steady.value:
        problems.append(f"poll_interval_fast={fast.value:g} ({fast.source}) is longer than poll_interval="
                        f"{steady.value:g} ({steady.source}): the fast pace is for jobs starting or ending; "
                        "lower poll_interval_fast or raise poll_interval")
    cores, processes = merged["cores"].value, merged["processes"].value
    if processes is None and cores is not None:
        merged["processes"] = Entry(None, default_processes(cores), "default:sqrt(cores)")
    elif processes is not None and cores is not None and processes > cores:
        problems.append(f"processes={processes} with cores={cores} leaves a worker without a core: ask for "
                        f"cores={processes} or more, or processes={cores} or fewer")
    nodes = merged.get("nodes")
    if nodes is not None and (nodes.value or 1) > 1 and batch and not multi_node(batch):
        problems.append(nodes_elsewhere(nodes.value, nodes.source, batch))
    for option, entry in merged.items():
        # Another batch system's own setting (adapters declare theirs; adapter_options.py).
        owners = elsewhere(option, batch) if entry.value is not None else ()
        if owners:
            problems.append(f"{option} ({entry.source}) is a {'/'.join(b.upper() for b in owners)} setting; "
                            f"on {batch.upper()} use {option_by_name()[option].instead}")
    hook = resolve_hook(batch)
    if hook is not None:
        # The batch system's own rules over the whole picture (HTCondor's required disk, PBS's
        # $PBS_ACCOUNT): settings it works out, or a ValueError that says what to write.
        try:
            worked_out = hook({k: e.value for k, e in merged.items()}, environ)
        except ValueError as e:
            problems.append(str(e))
        else:
            for option, (value, source) in (worked_out or {}).items():
                merged[option] = Entry(value, value, source)
    if problems:
        raise ConfigError(problems)


def nodes_elsewhere(nodes: int, source: str, batch: str) -> str:
    """The refusal of nodes= > 1 on a batch system whose jobs cannot span nodes (adapters' `multi_node`)."""
    return (f"nodes={nodes} ({source}): one job over several nodes is supported with SLURM (SLURMCluster(nodes=...), "
            f"docs/slurm.md); with {str(batch).upper()} ask for one job per node instead: remove nodes= and ask for "
            f"{nodes} times the jobs (scale(jobs=N), or n_workers / `hpc-cluster up --workers` counted in jobs of "
            "`processes` workers)")


# ---------------------------------------------------------------------------- starter file

def starter_config(batch: str = "local", site: str = "mysite", queue: str | None = None,
                   note: str = "") -> str:
    """A commented starter file generated from the settings table. Pure; `config init` writes it."""
    active = {"batch": batch, "cores": 1, "memory": "1GB", "walltime": "01:00:00"}
    if queue:
        active["queue"] = queue
    lines = [
        "# hpc-cluster configuration: docs/configuration.md lists every key.",
        "# Check it with `hpc-cluster config check`; see the merged result with `config show`.",
        "# Values here are overridden by HPC_CLUSTER_<KEY> variables and by keyword arguments.",
    ]
    if note:
        lines.append(f"# {note}")
    lines += [f"default: {site}", "sites:", f"  {site}:"]
    for o in options():
        if o.scope != "site":
            continue
        if o.name in active:
            lines.append(f"    {o.name}: {_flow(active[o.name])}   # {o.help}")
        else:
            shown = o.example if o.default is None else o.default
            lines.append(f"    # {o.name}: {_flow(shown)}   # {o.help}")
    lines += ["# Scheduler and nanny knobs, for every site (a site may also set them):",
              "settings:"]
    for o in options():
        if o.scope == "both":
            shown = o.example if o.default is None else o.default
            lines.append(f"  # {o.name}: {_flow(shown)}   # {o.help}")
    return "\n".join(lines) + "\n"
