"""Site configuration: config files, HPC_CLUSTER_* environment variables, keyword arguments.

The settings themselves (names, validators, defaults, help) are one table, `OPTIONS`, in
config_schema.py; this module finds, reads and merges. Import both from here.

Precedence, highest first: keyword arguments > HPC_CLUSTER_<KEY> > config files
(earlier file in the lookup order wins per key; inside one file a site's own entry wins
over `settings`) > the defaults in OPTIONS. See docs/configuration.md.

Parsing and validation are pure functions over text and mappings; only `find_config_files`
and `load_config_files` touch the file system, so tests need no real /etc or $HOME.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..units import format_memory, format_walltime
from .config_schema import (ALIASES, OPTION_BY_NAME, OPTIONS, SETTINGS_NAMES,  # noqa: F401
                            TOP_LEVEL_KEYS, ConfigError, Option, _LineError, canonical_key,
                            default_values, did_you_mean, options_markdown, parse_value)

__all__ = [
    "ConfigError", "ConfigFile", "Entry", "Option", "OPTIONS", "OPTION_BY_NAME", "ResolvedConfig",
    "candidate_paths", "check_keywords", "default_values", "env_overrides", "find_config_files",
    "load_config_files", "merge", "options_markdown", "parse_config_text", "parse_value",
    "resolve", "select_site", "starter_config", "system_config_dir", "user_config_dir",
]

# Admins put the lab's shared file here; the env var exists so tests (and sites that
# cannot write /etc) can point elsewhere.
SYSTEM_CONFIG_DIR = "/etc/hpc-cluster"
CONFIG_FILENAME = "config.yaml"
CWD_FILENAME = "hpc-cluster.yaml"
ENV_PREFIX = "HPC_CLUSTER_"

# HPC_CLUSTER_* names that are not settings: the config machinery's own, and the ones our
# job scripts and processes export at run time. Any other HPC_CLUSTER_* variable must be
# a setting; an unknown one is refused, because a typo would otherwise do nothing.
ENV_META = {"CONFIG", "SITE", "SYSTEM_CONFIG_DIR"}
ENV_RUNTIME = {"SECRET", "JOB_ID", "JOB_START", "JOB_WALLTIME", "WORKER_STATUS"}


# ---------------------------------------------------------------------------- YAML with lines

class _Map(dict):
    """A mapping from YAML that remembers its own line and each key's line (1-based)."""

    line: int = 1
    lines: dict


class _LineLoader(yaml.SafeLoader):
    pass


class _ShapeError(yaml.constructor.ConstructorError):
    """Valid YAML that we still refuse (a key given twice, a non-text key)."""


