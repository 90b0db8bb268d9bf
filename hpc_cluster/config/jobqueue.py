"""dask-jobqueue's configuration, read the way dask-jobqueue reads it.

A dask-jobqueue user's settings live in dask's configuration under `jobqueue.<name>`
(`jobqueue.slurm`, `jobqueue.pbs`, or the section `config_name=` names): YAML files in
dask's config directories (usually ~/.config/dask/jobqueue.yaml), DASK_JOBQUEUE__* variables
and `dask.config.set`. This module turns that section into entries of our settings table,
beneath the site config files (resolve.py), and says what it could not carry over: nothing
of a user's old setup is dropped without a word.

Pure functions over mappings, except `dask_section` and `file_section`, which read dask's
configuration and a YAML file.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..units import UnitError, parse_walltime
from .adapter_options import adapter_classes, cluster_name, declares_keywords, native_keywords, walltime_reading
from .files import Entry, load_yaml
from .schema import ConfigError, option_by_name, parse_value

# jobqueue.yaml's keys (hyphenated, as dask-jobqueue writes them) -> our core settings; the
# adapters' own settings add theirs (key_map()).
KEY_MAP = {
    "name": "job_name", "cores": "cores", "memory": "memory", "processes": "processes",
    "python": "python", "interface": "interface", "death-timeout": "death_timeout",
    "local-directory": "local_directory", "shared-temp-directory": "shared_temp_directory",
    "worker-command": "worker_command", "worker-extra-args": "worker_extra_args",
    "shebang": "shebang", "queue": "queue", "account": "account", "walltime": "walltime",
    "job-script-prologue": "job_script_prologue", "job-extra-directives": "job_extra_directives",
    "job-directives-skip": "job_directives_skip", "log-directory": "log_directory",
    "scheduler-options": "scheduler_options", "project": "account",
    # Not dask-jobqueue's (its TLS is the security= keyword), but what a user who writes it means:
    # `security: false` turns our default TLS off (issue 34).
    "security": "security",
}
# Names dask-jobqueue renamed (old -> new). As there, the old one still counts, with a
# FutureWarning, but only where the new one ends up empty.
DEPRECATED = {"project": "account", "extra": "worker_extra_args", "env_extra": "job_script_prologue",
              "job_extra": "job_extra_directives", "header_skip": "job_directives_skip"}
# ... except where it is no old name: an adapter's `native_keywords` (adapter_options.py) say
# so, e.g. where dask-jobqueue's cluster class calls its account `project` (qsub -P): there
# it is the setting itself, read without a warning.
# What dask's standard worker module means here: our worker. Not worth a note.
DEFAULT_WORKER_COMMAND = "distributed.cli.dask_worker"

# scheduler_options keys with a meaning here, and what happens to the others.
SCHEDULER_OPTIONS_USED = {"host", "port", "interface", "protocol", "security", "dashboard_address", "dashboard"}
SCHEDULER_OPTION_NOTES: dict[str, str] = {}


@dataclass
class JobqueueLayer:
    """What a jobqueue section contributes: settings, renamed keys' fallbacks, and notes."""

    entries: dict[str, Entry] = field(default_factory=dict)
    fallbacks: dict[str, Entry] = field(default_factory=dict)   # deprecated names, by new name
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def hyphenated(key: str) -> str:
    return key.replace("_", "-")


def key_map() -> dict[str, str]:
    """jobqueue.yaml's keys -> our settings: the core ones and the adapters' (their `jobqueue` key)."""
    own = {o.jobqueue_key: o.name for o in option_by_name().values() if o.owners and o.jobqueue_key}
    return {**KEY_MAP, **own}


def elsewhere(option: str, batch: str | None) -> tuple[str, ...]:
    """The batch systems `option` belongs to, when it is refused on `batch`: an adapter's own
    setting (declared to be refused elsewhere) on a batch system whose adapter declares its own
    keywords and not this one. () otherwise: a core setting, or `batch` decides for itself."""
    o = option_by_name().get(option)
    if o is None or not o.owners or batch in o.owners or o.elsewhere != "refuse" or not declares_keywords(batch):
        return ()
    return o.owners


def _old_name(old: str, batch: str | None) -> bool:
    """A name dask-jobqueue renamed, unless `batch`'s adapter calls a setting so itself."""
    return old in DEPRECATED and old not in native_keywords(batch)


