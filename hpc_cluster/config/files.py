"""Site config files: where they are looked for, how they are read (YAML that remembers
its lines), and how each block is validated against the settings table (schema.py).

Only `find_config_files` and `load_config_files` touch the file system; the rest are pure
functions over text and mappings, so tests need no real /etc or $HOME.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from .schema import (TOP_LEVEL_KEYS, ConfigError, LineError, aliases, option_by_name, settings_names,
                     canonical_key, did_you_mean, parse_value)

# Admins put the lab's shared file here; the env var exists so tests (and sites that
# cannot write /etc) can point elsewhere.
SYSTEM_CONFIG_DIR = "/etc/hpc-cluster"
CONFIG_FILENAME = "config.yaml"
CWD_FILENAME = "hpc-cluster.yaml"

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


def _number_or_clock(loader, node):
    # YAML 1.1 reads '30:00' as the base-60 number 1800: a walltime written without quotes
    # would then be 1800 minutes to SLURM. Clock-like values stay as written.
    if ":" in str(node.value):
        return loader.construct_scalar(node)
    if node.tag.endswith(":int"):
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    return yaml.SafeLoader.construct_yaml_float(loader, node)


_LineLoader.add_constructor("tag:yaml.org,2002:int", _number_or_clock)
_LineLoader.add_constructor("tag:yaml.org,2002:float", _number_or_clock)


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
                            + (did_you_mean(key, list(option_by_name()) + list(aliases())) or
                               "; see docs/configuration.md for the keys"))
            continue
        if name not in allowed:
            problems.append(f"{path}, line {line}: '{key}' cannot go in {where}; only the scheduler "
                            f"and nanny knobs can ({', '.join(settings_names())}): put it in a site")
            continue
        if name in given:
            problems.append(f"{path}, line {line}: '{key}' and '{given[name]}' in {where} are the "
                            "same setting; keep one")
            continue
        given[name] = key
        try:
            value = parse_value(name, raw)
        except LineError as e:
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
            cf.sites[name] = _validate_block(block, path, f"site '{name}'", set(option_by_name()),
                                             problems, base_dir)
    cf.settings = _validate_block(doc.get("settings"), path, "settings", set(settings_names()),
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