def _construct_map(loader, node):
    # Duplicate keys are checked before merge keys (<<) are flattened: YAML itself lets
    # the last one win silently, and a setting that silently does nothing is what we refuse.
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value != "<<":
            if key_node.value in seen:
                raise _ShapeError(
                    None, None, f"key '{key_node.value}' appears twice (first on line "
                    f"{seen[key_node.value]}); keep one", key_node.start_mark)
            seen[key_node.value] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    data = _Map()
    data.line = node.start_mark.line + 1
    data.lines = {}
    yield data
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise _ShapeError(None, None, f"key {key!r} must be a name (text)", key_node.start_mark)
        data[key] = loader.construct_object(value_node, deep=True)
        data.lines[key] = key_node.start_mark.line + 1


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML text; mappings come back as `_Map`s with line numbers."""
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f", line {mark.line + 1}" if mark else ""
        if isinstance(e, _ShapeError):
            raise ConfigError(f"{source}{line}: {e.problem}") from None
        what = " ".join(p for p in (e.context, e.problem) if p)
        raise ConfigError(f"{source}{line}: not valid YAML: {what} (check the indentation "
                          "there, and quote values that contain ': ' or start with a special "
                          "character)") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from None


def _plain(value: Any) -> Any:
    # _Map is a dict subclass that yaml's SafeDumper refuses to write.
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _flow(value: Any) -> str:
    """One-line YAML for a value: `[a, b]`, `{host: x}`, `'01:00:00'`."""
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=10**6).strip()
    return text.removesuffix("...").strip()


# ---------------------------------------------------------------------------- one file

@dataclass
class Entry:
    raw: Any            # as written (for display)
    value: Any          # parsed and validated
    source: str         # "file:/path:line", "env:HPC_CLUSTER_X", "keyword", "default"


@dataclass
class ConfigFile:
    path: str
    default: Entry | None = None
    sites: dict[str, dict[str, Entry]] = field(default_factory=dict)
    settings: dict[str, Entry] = field(default_factory=dict)


def _validate_block(block: Any, path: str, where: str, allowed: set[str], problems: list[str],
                    base_dir: str | None) -> dict[str, Entry]:
    """Validate one site (or the settings block): names, values, lines."""
    if block is None:
        return {}
    line0 = getattr(block, "line", 1)
    if not isinstance(block, Mapping):
        problems.append(f"{path}, line {line0}: {where} must be a map of settings, not {block!r}")
        return {}
    out: dict[str, Entry] = {}
    given: dict[str, str] = {}
    for key, raw in block.items():
        line = block.lines.get(key, line0) if isinstance(block, _Map) else line0
        name = canonical_key(key)
        if name is None:
            problems.append(f"{path}, line {line}: unknown key '{key}' in {where}"
                            + (did_you_mean(key, list(OPTION_BY_NAME) + list(ALIASES)) or
                               "; see docs/configuration.md for the keys"))
            continue
        if name not in allowed:
            problems.append(f"{path}, line {line}: '{key}' cannot go in {where}; only the scheduler "
                            f"and nanny knobs can ({', '.join(SETTINGS_NAMES)}): put it in a site")
            continue
        if name in given:
            problems.append(f"{path}, line {line}: '{key}' and '{given[name]}' in {where} are the "
                            "same setting; keep one")
            continue
        given[name] = key
        try:
            value = parse_value(name, raw)
        except _LineError as e:
            problems.append(f"{path}, line {e.line or line}: {e} in {where}")
            continue
        except ValueError as e:
            problems.append(f"{path}, line {line}: {e}")
            continue
        if name == "template" and base_dir and not os.path.isabs(value):
            # A site template ships next to the site file, so resolve it from there.
            value = os.path.join(base_dir, value)
        out[name] = Entry(raw, value, f"file:{path}:{line}")
    return out


def parse_config_text(text: str, path: str = "<string>") -> ConfigFile:
    """Parse and validate one config file's text. Raises ConfigError listing every problem."""
    doc = load_yaml(text, path)
    cf = ConfigFile(path)
    if doc is None:
        return cf                       # an empty file is a valid, empty config
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{path}, line 1: the file must be a map with 'default', 'sites' "
                          f"and 'settings' keys, not a {type(doc).__name__}")
    problems: list[str] = []
    base_dir = os.path.dirname(os.path.abspath(path)) if not path.startswith("<") else None
    for key in doc:
        line = doc.lines.get(key, 1)
        if key in TOP_LEVEL_KEYS:
            continue
        if canonical_key(key):
            problems.append(f"{path}, line {line}: '{key}' must be inside a site (under "
                            "'sites: NAME:') or, for scheduler/nanny knobs, under 'settings'")
        else:
            problems.append(f"{path}, line {line}: unknown top-level key '{key}'"
                            + (did_you_mean(key, TOP_LEVEL_KEYS) or
                               f"; the top level holds only {', '.join(TOP_LEVEL_KEYS)}"))
    if "default" in doc:
        line = doc.lines["default"]
        if isinstance(doc["default"], str) and doc["default"]:
            cf.default = Entry(doc["default"], doc["default"], f"file:{path}:{line}")
        else:
            problems.append(f"{path}, line {line}: default={doc['default']!r} must be a site name")
    sites = doc.get("sites")
    if sites is not None and not isinstance(sites, Mapping):
        problems.append(f"{path}, line {doc.lines['sites']}: 'sites' must be a map of site "
                        "names to settings")
    elif sites:
        for name, block in sites.items():
            cf.sites[name] = _validate_block(block, path, f"site '{name}'", set(OPTION_BY_NAME),
                                             problems, base_dir)
    cf.settings = _validate_block(doc.get("settings"), path, "settings", set(SETTINGS_NAMES),
                                  problems, base_dir)
    if problems:
        raise ConfigError(problems)
    return cf


# ---------------------------------------------------------------------------- finding files

@dataclass(frozen=True)
class Candidate:
    label: str          # where this place in the lookup order comes from
    path: Path
    required: bool      # named explicitly: missing is an error, not a skip


def user_config_dir(environ: Mapping[str, str]) -> Path:
    xdg = environ.get("XDG_CONFIG_HOME")
    home = environ.get("HOME") or str(Path.home())
    return Path(xdg if xdg else os.path.join(home, ".config")) / "hpc-cluster"


def system_config_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HPC_CLUSTER_SYSTEM_CONFIG_DIR") or SYSTEM_CONFIG_DIR)