def deprecation_message(old: str, new: str) -> str:
    # "X has been renamed to Y" is what dask-jobqueue users (and its tests) look for.
    return (f"{old} has been renamed to {new}. You are still using it (as a keyword or in a config "
            f"file, even if only set to []). Where {new} is empty, {old} is used for now; otherwise "
            f"it is ignored. Rename it to {new}.")


def translate(section: Mapping[str, Any], config_name: str, batch: str | None,
              label: Mapping[str, str] | None = None) -> JobqueueLayer:
    """One `jobqueue.<config_name>` section -> our entries. `label` says where each key came
    from (a file, a DASK_* variable, dask.config.set); pure."""
    out = JobqueueLayer()
    label = label or {}
    keys = key_map()
    for key, raw in section.items():
        k = hyphenated(str(key))
        where = f"jobqueue.{config_name}.{k}"
        source = f"jobqueue:{label.get(k) or label.get(str(key)) or where}"
        if raw is None:
            continue                              # null: "not set", as in dask-jobqueue
        old = k.replace("-", "_")
        if _old_name(old, batch):
            warnings.warn(deprecation_message(old, DEPRECATED[old]), FutureWarning, stacklevel=4)
            _add(out.fallbacks, out.problems, DEPRECATED[old], raw, f"{source} (renamed: {old})", where)
            continue
        option = keys.get(k)
        if option is None:
            out.notes.append(f"{where} ({source.removeprefix('jobqueue:')}) is not a setting of "
                             f"dask-jobqueue's {cluster_name(batch)} nor of ours; ignored")
            continue
        if _defaulted_elsewhere(option, raw, batch):
            continue
        if elsewhere(option, batch):
            out.notes.append(f"{where} is a {_upper(elsewhere(option, batch))} setting; "
                             f"{cluster_name(batch)} does not use it (nor does dask-jobqueue's); ignored")
            continue
        if option == "worker_command" and str(raw).strip() == DEFAULT_WORKER_COMMAND:
            continue                              # the standard worker, which is ours
        if option == "scheduler_options" and not raw:
            continue
        _add(out.entries, out.problems, option, raw, source, where, batch)
    return out


def _add(into: dict, problems: list, option: str, raw: Any, source: str, where: str,
         batch: str | None = None) -> None:
    try:
        if option == "walltime" and batch:        # read as this batch system reads it
            parse_walltime(raw, what="walltime", batch=walltime_reading(batch))
        into[option] = Entry(raw, parse_value(option, raw), source)
    except ValueError as e:
        problems.append(f"{where} ({source.removeprefix('jobqueue:')}): {e}")


def _defaulted_elsewhere(option: str, value: Any, batch: str | None) -> bool:
    """An adapter's setting at its default (with one: a bool or a list) in another batch
    system's section: dask-jobqueue's jobqueue.yaml writes every section's defaults (LSF's
    use-stdin: true in each), so there is nothing to say."""
    o = option_by_name().get(option)
    return (o is not None and bool(o.owners) and batch not in o.owners and o.default is not None
            and value == o.default)


def _upper(batches) -> str:
    return "/".join(b.upper() for b in batches)


def scheduler_option_notes(options: Mapping[str, Any]) -> list[str]:
    """What happens to each scheduler_options key we do not use."""
    notes = []
    for key in options:
        if key in SCHEDULER_OPTIONS_USED:
            continue
        what = SCHEDULER_OPTION_NOTES.get(key, "not an option of hpc-cluster's scheduler")
        notes.append(f"scheduler_options[{key!r}]: {what}; ignored")
    return notes


def merge_layers(lower: JobqueueLayer, upper: JobqueueLayer) -> JobqueueLayer:
    """`upper` wins per setting (dask's live configuration over a file a site names)."""
    return JobqueueLayer({**lower.entries, **upper.entries}, {**lower.fallbacks, **upper.fallbacks},
                         lower.notes + upper.notes, lower.problems + upper.problems)


# ---------------------------------------------------------------------------- reading

def file_section(path: str, config_name: str) -> tuple[dict, dict]:
    """(section, labels) of `jobqueue.<config_name>` in a jobqueue.yaml file."""
    path = os.path.expanduser(path)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"jobqueue_config={path!r}: cannot read it: {e.strerror}") from None
    doc = load_yaml(text, path) or {}
    section = ((doc.get("jobqueue") or {}) if isinstance(doc, Mapping) else {}).get(config_name) or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{path}: jobqueue.{config_name} must be a map of settings")
    return dict(section), {hyphenated(k): f"{path}" for k in section}


def dask_section(config_name: str) -> tuple[dict, dict]:
    """(section, labels) of `jobqueue.<config_name>` in dask's live configuration.

    dask merges its YAML files, DASK_* variables and dask.config.set into one tree and keeps
    no record of which said what; the labels are found by looking at each source again. Values
    that only dask-jobqueue's own defaults give (registered when dask_jobqueue is imported)
    are left out: they are ours too, and did not come from the user.
    """
    import dask.config

    section = dask.config.get(f"jobqueue.{config_name}", default=None) or {}
    if not isinstance(section, Mapping):
        return {}, {}
    defaults: dict = {}
    for d in dask.config.defaults:
        defaults = dask.config.merge(defaults, d)
    default_section = (defaults.get("jobqueue") or {}).get(config_name) or {}
    env = ((dask.config.collect_env().get("jobqueue") or {}).get(config_name) or {})
    files = [(p, ((list(dask.config.collect_yaml([p])) or [{}])[0].get("jobqueue") or {}).get(config_name) or {})
             for p in _dask_yaml_files()]
    out, labels = {}, {}
    for key, value in section.items():
        k = hyphenated(key)
        in_env = _lookup(env, k)
        in_file = next((p for p, sec in files if _lookup(sec, k) is not _MISSING), None)
        if in_env is not _MISSING:
            labels[k] = f"DASK_JOBQUEUE__{config_name.upper()}__{key.upper().replace('-', '_')}"
        elif in_file is not None and _lookup(dict(files)[in_file], k) == value:
            labels[k] = in_file
        elif _lookup(default_section, k) == value:
            continue                              # dask-jobqueue's default, not the user's
        else:
            labels[k] = "dask.config.set"
        out[k] = value
    return out, labels


_MISSING = object()


def _lookup(section: Mapping, key: str) -> Any:
    for k, v in section.items():
        if hyphenated(str(k)) == key:
            return v
    return _MISSING


def _dask_yaml_files() -> list[str]:
    import dask.config
    found = []
    for base in dask.config.paths:
        if os.path.isdir(base):
            found += sorted(os.path.join(base, n) for n in os.listdir(base) if n.endswith((".yaml", ".yml")))
        elif os.path.isfile(base):
            found.append(base)
    return found


def jobqueue_layer(config_name: str, batch: str | None, named_file: str | None = None) -> JobqueueLayer:
    """The jobqueue settings for one cluster: a file the site names, beneath dask's config."""
    layer = JobqueueLayer()
    if named_file:
        section, labels = file_section(named_file, config_name)
        layer = translate(section, config_name, batch, labels)
    section, labels = dask_section(config_name)
    return merge_layers(layer, translate(section, config_name, batch, labels))


# ---------------------------------------------------------------------------- importing

# The values dask-jobqueue's own jobqueue.yaml gives every section (copied into
# ~/.config/dask on first import): a section that says only these was never customized.
JOBQUEUE_DEFAULTS = {
    "name": "dask-worker", "death-timeout": 60, "worker-command": DEFAULT_WORKER_COMMAND,
    "worker-extra-args": [], "shebang": "#!/usr/bin/env bash", "walltime": "00:30:00",
    "job-script-prologue": [], "job-extra-directives": [], "job-directives-skip": [],
    "scheduler-options": {},
}


def customized(section: Mapping[str, Any], batch: str | None = None) -> dict:
    """The keys of a section that say something beyond dask-jobqueue's defaults: the core
    ones above, an adapter setting's own default (use-stdin: true), and a walltime that reads,
    as `batch` reads it, as the default half hour (dask-jobqueue writes LSF's '00:30')."""
    keys = key_map()
    table = option_by_name()
    out = {}
    for key, value in section.items():
        k = hyphenated(str(key))
        if value is None or JOBQUEUE_DEFAULTS.get(k, _MISSING) == value:
            continue
        own = table.get(keys.get(k, ""))
        if own is not None and own.owners and own.default is not None and value == own.default:
            continue
        if k == "walltime" and batch and _reads_as(value, batch) == _reads_as(JOBQUEUE_DEFAULTS[k], batch):
            continue
        out[k] = value
    return out