def candidate_paths(config: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None,
                    cwd: str | os.PathLike | None = None) -> list[Candidate]:
    """The lookup order, highest priority first (pure: reads no files).

    Naming a file (config= / --config, or $HPC_CLUSTER_CONFIG) means "use this one": the
    implicit personal files (./hpc-cluster.yaml, the user config dir) are then not read.
    The system file is always read, beneath everything: it holds what the lab shares.
    """
    environ = os.environ if environ is None else environ
    cwd = Path(cwd or os.getcwd())
    out: list[Candidate] = []
    if config:
        out.append(Candidate("config= / --config", Path(os.path.expanduser(str(config))), True))
    if environ.get("HPC_CLUSTER_CONFIG"):
        out.append(Candidate("$HPC_CLUSTER_CONFIG",
                             Path(os.path.expanduser(environ["HPC_CLUSTER_CONFIG"])), True))
    if not out:
        out.append(Candidate("current directory", cwd / CWD_FILENAME, False))
        out.append(Candidate("user config", user_config_dir(environ) / CONFIG_FILENAME, False))
    out.append(Candidate("system config", system_config_dir(environ) / CONFIG_FILENAME, False))
    return [Candidate(c.label, c.path if c.path.is_absolute() else cwd / c.path, c.required)
            for c in out]


def find_config_files(config=None, environ=None, cwd=None) -> list[Path]:
    """The config files that exist, highest priority first. A named file must exist."""
    found: list[Path] = []
    for c in candidate_paths(config, environ, cwd):
        if c.path.is_file():
            if c.path.resolve() not in [p.resolve() for p in found]:
                found.append(c.path)
        elif c.required:
            raise ConfigError(f"{c.path}: no such config file (given by {c.label})")
    return found


def load_config_files(paths) -> list[ConfigFile]:
    """Read and validate files; every problem in every file is reported at once."""
    files, problems = [], []
    for p in paths:
        try:
            text = Path(p).read_text()
        except OSError as e:
            problems.append(f"{p}: cannot read: {e.strerror}")
            continue
        try:
            files.append(parse_config_text(text, str(p)))
        except ConfigError as e:
            problems.extend(e.problems)
    if problems:
        raise ConfigError(problems)
    return files


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
    valid = [ENV_PREFIX + o.name.upper() for o in OPTIONS]
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
            raw = _env_text_to_value(OPTION_BY_NAME[name], text)
            out[name] = Entry(text, parse_value(name, raw), f"env:{var}")
        except yaml.YAMLError:
            problems.append(f"environment variable {var}={text!r} is not valid YAML for a {OPTION_BY_NAME[name].kind}")
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
            problems.append(f"unknown keyword '{key}'" + did_you_mean(key, list(OPTION_BY_NAME)))
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

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def table(self) -> str:
        """A readable table: key, value as written (and parsed, where that differs), source."""
        rows = [("key", "value", "source")]
        for o in OPTIONS:
            raw, value = self.raw[o.name], self.values[o.name]
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
          keywords: Mapping[str, Entry]) -> dict[str, Entry]:
    """Pure merge: keywords > env > files (earlier wins; in a file, site > settings) > default."""
    merged: dict[str, Entry] = {}
    for o in OPTIONS:
        entry = keywords.get(o.name) or env.get(o.name)
        if entry is None:
            for f in files:
                entry = f.sites.get(site, {}).get(o.name) or f.settings.get(o.name)
                if entry is not None:
                    break
        if entry is None:
            parsed = None if o.default is None else o.check(o.name, o.default)
            entry = Entry(o.default, parsed, "default")
        merged[o.name] = entry
    return merged


def resolve(site: str | None = None, config: str | os.PathLike | None = None, *,
            environ: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
            **kwargs) -> ResolvedConfig:
    """Find, read, validate and merge everything for one site. Raises ConfigError.

    `environ` and `cwd` default to the process's; tests pass their own.
    """
    environ = os.environ if environ is None else environ
    keywords = check_keywords(kwargs)        # cheapest mistakes first: a typo in the call
    files = load_config_files(find_config_files(config, environ, cwd))
    env = env_overrides(environ)
    chosen, why = select_site(files, site, environ)
    merged = merge(files, chosen, env, keywords)
    return ResolvedConfig(site=chosen, values={k: e.value for k, e in merged.items()},
                          raw={k: e.raw for k, e in merged.items()},
                          sources={k: e.source for k, e in merged.items()},
                          files=[f.path for f in files], site_source=why)


# ---------------------------------------------------------------------------- starter file

def starter_config(batch: str = "local", site: str = "mysite", queue: str | None = None,
                   note: str = "") -> str:
    """A commented starter file generated from OPTIONS. Pure; `config init` writes it."""
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
    for o in OPTIONS:
        if o.scope != "site":
            continue
        if o.name in active:
            lines.append(f"    {o.name}: {_flow(active[o.name])}   # {o.help}")
        else:
            shown = o.example if o.default is None else o.default
            lines.append(f"    # {o.name}: {_flow(shown)}   # {o.help}")
    lines += ["# Scheduler and nanny knobs, for every site (a site may also set them):",
              "settings:"]
    for o in OPTIONS:
        if o.scope == "both":
            shown = o.example if o.default is None else o.default
            lines.append(f"  # {o.name}: {_flow(shown)}   # {o.help}")
    return "\n".join(lines) + "\n"