def _reads_as(walltime: Any, batch: str) -> float | None:
    try:
        return parse_walltime(walltime, what="walltime", batch=walltime_reading(batch))
    except UnitError:
        return None


def site_from_section(section: Mapping[str, Any], config_name: str, batch: str) -> tuple[dict, list[str]]:
    """A site (our key names, values as written) from one jobqueue section, and what could
    not be carried over. Pure: `hpc-cluster config import-jobqueue` writes the result."""
    settings: dict[str, Any] = {"batch": batch}
    notes: list[str] = []
    renamed: dict[str, Any] = {}
    keys = key_map()
    for key, value in section.items():
        k = hyphenated(str(key))
        where = f"jobqueue.{config_name}.{k}"
        if value is None:
            continue
        old = k.replace("-", "_")
        if _old_name(old, batch):
            renamed[DEPRECATED[old]] = (value, old)
            continue
        option = keys.get(k)
        if option is None:
            notes.append(f"{where}: not a setting of dask-jobqueue's {cluster_name(batch)} nor of ours; left out")
        elif _defaulted_elsewhere(option, value, batch):
            continue
        elif elsewhere(option, batch):
            notes.append(f"{where}: a {_upper(elsewhere(option, batch))} setting; left out")
        elif option == "worker_command" and str(value).strip() == DEFAULT_WORKER_COMMAND:
            continue
        elif option == "scheduler_options":
            if value:
                settings[option] = dict(value)
                notes += [f"{where}: {n}" for n in scheduler_option_notes(value)]
        else:
            try:
                if option == "walltime":                  # as this batch system reads it
                    parse_walltime(value, what="walltime", batch=walltime_reading(batch))
                parse_value(option, value)
            except ValueError as e:
                notes.append(f"{where}: {e}; left out")
                continue
            settings[option] = value
    for new, (value, old) in renamed.items():
        if not settings.get(new):
            settings[new] = value
            notes.append(f"jobqueue.{config_name}.{hyphenated(old)}: renamed to {new} (dask-jobqueue renamed it too)")
        else:
            notes.append(f"jobqueue.{config_name}.{hyphenated(old)}: ignored, {new} is set (as in dask-jobqueue)")
    return settings, notes


OTHER_SECTIONS = ("oar", "moab", "local")


def import_jobqueue(tree: Mapping[str, Any], batches: Mapping[str, str] | None = None
                    ) -> tuple[dict[str, dict], list[str]]:
    """Sites from a whole `jobqueue:` tree: one per section of an installed batch system (named
    after it, as dask-jobqueue names them) that says more than dask-jobqueue's defaults, and
    notes on everything left behind, sections of other batch systems included. `batches` names
    the batch system of sections with names of the user's own."""
    sites: dict[str, dict] = {}
    notes: list[str] = []
    batches = batches or {}
    installed = sorted(adapter_classes())
    for name, section in tree.items():
        if not isinstance(section, Mapping):
            notes.append(f"jobqueue.{name}: not a map of settings; left out")
            continue
        batch = batches.get(name) or (name if name in installed else None) or (
            None if name in OTHER_SECTIONS else _batch_of_custom(section))
        if batch is None:
            if not customized(section):
                continue
            if name in OTHER_SECTIONS:
                notes.append(f"jobqueue.{name}: hpc-cluster has no {name.upper()} adapter yet; its settings "
                             f"({', '.join(customized(section))}) were left out")
            else:
                notes.append(f"jobqueue.{name}: cannot tell which batch system it is for; name it with "
                             f"--section {name}=BATCH (installed: {', '.join(installed)})")
            continue
        if not customized(section, batch):
            # A section as dask-jobqueue's jobqueue.yaml writes it (every user's has one of each
            # batch system) is no site.
            continue
        sites[name], site_notes = site_from_section(section, name, batch)
        notes += site_notes
    return sites, notes


def _batch_of_custom(section: Mapping[str, Any]) -> str | None:
    """A section under a name of the user's own (config_name=...): the batch system whose own
    settings it gives (of several that share them, the first by name), else None."""
    keys, table = key_map(), option_by_name()
    owners = None
    for key in section:
        o = table.get(keys.get(hyphenated(str(key)), ""))
        if o is not None and o.owners:
            owners = set(o.owners) if owners is None else owners & set(o.owners)
    return min(owners) if owners else None
